#!/usr/bin/env bash
# Issue 46's measurements, launches alternating (bench/RESULTS.md, "The
# torchrun data plane"):
#  1. bench/gloo_vs_torch.py under torchrun (vemesh's Gloo group, shared
#     memory on, then VEMESH_GLOO_SHM=0, beside torch 1.13's gloo in the
#     same job) and under mpirun (vemesh on MPI), at 8 and 4 ranks;
#  2. train_nd with the main job's mesh (PP=2,DP=2,TP=2) under torchrun and
#     under mpirun: the median step time of each launch (steps 2..N).
#
#   bash bench/torchrun_data_plane.sh [reps] [build/release] [all|collectives|train_nd]
set -uo pipefail
cd "$(dirname "$0")/.."
reps=${1:-3}
build=${2:-build/release}
what=${3:-all}
py=/usr/bin/python3
export PYTHONPATH=$PWD/$build/python OMP_NUM_THREADS=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_btl_tcp_if_include=lo OMPI_MCA_oob_tcp_if_include=lo
free_port() {
  "$py" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
torchrun_n() {  # N args...
  local n=$1; shift
  torchrun --nnodes=1 --rdzv_backend=c10d --rdzv_endpoint="127.0.0.1:$(free_port)" \
    --rdzv_id="vemesh-bench-$$-$RANDOM" --nproc_per_node="$n" --redirects 1 --tee 1 "$@"
}
collectives() {  # launcher N [env]
  local launcher=$1 n=$2; shift 2
  echo "== $launcher -n $n $* load $(cut -d' ' -f1-3 /proc/loadavg)"
  if [[ $launcher == torchrun ]]; then
    env "$@" timeout 600 bash -c "$(declare -f free_port torchrun_n); py=$py; torchrun_n $n bench/gloo_vs_torch.py --rounds 5 --budget 0.15" 2>&1 |
      sed -n 's/^\[default0\]://p'
  else
    env "$@" timeout 600 mpirun --oversubscribe --bind-to none -n "$n" "$py" bench/gloo_vs_torch.py --rounds 5 --budget 0.15 2>&1 |
      grep -v '^\[' | grep '|\|ranks'
  fi
}
train_nd() {  # launcher
  local launcher=$1 bin=$build/examples/train_nd/train_nd
  local args=(--mesh PP=2,DP=2,TP=2 --steps 50)
  local out
  if [[ $launcher == torchrun ]]; then
    out=$(timeout 600 bash -c "$(declare -f free_port torchrun_n); py=$py; torchrun_n 8 --no_python $bin ${args[*]}" 2>&1 | sed -n 's/^\[default0\]://p')
  else
    out=$(timeout 600 mpirun --oversubscribe --bind-to none -n 8 "$bin" "${args[@]}" 2>&1)
  fi
  # Steps 2..N of rank 0 (the first builds buffers), sorted: the median.
  echo "$out" | grep -E '^step +[0-9]+/' | tail -n +2 | awk '{print $(NF-1)}' | sort -g |
    awk -v l="$launcher" -v load="$(cut -d' ' -f1-3 /proc/loadavg)" '
      { t[NR] = $1 }
      END { printf "train_nd %s: median step %.2f ms (min %.2f, max %.2f, %d steps), load %s\n",
            l, (NR % 2 ? t[(NR+1)/2] : (t[NR/2] + t[NR/2+1]) / 2), t[1], t[NR], NR, load }'
  echo "$out" | grep -E '^(PASS|FAIL)' | head -1
}
for ((i = 1; i <= reps; i++)); do
  echo "#### rep $i"
  for n in 8 4; do
    [[ $what == train_nd ]] && break
    collectives torchrun "$n"
    collectives mpirun "$n"
    collectives torchrun "$n" VEMESH_GLOO_SHM=0
  done
  [[ $what == collectives ]] && continue
  train_nd torchrun
  train_nd mpirun
  VEMESH_GLOO_SHM=0 train_nd torchrun | sed 's/^train_nd torchrun/train_nd torchrun VEMESH_GLOO_SHM=0/'
done
