#!/usr/bin/env bash
# Mesh creation across emulated hosts (tests/multihost/hosts.sh) against one
# host, side by side: bench/init (vemesh's init_device_mesh against the same
# groups made with MPI by hand: one MPI_Comm_split per dimension, MPI_Cart_sub,
# and every sub-group created by every rank) in one mpirun job per placement,
# all on this machine, one after the other:
#
#   machine   8 ranks on this machine itself (loopback, no namespaces)
#   1x8       one emulated host holding 8 ranks (shared memory between them)
#   2x4, 4x2  2 and 4 emulated hosts (TCP over veth between hosts, shared
#             memory inside each), block placement (--map-by slot)
#
#   bench/multihost_init.sh [build dir] [reps] [shapes]
#   bench/multihost_init.sh build/release 21 2x2x2,2x4
#
# Needs root (namespaces; without it only "machine" runs, and it says so)
# and the bench built (cmake --build <build> --target vemesh_bench_init).
# Prints each job's table, then one summary table: median ms per method
# (rows) and placement (columns), per mesh shape. The hosts share this
# machine's cores, so a host boundary costs a trip through the kernel's
# TCP stack and a veth pair, never a real wire: the numbers show what
# crossing hosts adds to vemesh's calls and to the hand-made ones alike, not
# a cluster's latency.
set -u
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-build/release}
reps=${2:-21}
shapes=${3:-2x2x2,2x4}
bin=$(cd "$build" && pwd)/bench/init
if [[ ! -x "$bin" ]]; then
  echo "multihost_init: $bin not found (cmake --build $build --target vemesh_bench_init)" >&2
  exit 2
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_btl=self,vader,tcp
export OMPI_MCA_btl_vader_single_copy_mechanism=none
# Every placement yields the cores while waiting, as Open MPI does by itself
# only where a host holds more ranks than its slots (the "machine" run, not
# the hostfile runs): otherwise 8 spinning ranks on 2 cores compare
# scheduling, not placement.
export OMPI_MCA_mpi_yield_when_idle=1
args=(--bind-to none "$bin" --reps="$reps" --shapes="$shapes")
out=$(mktemp -d /run/vemesh-mh-bench.XXXXXX 2>/dev/null || mktemp -d)
cols=()

run_machine() {
  echo "== machine: 8 ranks, this machine, loopback"
  echo "\$ mpirun --oversubscribe -n 8 ${args[*]}"
  OMPI_MCA_btl_tcp_if_include=lo OMPI_MCA_oob_tcp_if_include=lo \
    timeout -k 5 600 mpirun --oversubscribe -n 8 "${args[@]}" | tee "$out/machine.txt"
  cols+=(machine)
}

# run_hosts HOSTS SLOTS
run_hosts() (
  local h=$1 s=$2
  # shellcheck source=../tests/multihost/hosts.sh
  source "$here/../tests/multihost/hosts.sh"
  mh_up "$h" || exit 1
  local hostfile
  hostfile=$(mh_hostfile "$s")
  echo "== ${h}x${s}: $h emulated hosts x $s ranks, --map-by slot"
  echo "\$ mpirun --mca plm_rsh_agent nsrsh --hostfile <$h hosts, slots=$s> --map-by slot -n $((h * s)) ${args[*]}   (in node0; TCP on eth0)"
  OMPI_MCA_btl_tcp_if_include=$MH_IFACE OMPI_MCA_oob_tcp_if_include=$MH_IFACE \
    mh_exec node0 timeout -k 5 600 mpirun --mca plm_rsh_agent "$MH_RSH" \
      --hostfile "$hostfile" --map-by slot -n $((h * s)) "${args[@]}" |
    tee "$out/${h}x${s}.txt"
)

run_machine
if [[ $(id -u) -ne 0 ]] || ! ip netns list >/dev/null 2>&1; then
  echo "multihost_init: not root: no emulated hosts, only the 'machine' column" >&2
else
  for hs in 1x8 2x4 4x2; do
    run_hosts "${hs%x*}" "${hs#*x}" && cols+=("$hs")
  done
fi

# Summary: median ms of each method, per shape, placements side by side.
python3 - "$out" "${cols[@]}" <<'EOF'
import re, sys, os
out, cols = sys.argv[1], sys.argv[2:]
tables = {}  # shape -> method -> col -> median
order = {}
for c in cols:
    shape = None
    for line in open(os.path.join(out, c + ".txt")):
        m = re.match(r"world \d+, mesh (\S+)", line)
        if m:
            shape = m.group(1)
            continue
        m = re.match(r"\| (\S[^|]*?) \| ([0-9.]+) \| ([0-9.]+) \| ([0-9.]+) \|", line)
        if m and shape:
            tables.setdefault(shape, {}).setdefault(m.group(1), {})[c] = float(m.group(2))
            order.setdefault(shape, [])
            if m.group(1) not in order[shape]:
                order[shape].append(m.group(1))
print("\n== summary: median ms (slowest rank), per placement")
for shape, rows in tables.items():
    print(f"\nmesh {shape}\n")
    print("| method | " + " | ".join(cols) + " |")
    print("|---|" + "---:|" * len(cols))
    for method in order[shape]:
        cells = [f"{rows[method][c]:.3f}" if c in rows[method] else "-" for c in cols]
        print(f"| {method} | " + " | ".join(cells) + " |")
EOF
rm -rf "$out"
