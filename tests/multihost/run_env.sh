#!/usr/bin/env bash
# One env:// job across emulated hosts (no MPI launcher): makes HOSTS hosts
# and starts RANKS processes on each, inside the host, with what torchrun or
# a hand-written Slurm script sets: RANK, WORLD_SIZE, LOCAL_RANK,
# LOCAL_WORLD_SIZE, MASTER_ADDR (node0's address: rank 0 hosts vemesh's TCP
# store there) and MASTER_PORT; Gloo carries the rest. Waits for every rank
# within LIMIT seconds (then ends the rest by PID and reports 124), prints
# every rank's output, and exits with the worst exit code.
#
#   run_env.sh [--hosts 2] [--ranks 4] [--limit 60] [--check "..."]
#              [--expect REGEX] [--torchrun] program [args...]
#
# --check and --expect: as in run_mpirun.sh.
# --torchrun starts one `torchrun --no_python --nnodes=HOSTS --node_rank=I
# --nproc_per_node=RANKS --rdzv_backend=c10d` per host instead of the
# processes themselves.
set -u
here=$(cd "$(dirname "$0")" && pwd)
hosts=2 ranks=4 limit=60 check="" expect="" torchrun=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --hosts) hosts=$2; shift 2 ;;
    --ranks) ranks=$2; shift 2 ;;
    --limit) limit=$2; shift 2 ;;
    --check) check=$2; shift 2 ;;
    --expect) expect=$2; shift 2 ;;
    --torchrun) torchrun=1; shift ;;
    *) break ;;
  esac
done
# shellcheck source=hosts.sh
source "$here/hosts.sh"
mh_require_root_or_skip
mh_up "$hosts" || { echo "FAIL: could not make $hosts emulated hosts"; exit 1; }
world=$((hosts * ranks))
master=$(mh_addr node0)
port=29411   # the hosts' network is this run's own: no other user of it
unset OMPI_COMM_WORLD_SIZE OMPI_COMM_WORLD_RANK OMPI_COMM_WORLD_LOCAL_RANK PMIX_RANK PMI_RANK
echo "run_env: $hosts hosts x $ranks ranks, MASTER_ADDR=$master:$port: $*"
pids=() outs=()
start=$SECONDS
for ((h = 0; h < hosts; ++h)); do
  if ((torchrun)); then
    o="$MH_STATE/node$h.out"
    # --redirects/--tee 1: see tests/launch/run_torchrun.sh (torch 1.13 on
    # Python 3.11 cannot parse their default).
    mh_exec "node$h" torchrun --no_python --nnodes="$hosts" --node_rank="$h" \
      --nproc_per_node="$ranks" --redirects 1 --tee 1 --rdzv_backend=c10d \
      --rdzv_endpoint="$master:$((port + 1))" --master_addr="$master" \
      --master_port="$port" "$@" >"$o" 2>&1 &
    pids+=($!) outs+=("$o")
    continue
  fi
  for ((l = 0; l < ranks; ++l)); do
    r=$((h * ranks + l))
    o="$MH_STATE/rank$r.out"
    mh_exec "node$h" env RANK=$r WORLD_SIZE=$world LOCAL_RANK=$l \
      LOCAL_WORLD_SIZE=$ranks MASTER_ADDR="$master" MASTER_PORT=$port \
      "$@" >"$o" 2>&1 &
    pids+=($!) outs+=("$o")
  done
done
deadline=$((SECONDS + limit))
worst=0 killed=0
for pid in "${pids[@]}"; do
  while kill -0 "$pid" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.1; done
  if kill -0 "$pid" 2>/dev/null; then
    killed=1
    break
  fi
done
if ((killed)); then
  echo "FAIL: the job did not end within ${limit}s; ending every host"
  # Killing a host's holder ends everything that ran there; then the
  # nsenter processes we started return.
  for h in $(mh_hosts); do kill -KILL "$(mh_holder_pid "$h")" 2>/dev/null; done
fi
codes=()
for pid in "${pids[@]}"; do
  wait "$pid"; rc=$?
  codes+=("$rc")
  if ((rc > worst)); then worst=$rc; fi
done
for i in "${!outs[@]}"; do
  echo "--- $(basename "${outs[$i]}" .out): exit code ${codes[$i]}"
  cat "${outs[$i]}"
done
cat "${outs[@]}" >"$MH_STATE/job.out"
echo "run_env: job ended after $((SECONDS - start)) s, worst exit code $worst"
if ((killed)); then exit 124; fi
mh_verdict "$worst" "$MH_STATE/job.out" "$world" "$check" "$expect"
