#!/usr/bin/env python3
"""Checks placement_probe's output against where the ranks really ran.

    check_probe.py [--world N] [--expect-hosts H] [--expect-ranks-per-host R]
                   [--expect-crossing TP=0,DP=0,PP=4] [--expect-placement]
                   [--expect-warnings TP=1]
                   [FILE]          (default: stdin)

Reads every "PROBE rank=R hostname=H host_local_rank=L host_size=S
group.DIM=r,r,..." line (one per rank) and, if present, rank 0's
"PLACEMENT {json}" line. The truth is the hostnames (the emulated host each
rank's process really ran in); from them it computes each host's ranks,
each rank's index among its host's ranks in global-rank order, and for
every dimension how many of its groups span more than one host. Then it
asserts that vemesh's view (host_local_rank, host_size, the PLACEMENT JSON)
matches, and the expected facts given on the command line.
--expect-warnings counts vemesh's placement warnings ("warning: TP is
latency-sensitive but ... cross hosts") per dimension; with it, a warning
for a dimension it does not list is a mismatch too. Prints every
mismatch and exits 1 if there is one; prints "PASS: ..." and exits 0
otherwise.
"""
import argparse
import json
import re
import sys


def parse_counts(text):
    out = {}
    for item in filter(None, text.split(",")):
        name, _, value = item.partition("=")
        out[name.strip()] = int(value)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("file", nargs="?")
    ap.add_argument("--world", type=int)
    ap.add_argument("--expect-hosts", type=int)
    ap.add_argument("--expect-ranks-per-host", type=int)
    ap.add_argument("--expect-crossing", type=parse_counts, default={})
    ap.add_argument("--expect-warnings", type=parse_counts)
    ap.add_argument("--expect-placement", action="store_true",
                    help="fail when rank 0 printed no PLACEMENT line")
    args = ap.parse_args()
    text = open(args.file).read() if args.file else sys.stdin.read()

    errors = []
    probes = {}   # rank -> {key: value}
    placement = None
    dim_order = []
    warnings = {}
    for line in text.splitlines():
        m = re.search(r"warning: (\w+) is latency-sensitive", line)
        if m:
            warnings[m.group(1)] = warnings.get(m.group(1), 0) + 1
        if "PROBE_ERROR" in line:
            errors.append(f"a rank failed: {line.strip()}")
            continue
        m = re.search(r"\bPLACEMENT (\{.*\})\s*$", line)
        if m:
            if placement is not None:
                errors.append("more than one PLACEMENT line (only rank 0 prints it)")
            try:
                placement = json.loads(m.group(1))
            except ValueError as e:
                errors.append(f"PLACEMENT is not JSON ({e}): {m.group(1)}")
            continue
        m = re.search(r"\bPROBE (rank=.*)$", line)
        if not m:
            continue
        fields = dict(kv.split("=", 1) for kv in m.group(1).split())
        rank = int(fields["rank"])
        if rank in probes:
            errors.append(f"rank {rank} printed two PROBE lines")
        probes[rank] = fields
        dims = [k[len("group."):] for k in fields if k.startswith("group.")]
        if not dim_order:
            dim_order = dims
        elif dims != dim_order:
            errors.append(f"rank {rank} has dimensions {dims}, rank 0 {dim_order}")

    world = args.world if args.world is not None else len(probes)
    missing = sorted(set(range(world)) - set(probes))
    extra = sorted(set(probes) - set(range(world)))
    if missing:
        errors.append(f"no PROBE line from ranks {missing} (of {world})")
    if extra:
        errors.append(f"PROBE lines from ranks {extra} outside 0..{world - 1}")
    if missing or not probes:
        # Without every rank's line the truth itself is unknown.
        for e in errors + ([] if probes else ["no PROBE lines at all"]):
            print(f"FAIL: {e}", file=sys.stderr)
        print(text[-4000:], file=sys.stderr)
        return 1

    ranks = sorted(probes)
    host_of = {r: probes[r]["hostname"] for r in ranks}
    hosts = []  # in order of their lowest global rank
    for r in ranks:
        if host_of[r] not in hosts:
            hosts.append(host_of[r])
    on_host = {h: [r for r in ranks if host_of[r] == h] for h in hosts}

    # Host-local rank and host size: vemesh's view against the truth.
    for r in ranks:
        h = host_of[r]
        want_size, want_local = len(on_host[h]), on_host[h].index(r)
        got_size = int(probes[r]["host_size"])
        got_local = int(probes[r]["host_local_rank"])
        if got_size != want_size:
            errors.append(f"rank {r} on {h}: host_size={got_size}, but {want_size} "
                          f"ranks ran on {h} ({on_host[h]})")
        if got_local != want_local:
            errors.append(f"rank {r} on {h}: host_local_rank={got_local}, but it is "
                          f"number {want_local} of {h}'s ranks {on_host[h]}")

    # Groups: every member reports the same group; count crossing groups.
    crossing, groups_of = {}, {}
    for d in dim_order:
        groups = set()
        for r in ranks:
            g = tuple(int(x) for x in probes[r][f"group.{d}"].split(","))
            if r not in g:
                errors.append(f"rank {r}'s {d} group {list(g)} does not contain it")
            for member in g:
                if member in probes and probes[member][f"group.{d}"] != probes[r][f"group.{d}"]:
                    errors.append(f"{d}: rank {r} says its group is {list(g)}, member "
                                  f"{member} says {probes[member]['group.' + d]}")
            groups.add(g)
        groups_of[d] = groups
        crossing[d] = sum(1 for g in groups
                          if len({host_of.get(m, f'?{m}') for m in g}) > 1)

    # Expected facts from the command line.
    if args.expect_hosts is not None and len(hosts) != args.expect_hosts:
        errors.append(f"ranks ran on {len(hosts)} hosts {hosts}, expected {args.expect_hosts}")
    if args.expect_ranks_per_host is not None:
        for h in hosts:
            if len(on_host[h]) != args.expect_ranks_per_host:
                errors.append(f"{h} ran {len(on_host[h])} ranks {on_host[h]}, expected "
                              f"{args.expect_ranks_per_host}")
    for d, want in args.expect_crossing.items():
        if d not in crossing:
            errors.append(f"--expect-crossing names {d}, not a dimension ({dim_order})")
        elif crossing[d] != want:
            errors.append(f"{d}: {crossing[d]} of {len(groups_of[d])} groups cross hosts, "
                          f"expected {want}")

    if args.expect_warnings is not None:
        for d in sorted(set(args.expect_warnings) | set(warnings)):
            want, got = args.expect_warnings.get(d, 0), warnings.get(d, 0)
            if want != got:
                errors.append(f"{got} placement warnings for {d}, expected {want}")

    # vemesh's own placement report, when printed.
    if placement is None:
        if args.expect_placement:
            errors.append("rank 0 printed no PLACEMENT line")
    else:
        want = {
            "vemesh_placement": 1,
            "world_size": world,
            "hosts": hosts,
            "rank_hosts": [hosts.index(host_of[r]) for r in ranks],
        }
        for key, value in want.items():
            if placement.get(key) != value:
                errors.append(f"PLACEMENT {key}={placement.get(key)!r}, truth {value!r}")
        mesh = placement.get("mesh", {})
        if mesh.get("dim_names") != dim_order:
            errors.append(f"PLACEMENT mesh.dim_names={mesh.get('dim_names')}, probe {dim_order}")
        pdims = placement.get("dims", [])
        if [e.get("name") for e in pdims] != dim_order:
            errors.append(f"PLACEMENT dims {[e.get('name') for e in pdims]}, probe {dim_order}")
        for e in pdims:
            d = e.get("name")
            if d not in crossing:
                continue
            sizes = {len(g) for g in groups_of[d]}
            truth = {"group_count": len(groups_of[d]),
                     "group_size": sizes.pop() if len(sizes) == 1 else sorted(sizes),
                     "crossing_groups": crossing[d]}
            for key, value in truth.items():
                if e.get(key) != value:
                    errors.append(f"PLACEMENT dims[{d}].{key}={e.get(key)!r}, truth {value!r}")
            i = dim_order.index(d)
            shape = mesh.get("shape", [])
            if i < len(shape) and shape[i] != truth["group_size"]:
                errors.append(f"PLACEMENT mesh.shape[{i}]={shape[i]}, {d} groups have "
                              f"{truth['group_size']} ranks")

    summary = (f"{world} ranks on {len(hosts)} hosts "
               + " ".join(f"{h}:{on_host[h]}" for h in hosts)
               + "; crossing " + ",".join(f"{d}={crossing[d]}" for d in dim_order)
               + ("; PLACEMENT checked" if placement is not None else "")
               + (f"; warnings {warnings}" if args.expect_warnings is not None else ""))
    if errors:
        for e in errors:
            print(f"FAIL: {e}", file=sys.stderr)
        print(f"(seen: {summary})", file=sys.stderr)
        return 1
    print(f"PASS: {summary}")
    return 0


sys.exit(main())
