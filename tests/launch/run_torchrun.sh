#!/usr/bin/env bash
# Runs a program under Debian's torchrun (python3-torch) the way PyTorch
# users do, bounded in time:
#
#   run_torchrun.sh LIMIT_SECONDS N program [args...]
#   -> torchrun --no_python --standalone --nproc_per_node=N program args
#
# At the limit torchrun is ended by its PID (it ends its workers) and the
# exit code is 124. Without torchrun the test says so and exits 77, which
# ctest reports as skipped (SKIP_RETURN_CODE), never as passed.
set -u
limit=$1; n=$2; shift 2
if ! command -v torchrun >/dev/null 2>&1; then
  echo "SKIPPED: torchrun not found (Debian package python3-torch; scripts/setup.sh installs it)"
  exit 77
fi
unset OMPI_COMM_WORLD_SIZE OMPI_COMM_WORLD_RANK OMPI_COMM_WORLD_LOCAL_RANK PMIX_RANK PMI_RANK
# torchrun's own threads: one each is plenty on 2 cores.
export OMP_NUM_THREADS=1
# --redirects/--tee 1: torch 1.13 on Python 3.11 cannot parse their default
# "0" (the IntFlag member NONE is skipped by iteration there), so stdout is
# redirected and teed back explicitly.
torchrun --no_python --standalone --nproc_per_node="$n" --redirects 1 --tee 1 "$@" &
pid=$!
deadline=$((SECONDS + limit))
while kill -0 "$pid" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.2; done
if kill -0 "$pid" 2>/dev/null; then
  echo "run_torchrun: torchrun $pid still running after ${limit}s: ending it" >&2
  kill -TERM "$pid" 2>/dev/null; sleep 3; kill -KILL "$pid" 2>/dev/null
  wait "$pid"
  exit 124
fi
wait "$pid"
