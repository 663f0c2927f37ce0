#!/bin/bash
# Runs on a GPU machine from the folder bench/gpu/bundle.sh packed (as
# .gpu/run.sh): the NCCL tests (MPI singleton, then env:// with one rank) and
# the NCCL start-up timings, each log also written to $OUT.
cd "$(dirname "$0")"
OUT=${OUT:-$PWD}
tar xzf ompi.tgz -C / 2>/dev/null
# vemesh dlopens libnccl.so.2 and libcudart.so.13 (comm/nccl/internal/
# nccl_api): on the GPU image they live in its Python packages.
extra=$(find /usr /opt /root /home \( -name 'libnccl.so.2' -o -name 'libcudart.so.13' \) -printf '%h\n' 2>/dev/null | sort -u | tr '\n' ':')
export LD_LIBRARY_PATH=$PWD/lib:${extra}${LD_LIBRARY_PATH:-}
echo "nccl/cudart dirs: $extra"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_ess_singleton_isolated=1
export OMPI_MCA_btl=self,vader,tcp OMPI_MCA_btl_tcp_if_include=lo OMPI_MCA_oob_tcp_if_include=lo
nvidia-smi -L
echo "=== nccl_communicator_test, MPI singleton"
timeout 300 bin/nccl_communicator_test 2>&1 | tee $OUT/nccl_test_mpi.log; echo "rc=${PIPESTATUS[0]}"
for t in bin/nccl_split_test bin/cuda_device_test; do
  [[ -x $t ]] || continue
  echo "=== $(basename $t), MPI singleton"
  timeout 120 $t 2>&1 | tee $OUT/$(basename $t).log | tail -5; echo "rc=${PIPESTATUS[0]}"
done
if [[ -x bin/hsdp ]]; then
  echo "=== examples/hsdp on cuda, mesh (1,1), MPI singleton"
  for i in 1 2 3; do  # grouped splits failed here only some of the time
    timeout 60 bin/hsdp --device cuda --mesh replicate=1,shard=1 2>&1 | tee $OUT/hsdp_cuda_$i.log | tail -2; echo "rc=${PIPESTATUS[0]}"
  done
fi
echo "=== nccl_communicator_test, env:// one rank (store + Gloo twin, no MPI launcher)"
timeout 300 bash spawn_env.sh --limit 200 --port 29517 1 bin/nccl_communicator_test 2>&1 | tee $OUT/nccl_test_env.log; echo "rc=${PIPESTATUS[0]}"
# Each repetition's creation and tear-down is printed (--verbose), so a
# slow step shows even when the whole run hits its bound.
REPS=${REPS:-5}
echo "=== nccl_init timings (MPI singleton)"
timeout 120 bin/nccl_init --reps=$REPS --verbose 2>&1 | tee $OUT/nccl_init.log; echo "rc=${PIPESTATUS[0]}"
echo "=== nccl_init timings (env://)"
timeout 120 bash spawn_env.sh --limit 110 --port 29518 1 bin/nccl_init --reps=$REPS --verbose 2>&1 | tee $OUT/nccl_init_env.log; echo "rc=${PIPESTATUS[0]}"
