#!/usr/bin/env bash
# The elastic fault scenarios: three replicas of train_nd (each its own
# mpirun, 2 ranks) meet through a Redis that this script starts on
# loopback; one scenario's fault happens; the script asserts what every
# replica printed and how it ended, and that the whole run ended within its
# bound.
#
#   elastic_job.sh TRAIN_ND SCENARIO
#
# Scenarios: dp_kill tp_kill pp_dp_kill build_kill second_failure sigstop
# replica_killed rejoin redis_killed soak, and the control plane's
# (issue 29): redis_restarted redis_restarted_newcomer mismatch rerun
# below_min replica_stopped; HSDP (issue 28): hsdp_kill hsdp_rejoin
# hsdp_corrupt hsdp_tp_rejoin hsdp_pp_rejoin; with the library's optimizers
# (issue 47): hsdp_adam_rejoin hsdp_zero_rejoin hsdp_adam_tp_pp_rejoin
# momentum_rejoin
# hsdp_checkpoint_restart; (issue 44) redis_restarted_recovery. Every process this script starts
# is ended by its PID (mpirun and its ranks, redis-server), never by name,
# also when an assertion fails.
set -u
bin=$1; scenario=$2
limit=${ELASTIC_LIMIT:-150}
start_time=$SECONDS
work=$(mktemp -d /tmp/vemesh_elastic.XXXXXX)
here=$(cd "$(dirname "$0")" && pwd)
# The harness: launcher/rc, fail, ranks_of, end_pid_tree, start_redis,
# restart_redis, wait_for, finish, expect_line and the EXIT trap.
source "$here/../common/redis_job.sh"

if ! command -v redis-server >/dev/null; then
  echo "FAIL: redis-server not found (scripts/setup.sh installs Debian's redis-server)"
  exit 1
fi
start_redis

mesh=PP=1,DP=3,TP=2
steps=30
extra=()   # arguments of every launch of the scenario
pace=0
common() {
  echo --mesh "$mesh" --batch 24 --micro_batches 2 --steps "$steps" \
    --elastic "redis://127.0.0.1:$port" --job "$scenario" \
    --heartbeat_ms 1000 --op_timeout_ms 2000 --pace_ms "$pace"
}
# launch K OUTFILE [extra args]: replica K, in the background.
launch() {
  local k=$1 out=$2; shift 2
  mpirun -n "${NP:-2}" --bind-to none $bin $(common) --replica "$k" \
    "${extra[@]}" "$@" \
    >"$work/$out.out" 2>&1 &
  launcher[$k]=$!
}
expect_pass() {  # expect_pass OUT DP
  [[ ${rc[$3]} == 0 ]] || fail "$1 exited ${rc[$3]}, expected 0"
  grep -qE "^PASS: replica .*parameters identical across ${dp_name:-DP}=$2 replicas" \
    "$work/$1.out" || fail "$1: no PASS line with ${dp_name:-DP}=$2"
  local line
  line=$(grep -E "^PASS|^FAIL" "$work/$1.out")
  [[ $line =~ communicators\ ([0-9]+)\ \(after\ start\ ([0-9]+)\) ]] &&
    [[ ${BASH_REMATCH[1]} == "${BASH_REMATCH[2]}" ]] ||
    fail "$1: communicator count not back to baseline: $line"
}
expect_dead() {  # expect_dead OUT K
  [[ ${rc[$2]} != 0 ]] || fail "$1 exited 0 but was killed"
  grep -qE "^PASS" "$work/$1.out" && fail "$1 printed PASS but was killed"
  return 0
}

