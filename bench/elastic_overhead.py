#!/usr/bin/env python3
"""Steady-state cost of the elastic mode (issue 47 item 5, "no per-step tax").

Two jobs on the same transports, alternated in one session so that the
machine's noise hits both alike, at each replica count R:

  plain    mpirun -n R train_nd --mesh PP=1,DP=R,TP=1 --replicate_backend=gloo
           (a static job: DP on Gloo, the rest on the launch's MPI)
  elastic  R x (mpirun -n 1 train_nd --mesh PP=1,DP=R,TP=1 --elastic
           redis://127.0.0.1:PORT --replica K): one launch per replica, DP on
           the elastic mesh's Gloo group, plus each step's verdict (end_step)

  agree    the elastic job with --agree_every_step: end_step's all_reduce
           over DP every step (the protocol before issue 47's fold)
  plain_tcp  the plain job with VEMESH_GLOO_SHM=0: its DP group on Gloo's
           TCP pairs only, as the elastic epoch's DP group is (one host)
  elastic_hb8  the elastic job with an 8 s lease (heartbeat every 2 s)

--tp N gives each replica N ranks (TP=N); with --hsdp they are DP_SHARD=N
instead (FSDP HYBRID_SHARD, AdamW: the issue's HSDP job), and both jobs sum
the loss over DP_SHARD, then DP_REPLICATE.

The first job named is the ratios' base. Each elastic run's step lines also
give the loop's parts ("verdict V ms; snapshot P ms; train H ms"): printed as
"verdict" and "parts" lines (medians over steps, then over runs).

Both train the same model, batch and steps without overlap (the elastic loop
runs DP after the replica's own work). A run's figure is the median of its
leader's per-step "time" lines after the first fifth (warm-up); each pair's
ratio is elastic / plain. Every process it starts (Redis, each mpirun) is
ended by its PID, never by name.

  elastic_overhead.py TRAIN_ND [--replicas 3,8] [--repeats 3] [--steps 200]
      [--tp N] [--hsdp] [--jobs plain,plain_tcp,elastic,elastic_hb8,agree]
  elastic_overhead.py TRAIN_ND --smoke      # one short pair at R=2 (ctest)

Prints one "pair" line per run pair, one "bench" line per R (median of the
pairs' ratios, its min..max, the medians of both jobs' step times, the
per-step difference in ms) and the load (/proc/loadavg) around each run.
Ends with "PASS: elastic overhead" or "FAIL: ...". No timing is asserted.
"""
import argparse
import collections
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

PLAIN_STEP = re.compile(r"^step +(\d+)/\d+ +loss \S+ +time +([\d.]+) ms")
ELASTIC_STEP = re.compile(r"^step (\d+)/\d+ loss \S+ time ([\d.]+) ms DP=(\d+)"
                          r"(?: at \d+ ms; verdict ([\d.]+) ms)?"
                          r"(?:; snapshot ([\d.]+) ms; train ([\d.]+) ms)?")
MPI_ENV = {
    "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
    "OMPI_MCA_rmaps_base_oversubscribe": "1",
    "OMPI_MCA_btl_tcp_if_include": "lo", "OMPI_MCA_oob_tcp_if_include": "lo",
    "OMPI_MCA_btl": "self,vader,tcp",
    "OMPI_MCA_btl_vader_single_copy_mechanism": "none",
    # More ranks than cores: a rank waiting in MPI yields.
    "OMPI_MCA_mpi_yield_when_idle": "1",
}


# (job, R) -> per run, the median of end_step's own time ("verdict V ms").
VERDICTS = collections.defaultdict(list)
# (job, R) -> per run, the medians of the loop's snapshot (the copy for an
# undo) and of the step hook alone ("snapshot S ms; train T ms").
PARTS = collections.defaultdict(list)


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def loadavg():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def model_args(a, r):
    # --hsdp: the HSDP job, FSDP over each replica's ranks and AdamW.
    mesh = (f"PP=1,DP_REPLICATE={r},DP_SHARD={a.tp},TP=1" if a.hsdp
            else f"PP=1,DP={r},TP={a.tp}")
    hsdp = ["--optimizer", "adam"] if a.hsdp else []
    return ["--mesh", mesh] + hsdp + ["--layers", str(a.layers),
            "--hidden", str(a.hidden), "--batch", str(a.batch),
            "--micro_batches", "1", "--steps", str(a.steps),
            "--overlap=false"]


