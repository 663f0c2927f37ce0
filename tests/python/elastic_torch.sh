#!/usr/bin/env bash
# The elastic torch job's fault scenarios (issue 42): three replicas of
# tests/python/elastic_torch.py (a torch MLP with AdamW; each replica one
# launch of 2 ranks: replicas 0 and 2 under mpirun, replica 1 under torchrun
# with a rendezvous port of its own) meet through a Redis that this script
# starts on loopback.
#
#   elastic_torch.sh PYTHON SCENARIO
#
# rejoin: replica 1 is SIGKILLed after step 8; the others go on at
#   DP_REPLICATE=2 (the same replicate group object); replica 1 launched
#   again joins (DP_REPLICATE=3) with the survivors' model, AdamW state and
#   progress (the state hashes printed after the join are asserted equal);
#   every final state is bit-identical and equal to one process over the
#   committed steps (elastic_torch.py --check).
# bug: replica 2 raises in its step 5 every time (not a lost member): it is
#   retried max_step_retries (2) times, then every replica ends with the
#   error naming replica 2 and the code, chained to the step's own exception
#   on replica 2.
#
# restart: periodic checkpoints (DP rank 0's replica), every replica killed,
#   the job launched again resumes from the newest one and ends equal to one
#   process over all steps.
# redis_restarted: Redis restarted empty mid-run is survived (no
#   membership change, final states equal to one process).
# corrupt: replica 1 perturbs a weight (a shard of its FSDP HYBRID_SHARD
#   model) after step 5; every replica ends with the DATA_LOSS that names
#   replica 1.
# ddp: rejoin with torch's own DistributedDataParallel built once
#   (vemesh.torch.elastic.ElasticDDP), and Redis restarted empty once the
#   joiner trains (no membership change after it).
# hsdp: rejoin with vemesh FSDP HYBRID_SHARD over (DP_REPLICATE, DP_SHARD)
#   built once, and only one rank of replica 1 killed: its mate ends at once
#   (exit 75 when told while in a replicate collective, or its replica's own
#   collective's error), the survivors recover; the joiner's shards and
#   AdamW state equal the survivors' of the same shard coordinate.
#
# Every process this script starts is ended by its PID (the launchers and
# their ranks, redis-server), never by name, also when an assertion fails.
set -u
py=$1; scenario=$2
here=$(cd "$(dirname "$0")" && pwd)
limit=${ELASTIC_LIMIT:-110}
start_time=$SECONDS
work=$(mktemp -d /tmp/vemesh_elastic_torch.XXXXXX)
# The harness: launcher/rc, fail, end_pid_tree, free_port, start_redis,
# wait_for, finish, expect_line and the EXIT trap.
source "$here/../common/redis_job.sh"
export OMP_NUM_THREADS=1 PYTHONDONTWRITEBYTECODE=1

for tool in redis-server mpirun torchrun; do
  command -v $tool >/dev/null || { echo "SKIPPED: $tool not found"; exit 77; }
done
"$py" -c 'import torch, numpy' 2>/dev/null ||
  { echo "SKIPPED: $py lacks torch or numpy"; exit 77; }
start_redis