case $scenario in
  checkpoint_restart|hsdp_checkpoint_restart)
    # Issue 27: every replica SIGKILLed after a checkpoint (the state lives
    # nowhere but --checkpoint_dir); the job launched again, as a new job
    # record, resumes at the checkpoint's step and ends PASS against the
    # serial curve of all steps. hsdp_ (issue 47): elastic HSDP with AdamW,
    # each replica's FSDP shards and moments saved by its own ranks.
    ck=(--checkpoint_dir "$work/ckpt" --checkpoint_every 5); pace=150
    if [[ $scenario == hsdp_checkpoint_restart ]]; then
      dp_name=DP_REPLICATE; mesh=PP=1,DP_REPLICATE=3,DP_SHARD=2,TP=1
      extra=(--optimizer adam)
    fi
    launch 0 r0 "${ck[@]}"; launch 1 r1 "${ck[@]}"; launch 2 r2 "${ck[@]}"
    wait_for r0 "^checkpoint: step 10 saved" 90
    for k in 0 1 2; do
      end_pid_tree "${launcher[$k]}"; wait "${launcher[$k]}" 2>/dev/null
    done
    for k in 0 1 2; do
      launch "$k" "r$k.b" "${ck[@]}" --job "${scenario}.restarted"
    done
    finish 0; finish 1; finish 2
    expect_pass r0.b 3 0; expect_pass r1.b 3 1; expect_pass r2.b 3 2
    for k in 0 1 2; do
      expect_line "r$k.b" "^resumed at step (1[05]|2[05]) from $work/ckpt/"
    done ;;
  dp_kill|tp_kill|pp_dp_kill)
    where=dp; [[ $scenario == tp_kill ]] && where=tp:1
    [[ $scenario == pp_dp_kill ]] && mesh=PP=2,DP=3,TP=1
    launch 0 r0; launch 1 r1 --fault "10:$where"; launch 2 r2
    finish 0; finish 1; finish 2
    for k in 0 2; do
      expect_pass r$k 2 $k
      expect_line r$k "^membership: epoch 2, DP=2 \[0, 2\].*resume at step 1[01]"
      # The recovery record (issue 28), once its first step committed.
      expect_line r$k "^recovery: detect [0-9.]+ ms, agree [0-9.]+ ms, rebuild [0-9.]+ ms, state [0-9.]+ ms; first good step 1[12] at=[0-9]{13}$"
    done
    # One rank of replica 1 killed (tp): its other rank, hung in the
    # replica's own group, is told by the survivors and ends itself, so
    # that they are not held until its launcher ends it (issue 47).
    [[ $scenario == tp_kill ]] && expect_line r1 "^vemesh: replica 1 rank 0: another rank of this replica is gone \(its liveness port [0-9.:]+ refuses\) in epoch 1: ending this process \(exit 75\)"
    expect_dead r1 1 ;;
  build_kill)
    launch 0 r0; launch 1 r1 --fault 0:establish; launch 2 r2
    finish 0; finish 1; finish 2
    for k in 0 2; do
      expect_pass r$k 2 $k
      expect_line r$k "^membership: epoch 2, DP=2 \[0, 2\].*resume at step 0"
    done
    expect_dead r1 1 ;;
  second_failure)
    launch 0 r0; launch 1 r1 --fault 10:dp; launch 2 r2 --fault 10:recovery
    finish 0; finish 1; finish 2
    expect_pass r0 1 0
    expect_line r0 "^membership: epoch [2-9], DP=1 \[0\]"
    expect_dead r1 1; expect_dead r2 2 ;;
  sigstop)
    launch 0 r0; launch 1 r1 --fault 10:stop; launch 2 r2
    wait_for r0 "^membership: epoch 2, DP=2" 60
    # The stopped rank resumes, finds its replica left out: evicted.
    for c in $(ranks_of "${launcher[1]}"); do kill -CONT "$c" 2>/dev/null; done
    finish 0; finish 1; finish 2
    expect_pass r0 2 0; expect_pass r2 2 2
    [[ ${rc[1]} == 3 ]] || fail "stopped replica exited ${rc[1]}, expected 3 (evicted)"
    expect_line r1 "replica 1 evicted" ;;
  replica_killed)
    steps=120; pace=25
    launch 0 r0; launch 1 r1; launch 2 r2
    wait_for r1 "^membership: epoch 1" 60 && sleep 1
    for c in $(ranks_of "${launcher[1]}"); do kill -KILL "$c"; done
    finish 0; finish 1; finish 2
    expect_pass r0 2 0; expect_pass r2 2 2; expect_dead r1 1 ;;
  rejoin|momentum_rejoin)
    # momentum_rejoin (issue 47): SGD with momentum, whose buffers the
    # joiner must receive to end equal to the others and to the serial run.
    [[ $scenario == momentum_rejoin ]] && extra=(--momentum 0.9)
    steps=150; pace=25
    launch 0 r0; launch 1 r1 --fault 10:dp; launch 2 r2
    wait_for r0 "^membership: epoch 2, DP=2" 60
    finish 1
    launch 1 r1b
    finish 0; finish 2; finish 1
    for k in 0 2; do
      expect_pass r$k 3 $k
      expect_line r$k "^membership: epoch 3, DP=3 \[0, 2, 1\].*state sent"
    done
    expect_pass r1b 3 1
    expect_line r1b "^membership: epoch 3, DP=3 \[0, 2, 1\] \(replica 1 is DP rank 2" ;;
  redis_killed)
    steps=400; pace=25
    launch 0 r0; launch 1 r1; launch 2 r2
    for k in 0 1 2; do wait_for r$k "^membership: epoch 1" 60; done
    sleep 1
    kill -KILL "$redis_pid"; wait "$redis_pid" 2>/dev/null; redis_pid=""
    killed_at=$SECONDS
    finish 0; finish 1; finish 2
    for k in 0 1 2; do
      [[ ${rc[$k]} != 0 ]] || fail "r$k exited 0 after the control plane died"
      expect_line r$k "control plane .* is lost|Unavailable"
    done
    ((SECONDS - killed_at <= 30)) ||
      fail "the replicas took $((SECONDS - killed_at)) s to end after Redis died" ;;
  soak)
    # 20 SIGKILLs of a whole replica at random moments (in a step, a
    # recovery, a join, a state transfer), each relaunched at once; then
    # the job must finish with every replica back and PASS.
    # Long enough (3500 paced steps: at least 70 s, more with recoveries)
    # that training outlasts the kills (about 55 s here): a job that ends
    # before the last relaunch leaves that replica to found a fresh job
    # alone. (2200 steps sufficed while every step read the record from
    # Redis; without that round trip they finished before the kills.)
    steps=${SOAK_STEPS:-3500}; pace=20
    limit=${ELASTIC_LIMIT:-190}
    declare -A gen=([0]=0 [1]=0 [2]=0)
    launch 0 r0.0; launch 1 r1.0; launch 2 r2.0
    for k in 0 1 2; do wait_for "r$k.0" "^membership: epoch 1" 60; done
    for i in $(seq 20); do
      # Kill only once every replica's latest launch was admitted, so that
      # a trained replica survives each kill (the state lives nowhere else).
      for j in 0 1 2; do wait_for "r$j.${gen[$j]}" "^membership" 60 || break 2; done
      sleep "0.$((RANDOM % 9 + 1))"
      k=$((RANDOM % 3))
      for c in $(ranks_of "${launcher[$k]}"); do kill -KILL "$c" 2>/dev/null; done
      finish "$k"
      echo "soak: kill $i: replica $k (launch r$k.${gen[$k]}, exit ${rc[$k]}) at $((SECONDS - start_time)) s"
      gen[$k]=$((gen[$k] + 1)); launch "$k" "r$k.${gen[$k]}"
    done
    echo "soak: 20 kills done at $((SECONDS - start_time)) s"
    for k in 0 1 2; do finish "$k"; done
    for k in 0 1 2; do expect_pass "r$k.${gen[$k]}" 3 "$k"; done
    grep -h "^membership" "$work"/r0.*.out | tail -n 3 ;;
  redis_restarted)
    # Redis restarted empty in the middle of a long step: the replicas
    # write their record back and train on, undisturbed.
    steps=8; pace=2000
    launch 0 r0; launch 1 r1; launch 2 r2
    for k in 0 1 2; do wait_for r$k "^step 1/" 60; done
    sleep 1; restart_redis
    finish 0; finish 1; finish 2
    for k in 0 1 2; do
      expect_pass r$k 3 $k
      grep -qE "^membership: epoch [2-9]" "$work/r$k.out" &&
        fail "r$k: the membership changed after the restart"
    done ;;
  redis_restarted_recovery)
    # Issue 44: Redis restarted empty while the survivors recover from a
    # killed replica: Redis is killed with replica 1, so that the whole
    # recovery (the quorum round, the epoch record, the DP group's
    # rendezvous) meets a Redis that is gone, then back empty. Every
    # survivor goes on at DP=2.
    # A 4 s lease (renewed each second): the restart leaves the leases
    # absent long enough that a survivor reads them during its recovery.
    steps=150; pace=25; extra=(--heartbeat_ms 4000)
    launch 0 r0; launch 1 r1; launch 2 r2
    for k in 0 1 2; do wait_for r$k "^membership: epoch 1" 60; done
    sleep 1
    kill -KILL "$redis_pid"; wait "$redis_pid" 2>/dev/null
    for c in $(ranks_of "${launcher[1]}"); do kill -KILL "$c"; done
    sleep "${REDIS_DOWN_S:-0.5}"; start_redis
    echo "redis restarted empty at $((SECONDS - start_time)) s"
    finish 0; finish 1; finish 2
    for k in 0 2; do
      expect_pass r$k 2 $k
      expect_line r$k "^membership: epoch [2-9], DP=2 \[0, 2\]"
    done
    expect_dead r1 1 ;;
  redis_restarted_newcomer)
    # The same, with a replica launched right after the restart whose
    # form_timeout (2.5 s here, 10 s by default; above the 2 s it waits for
    # a missing record) ends well before the job's next step boundary (7 s
    # steps): it must join the running job (DP 4), never found a fresh one
    # from the initial weights, so the record must come back from the
    # replicas' heartbeats, not from their next step.
    steps=4; pace=7000
    launch 0 r0; launch 1 r1; launch 2 r2
    for k in 0 1 2; do wait_for r$k "^step 1/" 60; done
    sleep 1; restart_redis
    launch 3 r3 --form_timeout_ms 2500
    finish 0; finish 1; finish 2; finish 3
    for k in 0 1 2 3; do expect_pass r$k 4 $k; done
    expect_line r3 "^membership: epoch [2-9], DP=4 \[0, 1, 2, 3\] \(replica 3 is DP rank 3"
    grep -q "^membership: epoch 1," "$work/r3.out" && fail "r3 founded a fresh job" ;;
  mismatch)
    # Relaunches with another batch, mesh or model are refused naming the
    # difference; the job goes on at DP=3 untouched.
    steps=400; pace=25
    launch 0 r0; launch 1 r1; launch 2 r2
    for k in 0 1 2; do wait_for r$k "^membership: epoch 1" 60; done
    launch 3 r3 --batch 12
    NP=1 mesh=PP=1,DP=3,TP=1 launch 4 r4
    launch 5 r5 --hidden 32
    t0=$SECONDS
    finish 3; finish 4; finish 5
    ((SECONDS - t0 <= 20)) || fail "the refusals took $((SECONDS - t0)) s"
    for k in 3 4 5; do
      [[ ${rc[$k]} == 1 ]] || fail "mismatched r$k exited ${rc[$k]}, expected 1"
    done
    expect_line r3 "INVALID_ARGUMENT.*cannot join.*batch is 12 here but 24 in the job"
    expect_line r4 "INVALID_ARGUMENT.*cannot join.*mesh is .*PP=1, DP=3, TP=1.* here but"
    expect_line r5 "INVALID_ARGUMENT.*cannot join.*model is 4x32.* here but 4x64"
    finish 0; finish 1; finish 2
    for k in 0 1 2; do
      expect_pass r$k 3 $k
      grep -qE "^membership: epoch [2-9]" "$work/r$k.out" &&
        fail "r$k: the membership changed"
    done ;;
  rerun|below_min)
    # A job that ended (PASS, or below --min_replicas): the same command
    # starts a fresh job at once, numbered on from the old epochs.
    steps=20
    if [[ $scenario == rerun ]]; then
      launch 0 r0; launch 1 r1; launch 2 r2
      finish 0; finish 1; finish 2
      for k in 0 1 2; do expect_pass r$k 3 $k; done
    else
      launch 0 r0 --min_replicas 3; launch 1 r1 --min_replicas 3 --fault 5:dp
      launch 2 r2 --min_replicas 3
      finish 0; finish 1; finish 2
      for k in 0 2; do
        [[ ${rc[$k]} == 1 ]] || fail "r$k exited ${rc[$k]} below min_replicas"
        expect_line r$k "min_replicas is 3"
      done
    fi
    t0=$SECONDS
    launch 0 r0b --min_replicas 3; launch 1 r1b --min_replicas 3
    launch 2 r2b --min_replicas 3
    finish 0; finish 1; finish 2
    for k in 0 1 2; do
      expect_pass r${k}b 3 $k
      expect_line r${k}b "^membership: epoch [2-9], DP=3 \[0, 1, 2\].*start"
    done
    ((SECONDS - t0 <= 30)) || fail "the rerun took $((SECONDS - t0)) s" ;;
  corrupt)
    # Replica 1's launch rank 0 adds 1 to a parameter after step 5: the
    # fingerprint check (every 2 steps) ends every replica with DataLoss
    # naming replica 1, never a PASS (issue 28).
    launch 0 r0 --fingerprint_every 2
    launch 1 r1 --fingerprint_every 2 --fault 5:corrupt
    launch 2 r2 --fingerprint_every 2
    finish 0; finish 1; finish 2
    for k in 0 1 2; do
      [[ ${rc[$k]} != 0 ]] || fail "r$k exited 0 with replica 1 corrupted"
      grep -qE "^PASS" "$work/r$k.out" && fail "r$k printed PASS"
      expect_line r$k "DATA_LOSS: the replicas' states differ after 2 steps .*replica 1 has "
    done ;;
  replica_stopped)
    # A whole replica (its launcher and both ranks) stopped for 4 s and
    # resumed finds itself evicted: exit 3, not an error blaming Redis.
    steps=60; pace=200
    launch 0 r0; launch 1 r1; launch 2 r2
    wait_for r1 "^step 10/" 60
    stopped=$(ranks_of "${launcher[1]}")
    kill -STOP "${launcher[1]}" $stopped
    sleep 4
    kill -CONT $stopped "${launcher[1]}"
    finish 0; finish 1; finish 2
    expect_pass r0 2 0; expect_pass r2 2 2
    [[ ${rc[1]} == 3 ]] || fail "stopped replica exited ${rc[1]}, expected 3 (evicted)"
    expect_line r1 "replica 1 evicted"
    grep -q "control plane .* is lost" "$work/r1.out" && fail "r1 blamed the control plane"
    true ;;
  hsdp_kill|hsdp_rejoin|hsdp_tp_rejoin|hsdp_pp_rejoin|hsdp_adam_rejoin|\
  hsdp_zero_rejoin|hsdp_adam_tp_pp_rejoin)
    # HSDP (issue 28): DP_REPLICATE is the elastic dimension, each replica
    # runs FSDP over DP_SHARD (x TP or x PP); replica 1 is SIGKILLed in its
    # DP_REPLICATE all_reduce, the survivors go on at DP_REPLICATE=2 (or 1);
    # *_rejoin relaunches it: its ranks receive their shards from the
    # live ranks of their DP_SHARD coordinate, and all end PASS, equal.
    dp_name=DP_REPLICATE; mesh=PP=1,DP_REPLICATE=3,DP_SHARD=2,TP=1; n=3
    if [[ $scenario == hsdp_tp_rejoin ]]; then
      mesh=PP=1,DP_REPLICATE=2,DP_SHARD=2,TP=2; n=2; export NP=4
    elif [[ $scenario == hsdp_pp_rejoin ]]; then
      # Two stages per replica: a rank's state is its stage's shards.
      mesh=PP=2,DP_REPLICATE=2,DP_SHARD=2,TP=1; n=2; export NP=4
    elif [[ $scenario == hsdp_adam_tp_pp_rejoin ]]; then
      # Issue 47: AdamW with TP and PP inside each replica (FSDP units of
      # one TP slice of one stage).
      mesh=PP=2,DP_REPLICATE=2,DP_SHARD=1,TP=2; n=2; export NP=4
      extra=(--optimizer adam)
    fi
    # Issue 47: the modules are built once; the joiner receives the
    # parameters and the optimizer state (AdamW's moments, step counts).
    [[ $scenario == hsdp_adam_rejoin ]] && extra=(--optimizer adam)
    # ZeRO-2 over DP_SHARD inside each replica, averaged over DP_REPLICATE.
    [[ $scenario == hsdp_zero_rejoin ]] && extra=(--optimizer adam --zero)
    [[ $scenario == hsdp_kill ]] && steps=20 || { steps=240; pace=25; }
    launch 0 r0; launch 1 r1 --fault 6:dp
    ((n == 3)) && launch 2 r2
    alive=(0); ((n == 3)) && alive=(0 2)
    list=$(IFS=,; echo "${alive[*]}" | sed 's/,/, /g')
    if [[ $scenario == hsdp_kill ]]; then
      for k in 0 1 2; do finish $k; done
      for k in 0 2; do
        expect_pass r$k 2 $k
        expect_line r$k "^membership: epoch 2, DP=2 \[0, 2\].*resume at step [67]"
      done
      expect_dead r1 1
    else
      wait_for r0 "^membership: epoch 2, DP=$((n - 1))" 60
      finish 1
      launch 1 r1b
      for k in "${alive[@]}"; do finish $k; done; finish 1
      for k in "${alive[@]}"; do
        expect_pass r$k $n $k
        expect_line r$k "^membership: epoch 3, DP=$n \[$list, 1\].*state sent"
      done
      expect_pass r1b $n 1
      expect_line r1b "^membership: epoch 3, DP=$n \[$list, 1\] \(replica 1 is DP rank $((n - 1))"
    fi ;;
  hsdp_corrupt)
    # The same HSDP job; replica 1's launch rank 0 adds 1 to its first
    # parameter shard after step 5: the fingerprint check ends every
    # replica with DataLoss naming replica 1, never a PASS.
    mesh=PP=1,DP_REPLICATE=3,DP_SHARD=2,TP=1; steps=20
    launch 0 r0 --fingerprint_every 2
    launch 1 r1 --fingerprint_every 2 --fault 5:corrupt
    launch 2 r2 --fingerprint_every 2
    finish 0; finish 1; finish 2
    for k in 0 1 2; do
      [[ ${rc[$k]} != 0 ]] || fail "r$k exited 0 with replica 1 corrupted"
      grep -qE "^PASS" "$work/r$k.out" && fail "r$k printed PASS"
      expect_line r$k "DATA_LOSS: the replicas' states differ after 2 steps .*replica 1 has "
    done ;;
  *) echo "unknown scenario $scenario"; exit 2 ;;
esac
echo "elastic $scenario: whole run $((SECONDS - start_time)) s (bound ${limit} s)"
((SECONDS - start_time <= limit)) || fail "ran past its bound"
((failures == 0)) && echo "PASS: elastic $scenario" && exit 0
exit 1