def steady_median(times, steps):
    """Median step time after the warm-up (the first fifth)."""
    kept = [t for s, t in times if s > steps // 5]
    return statistics.median(kept) if kept else float("nan")


def end_all(procs):
    for p in procs:
        if p.poll() is None:
            try:
                os.kill(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        p.wait()


def run_plain(a, r, work, tag, tcp=False):
    kind = "plain_tcp" if tcp else "plain"
    out = os.path.join(work, f"{kind}_{tag}.out")
    cmd = ["mpirun", "-n", str(r * a.tp), "--bind-to", "none", a.train_nd,
           "--replicate_backend=gloo"] + model_args(a, r)
    # plain_tcp: the DP group on Gloo's TCP pairs only, as the elastic
    # mesh's DP groups are (elastic_establish.cc: no shared memory).
    env = {**os.environ, **MPI_ENV}
    if tcp:
        env["VEMESH_GLOO_SHM"] = "0"
        cmd[1:1] = ["-x", "VEMESH_GLOO_SHM"]
    with open(out, "w") as f:
        p = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env)
    try:
        rc = p.wait(timeout=a.bound)
    except subprocess.TimeoutExpired:
        rc = "hung"
    end_all([p])
    text = open(out, errors="replace").read()
    if rc != 0 or "PASS:" not in text or "gloo" not in text:
        return None, f"plain R={r} ({tag}) exited {rc}; see {out}"
    times = [(int(m.group(1)), float(m.group(2)))
             for m in map(PLAIN_STEP.match, text.splitlines()) if m]
    return steady_median(times, a.steps), None


def run_elastic(a, r, work, port, tag, agree_every_step=False, kind=None):
    procs, outs = [], []
    kind = kind or ("agree" if agree_every_step else "elastic")
    # elastic_hb8: the heartbeat thread's Redis round trips 32x rarer
    # (lease 8 s, renewed every 2 s instead of every 250 ms).
    extra = ["--heartbeat_ms=8000"] if kind == "elastic_hb8" else []
    for k in range(r):
        out = os.path.join(work, f"{kind}_{tag}_r{k}.out")
        cmd = ["mpirun", "-n", str(a.tp), "--bind-to", "none", a.train_nd,
               "--elastic", f"redis://127.0.0.1:{port}", "--job",
               f"overhead_{kind}_{tag}", "--replica", str(k),
               f"--agree_every_step={str(agree_every_step).lower()}",
               # Every replica in the first epoch (an 8 s lease would
               # otherwise let the job form before the last one arrives).
               f"--min_replicas={r}"] + extra + model_args(a, r)
        with open(out, "w") as f:
            procs.append(subprocess.Popen(cmd, stdout=f,
                                          stderr=subprocess.STDOUT,
                                          env={**os.environ, **MPI_ENV}))
        outs.append(out)
    deadline = time.time() + a.bound
    rcs = []
    for p in procs:
        try:
            rcs.append(p.wait(timeout=max(1, deadline - time.time())))
        except subprocess.TimeoutExpired:
            rcs.append("hung")
    end_all(procs)
    text = open(outs[0], errors="replace").read()
    if any(rc != 0 for rc in rcs) or "PASS:" not in text:
        return None, f"{kind} R={r} ({tag}) exited {rcs}; see {outs[0]}"
    times, verdicts, snaps, trains = [], [], [], []
    for m in map(ELASTIC_STEP.match, text.splitlines()):
        # At full strength only (DP counts every data-parallel rank: R x
        # DP_SHARD with --hsdp).
        if m and int(m.group(3)) == r * (a.tp if a.hsdp else 1):
            s = int(m.group(1))
            times.append((s, float(m.group(2))))
            if m.group(4) is not None:
                verdicts.append((s, float(m.group(4))))
            if m.group(5) is not None:
                snaps.append((s, float(m.group(5))))
                trains.append((s, float(m.group(6))))
    VERDICTS[(kind, r)].append(steady_median(verdicts, a.steps))
    if snaps:
        PARTS[(kind, r)].append((steady_median(snaps, a.steps),
                                 steady_median(trains, a.steps)))
    return steady_median(times, a.steps), None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("train_nd")
    ap.add_argument("--replicas", default="3,8")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--batch", type=int, default=240,
                    help="divisible by every replica count (times --tp with "
                    "--hsdp)")
    ap.add_argument("--bound", type=float, default=300,
                    help="seconds one run may take before it counts as hung")
    ap.add_argument("--tp", type=int, default=1,
                    help="ranks per replica (TP inside each replica)")
    ap.add_argument("--hsdp", action="store_true",
                    help="the --tp ranks per replica are DP_SHARD instead "
                    "(FSDP HYBRID_SHARD over DP_REPLICATE x DP_SHARD, AdamW)")
    ap.add_argument("--jobs", default="plain,elastic",
                    help="of plain, plain_tcp (plain with VEMESH_GLOO_SHM=0: "
                    "DP on Gloo's TCP pairs, as the elastic mesh's), elastic, "
                    "elastic_hb8 (elastic, heartbeat every 2 s), "
                    "agree (elastic with "
                    "--agree_every_step: the agreement over DP every step, "
                    "as before issue 47's fold)")
    ap.add_argument("--smoke", action="store_true")
    a = ap.parse_args()
    if a.smoke:
        a.replicas, a.repeats, a.steps, a.hidden = "2", 1, 10, 16
    per_replica = a.tp if a.hsdp else 1  # the batch is split over DP
    bad = [r for r in map(int, a.replicas.split(","))
           if a.batch % (r * per_replica)]
    if bad:
        print(f"FAIL: --batch={a.batch} is not divisible by the data-parallel "
              f"size at --replicas {bad[0]}: expected a multiple of "
              f"{bad[0] * per_replica}")
        return 1
    # SIGTERM (a ctest timeout) ends the processes too, by their PIDs.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    for tool in ("redis-server", "mpirun"):
        if shutil.which(tool) is None:
            print(f"FAIL: {tool} not found")
            return 1
    work = tempfile.mkdtemp(prefix="vemesh_overhead.")
    port = free_port()
    redis = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save",
         "", "--appendonly", "no", "--protected-mode", "no", "--logfile",
         os.path.join(work, "redis.log")])
    failures = []
    print(f"model: {a.layers}x{a.hidden}, batch {a.batch}, {a.steps} steps, "
          f"no overlap; median of steps > {a.steps // 5}")
    try:
        for _ in range(50):
            try:
                socket.create_connection(("127.0.0.1", port), 0.1).close()
                break
            except OSError:
                time.sleep(0.1)
        jobs = a.jobs.split(",")
        base = jobs[0]  # the ratios' denominator
        for r in [int(x) for x in a.replicas.split(",")]:
            runs = []  # one {job: ms} per repeat
            for i in range(a.repeats):
                # Rotate which job goes first.
                order = jobs[i % len(jobs):] + jobs[:i % len(jobs)]
                got = {}
                for job in order:
                    before = loadavg()
                    tag = f"R{r}_{i}"
                    if job in ("plain", "plain_tcp"):
                        ms, err = run_plain(a, r, work, tag,
                                            job == "plain_tcp")
                    else:
                        ms, err = run_elastic(a, r, work, port, tag,
                                              job == "agree", job)
                    if err:
                        failures.append(err)
                        continue
                    got[job] = ms
                    print(f"run R={r} #{i} {job}: median {ms:.3f} ms/step; "
                          f"load {before} -> {loadavg()}", flush=True)
                if base in got and len(got) == len(jobs):
                    runs.append(got)
                    print(f"set R={r} #{i}: " + ", ".join(
                        f"{j} {got[j]:.3f} ms" for j in jobs) + "; " +
                        ", ".join(f"{j}/{base} {got[j] / got[base]:.3f}"
                                  for j in jobs if j != base), flush=True)
            if not runs:
                continue
            for j in jobs:
                if j == base:
                    continue
                ratios = [g[j] / g[base] for g in runs]
                diffs = [g[j] - g[base] for g in runs]
                plain = statistics.median(g[base] for g in runs)
                mine = statistics.median(g[j] for g in runs)
                vs = [v for v in VERDICTS[(j, r)] if v == v]
                if vs:
                    print(f"verdict R={r} {j}: end_step median of runs "
                          f"{statistics.median(vs):.3f} ms (min {min(vs):.3f}, "
                          f"max {max(vs):.3f}); share of its step "
                          f"{statistics.median(vs) / statistics.median(g[j] for g in runs):.4f}",
                          flush=True)
                parts = PARTS.get((j, r), [])
                if parts:
                    print(f"parts R={r} {j}: snapshot median of runs "
                          f"{statistics.median(p[0] for p in parts):.3f} ms "
                          f"(max {max(p[0] for p in parts):.3f}); step hook "
                          f"{statistics.median(p[1] for p in parts):.3f} ms "
                          f"(min {min(p[1] for p in parts):.3f}, max "
                          f"{max(p[1] for p in parts):.3f})", flush=True)
                print(f"bench R={r}: {j}/{base} "
                      f"{statistics.median(ratios):.3f} (min "
                      f"{min(ratios):.3f}, max {max(ratios):.3f}, "
                      f"{len(runs)} sets); {base} {plain:.3f} ms/step, {j} "
                      f"{mine:.3f} ms/step; difference "
                      f"{statistics.median(diffs):.3f} ms/step (min "
                      f"{min(diffs):.3f}, max {max(diffs):.3f})", flush=True)
    finally:
        os.kill(redis.pid, signal.SIGKILL)
        redis.wait()
    for f in failures:
        print(f"FAIL: {f}")
    if failures:
        print(f"kept {work}")
        return 1
    shutil.rmtree(work, ignore_errors=True)
    print("PASS: elastic overhead")
    return 0


if __name__ == "__main__":
    sys.exit(main())
