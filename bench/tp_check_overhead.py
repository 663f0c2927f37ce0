"""What the tensor-parallel layers' input check costs (vemesh.torch).

ColumnParallelLinear / RowParallelLinear agree each forward input's dtype and
shape over the TP group (one all_gather of 256 bytes per rank) before their
collectives, so that bad input raises on every rank instead of hanging.
This times one forward + backward of a column -> ReLU -> row MLP with the
check on and off (check_inputs=False), interleaved rounds, and prints the
median and spread of the per-step mean of each, on rank 0:

  PYTHONPATH=build/release/python mpirun -n 4 python3 bench/tp_check_overhead.py
  PYTHONPATH=build/release/python torchrun --standalone --nproc_per_node=4 \
    --redirects 1 --tee 1 bench/tp_check_overhead.py [--hidden 1024] [--iters 50]
"""
import argparse
import os
import statistics
import time

import torch

from vemesh import VESCALE_DEVICE_MESH
from vemesh.torch import ColumnParallelLinear, RowParallelLinear

p = argparse.ArgumentParser()
p.add_argument("--features", type=int, default=256)
p.add_argument("--hidden", type=int, default=1024)
p.add_argument("--batch", type=int, default=32)
p.add_argument("--iters", type=int, default=50)
p.add_argument("--rounds", type=int, default=7)
args = p.parse_args()

torch.set_num_threads(1)
world = int(os.environ.get("WORLD_SIZE",
                           os.environ.get("OMPI_COMM_WORLD_SIZE", "1")))
VESCALE_DEVICE_MESH.init_device_mesh("cpu", (world,), mesh_dim_names=("TP",),
                                     timeout=120)
torch.manual_seed(0)


def mlp(check):
    fc1 = ColumnParallelLinear(args.features, args.hidden, check_inputs=check)
    fc2 = RowParallelLinear(args.hidden, args.features, input_is_parallel=True,
                            check_inputs=check)
    return lambda x: fc2(torch.relu(fc1(x)))


models = {"check": mlp(True), "no check": mlp(False)}
x = torch.randn(args.batch, args.features, requires_grad=True)
times = {k: [] for k in models}
for _ in range(args.rounds):
    for name, f in models.items():
        f(x).sum().backward()  # warm
        start = time.perf_counter()
        for _ in range(args.iters):
            f(x).sum().backward()
        times[name].append((time.perf_counter() - start) / args.iters * 1e3)

if VESCALE_DEVICE_MESH.get_rank() == 0:
    print(f"TP={VESCALE_DEVICE_MESH.size()} MLP {args.features}->{args.hidden}"
          f"->{args.features}, batch {args.batch}, forward+backward, "
          f"{args.rounds} rounds x {args.iters} steps")
    for name, t in times.items():
        print(f"  {name:9s} median {statistics.median(t):7.3f} ms/step "
              f"(min {min(t):.3f}, max {max(t):.3f})")
    ratio = [a / b for a, b in zip(times["check"], times["no check"])]
    print(f"  check / no check: median {statistics.median(ratio):.3f} "
          f"(min {min(ratio):.3f}, max {max(ratio):.3f})")
