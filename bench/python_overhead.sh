#!/usr/bin/env bash
# The Python module's per-call overhead (bench/python_overhead.py) in the
# three settings of bench/RESULTS.md ("Python: per-call overhead"): one process (the binding's
# cost alone), 2 ranks under mpirun (MPI) and 2 ranks under torchrun (Gloo,
# beside torch.distributed's gloo on the same tensors).
#
#   bash bench/python_overhead.sh [build/release]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build/release}
py=/usr/bin/python3
export PYTHONPATH=$PWD/$build/python OMP_NUM_THREADS=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_btl=self,vader,tcp
export OMPI_MCA_btl_vader_single_copy_mechanism=none
export OMPI_MCA_btl_tcp_if_include=lo OMPI_MCA_oob_tcp_if_include=lo
script=bench/python_overhead.py
echo "== one process (MPI singleton)"; uptime
"$py" "$script" --iters 20000 --rounds 7
echo "== mpirun -n 2"; uptime
mpiexec --bind-to none -n 2 "$py" "$script" --iters 5000 --rounds 7
echo "== torchrun --nproc_per_node=2"; uptime
port=$("$py" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
torchrun --nnodes=1 --rdzv_backend=c10d --rdzv_endpoint="127.0.0.1:$port" \
  --rdzv_id="vemesh-bench-$$" --nproc_per_node=2 --redirects 1 --tee 1 \
  "$script" --iters 2000 --rounds 7 2>&1 | sed -n 's/^\[default0\]://p'
