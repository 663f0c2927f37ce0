#!/usr/bin/env python3
"""One step of torch's DistributedDataParallel on torch's Gloo group against
the same step on a vemesh group (issue 41, "Measure").

Under torchrun, every rank builds the same torch model twice, wraps one in
DDP over torch's default Gloo group (init_process_group("gloo")) and the
other in DDP over vemesh's world group (vemesh.torch.as_process_group of a
1-D cpu mesh: Gloo under torchrun, vemesh's own), and times full training
steps - zero_grad, forward, backward with DDP's bucketed all_reduces
overlapping it, optimizer step - alternating the two in rounds so that the
machine's noise hits both alike (the order flips each round). Ranks line up
at a barrier (not timed) before each step; a step's time is the slowest
rank's.

  torchrun --standalone --nproc_per_node=4 --redirects 1 --tee 1 \\
      bench/torch_ddp.py [--model large|small] [--rounds 7] [--steps 15]

Rank 0 prints, per group, the median step time with its 10th..90th
percentile spread over all timed steps, each round's median, and the ratio
vemesh / gloo (of the medians, and each round's), with /proc/loadavg before
and after. No timing is asserted. Both models end with the same parameters
(checked: the two groups compute the same sums).
"""
import argparse
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

import vemesh
from vemesh.torch import as_process_group

MODELS = {
    # (width, layers, batch per rank): 4.2 M float32 parameters (16.8 MB,
    # two of DDP's buckets: its 1 MB first one and a 25 MB-capped rest), and
    # a latency-bound 13 K (one bucket).
    "large": (1024, 4, 32),
    "small": (64, 3, 32),
}


def make_model(width, layers):
    torch.manual_seed(0)
    mods = []
    for _ in range(layers):
        mods += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    mods.append(torch.nn.Linear(width, 10))
    return torch.nn.Sequential(*mods)


def loadavg():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def percentile(xs, q):
    xs = sorted(xs)
    k = (len(xs) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", choices=sorted(MODELS), default="large")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--steps", type=int, default=15, help="timed per round")
    ap.add_argument("--warmup", type=int, default=3, help="per round, untimed")
    args = ap.parse_args()

    load_before = loadavg()
    dist.init_process_group("gloo")
    mesh = vemesh.init_device_mesh("cpu", (dist.get_world_size(),))
    groups = {"gloo": None, "vemesh": as_process_group(mesh)}
    me, n = dist.get_rank(), dist.get_world_size()
    width, layers, batch = MODELS[args.model]

    runs = {}
    for name, pg in groups.items():
        model = make_model(width, layers)
        ddp = torch.nn.parallel.DistributedDataParallel(model,
                                                        process_group=pg)
        opt = torch.optim.SGD(ddp.parameters(), lr=1e-3)
        runs[name] = (model, ddp, opt)
    gen = torch.Generator().manual_seed(1 + me)
    x = torch.randn(batch, width, generator=gen)
    y = torch.randint(0, 10, (batch,), generator=gen)

    def step(name):
        _, ddp, opt = runs[name]
        opt.zero_grad()
        torch.nn.functional.cross_entropy(ddp(x), y).backward()
        opt.step()

    times = {name: [] for name in groups}  # [round][step] this rank's
    for r in range(args.rounds):
        order = list(groups) if r % 2 == 0 else list(groups)[::-1]
        for name in order:
            for _ in range(args.warmup):
                step(name)
            this_round = []
            for _ in range(args.steps):
                dist.barrier()
                t0 = time.perf_counter()
                step(name)
                this_round.append(time.perf_counter() - t0)
            times[name].append(this_round)

    # The same steps on the same data: both groups must have summed alike.
    for a, b in zip(runs["gloo"][0].parameters(),
                    runs["vemesh"][0].parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)

    every = [None] * n
    dist.all_gather_object(every, times)
    if me == 0:
        report(args, every, n, load_before)
    dist.barrier()


def report(args, every, n, load_before):
    width, layers, batch = MODELS[args.model]
    params = sum(p.numel() for p in make_model(width, layers).parameters())
    print(f"torch_ddp: {n} ranks, model {args.model} ({params} float32 "
          f"parameters, {layers} x Linear({width}), batch {batch} per rank), "
          f"{args.rounds} rounds x {args.steps} timed steps (+{args.warmup} "
          f"warm-up) per group, torch {torch.__version__}")
    medians, round_medians = {}, {}
    for name in ("gloo", "vemesh"):
        # A step's time: the slowest rank's.
        per_round = [[max(every[k][name][r][s] for k in range(n)) * 1e3
                      for s in range(args.steps)] for r in range(args.rounds)]
        flat = [t for rnd in per_round for t in rnd]
        medians[name] = statistics.median(flat)
        round_medians[name] = [statistics.median(rnd) for rnd in per_round]
        print(f"  {name:6s} step ms: median {medians[name]:.2f} "
              f"(p10..p90 {percentile(flat, 0.1):.2f}..{percentile(flat, 0.9):.2f});"
              f" per round " + " ".join(f"{m:.2f}" for m in round_medians[name]))
    ratios = [v / g for v, g in zip(round_medians["vemesh"],
                                    round_medians["gloo"])]
    print(f"  vemesh / gloo: {medians['vemesh'] / medians['gloo']:.3f} "
          f"(per round: median {statistics.median(ratios):.3f}, "
          f"{min(ratios):.3f}..{max(ratios):.3f})")
    print(f"  load (1/5/15 min): before {load_before}, after {loadavg()}")
    sys.stdout.flush()


if __name__ == "__main__":
    if "RANK" not in os.environ:
        sys.exit("torch_ddp.py runs under torchrun (see its docstring)")
    main()
