# shellcheck shell=bash
# Emulated hosts on one machine, for the multi-host tests. Sourced:
#
#   source tests/multihost/hosts.sh
#   mh_require_root_or_skip          # exit 77 with "SKIP: <why>" where namespaces can't be made
#   mh_up 4                          # hosts node0..node3; mh_down runs at EXIT/TERM/INT
#   mh_exec node2 hostname           # -> node2
#   mh_exec node0 mpirun --mca plm_rsh_agent "$MH_RSH" --hostfile "$MH_STATE/hostfile" ...
#
# A host is what a program can tell about where it runs: its own network
# (a veth "eth0" with an address from 10.77.0.0/24, on a bridge that lives in
# a separate "switch" namespace, so no address exists outside this run's
# namespaces), its own hostname (UTS), its own /tmp and /dev/shm (private
# mount namespace: Open MPI's session dirs and shared memory stay per host),
# an /etc/hosts naming every node, its own IPC and PID namespaces. Each host
# is held by one "holder" process, PID 1 of the host's PID namespace: killing
# it by PID ends everything that ran on that host.
#
# State (holder PIDs, addresses, hostfile, broker socket) lives in $MH_STATE,
# /run/vemesh-mh/<runid>: not under /tmp, which every host has its own of.
#
# Entering a host: from this machine's namespaces, mh_exec uses nsenter on the
# holder's PID. From inside a host (mpirun in node0 starting orted on node1)
# that is impossible (a PID namespace can only be entered from its parent),
# so $MH_RSH (tests/multihost/nsrsh, the ssh stand-in) asks a small broker
# running outside every host ($MH_STATE/broker.sock) to run the command there,
# handing it its stdin/stdout/stderr.

MH_IFACE=eth0
MH_NET_PREFIX=10.77.0
MH_HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
MH_RSH="$MH_HERE/nsrsh"
MH_STATE=""
MH_RUNID=""
MH_N=0
MH_BROKER_PID=""
declare -a MH_STARTER_PIDS=()

# Exits 77 (ctest's SKIP_RETURN_CODE) with the reason when this machine
# cannot make namespaces: not root, or a kernel/container that refuses.
mh_require_root_or_skip() {
  local why=""
  if [[ $(id -u) -ne 0 ]]; then
    why="not root (uid $(id -u)): network/PID namespaces need root"
  else
    local tool
    for tool in ip unshare nsenter setpriv python3; do
      command -v "$tool" >/dev/null 2>&1 || { why="'$tool' not found (scripts/setup.sh installs it)"; break; }
    done
  fi
  if [[ -z "$why" ]]; then
    local probe="vmhprobe$$"
    if ! ip netns add "$probe" 2>/dev/null; then
      why="'ip netns add' failed: network namespaces not permitted here"
    else
      if ! ip -n "$probe" link add mhp0 type veth peer name mhp1 2>/dev/null; then
        why="cannot create a veth pair inside a network namespace"
      elif ! ip -n "$probe" link add mhbr type bridge 2>/dev/null; then
        why="cannot create a bridge inside a network namespace"
      fi
      ip netns del "$probe" 2>/dev/null
    fi
  fi
  if [[ -z "$why" ]] &&
     ! unshare --uts --ipc --mount --pid --fork --mount-proc true 2>/dev/null; then
    why="'unshare --uts --ipc --mount --pid --fork --mount-proc' failed"
  fi
  if [[ -n "$why" ]]; then
    echo "SKIP: emulated hosts unavailable: $why" >&2
    echo "SKIP: emulated hosts unavailable: $why"
    exit 77
  fi
}

mh_hosts() {
  local i
  for ((i = 0; i < MH_N; ++i)); do echo "node$i"; done
}

# The host's address: node<i> -> 10.77.0.<11+i>.
mh_addr() {
  cat "$MH_STATE/$1/addr"
}

mh_holder_pid() {
  cat "$MH_STATE/$1/holder"
}

