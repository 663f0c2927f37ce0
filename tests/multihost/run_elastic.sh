#!/usr/bin/env bash
# An elastic job across two emulated hosts: Redis runs in node0 on its own
# address; replica k is an `mpirun -n 2` inside node k (a launch never spans
# hosts). The DP groups advertise each rank's interface towards Redis
# (docs/ELASTIC.md), so they form across the hosts: both replicas must end
# PASS at DP=2. With --loopback, every rank is forced to advertise
# 127.0.0.1 (VEMESH_GLOO_HOST): the groups cannot form and the error must
# name the addresses tried. Everything runs inside the hosts and ends with
# them (mh_down kills each host's holder).
#
#   run_elastic.sh [--loopback] TRAIN_ND
set -u
here=$(cd "$(dirname "$0")" && pwd)
loopback=0
[[ ${1:-} == --loopback ]] && { loopback=1; shift; }
bin=$1
limit=90
# shellcheck source=hosts.sh
source "$here/hosts.sh"
mh_require_root_or_skip
command -v redis-server >/dev/null || { echo "SKIP: redis-server not found"; exit 77; }
mh_up 2 || { echo "FAIL: could not make 2 emulated hosts"; exit 1; }
mh_mpi_env
redis=$(mh_addr node0)
port=6390
mh_exec node0 redis-server --port $port --bind "$redis" --save "" \
  --appendonly no --protected-mode no --logfile "$MH_STATE/redis.log" &
for _ in $(seq 100); do
  mh_exec node1 bash -c "exec 3<>/dev/tcp/$redis/$port" 2>/dev/null && break
  sleep 0.05
done
extra=()
((loopback)) && extra=(env VEMESH_GLOO_HOST=127.0.0.1)
# Refused groups end at the recovery deadline: 8 s gives each replica
# several epochs' tries (2 s each) to name the addresses, in less wait.
recovery_ms=15000
((loopback)) && recovery_ms=8000
pids=()
start=$SECONDS
for k in 0 1; do
  mh_exec node$k "${extra[@]}" mpirun -n 2 --bind-to none -x VEMESH_GLOO_HOST \
    "$bin" --mesh PP=1,DP=2,TP=2 --batch 24 --micro_batches 2 --steps 20 \
    --elastic "redis://$redis:$port" --job two_hosts --replica $k \
    --op_timeout_ms 2000 --recovery_timeout_ms "$recovery_ms" \
    >"$MH_STATE/r$k.out" 2>&1 &
  pids+=($!)
done
codes=()
for p in "${pids[@]}"; do
  while kill -0 "$p" 2>/dev/null && ((SECONDS - start < limit)); do sleep 0.2; done
  kill -0 "$p" 2>/dev/null && { echo "FAIL: a replica ran past ${limit}s"; exit 124; }
  wait "$p"; codes+=($?)
done
failures=0
for k in 0 1; do
  echo "--- replica $k on node$k: exit ${codes[$k]}"; cat "$MH_STATE/r$k.out"
  if ((loopback)); then
    [[ ${codes[$k]} != 0 ]] || { echo "FAIL: replica $k exited 0"; failures=1; }
    # The replicas give up at their own deadlines: the one that tries last
    # may find that the other never advertised in its final epoch.
    grep -qE "addresses tried: DP rank 0 \(replica 0\) at (127\.0\.0\.1|\(never advertised\)), DP rank 1 \(replica 1\) at (127\.0\.0\.1|\(never advertised\))" \
      "$MH_STATE/r$k.out" && grep -q "replica $k) at 127.0.0.1" "$MH_STATE/r$k.out" ||
      { echo "FAIL: replica $k: no error naming the addresses tried"; failures=1; }
  else
    [[ ${codes[$k]} == 0 ]] || { echo "FAIL: replica $k exited ${codes[$k]}"; failures=1; }
    grep -qE "PASS: replica $k: .*parameters identical across DP=2 replicas" \
      "$MH_STATE/r$k.out" || { echo "FAIL: replica $k: no PASS at DP=2"; failures=1; }
  fi
done
echo "run_elastic: ended after $((SECONDS - start)) s"
((failures == 0)) && echo "PASS: elastic across two hosts$( ((loopback)) && echo ' (loopback refused)')"
exit $failures