steps=30
job=$scenario
mode=${MODE:-manual}  # elastic_torch.py --mode: manual, ddp or hsdp
args=()
# launch K OUT mpirun|torchrun: replica K (2 ranks), in the background.
launch() {
  local k=$1 out=$2 how=$3
  local cmd=("$here/elastic_torch.py" --store "redis://127.0.0.1:$port"
             --replica "$k" --job "$job" --steps "$steps" --out "$work"
             --mode "$mode" "${args[@]}")
  if [[ $how == mpirun ]]; then
    mpirun -n 2 --bind-to none "$py" "${cmd[@]}" >"$work/$out.out" 2>&1 &
  else
    (unset OMPI_COMM_WORLD_SIZE OMPI_COMM_WORLD_RANK PMIX_RANK PMI_RANK
     exec torchrun --nnodes=1 --nproc_per_node=2 --rdzv_backend=c10d \
       --rdzv_endpoint="127.0.0.1:$(free_port)" --rdzv_id="vemesh-ft-$k-$RANDOM" \
       --redirects 1 --tee 1 "${cmd[@]}") >"$work/$out.out" 2>&1 &
  fi
  launcher[$k]=$!
}
# passes OUT K: both ranks of replica K printed PASS (the two ranks' lines
# may share a line of the launcher's output).
passes() {
  [[ $(grep -oE "PASS: replica $2 shard [01] " "$work/$1.out" | sort -u | wc -l) == 2 ]] ||
    fail "$1: not a PASS from both ranks of replica $2"
}
# rank_pid LAUNCHER R: the PID of the rank with LOCAL_RANK=R among the
# launcher's children (torchrun's workers), or nothing.
rank_pid() {
  local c
  for c in $(pgrep -P "$1" 2>/dev/null); do
    tr '\0' '\n' <"/proc/$c/environ" 2>/dev/null | grep -qx "LOCAL_RANK=$2" &&
      { echo "$c"; return; }
  done
}
# joined_equal OUT...: the state every rank printed at the first DP=3 epoch
# of the last OUT (the joiner: model, AdamW and progress, an FSDP's and its
# optimizer's by shard) is one hash per shard coordinate, printed by the
# three replicas' ranks of that coordinate.
joined_equal() {
  local last=${!#} epoch hashes
  epoch=$(grep -oE "state: epoch [0-9]+ DP=3" "$work/$last.out" | head -n 1 | awk '{print $3}')
  [[ -n $epoch ]] || { fail "$last did not join at DP=3"; return; }
  hashes=$(for o in "$@"; do cat "$work/$o.out"; done |
    grep -oE "state: epoch $epoch DP=3 step [0-9]+ shard [01] hash [0-9a-f]{16}" |
    awk '{print $6, $8, $10}' | sort | uniq -c)
  echo "joined at epoch $epoch: $hashes"
  [[ $(wc -l <<<"$hashes") == 2 && $(awk '$1 == 3' <<<"$hashes" | wc -l) == 2 &&
     $(awk '{print $2}' <<<"$hashes" | sort -u | wc -l) == 1 ]] ||
    fail "the states at the join differ (or a rank is missing): $hashes"
}

case $scenario in
  rejoin|ddp|hsdp)
    # ddp / hsdp: the same with torch's own DistributedDataParallel
    # (ElasticDDP) or vemesh FSDP HYBRID_SHARD, built once; hsdp kills one
    # rank of replica 1 only (its mate ends at once); ddp restarts Redis
    # empty once the joiner trains (no membership change after it).
    [[ $scenario == rejoin ]] || mode=$scenario
    args=(--pace_ms 30 --extra 12)
    [[ $scenario == ddp ]] && args=(--pace_ms 30 --extra 45)
    launch 0 r0 mpirun; launch 1 r1 torchrun; launch 2 r2 mpirun
    wait_for r1 "step 8 committed" 60
    if [[ $scenario == hsdp ]]; then
      victim=$(rank_pid "${launcher[1]}" 1)
      [[ -n $victim ]] || fail "no LOCAL_RANK=1 worker under torchrun ${launcher[1]}"
      kill -KILL "$victim" 2>/dev/null
      # Its mate ends at once: told by a survivor while it waits in a
      # replicate collective (exit 75), or its own replica's collective
      # fails first and the error ends it (the race is the kill's timing).
      wait_for r1 "replica 1 rank 0: another rank of this replica is gone .*exit 75|vemesh._C.Error: " 20 &&
        echo "replica 1's other rank: $(grep -oE "another rank of this replica is gone|vemesh._C.Error: [^[]*" "$work/r1.out" | head -n 1)"
    fi
    end_pid_tree "${launcher[1]}"; wait "${launcher[1]}" 2>/dev/null
    unset "launcher[1]"
    wait_for r0 "recovery: epoch 2, DP=2 \[0, 2\]" 30
    launch 1 r1b torchrun
    if [[ $scenario == ddp ]]; then
      wait_for r1b "step [0-9]+ committed DP=3" 60
      before=$(grep -c "recovery: epoch" "$work/r0.out")
      restart_redis
    fi
    finish 0; finish 2; finish 1
    for k in 0 2; do
      [[ ${rc[$k]} == 0 ]] || fail "r$k exited ${rc[$k]}"
      expect_line r$k "recovery: epoch 2, DP=2 \[0, 2\], resume at step [0-9]+;.*step failed"
      expect_line r$k "recovery: epoch 3, DP=3 \[0, 2, 1\]"
      expect_line r$k "committed DP=2"
      passes r$k $k
    done
    if [[ $scenario == ddp ]]; then
      (($(grep -c "recovery: epoch" "$work/r0.out") == before)) ||
        fail "r0: the membership changed after Redis was restarted"
    fi
    [[ ${rc[1]} == 0 ]] || fail "r1b exited ${rc[1]}"
    passes r1b 1
    # The joiner's state right after joining (model, AdamW, progress) is the
    # survivors' at that epoch.
    joined_equal r0 r2 r1b
    "$py" "$here/elastic_torch.py" --check "$work" --steps "$steps" ||
      fail "final states"
    echo "kill -> DP=2 recovery record:"; grep -hoE "recovery: epoch 2, .*" "$work/r0.out" | head -n 1 ;;
  bug)
    args=(--bug_at 5 --bug_replica 2)
    launch 0 r0 mpirun; launch 1 r1 torchrun; launch 2 r2 mpirun
    finish 0; finish 1; finish 2
    for k in 0 1 2; do
      [[ ${rc[$k]} != 0 ]] || fail "r$k exited 0 despite the bug"
      grep -q "PASS" "$work/r$k.out" && fail "r$k printed PASS"
      expect_line r$k "replica 2"
      [[ $(grep -oE "recovery: epoch" "$work/r$k.out" | wc -l) -ge 4 ]] ||
        fail "r$k: fewer than 2 retries per rank"
    done
    expect_line r2 "RuntimeError: injected bug at step 5"
    expect_line r2 "direct cause of the following exception" ;;
  restart)
    # Issue 42 item 5: replica DP rank 0 checkpoints every 5 steps
    # (vemesh.torch.elastic.ElasticCheckpointer); every replica SIGKILLed
    # after step 10's checkpoint (the state lives nowhere else); the job
    # launched again (a new job record) resumes from the newest checkpoint
    # and ends with every final state equal to one process over all steps.
    args=(--pace_ms 30 --ckpt_dir "$work/ckpt" --ckpt_every 5)
    launch 0 r0 mpirun; launch 1 r1 torchrun; launch 2 r2 mpirun
    wait_for r0 "checkpoint: step 10 committed" 60
    for k in 0 1 2; do
      end_pid_tree "${launcher[$k]}"; wait "${launcher[$k]}" 2>/dev/null
      unset "launcher[$k]"
    done
    job=restart.b  # a new job record: the whole job launched again
    launch 0 r0b mpirun; launch 1 r1b torchrun; launch 2 r2b mpirun
    finish 0; finish 1; finish 2
    for k in 0 1 2; do
      [[ ${rc[$k]} == 0 ]] || fail "r${k}b exited ${rc[$k]}"
      passes r${k}b $k
      expect_line r${k}b "resumed at step (1[05]|[2-9][05]) from $work/ckpt"
    done
    "$py" "$here/elastic_torch.py" --check "$work" --steps "$steps" ||
      fail "final states" ;;
  redis_restarted)
    # Redis killed and started again empty in the middle of training: the
    # replicas write their record back and train on at DP_REPLICATE=3, no
    # membership change, every final state equal to one process.
    args=(--pace_ms 100)
    launch 0 r0 mpirun; launch 1 r1 torchrun; launch 2 r2 mpirun
    for k in 0 1 2; do wait_for r$k "step 5 committed" 60; done
    restart_redis
    finish 0; finish 1; finish 2
    for k in 0 1 2; do
      [[ ${rc[$k]} == 0 ]] || fail "r$k exited ${rc[$k]}"
      passes r$k $k
      grep -qE "recovery: epoch" "$work/r$k.out" &&
        fail "r$k: the membership changed after the restart"
    done
    "$py" "$here/elastic_torch.py" --check "$work" --steps "$steps" ||
      fail "final states" ;;
  corrupt)
    mode=hsdp  # the fingerprint over FSDP's shards (register_state's local state)
    # Replica 1's first rank adds 1e-3 to a weight after step 5: the
    # fingerprint comparison (every 2 steps) ends every replica with
    # DATA_LOSS naming replica 1, never a PASS.
    args=(--corrupt_at 5 --corrupt_replica 1 --fingerprint_every 2)
    launch 0 r0 mpirun; launch 1 r1 torchrun; launch 2 r2 mpirun
    finish 0; finish 1; finish 2
    for k in 0 1 2; do
      [[ ${rc[$k]} != 0 ]] || fail "r$k exited 0 with replica 1 perturbed"
      grep -qE "PASS" "$work/r$k.out" && fail "r$k printed PASS"
      expect_line r$k "states differ .*replica 1 (has|differs)"
    done ;;
  measure)
    # bench/RESULTS.md: KILLS times, the torchrun replica (both ranks and
    # its agent) is SIGKILLed in the middle of training at 3 replicas and
    # launched again once the survivors recovered; kill -> the survivors'
    # first committed step at DP_REPLICATE=2, with the recovery record's
    # phases. Not a ctest (timings).
    steps=1000000; args=(--pace_ms 20); kills=${KILLS:-10}
    limit=${ELASTIC_LIMIT:-600}
    launch 0 r0 mpirun; launch 1 r1.0 torchrun; launch 2 r2 mpirun
    : >"$work/kills"
    for i in $(seq "$kills"); do
      prev=$((i - 1))
      wait_for "r1.$prev" "state: epoch [0-9]+ DP=3" 90 || break
      sleep 1.$((RANDOM % 10))
      before=$(grep -oE "recovery: epoch [0-9]+, DP=2" "$work/r0.out" | wc -l)
      echo "$(date +%s%3N) $i" >>"$work/kills"
      end_pid_tree "${launcher[1]}"; wait "${launcher[1]}" 2>/dev/null
      unset "launcher[1]"
      deadline=$((SECONDS + 30))
      while (($(grep -oE "recovery: epoch [0-9]+, DP=2" "$work/r0.out" | wc -l) <= before)); do
        ((SECONDS < deadline)) || { fail "no recovery after kill $i"; break 2; }
        sleep 0.1
      done
      launch 1 "r1.$i" torchrun
    done
    wait_for "r1.$kills" "state: epoch [0-9]+ DP=3" 90
    "$py" - "$work" <<'PYEOF'
