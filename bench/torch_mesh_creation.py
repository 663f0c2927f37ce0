"""torch 1.13's way to make a mesh's groups under torchrun (gloo), timed like
bench/torchrun_init.cc times vemesh's, for bench/torchrun_creation.sh:

    torchrun --standalone --nproc_per_node=16 --redirects 1 --tee 1 \
        bench/torch_mesh_creation.py 2,2,4 9

torch 1.13 has no DeviceMesh for gloo groups: every rank calls
dist.new_group for every sub-group of every dimension (the pattern of
Megatron, veScale and torch's own DeviceMesh of that time), in the same
order. The world group (init_process_group("gloo")) is made once, untimed,
as vemesh's first (untimed) creation joins the store. Each repetition makes
all the groups after a world barrier; a sample is the slowest rank's time (a
max all_reduce over the world). Rank 0 prints one line.
"""
import os
import sys
import time

import torch
import torch.distributed as dist


def sockets():
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
                count += 1
        except OSError:
            pass
    return count


def groups_of(shape):
    """Every sub-group of every dimension, in one order on every rank."""
    world = 1
    for s in shape:
        world *= s
    strides = [1] * len(shape)
    for d in range(len(shape) - 2, -1, -1):
        strides[d] = strides[d + 1] * shape[d + 1]
    out = []
    for d, size in enumerate(shape):
        seen = set()
        for r in range(world):
            base = r - ((r // strides[d]) % size) * strides[d]
            if base in seen:
                continue
            seen.add(base)
            out.append((d, [base + i * strides[d] for i in range(size)]))
    return out


def main():
    shape = [int(x) for x in sys.argv[1].split(",")]
    reps = int(sys.argv[2]) if len(sys.argv) > 2 else 9
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    plan = groups_of(shape)
    samples = []
    mine = []
    for i in range(reps + 1):
        dist.barrier()
        for g in mine:
            dist.destroy_process_group(g)
        dist.barrier()
        start = time.perf_counter()
        made = [(d, ranks, dist.new_group(ranks, backend="gloo"))
                for d, ranks in plan]
        took = torch.tensor([(time.perf_counter() - start) * 1e3])
        mine = [g for _, ranks, g in made if rank in ranks]
        dist.all_reduce(took, op=dist.ReduceOp.MAX)
        if i > 0:
            samples.append(took.item())
    count = torch.tensor([float(sockets() if rank else 0)])
    dist.all_reduce(count, op=dist.ReduceOp.MAX)
    rank0 = sockets()
    if rank == 0:
        s = sorted(samples)
        print(f"torch world {dist.get_world_size()} mesh ({sys.argv[1]}): "
              f"median {s[len(s) // 2]:.1f} ms of {reps} "
              f"[{' '.join(f'{v:.1f}' for v in samples)}]; sockets per rank "
              f"{int(count.item())} (rank 0: {rank0}, store included)",
              flush=True)
    dist.barrier()


if __name__ == "__main__":
    main()
