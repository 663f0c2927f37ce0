#!/bin/sh
# Fails when a program links libcudart or libnccl: vemesh loads them at run
# time (vemesh/comm/nccl/internal/nccl_api.h), so a program that does not
# call CUDA itself must not need them. Usage: no_cuda_linked.sh <program>...
status=0
for program in "$@"; do
  libraries=$(ldd "$program") || { echo "FAIL: ldd $program failed"; exit 2; }
  linked=$(printf '%s\n' "$libraries" | grep -E 'libcudart|libnccl')
  if [ -n "$linked" ]; then
    echo "FAIL: $program links CUDA or NCCL:"
    printf '%s\n' "$linked"
    status=1
  else
    echo "ok: $program links neither libcudart nor libnccl"
  fi
done
exit $status
