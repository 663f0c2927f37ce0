#!/usr/bin/env bash
# docs/ELASTIC.md's torchrun recipe, read from the document and run as
# written there (the port P_k, the Redis port and the binary substituted;
# --steps and --job appended): three replicas, each its own torchrun,
# meeting through a Redis on loopback. Every replica must end PASS at DP=3
# within the bound. Every process this script starts is ended by its PID.
#
#   torchrun_recipe.sh TRAIN_ND ELASTIC_MD
set -u
bin=$1 doc=$2
limit=${ELASTIC_LIMIT:-150}
start_time=$SECONDS
work=$(mktemp -d /tmp/vemesh_torchrun.XXXXXX)
pids=()
redis_pid=""
failures=0
cleanup() {
  local p c
  for p in "${pids[@]}"; do
    for c in $(pgrep -P "$p" 2>/dev/null); do kill -KILL "$c" 2>/dev/null; done
    kill -KILL "$p" 2>/dev/null
  done
  [[ -n $redis_pid ]] && kill -KILL "$redis_pid" 2>/dev/null
  wait 2>/dev/null
  if ((failures > 0)); then
    for f in "$work"/*.out; do echo "---- $f"; tail -n 30 "$f"; done
  fi
  rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
for tool in torchrun redis-server; do
  command -v $tool >/dev/null || { echo "FAIL: $tool not found"; exit 1; }
done
free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
port=$(free_port)
redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no \
  --protected-mode no --logfile "$work/redis.log" &
redis_pid=$!
for _ in $(seq 100); do
  (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break
  sleep 0.05
done
# The recipe: the indented block of "Running it" that starts with
# `torchrun --rdzv_backend`, its continuation lines joined.
recipe=$(awk '/^ +torchrun --rdzv_backend/ {on=1}
              on {sub(/^ +/, ""); line = line $0 " "; if ($0 !~ /\\$/) exit}
              END {gsub(/\\ /, "", line); print line}' "$doc")
[[ $recipe == torchrun* ]] || { echo "FAIL: no torchrun recipe in $doc"; exit 1; }
echo "recipe: $recipe"
export OMP_NUM_THREADS=1
for k in 0 1 2; do
  line=${recipe//P_k/$(free_port)}
  line=${line//127.0.0.1:6379/127.0.0.1:$port}
  line=${line//replica k/replica $k}
  line=${line/ train_nd / $bin }
  # shellcheck disable=SC2086
  $line --steps 20 --job torchrun_recipe >"$work/r$k.out" 2>&1 &
  pids+=($!)
done
for k in 0 1 2; do
  p=${pids[$k]}
  while kill -0 "$p" 2>/dev/null && ((SECONDS - start_time < limit)); do
    sleep 0.2
  done
  kill -0 "$p" 2>/dev/null && fail "replica $k still running after ${limit}s"
  wait "$p"; rc=$?
  [[ $rc == 0 ]] || fail "torchrun of replica $k exited $rc"
  grep -qE "PASS: replica $k: .*parameters identical across DP=3 replicas" \
    "$work/r$k.out" || fail "replica $k: no PASS line at DP=3"
  grep -q "TORCHELASTIC_USE_AGENT_STORE" "$work/r$k.out" &&
    fail "replica $k: refused for the agent store"
done
echo "torchrun recipe: whole run $((SECONDS - start_time)) s (bound ${limit} s)"
((failures == 0)) && echo "PASS: elastic torchrun_recipe" && exit 0
exit 1
