#!/usr/bin/env bash
# The main job: builds vemesh and runs the N-D parallel training example on
# 8 ranks with PP=2, DP=2, TP=2: pipeline stages, data-parallel replicas and
# tensor-parallel layers at once, checked against a serial run of the same
# model (the last line says PASS or FAIL; the exit code follows it).
#
#   bash scripts/main_job.sh                     # PP=2,DP=2,TP=2 on 8 ranks
#   bash scripts/main_job.sh PP=4,TP=2 --steps 20 # another mesh, more flags
#
# The first argument replaces the mesh (the rank count is its product); the
# rest go to train_nd (see `train_nd --help`).
#
#   VEMESH_LAUNCHER=torchrun bash scripts/main_job.sh   # the same job under
#       torchrun --no_python --standalone (env://, Gloo; no MPI at all)
set -euo pipefail
cd "$(dirname "$0")/.."
# What building and running the job needs (not the tests' extras).
if [[ "${VEMESH_LAUNCHER:-mpirun}" == torchrun ]]; then
  bash scripts/setup.sh --torch
else
  bash scripts/setup.sh
fi
# Open MPI refuses root and more ranks than cores unless told; this runs as
# root on 2 cores.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1
# One host: Open MPI's TCP traffic stays on loopback.
export OMPI_MCA_btl_tcp_if_include=lo OMPI_MCA_oob_tcp_if_include=lo
# Tests and benchmarks off: their libraries (GTest, Google Benchmark) come
# with `setup.sh --test`; `cmake --preset release` turns them on again.
cmake --preset release -DVEMESH_BUILD_TESTS=OFF -DVEMESH_BUILD_BENCH=OFF >/dev/null
cmake --build --preset release --target train_nd

mesh=${1:-PP=2,DP=2,TP=2}
shift || true
np=1
for part in ${mesh//,/ }; do
  # A malformed mesh is left for train_nd to explain.
  [[ $part =~ ^[^=]+=[0-9]+$ ]] && np=$((np * ${part#*=}))
done
if [[ "${VEMESH_LAUNCHER:-mpirun}" == torchrun ]]; then
  echo "+ torchrun --no_python --standalone --nproc_per_node=$np train_nd --mesh $mesh $*"
  # --redirects/--tee 1: torch 1.13 on Python 3.11 cannot parse their
  # default (see tests/launch/run_torchrun.sh).
  exec torchrun --no_python --standalone --nproc_per_node="$np" --redirects 1 --tee 1 \
    ./build/release/examples/train_nd/train_nd --mesh "$mesh" "$@"
fi
# One host: Open MPI's TCP traffic (data and out-of-band) stays on loopback.
export OMPI_MCA_btl_tcp_if_include=${OMPI_MCA_btl_tcp_if_include:-lo}
export OMPI_MCA_oob_tcp_if_include=${OMPI_MCA_oob_tcp_if_include:-lo}
echo "+ mpirun -n $np train_nd --mesh $mesh $*"
exec mpirun --oversubscribe --bind-to none -n "$np" \
  ./build/release/examples/train_nd/train_nd --mesh "$mesh" "$@"