import re, statistics, sys
work = sys.argv[1]
kills = [int(l.split()[0]) for l in open(f"{work}/kills")]
out = open(f"{work}/r0.out").read()
steps = [(float(m.group(2)), int(m.group(1))) for m in
         re.finditer(r"committed DP=(\d) at=([\d.]+)", out)]
def records(dp):
    # One record per epoch (both ranks of the replica print it: the first).
    seen = {}
    for m in re.finditer(r"recovery: epoch (\d+), DP=%d .*?detect ([\d.]+) ms, "
                         r"agree ([\d.]+) ms, build ([\d.]+) ms, state ([\d.]+) ms" % dp,
                         out):
        seen.setdefault(int(m.group(1)), [float(x) for x in m.groups()[1:]])
    return list(seen.values())
recs = records(2)
lat = []
for t in kills:
    first = next((at for at, dp in steps if at > t and dp == 2), None)
    if first is not None:
        lat.append(first - t)
def stats(name, xs):
    xs = sorted(xs)
    if not xs:
        print(f"{name}: no samples"); return
    p99 = xs[min(len(xs) - 1, int(round(0.99 * (len(xs) - 1))))]
    print(f"{name}: n={len(xs)} median {statistics.median(xs):.1f} ms, "
          f"p99 {p99:.1f} ms, min {xs[0]:.1f}, max {xs[-1]:.1f}")
