"""vemesh's cpu group against torch.distributed's gloo on the same tensors,
in one torchrun job (issue 46): all_reduce, all_gather, reduce_scatter
(vemesh only: torch 1.13's gloo has none) and broadcast of float32 at
4 KiB, 1 MiB and 16 MiB.

  PYTHONPATH=build/release/python torchrun --standalone --nproc_per_node=8 \
    --redirects 1 --tee 1 bench/gloo_vs_torch.py [--rounds 7] [--ops ...]
  mpirun -n 8 python3 bench/gloo_vs_torch.py   # vemesh over MPI only

Every round runs each (op, size) pair once per form, the forms alternating
in order round by round; a sample is the slowest rank's mean time per call
(the ranks' times are max-reduced over vemesh after the timed loop). Rank 0
prints, per pair, the median over rounds, the spread (min-max) and the
ratio of medians vemesh / torch.
"""
import argparse
import os
import statistics
import time

import numpy as np

import vemesh

p = argparse.ArgumentParser()
p.add_argument("--rounds", type=int, default=7)
p.add_argument("--sizes", default="4096,1048576,16777216")
p.add_argument("--ops", default="all_reduce,all_gather,reduce_scatter,broadcast")
p.add_argument("--budget", type=float, default=0.25,
               help="seconds per sample (sets the call count per size)")
args = p.parse_args()

world = int(os.environ.get("WORLD_SIZE",
                           os.environ.get("OMPI_COMM_WORLD_SIZE", "1")))
mesh = vemesh.init_device_mesh("cpu", (world,), mesh_dim_names=("world",))
g = mesh.get_group()
import torch  # noqa: E402

dist = None
if "RANK" in os.environ and "OMPI_COMM_WORLD_SIZE" not in os.environ:
    import torch.distributed as dist
    # vemesh's rank 0 hosts its store at MASTER_PORT; torch meets on the next.
    port = int(os.environ["MASTER_PORT"]) + 1
    dist.init_process_group(
        "gloo", init_method=f"tcp://{os.environ['MASTER_ADDR']}:{port}",
        rank=int(os.environ["RANK"]), world_size=world)

n = g.size()


def make(op, nbytes):
    count = nbytes // 4
    if op == "all_reduce":
        t = torch.ones(count)
        return {"vemesh": lambda: g.all_reduce(t),
                "torch": (lambda: dist.all_reduce(t)) if dist else None}
    if op == "broadcast":
        t = torch.ones(count)
        return {"vemesh": lambda: g.broadcast(t, 0),
                "torch": (lambda: dist.broadcast(t, 0)) if dist else None}
    if op == "all_gather":  # nbytes: each rank's block
        inp = torch.ones(count)
        out = torch.empty(count * n)
        outs = list(out.chunk(n))
        return {"vemesh": lambda: g.all_gather(out, inp),
                "torch": (lambda: dist.all_gather(outs, inp)) if dist else None}
    if op == "reduce_scatter":  # nbytes: the input, as for all_reduce
        inp = torch.ones(count - count % n)
        out = torch.empty(inp.numel() // n)
        return {"vemesh": lambda: g.reduce_scatter(out, inp), "torch": None}
    raise SystemExit(f"unknown op {op!r}")


def timed(fn, calls):
    g.barrier()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    took = np.array([(time.perf_counter() - start) / calls], np.float64)
    g.all_reduce(took, op="max")
    return float(took[0])


pairs = []
for op in args.ops.split(","):
    for size in (int(s) for s in args.sizes.split(",")):
        forms = {k: v for k, v in make(op, size).items() if v is not None}
        one = timed(forms["vemesh"], 3)  # warm-up and a first estimate
        for f in forms.values():
            timed(f, 3)
        calls = np.array([max(5, min(2000, int(args.budget / max(one, 1e-6))))],
                         np.int64)
        g.broadcast(calls, 0)
        pairs.append((op, size, forms, int(calls[0]), {k: [] for k in forms}))

for r in range(args.rounds):
    for op, size, forms, calls, samples in pairs:
        order = list(forms)
        if r % 2:
            order.reverse()
        for k in order:
            samples[k].append(timed(forms[k], calls))

if g.rank() == 0:
    print(f"{n} ranks, backend {g.backend}, {args.rounds} rounds, "
          f"load {open('/proc/loadavg').read().split()[:3]}")
    print("| op | bytes | calls | vemesh us median (min-max) | "
          "torch gloo us median (min-max) | vemesh / torch |")
    print("|---|---:|---:|---:|---:|---:|")
    for op, size, forms, calls, samples in pairs:
        cells = []
        med = {}
        for k in ("vemesh", "torch"):
            if k not in samples:
                cells.append("—")
                continue
            s = [x * 1e6 for x in samples[k]]
            med[k] = statistics.median(s)
            cells.append(f"{med[k]:.0f} ({min(s):.0f}-{max(s):.0f})")
        ratio = (f"{med['vemesh'] / med['torch']:.2f}" if "torch" in med
                 else "—")
        print(f"| {op} | {size} | {calls} | {cells[0]} | {cells[1]} | {ratio} |")
if dist:
    dist.destroy_process_group()
