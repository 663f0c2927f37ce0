#!/usr/bin/env bash
# Runs one launch fault scenario of launch_probe on 4 env:// ranks and checks
# what every live rank saw, and that the whole job ended within its bound.
#
#   expect_probe.sh PROBE SCENARIO
#
# Scenarios (timeout 3 s each; the job must end within 30 s):
#   all_arrive          4 OK lines
#   never_arrives       rank 3 is never started: ranks 0-2 DeadlineExceeded
#                       naming rank 3
#   rank_dies           rank 2 joins the store, then dies: ranks 0,1,3
#                       DeadlineExceeded naming rank 2
#   world_size_differs  rank 1 has WORLD_SIZE=5: every rank InvalidArgument
#                       naming WORLD_SIZE
#   master_unreachable  rank 0 (the store host) never starts: ranks 1-3
#                       Unavailable naming MASTER_ADDR:MASTER_PORT
#   port_taken          MASTER_PORT is held by another listener: rank 0
#                       names the port it could not take; every rank fails
#   garbage             junk is sent to the store port during rendezvous:
#                       4 OK lines
#   ipv6                MASTER_ADDR=::1: 4 OK lines (the store and Gloo over
#                       IPv6 loopback)
#   unresolvable        MASTER_ADDR names no host: every rank InvalidArgument
#                       naming MASTER_ADDR, at once (not after the timeout)
#   flood               rank 0 runs under ulimit -n 256 while 600 idle
#                       connections flood the store port (ranks 1-3 come
#                       2 s late, into the flood): 4 OK lines
set -u
probe=$1; scenario=$2
here=$(cd "$(dirname "$0")" && pwd)
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
out=$(mktemp); trap 'rm -f "$out"' EXIT
start=$SECONDS
helper_pid=""
port=$(free_port)
case "$scenario" in
  never_arrives) export SPAWN_SKIP="3" ;;
  rank_dies) export SPAWN_ENV_2="VEMESH_PROBE_DIE=1" ;;
  world_size_differs) export SPAWN_ENV_1="WORLD_SIZE=5" ;;
  master_unreachable) export SPAWN_SKIP="0" ;;
  port_taken)
    # Another program holds the port (bounded: it leaves after 20 s).
    python3 -c "import socket,time; s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(('127.0.0.1', $port)); s.listen(64); time.sleep(20)" &
    helper_pid=$!
    # Go on only once the port is really held (a loaded machine starts
    # python slowly): at most 10 s, loopback only.
    for _ in $(seq 100); do
      if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then break; fi
      sleep 0.1
    done ;;
  garbage)
    # Junk on the store port while the ranks rendezvous: 40 connections at
    # most, over about 2 s.
    python3 - "$port" <<'PY' &
import os, socket, sys, time
port = int(sys.argv[1])
for i in range(40):
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=0.2)
        s.sendall(os.urandom(64) if i % 2 else b"\xff\xff\xff\xff" + b"x" * 16)
        s.close()
    except OSError:
        pass
    time.sleep(0.05)
PY
    helper_pid=$! ;;
  ipv6)
    for r in 0 1 2 3; do export "SPAWN_ENV_$r=MASTER_ADDR=::1"; done ;;
  unresolvable)
    for r in 0 1 2 3; do export "SPAWN_ENV_$r=MASTER_ADDR=no-such-host.invalid"; done ;;
  flood)
    # 600 idle connections, held for 8 s, against rank 0's 256 descriptors.
    python3 - "$port" <<'PY' &
import socket, sys, time
port = int(sys.argv[1])
held = []
deadline = time.time() + 8
while len(held) < 600 and time.time() < deadline:
    try:
        held.append(socket.create_connection(("127.0.0.1", port), timeout=0.2))
    except OSError:
        time.sleep(0.01)
time.sleep(max(0, deadline - time.time()))
PY
    helper_pid=$!
    sleep 1 ;;
  all_arrive) ;;
  *) echo "unknown scenario $scenario"; exit 2 ;;
esac
if [[ "$scenario" == flood ]]; then
  # Rank 0 hosts the store: its descriptor limit is the one a flood meets.
  bash "$here/spawn_env.sh" --limit 40 --port "$port" 4 \
    bash -c 'if [[ $RANK == 0 ]]; then ulimit -n 256; else sleep 2; fi; exec "$0" "$@"' \
    "$probe" 8 >"$out" 2>&1
else
  bash "$here/spawn_env.sh" --limit 40 --port "$port" 4 "$probe" 3 >"$out" 2>&1
fi
rc=$?
took=$((SECONDS - start))
if [[ -n "$helper_pid" ]]; then kill "$helper_pid" 2>/dev/null; wait "$helper_pid" 2>/dev/null; fi
cat "$out"
fail() { echo "FAIL [$scenario]: $*"; exit 1; }
((took <= 30)) || fail "the job took ${took}s (bound 30s)"
((rc != 124)) || fail "a rank had to be killed"
count() { grep -c -E "$1" "$out" || true; }
case "$scenario" in
  all_arrive|garbage|ipv6|flood)
    [[ $(count '^probe rank [0-3]: OK') == 4 ]] || fail "expected 4 OK lines" ;;
  never_arrives)
    [[ $(count '^probe rank [0-2]: DEADLINE_EXCEEDED: .*rank\(s\) 3 of 4 never arrived') == 3 ]] ||
      fail "expected ranks 0-2 to name rank 3" ;;
  rank_dies)
    [[ $(count '^probe rank [013]: DEADLINE_EXCEEDED: .*rank\(s\) 2 of 4 never arrived') == 3 ]] ||
      fail "expected ranks 0, 1, 3 to name rank 2" ;;
  world_size_differs)
    [[ $(count '^probe rank [0-3]: INVALID_ARGUMENT: .*WORLD_SIZE') == 4 ]] ||
      fail "expected 4 InvalidArgument lines naming WORLD_SIZE" ;;
  master_unreachable)
    [[ $(count '^probe rank [1-3]: UNAVAILABLE: .*MASTER_ADDR:MASTER_PORT = 127.0.0.1:') == 3 ]] ||
      fail "expected ranks 1-3 Unavailable naming MASTER_ADDR:MASTER_PORT" ;;
  unresolvable)
    [[ $(count "^probe rank [0-3]: INVALID_ARGUMENT: .*MASTER_ADDR='no-such-host.invalid' does not resolve.*\(after 0\.") == 4 ]] ||
      fail "expected 4 immediate InvalidArgument lines naming MASTER_ADDR" ;;
  port_taken)
    [[ $(count "^probe rank 0: [A-Z_]+: .*could not host the store at MASTER_ADDR:MASTER_PORT = 127.0.0.1:$port") == 1 ]] ||
      fail "expected rank 0 to name the port it could not take"
    [[ $(count '^probe rank [0-3]: [A-Z_]+: ') == 4 && $(count '^probe rank [0-3]: OK') == 0 ]] ||
      fail "expected every rank to fail" ;;
esac
echo "PASS [$scenario] in ${took}s"