stats("kill -> first good step (DP_REPLICATE=2)", lat)
for i, ph in enumerate(("detect", "agree", "build", "state")):
    stats(f"  {ph}", [r[i] for r in recs])
grows = records(3)
for i, ph in enumerate(("agree", "build", "state")):
    stats(f"grow to DP_REPLICATE=3 (survivor's record): {ph}", [r[i + 1] for r in grows])
PYEOF
    ;;
  overhead)
    # bench/RESULTS.md: steady-state step time of the same torch job, PAIRS
    # times each: not elastic (one mpirun of 6 ranks, a Gloo DP_REPLICATE
    # group) and elastic (three mpirun launches of 2 ranks). The step time
    # is the median interval between rank 0's commits after the first 50.
    steps=${STEPS:-400}; args=(); pairs=${PAIRS:-3}
    limit=${ELASTIC_LIMIT:-900}
    for i in $(seq "$pairs"); do
      mpirun -n 6 --bind-to none "$py" "$here/elastic_torch.py" --plain \
        --mode "$mode" --steps "$steps" >"$work/plain.$i.out" 2>&1 &
      launcher[9]=$!; finish 9
      job=overhead.$i
      launch 0 "el.$i" mpirun; launch 1 "el1.$i" mpirun; launch 2 "el2.$i" mpirun
      finish 0; finish 1; finish 2
    done
    "$py" - "$work" "$pairs" <<'PYEOF'
import re, statistics, sys
work, pairs = sys.argv[1], int(sys.argv[2])
def step_ms(path):
    ats = {}
    # Whole lines only: two ranks' prints may share a line of mpirun's output.
    for m in re.finditer(r"^step (\d+) committed DP=3 at=(\d+\.\d+)$",
                         open(path).read(), re.M):
        ats.setdefault(int(m.group(1)), float(m.group(2)))  # the first rank's
    keys = sorted(k for k in ats if k > 50)
    d = [ats[b] - ats[a] for a, b in zip(keys, keys[1:]) if b == a + 1]
    return statistics.median(d), statistics.mean(d)
for i in range(1, pairs + 1):
    p, e = step_ms(f"{work}/plain.{i}.out"), step_ms(f"{work}/el.{i}.out")
    print(f"pair {i}: not elastic median {p[0]:.2f} ms (mean {p[1]:.2f}), "
          f"elastic median {e[0]:.2f} ms (mean {e[1]:.2f}), median ratio {e[0] / p[0]:.2f}")
PYEOF
    ;;
  *) echo "unknown scenario $scenario"; exit 2 ;;
esac
echo "elastic_torch $scenario: whole run $((SECONDS - start_time)) s (bound ${limit} s)"
((SECONDS - start_time <= limit)) || fail "ran past its bound"
((failures == 0)) && echo "PASS: elastic_torch $scenario" && exit 0
exit 1
