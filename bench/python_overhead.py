"""Per-call cost of a small all_reduce from Python (vemesh), the same call
from C++ (vemesh._cpp_all_reduce_loop, same group and buffer), and
torch.distributed's gloo all_reduce on the same tensor, in one job.

  PYTHONPATH=build/release/python torchrun --nnodes=1 --rdzv_backend=c10d \
    --rdzv_endpoint=127.0.0.1:29511 --nproc_per_node=2 --redirects 1 --tee 1 \
    bench/python_overhead.py [--count 8] [--iters 2000] [--rounds 5]
  mpirun -n 2 python3 bench/python_overhead.py   # no torch row (no env://)

Rounds interleave the three forms; each row is the median over rounds of
the mean per call. Rank 0 prints the table.
"""
import argparse
import os
import statistics
import time

import numpy as np

import vemesh

p = argparse.ArgumentParser()
p.add_argument("--count", type=int, default=8)
p.add_argument("--iters", type=int, default=2000)
p.add_argument("--rounds", type=int, default=5)
args = p.parse_args()

mesh = vemesh.init_device_mesh("cpu", (int(os.environ.get("WORLD_SIZE",
                               os.environ.get("OMPI_COMM_WORLD_SIZE", "1"))),),
                               mesh_dim_names=("world",))
g = mesh.get_group()
torch = dist = None
if "RANK" in os.environ and "OMPI_COMM_WORLD_SIZE" not in os.environ:
    import torch
    import torch.distributed as dist
    # vemesh's rank 0 hosts its store at MASTER_ADDR:MASTER_PORT, so
    # torch.distributed meets on the next port (README, Python section).
    port = int(os.environ["MASTER_PORT"]) + 1
    dist.init_process_group(
        "gloo", init_method=f"tcp://{os.environ['MASTER_ADDR']}:{port}",
        rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]))

arr = np.ones(args.count, np.float32)
t = torch.ones(args.count, dtype=torch.float32) if torch else None


def per_call(fn):
    g.barrier()
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) / args.iters * 1e6


def py_numpy():
    for _ in range(args.iters):
        g.all_reduce(arr)


def py_torch():
    for _ in range(args.iters):
        g.all_reduce(t)


def cpp():
    vemesh._cpp_all_reduce_loop(g, arr, args.iters)


def torch_gloo():
    for _ in range(args.iters):
        dist.all_reduce(t)


forms = [("C++ Communicator::all_reduce (same group)", cpp),
         ("Python vemesh all_reduce, numpy", py_numpy)]
if torch:
    forms += [("Python vemesh all_reduce, torch tensor", py_torch),
              ("torch.distributed.all_reduce (gloo)", torch_gloo)]
times = {name: [] for name, _ in forms}
for name, fn in forms:  # warm-up
    args_iters, args.iters = args.iters, 100
    per_call(fn)
    args.iters = args_iters
for _ in range(args.rounds):
    for name, fn in forms:
        times[name].append(per_call(fn))

if g.rank() == 0:
    base = statistics.median(times[forms[0][0]])
    print(f"{g.size()} ranks, backend {g.backend}, {args.count} float32, "
          f"{args.iters} calls x {args.rounds} rounds")
    print(f"| form | us per call (median of rounds) | vs C++ |")
    print(f"|---|---|---|")
    for name, _ in forms:
        m = statistics.median(times[name])
        print(f"| {name} | {m:.1f} | {m - base:+.1f} us |")
if dist:
    dist.destroy_process_group()
