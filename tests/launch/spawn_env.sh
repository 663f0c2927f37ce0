#!/usr/bin/env bash
# The plainest env:// launcher: starts N copies of a program with RANK,
# WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT set
# (what torchrun, Kubernetes' PyTorchJob or a hand-written Slurm script set),
# waits for them within a bound, and exits with the worst exit code.
#
#   spawn_env.sh [--limit SECONDS] [--port P] N program [args...]
#
# Per-rank overrides for fault tests: SPAWN_ENV_<rank>="VAR=value ..." is
# added to that rank's environment; SPAWN_SKIP="2 3" starts no process for
# those ranks (they never arrive). Processes still running at the limit are
# ended by their PIDs (TERM, then KILL), and the exit code is 124.
set -u
limit=120
port=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --limit) limit=$2; shift 2 ;;
    --port) port=$2; shift 2 ;;
    *) break ;;
  esac
done
n=$1; shift
if [[ -z "$port" ]]; then
  # A free loopback port, chosen by the kernel.
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
fi
unset OMPI_COMM_WORLD_SIZE OMPI_COMM_WORLD_RANK OMPI_COMM_WORLD_LOCAL_RANK PMIX_RANK PMI_RANK
pids=()
for ((r = 0; r < n; ++r)); do
  if [[ " ${SPAWN_SKIP:-} " == *" $r "* ]]; then continue; fi
  extra_name="SPAWN_ENV_$r"
  # shellcheck disable=SC2086
  env RANK=$r WORLD_SIZE=$n LOCAL_RANK=$r LOCAL_WORLD_SIZE=$n \
      MASTER_ADDR=127.0.0.1 MASTER_PORT=$port ${!extra_name:-} "$@" &
  pids+=($!)
done
deadline=$((SECONDS + limit))
worst=0
killed=0
for pid in "${pids[@]}"; do
  while kill -0 "$pid" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.1; done
  if kill -0 "$pid" 2>/dev/null; then
    echo "spawn_env: rank process $pid still running after ${limit}s: ending it" >&2
    kill -TERM "$pid" 2>/dev/null; sleep 1; kill -KILL "$pid" 2>/dev/null
    killed=1
  fi
  wait "$pid"; rc=$?
  if ((rc > worst)); then worst=$rc; fi
done
# A kill says so, whatever the killed processes' own exit codes were.
if ((killed)); then exit 124; fi
exit "$worst"
