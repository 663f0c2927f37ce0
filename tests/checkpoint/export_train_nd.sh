#!/usr/bin/env bash
# An HSDP + TP checkpoint out as plain tensors: train_nd trains 2 AdamW
# steps on DP_REPLICATE=2,DP_SHARD=2,TP=2 (8 ranks: FSDP flat shards inside
# TP blocks, replicas written once) and, as the serial model, on one process
# (PP=1,DP=1,TP=1), each saving at step 2; `vemesh checkpoint export` writes
# each as one safetensors file, and a plain-Python reader (no vemesh)
# finds the same tensors (parameters and AdamW state) by name, dtype and
# shape, equal to 1e-10 relative.
#   export_train_nd.sh MPIEXEC "MPIEXEC;FLAGS" TRAIN_ND VEMESH_CLI PYTHON READER
set -u
mpiexec=$1 flags=$2 train_nd=$3 cli=$4 py=$5 reader=$6
IFS=';' read -r -a mpi_flags <<<"$flags"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
common=(--steps 2 --checkpoint_every 2 --batch 32 --micro_batches 2
        --optimizer adam --lr 0.01)
"$mpiexec" "${mpi_flags[@]}" -n 8 "$train_nd" --mesh DP_REPLICATE=2,DP_SHARD=2,TP=2 \
  --checkpoint_dir "$dir/hsdp" "${common[@]}" >"$dir/hsdp.txt" 2>&1 ||
  { cat "$dir/hsdp.txt"; fail "the HSDP + TP run"; }
"$mpiexec" "${mpi_flags[@]}" -n 1 "$train_nd" --mesh PP=1,DP=1,TP=1 \
  --checkpoint_dir "$dir/serial" "${common[@]}" >"$dir/serial.txt" 2>&1 ||
  { cat "$dir/serial.txt"; fail "the one-process run"; }
"$cli" checkpoint inspect "$dir/hsdp" || fail "inspect"
"$cli" checkpoint export "$dir/hsdp" "$dir/hsdp.safetensors" || fail "export"
"$cli" checkpoint export "$dir/serial" "$dir/serial.safetensors" || fail "export"
"$py" "$reader" compare "$dir/hsdp.safetensors" "$dir/serial.safetensors" 1e-10 ||
  fail "the exported tensors differ"
echo "PASS: HSDP + TP checkpoint exported and read without vemesh"
