#!/usr/bin/env python3
"""Turns Google Benchmark JSON from bench/queries and bench/scale into the
markdown tables of bench/RESULTS.md.

Times are CPU times: on a shared machine a single-threaded loop is often
descheduled, and wall time then measures the other tenants, not the code.

  bench/report.py queries queries.json
  bench/report.py scale scale.json
"""
import json
import sys
from collections import defaultdict


def medians(path):
    """{benchmark name: {world: (cpu_time, unit, counters)}}, medians over
    repetitions (or the single run when there were none)."""
    with open(path) as f:
        data = json.load(f)
    out = defaultdict(dict)
    # Registration order (family_index), whatever order the runs came in.
    data["benchmarks"].sort(key=lambda b: b.get("family_index", 0))
    have_aggregates = any(b.get("run_type") == "aggregate"
                          for b in data["benchmarks"])
    skip = {"name", "run_name", "run_type", "family_index",
            "per_family_instance_index", "repetitions", "repetition_index",
            "threads", "iterations", "real_time", "cpu_time", "time_unit",
            "aggregate_name", "aggregate_unit", "items_per_second",
            "error_occurred", "error_message"}
    for b in data["benchmarks"]:
        if have_aggregates and b.get("aggregate_name") != "median":
            continue
        if b.get("error_occurred"):
            continue
        family, _, arg = b["run_name"].partition("/world:")
        counters = {k: v for k, v in b.items() if k not in skip}
        out[family.removeprefix("BM_")][int(arg)] = (
            b["cpu_time"], b["time_unit"], counters)
    return data["context"], out


def queries(path):
    context, rows = medians(path)
    worlds = sorted({w for r in rows.values() for w in r})
    head = " | ".join(f"{w:,} ranks" for w in worlds)
    print(f"| query | {head} | max/min | all < 10 ns | flat (< 1.5) |")
    print("|---|" + "---:|" * len(worlds) + "---:|:-:|:-:|")
    for name, r in rows.items():
        ns = [r[w][0] for w in worlds if w in r]
        cells = " | ".join(
            f"{r[w][0]:,.1f}" if w in r else "-" for w in worlds)
        ratio = max(ns) / min(ns)
        print(f"| {name} | {cells} | {ratio:,.2f} | "
              f"{'yes' if max(ns) < 10 else 'no'} | "
              f"{'yes' if ratio < 1.5 else 'no'} |")
    print(f"\n(CPU ns per call, medians over repetitions; host {context.get('host_name')}, "
          f"{context.get('num_cpus')} CPUs, {context.get('mhz_per_cpu')} MHz)")


def scale(path):
    _, rows = medians(path)
    worlds = sorted({w for r in rows.values() for w in r})

    def cell(family, what, fmt):
        def get(w):
            r = rows.get(family, {}).get(w)
            if r is None:
                return "-"
            t, unit, counters = r
            return fmt(t, unit, counters)
        return get

    def time_in(unit_out):
        scale_to = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}

        def f(t, unit, _):
            return f"{t * scale_to[unit] / scale_to[unit_out]:,.3f}"
        return f

    def counter(name):
        return lambda t, unit, c: f"{int(c.get(name, 0)):,}"

    columns = [
        ("default layout: memory_bytes()",
         cell("Layout_CreateDefault", "", counter("layout_bytes"))),
        ("default layout: heap measured",
         cell("Layout_CreateDefault", "", counter("heap_bytes"))),
        ("explicit rank list: heap measured",
         cell("Layout_CreateExplicit", "", counter("heap_bytes"))),
        ("registry (meta): heap measured",
         cell("Registry_InitMeta", "", counter("heap_bytes"))),
        ("init_device_mesh(\"meta\") us",
         cell("Registry_InitMeta", "", time_in("us"))),
        ("MeshLayout::Create (default) us",
         cell("Layout_CreateDefault", "", time_in("us"))),
        ("groups({\"TP\"}) ms", cell("Layout_GroupsTP", "", time_in("ms"))),
        ("groups({\"DP\"}) ms", cell("Layout_GroupsDP", "", time_in("ms"))),
        ("get_global_tensor_parallel_meshes() ms",
         cell("Registry_GlobalTensorParallelMeshes", "", time_in("ms"))),
    ]
    print("| world | " + " | ".join(c[0] for c in columns) + " |")
    print("|---:|" + "---:|" * len(columns))
    for w in worlds:
        print(f"| {w:,} | " + " | ".join(c[1](w) for c in columns) + " |")


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("queries", "scale"):
        sys.exit(__doc__)
    {"queries": queries, "scale": scale}[sys.argv[1]](sys.argv[2])
