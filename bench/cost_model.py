#!/usr/bin/env python3
"""Cost model of mesh creation, 1,024 to 131,072 ranks (bench/RESULTS.md).

Counts, per rank, the message rounds on the critical path and the bytes each
rank receives, for three ways of making every per-dimension group of a 3-D
(PP, DP, TP=8) mesh, then turns them into time with a per-round latency
fitted to this machine's 4-rank floor (alpha) and an assumed bandwidth
(beta). Run: python3 bench/cost_model.py [alpha_us] [GB_per_s]

  python3 bench/cost_model.py --worlds 8:2x2x2,16:2x4x2,32:2x4x4,64:4x4x4
prints instead, per rank, what the model says one vemesh creation (steady
state, the MPI path) uses at those worlds: collective calls by kind, rounds,
bytes received, sockets vemesh opens, store operations: the figures that
`mpirun -n N build/release/bench/init --shapes=... --counts` measures
(calls, sockets, store operations) to check the model against.

Per collective (Open MPI 4.1, P ranks, L = ceil(log2 P)):
  MPI_Comm_split   allgather of (color, key) over the parent, L rounds, 8P B;
                   then the context id: 2 allreduces (nextcid) + 1 (activate),
                   3L rounds                                  -> 4L rounds, 8P B
  MPI_Comm_idup    nextcid + activate                         -> 3L rounds, ~0 B
  Iallgather       256-byte block per rank (recursive doubling / Bruck)
                                                              -> L rounds, 256P B
  MPI_Comm_create_group  (vemesh since issue 32: one per dimension,
                   collective over the group of s ranks only): the context
                   id agreed by tagged allreduces over the group (nextcid's
                   2 + activate's 1), each a reduce and a broadcast on a
                   tree, 2 ceil(log2 s) rounds           -> 6 log2(s) rounds, ~0 B
  MPI_Comm_create  (one per sub-group, collective over the world):
                   nextcid + activate                         -> 3L rounds, ~0 B
  Every new communicator also has a fixed cost on each of its ranks that no
  round counts (Open MPI selects and initialises the collective modules of
  each communicator: mca_coll_base_comm_select, ~4.6 us of one rank's CPU at
  1 rank here). It is modelled as COMM_FIXED_ROUNDS rounds' worth of time
  per communicator a rank makes, fitted (least squares, 0.1 steps) to the
  measured ratio "vemesh's MPI calls by hand / floor" at 8-64 ranks
  (RESULTS.md, issue 32: 1.07, 1.14, 0.91, 1.26, medians of 6 runs): 19.
  The ratio is 4 communicators (3 groups + the world's idup) over the
  floor's 3, so it can only move between the rounds' 0.83 (k = 0) and 4/3
  (k large); the four worlds alone give k from 4 to 140 (noise of the
  loaded runs), and the fit leaves a scatter of 0.14 in the ratio.
  ncclCommSplit    NCCL's bootstrap all-gather of (color, key) over the
                   parent is a socket ring: P-1 steps (a bidirectional ring,
                   P/2, in the newest NCCL); then the child's own init: its
                   bootstrap ring and ~2 all-gathers of peer and topology
                   info inside the group, ~3(s-1) steps, ~4 KB per peer.
"""
import math
import sys

SHAPES = {1024: (4, 32, 8), 4096: (4, 128, 8), 16384: (8, 256, 8),
          65536: (16, 512, 8), 131072: (16, 1024, 8)}
# Rounds' worth of time per communicator a rank makes (see above).
COMM_FIXED_ROUNDS = 19.2
# The meshes bench/init times at 8-64 ranks (RESULTS.md, issue 32).
SMALL = "8:2x2x2,16:2x4x2,32:2x4x4,64:4x4x4"


def log2(n):
    return math.ceil(math.log2(n)) if n > 1 else 0


def vemesh_mpi(P, shape):
    """One vemesh creation under mpirun, steady state, per rank: calls by
    kind, rounds, bytes received, sockets vemesh opens, store operations.
    The agreement gather and the world's idup span the world; each
    dimension's group is made over its members (MPI_Comm_create_group).
    MPI carries everything over its own transport (shared memory on a
    host, its own connections between hosts): vemesh opens no socket and
    uses no store on this path."""
    L = log2(P)
    calls = {"Iallgather": 1, "Comm_idup": 1, "Comm_create_group": len(shape)}
    # Communicators made (each pays COMM_FIXED_ROUNDS): the world's idup
    # and one per dimension.
    rounds = L + 3 * L + sum(6 * log2(s) for s in shape)
    return calls, rounds, 256 * P, 0, 0


