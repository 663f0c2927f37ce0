#!/usr/bin/env python3
"""Cost model of mesh creation, 1,024 to 65,536 ranks (bench/RESULTS.md §3).

Counts, per rank, the message rounds on the critical path and the bytes each
rank receives, for three ways of making every per-dimension group of a 3-D
(PP, DP, TP=8) mesh, then turns them into time with a per-round latency
fitted to this machine's 4-rank floor (alpha) and an assumed bandwidth
(beta). Run: python3 bench/cost_model.py [alpha_us] [GB_per_s]

Per collective (Open MPI 4.1, P ranks, L = ceil(log2 P)):
  MPI_Comm_split   allgather of (color, key) over the parent, L rounds, 8P B;
                   then the context id: 2 allreduces (nextcid) + 1 (activate),
                   3L rounds                                  -> 4L rounds, 8P B
  MPI_Comm_idup    nextcid + activate                         -> 3L rounds, ~0 B
  Iallgather       256-byte block per rank (recursive doubling / Bruck)
                                                              -> L rounds, 256P B
  MPI_Comm_create  (one per sub-group, collective over the world):
                   nextcid + activate                         -> 3L rounds, ~0 B
  ncclCommSplit    NCCL's bootstrap all-gather of (color, key) over the
                   parent is a socket ring: P-1 steps (a bidirectional ring,
                   P/2, in the newest NCCL); then the child's own init: its
                   bootstrap ring and ~2 all-gathers of peer and topology
                   info inside the group, ~3(s-1) steps, ~4 KB per peer.
"""
import math
import sys

SHAPES = {1024: (4, 32, 8), 4096: (4, 128, 8), 16384: (8, 256, 8),
          65536: (16, 512, 8)}


def model(P, shape):
    L = math.ceil(math.log2(P))
    D = len(shape)
    rows = {}
    rows["split (floor)"] = (D * 4 * L, D * 8 * P, D)
    rows["vemesh (steady state)"] = (L + 3 * L + D * 4 * L,
                                     256 * P + D * 8 * P, D + 2)
    rows["vemesh, first init in a process"] = (3 * L + L + 3 * L + D * 4 * L,
                                               256 * P + D * 8 * P, D + 3)
    groups = sum(P // s for s in shape)
    rows["every-group (MPI_Comm_create / new_group)"] = (groups * 3 * L, 0,
                                                         groups)
    ring = D * (P - 1) + sum(3 * (s - 1) for s in shape)
    rows["PyTorch split path (split_group -> ncclCommSplit per dim)"] = (
        ring, D * 8 * P + sum(3 * 4096 * (s - 1) for s in shape), D)
    return rows


def main():
    alpha = float(sys.argv[1]) * 1e-6 if len(sys.argv) > 1 else 4.7e-6
    beta = 1 / (float(sys.argv[2]) * 1e9) if len(sys.argv) > 2 else 1 / 10e9
    print(f"alpha {alpha * 1e6:.1f} us per round, {1 / beta / 1e9:.0f} GB/s")
    print("| ranks (shape) | method | collective calls per rank | rounds | "
          "bytes received per rank | modelled time | / floor |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for P, shape in SHAPES.items():
        rows = model(P, shape)
        floor = None
        for name, (rounds, nbytes, calls) in rows.items():
            t = rounds * alpha + nbytes * beta
            floor = floor or t
            label = f"{P:,} {shape}"
            print(f"| {label} | {name} | {calls:,} | {rounds:,} | "
                  f"{nbytes / 1e6:.2f} MB | {t * 1e3:,.1f} ms | {t / floor:.2f} |")


if __name__ == "__main__":
    main()
