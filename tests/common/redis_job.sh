# The harness of the elastic fault-scenario scripts, sourced by
# tests/elastic/elastic_job.sh (train_nd replicas) and
# tests/python/elastic_torch.sh (torch replicas): replicas, each its own
# launch, meet through a Redis that the script starts on loopback; every
# process the script starts is ended by its PID (the launchers and their
# ranks, redis-server), never by name, also when an assertion fails.
#
# Set before sourcing: work (a fresh directory for the outputs, OUT.out),
# limit (the whole run's bound in seconds) and start_time ($SECONDS at the
# start). Defines: launcher (replica -> launcher PID) and rc (replica ->
# exit code), redis_pid, port (Redis's, free on loopback), failures; fail,
# ranks_of, end_pid_tree, free_port, start_redis, restart_redis, wait_for,
# finish, expect_line; and the EXIT trap (cleanup: ends what is left, prints
# the outputs' tails if anything failed, removes $work unless ELASTIC_KEEP).
# It does not start Redis: the script calls start_redis once it has checked
# its tools.

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl=self,vader,tcp OMPI_MCA_btl_vader_single_copy_mechanism=none
export OMPI_MCA_btl_tcp_if_include=lo OMPI_MCA_oob_tcp_if_include=lo
export OMPI_MCA_rmaps_base_oversubscribe=1
# Six ranks share two cores: a rank waiting in MPI yields instead of
# spinning, so that the others' heartbeats are not starved.
export OMPI_MCA_mpi_yield_when_idle=1

declare -A launcher  # replica -> launcher PID
declare -A rc        # replica -> its launch's exit code (finish)
redis_pid=""
failures=0

fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
# The children of one PID (mpirun's ranks, torchrun's workers), by PID.
ranks_of() { pgrep -P "$1" 2>/dev/null; }
# A launcher's process tree ended by PID, children first.
end_pid_tree() {
  local p=$1 c
  for c in $(ranks_of "$p"); do kill -KILL "$c" 2>/dev/null; done
  kill -KILL "$p" 2>/dev/null
}
cleanup() {
  local k f
  for k in "${!launcher[@]}"; do end_pid_tree "${launcher[$k]}"; done
  [[ -n $redis_pid ]] && kill -KILL "$redis_pid" 2>/dev/null
  wait 2>/dev/null
  if ((failures > 0)); then
    for f in "$work"/*.out; do echo "---- $f"; tail -n 40 "$f"; done
  fi
  [[ -n ${ELASTIC_KEEP:-} ]] && echo "kept $work" || rm -rf "$work"
}
trap cleanup EXIT

# A free TCP port on loopback.
free_port() {
  "${py:-python3}" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
port=$(free_port)
# start_redis: an empty Redis without persistence on $port.
start_redis() {
  redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no \
    --protected-mode no --logfile "$work/redis.log" &
  redis_pid=$!
  for _ in $(seq 100); do
    (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break
    sleep 0.05
  done
}
# restart_redis: Redis killed and started again empty (no persistence).
restart_redis() {
  kill -KILL "$redis_pid"; wait "$redis_pid" 2>/dev/null
  start_redis
  echo "redis restarted empty at $((SECONDS - start_time)) s"
}
# wait_for OUT REGEX SECONDS: until $work/OUT.out has a matching line.
wait_for() {
  local deadline=$((SECONDS + $3))
  while ((SECONDS < deadline)); do
    grep -qE "$2" "$work/$1.out" 2>/dev/null && return 0
    sleep 0.1
  done
  fail "$1 never printed /$2/ within $3 s"
  return 1
}
# finish K: waits (bounded by $limit) for replica K's launch and stores its
# exit code in rc[K].
finish() {
  local k=$1 p=${launcher[$1]}
  while kill -0 "$p" 2>/dev/null && ((SECONDS - start_time < limit)); do
    sleep 0.1
  done
  if kill -0 "$p" 2>/dev/null; then
    fail "replica $k still running after ${limit}s: hung"
    end_pid_tree "$p"
  fi
  wait "$p"; rc[$k]=$?
  unset "launcher[$k]"
}
expect_line() { grep -qE "$2" "$work/$1.out" || fail "$1: no line /$2/"; }