def model(P, shape):
    """Per method: (rounds, bytes received, collective calls, communicators
    a rank makes)."""
    L = math.ceil(math.log2(P))
    D = len(shape)
    rows = {}
    rows["split (floor)"] = (D * 4 * L, D * 8 * P, D, D)
    calls, rounds, nbytes, _, _ = vemesh_mpi(P, shape)
    rows["vemesh (steady state)"] = (rounds, nbytes, sum(calls.values()),
                                     D + 1)
    rows["vemesh, first init in a process"] = (3 * L + rounds, nbytes,
                                               sum(calls.values()) + 1, D + 2)
    rows["vemesh until issue 32 (a world split per dim)"] = (
        L + 3 * L + D * 4 * L, 256 * P + D * 8 * P, D + 2, D + 1)
    groups = sum(P // s for s in shape)
    # A rank is a member of (makes) one group per dimension.
    rows["every-group (MPI_Comm_create / new_group)"] = (groups * 3 * L, 0,
                                                         groups, D)
    ring = D * (P - 1) + sum(3 * (s - 1) for s in shape)
    rows["PyTorch split path (split_group -> ncclCommSplit per dim)"] = (
        ring, D * 8 * P + sum(3 * 4096 * (s - 1) for s in shape), D, D)
    return rows


def modelled_time(rounds, nbytes, comms, alpha, beta):
    return (rounds + comms * COMM_FIXED_ROUNDS) * alpha + nbytes * beta


def print_worlds(spec):
    """--worlds 8:2x2x2,...: the model's per-rank counts, as bench/init
    --counts prints the measured ones."""
    print("| ranks | mesh | collective calls | by kind | rounds | bytes "
          "received | sockets vemesh opens | store operations | rounds / "
          "floor's (ndim world splits) | time / floor's, with the fixed "
          "cost per communicator |")
    print("|---|---|---:|---|---:|---:|---:|---:|---:|---:|")
    for item in spec.split(","):
        world, _, text = item.partition(":")
        P = int(world)
        shape = tuple(int(x) for x in text.split("x"))
        if math.prod(shape) != P:
            sys.exit(f"--worlds: mesh {text} has {math.prod(shape)} ranks, "
                     f"not {P}")
        calls, rounds, nbytes, sockets, store = vemesh_mpi(P, shape)
        kinds = " + ".join(f"{n} {k}" for k, n in calls.items())
        floor = len(shape) * 4 * log2(P)
        # Bytes are ignored here (shared memory; 2-16 KB).
        timed = ((rounds + (len(shape) + 1) * COMM_FIXED_ROUNDS) /
                 (floor + len(shape) * COMM_FIXED_ROUNDS))
        print(f"| {P:,} | {shape} | {sum(calls.values())} | {kinds} | "
              f"{rounds} | {nbytes:,} B | {sockets} | {store} | "
              f"{rounds / floor:.2f} | {timed:.2f} |")


def main():
    if len(sys.argv) > 1 and sys.argv[1].startswith("--worlds"):
        spec = (sys.argv[1].partition("=")[2] or
                (sys.argv[2] if len(sys.argv) > 2 else SMALL))
        print_worlds(spec)
        return
    alpha = float(sys.argv[1]) * 1e-6 if len(sys.argv) > 1 else 4.7e-6
    beta = 1 / (float(sys.argv[2]) * 1e9) if len(sys.argv) > 2 else 1 / 10e9
    print(f"alpha {alpha * 1e6:.1f} us per round, {1 / beta / 1e9:.0f} GB/s, "
          f"{COMM_FIXED_ROUNDS} rounds' time per communicator made")
    print("| ranks (shape) | method | collective calls per rank | rounds | "
          "bytes received per rank | modelled time | / floor |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for P, shape in SHAPES.items():
        rows = model(P, shape)
        floor = None
        for name, (rounds, nbytes, calls, comms) in rows.items():
            t = modelled_time(rounds, nbytes, comms, alpha, beta)
            floor = floor or t
            label = f"{P:,} {shape}"
            print(f"| {label} | {name} | {calls:,} | {rounds:,} | "
                  f"{nbytes / 1e6:.2f} MB | {t * 1e3:,.1f} ms | {t / floor:.2f} |")


if __name__ == "__main__":
    main()
