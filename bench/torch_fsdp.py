"""vemesh.torch.fsdp against its DDP-style mode (NO_SHARD) on the same torch
model and ranks: step time and the training state each rank holds.

  mpirun -n 8 python3 bench/torch_fsdp.py [--hidden 512] [--layers 8]
  torchrun --standalone --nproc_per_node=8 --redirects 1 --tee 1 bench/torch_fsdp.py

One job builds every configuration (NO_SHARD, FULL_SHARD, SHARD_GRAD_OP on
the 1-D mesh of all ranks; HYBRID_SHARD on (2, n/2); FULL_SHARD without the
per-step input agreement), then alternates them step by step, so the
machine's noise falls on all alike. A step is forward, backward, AdamW step
and zero_grad on a global batch split over the ranks; its time is the
slowest rank's (an all_reduce max after each round, outside the timing).
The input agreement (check_inputs=True) is also timed by itself.
Rank 0 prints, per configuration, the median step over every timed step,
its 10th-90th percentile spread, and per rank: parameter shard, gradient
and AdamW state bytes against NO_SHARD's, and the most bytes gathered at
once.
"""
import argparse
import os
import statistics
import time

import torch
import torch.nn as nn

import vemesh
from vemesh.torch.fsdp import (FullyShardedDataParallel as FSDP,
                               ModuleWrapPolicy, ShardingStrategy)

p = argparse.ArgumentParser()
p.add_argument("--hidden", type=int, default=512)
p.add_argument("--layers", type=int, default=8)
p.add_argument("--batch", type=int, default=64, help="global batch")
p.add_argument("--steps", type=int, default=10, help="timed steps per round")
p.add_argument("--rounds", type=int, default=5)
p.add_argument("--warmup", type=int, default=2)
args = p.parse_args()

torch.set_num_threads(1)


class Block(nn.Module):

    def __init__(self, n):
        super().__init__()
        self.fc = nn.Linear(n, n)

    def forward(self, x):
        return x + torch.tanh(self.fc(x))


def make_model():
    torch.manual_seed(0)
    return nn.Sequential(*[Block(args.hidden) for _ in range(args.layers)],
                         nn.Linear(args.hidden, 8))


ranks = int(os.environ.get("WORLD_SIZE",
                           os.environ.get("OMPI_COMM_WORLD_SIZE", "1")))
flat = vemesh.init_device_mesh("cpu", (ranks,), mesh_dim_names=("dp",),
                               timeout=600)
n = flat.size()
rank = flat.get_rank()
meshes = {"1d": flat}
if n % 2 == 0 and n > 2:
    meshes["2d"] = vemesh.init_device_mesh(
        "cpu", (2, n // 2), mesh_dim_names=("replicate", "shard"), timeout=600)

S = ShardingStrategy
configs = [("NO_SHARD (DDP-style)", "1d", S.NO_SHARD, {}),
           ("FULL_SHARD", "1d", S.FULL_SHARD, {}),
           ("SHARD_GRAD_OP", "1d", S.SHARD_GRAD_OP, {}),
           ("FULL_SHARD, check_inputs=False", "1d", S.FULL_SHARD,
            {"check_inputs": False})]
if "2d" in meshes:
    configs.insert(3, (f"HYBRID_SHARD (2, {n // 2})", "2d", S.HYBRID_SHARD,
                       {}))

g = torch.Generator().manual_seed(1)
x = torch.randn(args.batch, args.hidden, generator=g)
y = torch.randn(args.batch, 8, generator=g)
per = args.batch // n
x, y = x[rank * per:(rank + 1) * per], y[rank * per:(rank + 1) * per]

runs = []
for name, m, strategy, kw in configs:
    model = FSDP(make_model(), device_mesh=meshes[m],
                 sharding_strategy=strategy,
                 auto_wrap_policy=ModuleWrapPolicy({Block}), **kw)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    runs.append({"name": name, "model": model, "opt": opt, "times": []})


def step(r):
    loss = ((r["model"](x) - y)**2).mean()
    loss.backward()
    r["opt"].step()
    r["opt"].zero_grad()


for r in runs:
    for _ in range(args.warmup):
        step(r)
# Configurations alternate step by step, so load spikes fall on all alike.
for _ in range(args.rounds):
    times = torch.zeros(len(runs), args.steps, dtype=torch.float64)
    for i in range(args.steps):
        for j, r in enumerate(runs):
            t0 = time.perf_counter()
            step(r)
            times[j, i] = time.perf_counter() - t0
    flat.get_group().all_reduce(times, op="max")
    for j, r in enumerate(runs):
        r["times"].extend(times[j].tolist())

# The per-forward input agreement by itself (check_inputs=True's cost).
agree = runs[1]["model"]._fsdp
agree_times = torch.zeros(args.rounds * args.steps, dtype=torch.float64)
for i in range(agree_times.numel()):
    t0 = time.perf_counter()
    agree.finish_input_check(agree.start_input_check((x,), {}))
    agree_times[i] = time.perf_counter() - t0
flat.get_group().all_reduce(agree_times, op="max")


def state_bytes(r):
    params = sum(q.numel() * q.element_size() for q in r["model"].parameters())
    grads = sum(q.grad.numel() * q.grad.element_size()
                for q in r["model"].parameters() if q.grad is not None)
    opt = sum(t.numel() * t.element_size() for s in r["opt"].state.values()
              for t in s.values() if torch.is_tensor(t))
    return params, grads, opt


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


if rank == 0:
    total = sum(q.numel() for q in make_model().parameters())
    print(f"{n} ranks, {args.layers} x Linear({args.hidden}, {args.hidden}) "
          f"+ head: {total} float32 parameters, global batch {args.batch}, "
          f"{args.rounds} rounds x {args.steps} steps (+{args.warmup} warm-up)")
    base = None
    print("| configuration | step ms, median | p10-p90 | vs NO_SHARD | "
          "params + grads + AdamW per rank (bytes) | vs NO_SHARD | "
          "peak gathered (bytes) |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in runs:
        med = statistics.median(r["times"]) * 1e3
        lo, hi = pct(r["times"], 0.1) * 1e3, pct(r["times"], 0.9) * 1e3
        st = sum(state_bytes(r))
        if base is None:
            base = (med, st)
        peak = r["model"].memory_usage()["peak_gathered"]
        print(f"| {r['name']} | {med:.2f} | {lo:.2f}-{hi:.2f} | "
              f"{med / base[0]:.2f} | {st:,} | {st / base[1]:.3f} | "
              f"{peak:,} |")
    a = agree_times.tolist()
    print(f"input agreement alone (check_inputs=True, 1-D mesh): median "
          f"{statistics.median(a) * 1e3:.3f} ms, p10-p90 "
          f"{pct(a, 0.1) * 1e3:.3f}-{pct(a, 0.9) * 1e3:.3f} ms per forward")
