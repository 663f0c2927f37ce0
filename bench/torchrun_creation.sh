#!/usr/bin/env bash
# Mesh creation under torchrun, vemesh against torch 1.13, side by side
# (issue 32): for each world, the same torchrun (Debian's python3-torch)
# runs bench/torchrun_init (vemesh's cpu mesh, Gloo over the store rank 0
# hosts) and then bench/torch_mesh_creation.py (dist.new_group per sub-group,
# gloo), each timing REPS creations after an untimed first one. Prints each
# program's line (median ms of the slowest rank, the samples, sockets per
# rank) and a summary table.
#
#   bench/torchrun_creation.sh [build dir] [reps] [worlds]
#   bench/torchrun_creation.sh build/release 9 8,16
#
# Shapes: 8 ranks (2,2,2), 16 ranks (2,2,4). Needs the bench built
# (cmake --build <build> --target vemesh_bench_torchrun_init).
set -u
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-build/release}
reps=${2:-9}
worlds=${3:-8,16}
bin=$(cd "$build" && pwd)/bench/torchrun_init
if [[ ! -x "$bin" ]]; then
  echo "torchrun_creation: $bin not found (cmake --build $build --target vemesh_bench_torchrun_init)" >&2
  exit 2
fi
if ! command -v torchrun >/dev/null 2>&1; then
  echo "torchrun_creation: torchrun not found (python3-torch)" >&2
  exit 2
fi
unset OMPI_COMM_WORLD_SIZE OMPI_COMM_WORLD_RANK OMPI_COMM_WORLD_LOCAL_RANK PMIX_RANK PMI_RANK
export OMP_NUM_THREADS=1
declare -A shapes=([8]=2,2,2 [16]=2,2,4 [32]=2,4,4)
# torch 1.13 on Python 3.11 needs --redirects/--tee given explicitly.
run=(torchrun --standalone --redirects 1 --tee 1)
declare -A vm tm vs ts vc
IFS=, read -r -a list <<<"$worlds"
for n in "${list[@]}"; do
  shape=${shapes[$n]}
  v=$("${run[@]}" --nproc_per_node="$n" --no_python "$bin" "$shape" "$reps" 2>/dev/null |
      grep -o 'vemesh world.*' | head -1)
  echo "$v"
  t=$("${run[@]}" --nproc_per_node="$n" "$here/torch_mesh_creation.py" "$shape" "$reps" 2>/dev/null |
      grep -o 'torch world.*' | head -1)
  echo "$t"
  vm[$n]=$(sed -E 's/.*median ([0-9.]+) ms.*/\1/' <<<"$v")
  tm[$n]=$(sed -E 's/.*median ([0-9.]+) ms.*/\1/' <<<"$t")
  vs[$n]=$(sed -E 's/.*sockets per rank ([0-9]+).*/\1/' <<<"$v")
  ts[$n]=$(sed -E 's/.*sockets per rank ([0-9]+).*/\1/' <<<"$t")
  vc[$n]=$(sed -E 's/.*CPU of all ranks per creation ([0-9.]+) ms.*/\1/' <<<"$v")
done
echo
echo "| ranks (mesh) | vemesh ms | torch 1.13 ms | torch / vemesh | sockets per rank, vemesh | torch | vemesh CPU of all ranks per creation, ms |"
echo "|---|---|---|---|---|---|---|"
for n in "${list[@]}"; do
  ratio=$(python3 -c "print(f'{${tm[$n]:-0} / max(${vm[$n]:-1}, 1e-9):.1f}x')" 2>/dev/null)
  echo "| $n (${shapes[$n]}) | ${vm[$n]} | ${tm[$n]} | $ratio | ${vs[$n]} | ${ts[$n]} | ${vc[$n]} |"
done
