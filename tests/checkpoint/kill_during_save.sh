#!/usr/bin/env bash
# SIGKILL at random points of a checkpoint save, RUNS times: after every
# kill the checkpoint directory loads, with the exact values of either the
# previous committed step or the step being saved (if it committed before
# the kill), never anything half-written.
#   kill_during_save.sh CHECKPOINT_DRIVER [RUNS]
set -u
driver=$1
runs=${2:-20}
dir=$(mktemp -d /tmp/vemesh_ckpt_kill_XXXXXX)
trap 'rm -rf "$dir"' EXIT
ranks=4 rows=8192   # 8 MiB of w, in 4 row shards

timeout 60 "$driver" save "$dir" 1 $ranks $rows >/dev/null || { echo "FAIL: first save"; exit 1; }
# How long one whole save takes (process start included): kills land
# uniformly inside it.
t0=$(date +%s%N)
timeout 60 "$driver" save "$dir" 2 $ranks $rows >/dev/null || { echo "FAIL: second save"; exit 1; }
full_us=$(( ($(date +%s%N) - t0) / 1000 ))
echo "one save takes ${full_us} us"
committed=2 step=2 killed=0 completed=0 new=0
for ((i = 1; i <= runs; ++i)); do
  step=$((step + 1))
  delay_us=$(( (RANDOM * 32768 + RANDOM) % (full_us + 1) ))
  "$driver" save "$dir" $step $ranks $rows >/dev/null 2>&1 &
  pid=$!
  sleep "$(printf '0.%06d' "$delay_us")"
  kill -KILL $pid 2>/dev/null
  wait $pid
  rc=$?
  if [ $rc -eq 137 ]; then killed=$((killed + 1)); else completed=$((completed + 1)); fi
  out=$(timeout 60 "$driver" verify "$dir" $committed $step 2>&1)
  if [ $? -ne 0 ]; then
    echo "FAIL: run $i (kill after ${delay_us} us, rc $rc): $out"
    ls -lR "$dir"
    exit 1
  fi
  loaded=${out##* }
  [ "$loaded" = "$step" ] && new=$((new + 1))
  echo "run $i: killed after ${delay_us} us (rc $rc), $out"
  committed=$loaded
done
echo "PASS: $runs runs ($killed killed, $completed finished first; $new loaded the new step, the others the previous one); every load exact"