# Runs a command inside HOST with this shell's environment and working
# directory (every path but /tmp and /dev/shm is the machine's own; the
# source tree, the working directory and MH_SHARE stay visible under /tmp).
mh_exec() {
  local host=$1; shift
  local pid
  pid=$(mh_holder_pid "$host") || { echo "mh_exec: no host '$host'" >&2; return 2; }
  nsenter -t "$pid" --net --uts --ipc --mount --pid --wd="$PWD" -- "$@"
}

# The hosts' network is IPv4 only (10.77.0.0/24): without this, every eth0
# also gets an IPv6 link-local address, "tentative" for its first seconds,
# that Open MPI (built with IPv6) may pick and stall on. No-op on a kernel
# without IPv6.
mh_ipv4_only() {
  nsenter --net="/run/netns/$1" -- sh -c \
    'for f in /proc/sys/net/ipv6/conf/all/disable_ipv6 /proc/sys/net/ipv6/conf/default/disable_ipv6; do
       [ -w "$f" ] && echo 1 >"$f"; done; true'
}

# Removes what runs killed outright left behind: the state dir and the
# (empty) network namespaces of every run whose shell ($$ in its name) is
# gone. Their processes died with that shell (--pdeathsig); nothing is
# killed here, a stale PID may name somebody else's process by now.
mh_forget_stale_runs() {
  local d owner ns
  for d in /run/vemesh-mh/vmh*; do
    [[ -d "$d" ]] || continue
    owner=${d##*/vmh}
    [[ "$owner" =~ ^[0-9]+$ ]] || continue
    kill -0 "$owner" 2>/dev/null && continue
    if [[ -f "$d/netns" ]]; then
      while read -r ns; do ip netns del "$ns" 2>/dev/null; done <"$d/netns"
    fi
    rm -rf "$d"
  done
}

# Makes hosts node0..node<N-1>. Fails (non-zero, with a message) if any step
# fails; mh_down (installed on EXIT, TERM, INT) tears down what was made.
mh_up() {
  local n=$1 i
  if ! [[ "$n" =~ ^[0-9]+$ ]] || ((n < 1 || n > 200)); then
    echo "mh_up: host count '$n' must be 1..200" >&2; return 2
  fi
  MH_N=$n
  MH_RUNID="vmh$$"
  MH_STATE="/run/vemesh-mh/$MH_RUNID"
  export MH_STATE MH_IFACE MH_RSH
  trap mh_down EXIT
  trap 'mh_down; exit 143' TERM
  trap 'mh_down; exit 130' INT
  mh_forget_stale_runs
  rm -rf "$MH_STATE"
  mkdir -p "$MH_STATE" || return 1

  # /etc/hosts every host sees, and a hostfile for mpirun (slots filled in
  # by the test).
  {
    echo "127.0.0.1 localhost"
    for ((i = 0; i < n; ++i)); do echo "$MH_NET_PREFIX.$((11 + i)) node$i"; done
  } >"$MH_STATE/etc_hosts"

  local sw="${MH_RUNID}-sw"
  ip netns add "$sw" || return 1
  echo "$sw" >>"$MH_STATE/netns"
  mh_ipv4_only "$sw"
  ip -n "$sw" link set lo up &&
    ip -n "$sw" link add br0 type bridge &&
    ip -n "$sw" link set br0 up || return 1

  for ((i = 0; i < n; ++i)); do
    local host="node$i" ns="${MH_RUNID}-n$i" addr="$MH_NET_PREFIX.$((11 + i))"
    mkdir -p "$MH_STATE/$host"
    echo "$addr" >"$MH_STATE/$host/addr"
    ip netns add "$ns" || return 1
    echo "$ns" >>"$MH_STATE/netns"
    mh_ipv4_only "$ns"
    ip -n "$sw" link add "p$i" type veth peer name "$MH_IFACE" netns "$ns" &&
      ip -n "$sw" link set "p$i" master br0 &&
      ip -n "$sw" link set "p$i" up &&
      ip -n "$ns" link set lo up &&
      ip -n "$ns" addr add "$addr/24" dev "$MH_IFACE" &&
      ip -n "$ns" link set "$MH_IFACE" up || return 1

    # The holder: PID 1 of the host's PID namespace. It names the host,
    # gives it a private /tmp, /dev/shm, /etc/hosts and a /sys showing its
    # own network devices, says it is ready, then waits (reaping whatever
    # is left to it) until killed.
    # Paths under /tmp that every host must see at the same path, as a
    # cluster's shared file system: the source tree (these scripts), the
    # working directory (ctest's build tree) and MH_SHARE (colon-separated).
    # A clone under /tmp (CI's) would otherwise vanish under the host's own
    # /tmp. Each is bound aside before the tmpfs covers /tmp, then back.
    local keep="" back="" path kept=0
    local -a shared=("$(cd "$MH_HERE/../.." && pwd)" "$PWD")
    local -a extra=()
    IFS=: read -r -a extra <<<"${MH_SHARE:-}"
    for path in "${shared[@]}" "${extra[@]}"; do
      [[ $path == /tmp/* && -d $path ]] || continue
      mkdir -p "$MH_STATE/$host/keep$kept"
      keep+="mount --bind $(printf %q "$path") '$MH_STATE/$host/keep$kept' && "
      back+="mkdir -p $(printf %q "$path") && mount --bind '$MH_STATE/$host/keep$kept' $(printf %q "$path") && "
      kept=$((kept + 1))
    done
    local setup
    setup="hostname $host && $keep
      mount -t tmpfs -o mode=1777 mh-tmp /tmp && $back
      mount -t tmpfs -o mode=1777 mh-shm /dev/shm &&
      mount --bind '$MH_STATE/etc_hosts' /etc/hosts || exit 1
      umount -l /sys 2>/dev/null && mount -t sysfs mh-sys /sys 2>/dev/null
      touch '$MH_STATE/$host/ready'
      while :; do sleep 3600 & wait \$!; done"
    # If this shell is killed outright (SIGKILL: no trap runs), the
    # starter gets SIGKILL (--pdeathsig) and, through --kill-child, so does
    # the holder: the host ends with everything on it.
    setpriv --pdeathsig KILL -- nsenter --net="/run/netns/$ns" -- \
      unshare --kill-child --uts --ipc --mount --pid --fork --mount-proc --propagation private \
      -- bash -c "$setup" </dev/null 2>"$MH_STATE/$host/holder.log" &
    MH_STARTER_PIDS+=($!)
    local starter=$! holder="" tries
    # The holder is the starter's (unshare's) only child.
    for ((tries = 0; tries < 200; ++tries)); do
      holder=$(cat "/proc/$starter/task/$starter/children" 2>/dev/null)
      holder=${holder%% *}
      [[ -n "$holder" ]] && break
      kill -0 "$starter" 2>/dev/null || break
      sleep 0.05
    done
    if [[ -z "$holder" ]]; then
      echo "mh_up: the holder of $host did not start" >&2; return 1
    fi
    echo "$holder" >"$MH_STATE/$host/holder"
  done

  # Each holder says when its mounts are in place (bounded wait).
  for ((i = 0; i < n; ++i)); do
    local tries
    for ((tries = 0; tries < 200; ++tries)); do
      [[ -e "$MH_STATE/node$i/ready" ]] && break
      sleep 0.05
    done
    if [[ ! -e "$MH_STATE/node$i/ready" ]]; then
      echo "mh_up: node$i never became ready (mounts failed?):" >&2
      cat "$MH_STATE/node$i/holder.log" >&2; return 1
    fi
  done

  # The broker through which nsrsh enters hosts from inside a host.
  setpriv --pdeathsig KILL -- python3 "$MH_HERE/mh_broker.py" "$MH_STATE" </dev/null &
  MH_BROKER_PID=$!
  echo "$MH_BROKER_PID" >"$MH_STATE/broker.pid"
  local tries
  for ((tries = 0; tries < 200; ++tries)); do
    [[ -S "$MH_STATE/broker.sock" ]] && break
    sleep 0.05
  done
  if [[ ! -S "$MH_STATE/broker.sock" ]]; then
    echo "mh_up: the broker did not start" >&2; return 1
  fi
  return 0
}

# Writes an Open MPI hostfile with SLOTS slots per host to $MH_STATE/hostfile
# and prints its path.
mh_hostfile() {
  local slots=$1 h
  for h in $(mh_hosts); do echo "$h slots=$slots"; done >"$MH_STATE/hostfile"
  echo "$MH_STATE/hostfile"
}

# Exports the environment of an MPI job across the hosts: Open MPI's TCP on
# the hosts' interface only (ranks on different hosts must reach each other,
# and nothing may leave these namespaces), root allowed, and ranks that yield
# while waiting: the hosts share this machine's few cores, which a
# hostfile's slots or slurm.conf's CPUs hide from Open MPI. Every peer is
# added to the BTLs inside MPI_Init (mpi_add_procs_cutoff above the job's
# size; Debian's Open MPI 4.1 defaults to 0, adding peers on first contact):
# under srun --mpi=pmix the lazy path let a rank die of SIGSEGV at address 0
# in MPI_Init (slurm.sh). Launchers pass the environment on to every rank.
mh_mpi_env() {
  export OMPI_MCA_btl_tcp_if_include=$MH_IFACE OMPI_MCA_oob_tcp_if_include=$MH_IFACE
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  export OMPI_MCA_btl=self,vader,tcp OMPI_MCA_btl_vader_single_copy_mechanism=none
  export OMPI_MCA_mpi_yield_when_idle=1
  export OMPI_MCA_mpi_add_procs_cutoff=1024
}

# The verdict on a job's output OUT of NP ranks that exited RC: RC itself,
# then check_probe.py with CHECK's flags (when given), then OUT matching the
# regex EXPECT (when given). Prints what failed; returns the first failing
# code.
#   mh_verdict RC OUT NP CHECK EXPECT
mh_verdict() {
  local rc=$1 out=$2 np=$3 check=$4 expect=$5
  if [[ -n "$check" ]]; then
    # shellcheck disable=SC2086
    python3 "$MH_HERE/check_probe.py" --world "$np" $check "$out" || { ((rc == 0)) && rc=1; }
  fi
  if [[ -n "$expect" ]] && ! grep -qE -- "$expect" "$out"; then
    echo "FAIL: the output does not match '$expect'"
    ((rc == 0)) && rc=1
  fi
  return "$rc"
}

# Tears down everything mh_up made; safe to call twice and after a partial
# mh_up. Holders are killed by PID (SIGKILL: PID 1 of a namespace ignores
# anything else from outside), which ends every process of that host.
mh_down() {
  [[ -n "$MH_STATE" && -d "$MH_STATE" ]] || return 0
  local h pid i
  if [[ -n "$MH_BROKER_PID" ]]; then
    kill -TERM "$MH_BROKER_PID" 2>/dev/null
    wait "$MH_BROKER_PID" 2>/dev/null
  fi
  for ((i = 0; i < MH_N; ++i)); do
    h="node$i"
    [[ -f "$MH_STATE/$h/holder" ]] || continue
    pid=$(cat "$MH_STATE/$h/holder")
    kill -KILL "$pid" 2>/dev/null
  done
  for pid in "${MH_STARTER_PIDS[@]}"; do
    wait "$pid" 2>/dev/null
  done
  if [[ -f "$MH_STATE/netns" ]]; then
    local ns
    while read -r ns; do ip netns del "$ns" 2>/dev/null; done <"$MH_STATE/netns"
  fi
  rm -rf "$MH_STATE"
  MH_STATE=""
  MH_STARTER_PIDS=()
  MH_BROKER_PID=""
}
