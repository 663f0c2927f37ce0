#!/usr/bin/env bash
# Runs a Python test script on N ranks, bounded in time:
#
#   run_mp.sh torchrun|mpirun|single LIMIT_SECONDS N PYTHON script.py [args...]
#
# single:   PYTHON args... in this process (N is ignored): the one-process
#   pytest run, bounded the same way.
# torchrun: Debian's torchrun (python3-torch) with Python workers, env://
#   and Gloo, as PyTorch users launch (--redirects/--tee 1: torch 1.13 on
#   Python 3.11 cannot parse their default "0").
# mpirun:   mpiexec -n N PYTHON script.py (MPI started inside the module).
# At the limit the launcher is ended by its PID and the exit code is 124.
# A missing launcher exits 77, which ctest reports as skipped.
set -u
launcher=$1; limit=$2; n=$3; python=$4; shift 4
export OMP_NUM_THREADS=1
if ! "$python" -c 'import pytest, numpy' 2>/dev/null; then
  echo "SKIPPED: $python lacks pytest or numpy (Debian: python3-pytest python3-numpy)"; exit 77
fi
case "$launcher" in
  torchrun)
    if ! command -v torchrun >/dev/null 2>&1; then
      echo "SKIPPED: torchrun not found (Debian package python3-torch)"; exit 77
    fi
    unset OMPI_COMM_WORLD_SIZE OMPI_COMM_WORLD_RANK OMPI_COMM_WORLD_LOCAL_RANK PMIX_RANK PMI_RANK
    # --standalone's fixed port 29400 collides with any other torchrun on
    # the host: a free port for the c10d rendezvous instead (what
    # --standalone does otherwise).
    port=$("$python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    torchrun --nnodes=1 --rdzv_backend=c10d --rdzv_endpoint="127.0.0.1:$port" \
      --rdzv_id="vemesh-py-$$" --nproc_per_node="$n" --redirects 1 --tee 1 "$@" &
    ;;
  mpirun)
    mpiexec --oversubscribe --bind-to none -n "$n" "$python" "$@" &
    ;;
  single)
    "$python" "$@" &
    ;;
  *) echo "run_mp: unknown launcher '$launcher'" >&2; exit 2 ;;
esac
pid=$!
deadline=$((SECONDS + limit))
while kill -0 "$pid" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.2; done
if kill -0 "$pid" 2>/dev/null; then
  echo "run_mp: $launcher $pid still running after ${limit}s: ending it" >&2
  kill -TERM "$pid" 2>/dev/null; sleep 3; kill -KILL "$pid" 2>/dev/null
  wait "$pid"
  exit 124
fi
wait "$pid"
