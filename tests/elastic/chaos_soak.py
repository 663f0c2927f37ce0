#!/usr/bin/env python3
"""Chaos soak and kill benchmark of train_nd --elastic (issue 28).

N replicas of train_nd (one process each, no launcher) meet through a Redis
that this script starts on loopback. Every process it starts (Redis, each
replica) is ended by its PID, never by name, also when it fails.

  chaos_soak.py TRAIN_ND --mode soak --replicas 3 --kills 200 --stops 20
  chaos_soak.py TRAIN_ND --mode bench --replicas 8 --kills 20 [--lease]

soak: jobs one after another until the kills and stops are spent; in each,
whole replicas are SIGKILLed at random moments (start-up: a relaunched
replica before it is admitted; steps; recovery: a second kill right after a
first; state transfer: a joiner as soon as it is admitted; shutdown: in the
job's last steps) and SIGSTOPped for 50 ms to 2.5 s, each killed or evicted
replica launched again. Asserts: 0 hangs (every process ends within its
bound), every replica's last launch ends PASS (its loss curve equal to the
serial run's, parameters identical across the replicas). Prints the
distribution of kill -> first good step (the first survivor's "recovery:
... at=UNIX_MS" after a kill with no other event in between).

bench: one kill at a time on a job at full strength: kill a random
replica, wait for the survivors' first good step, launch it again, wait
until it trains, next. Prints median and p99 of kill -> first good step and
of each phase of the survivors' recovery record. --lease: the survivors
detect the loss by the lease alone (train_nd --lease_detection).
--hsdp: each replica is an mpirun of 2 ranks (x --tp), FSDP over
DP_SHARD=2 with AdamW, DP_REPLICATE elastic (issue 47); --kill rank then
SIGKILLs one rank of the replica (one GPU failing) and leaves the rest to
its launcher, --kill replica (the default) every rank of it, --kill mixed
either at random (in soak mode: the kills during steps). SIGSTOP stops
every rank of the replica.
Ends with "PASS: chaos soak" / "PASS: kill bench" or "FAIL: ...".
"""
import argparse
import os
import random
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

REC = re.compile(r"^recovery: detect ([\d.]+) ms, agree ([\d.]+) ms, "
                 r"rebuild ([\d.]+) ms, state ([\d.]+) ms; first good step "
                 r"(\d+) at=(\d+)$")


STDBUF = ["stdbuf", "-oL"] if shutil.which("stdbuf") else []


# Divisible by every DP size the job can shrink to (twice that for
# --hsdp: DP_SHARD=2).
def batch_for(n):
    return 24 if n <= 3 else 840


def now_ms():
    return int(time.time() * 1000)


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def pct(values, q):
    v = sorted(values)
    if not v:
        return float("nan")
    return v[min(len(v) - 1, int(round(q / 100.0 * (len(v) - 1))))]


class Job:
    def __init__(self, a, work, port, name, steps):
        self.a, self.work, self.port, self.name = a, work, port, name
        self.steps = steps
        self.procs = {}     # slot -> Popen (the current launch)
        self.files = {}     # slot -> its output file
        self.launches = {}  # slot -> count
        self.stopped = set()
        self.all = []       # every (Popen, deadline) started

    def launch(self, k):
        n = self.launches.get(k, 0) + 1
        self.launches[k] = n
        path = os.path.join(self.work, f"{self.name}_r{k}_{n}.out")
        # Line-buffered (stdbuf): the script reads the step lines as they
        # come, not 4 KiB later.
        tp = self.a.tp
        mesh = (f"PP=1,DP_REPLICATE={self.a.replicas},DP_SHARD=2,TP={tp}"
                if self.a.hsdp else f"PP=1,DP={self.a.replicas},TP=1")
        launcher = (["mpirun", "-n", str(2 * tp), "--bind-to", "none"]
                    if self.a.hsdp else [])
        cmd = STDBUF + launcher + [
               self.a.train_nd, "--mesh", mesh,
               "--batch", str(batch_for(self.a.replicas) * (2 if self.a.hsdp else 1)), "--micro_batches", "1",
               "--steps", str(self.steps), "--elastic",
               f"redis://127.0.0.1:{self.port}", "--job", self.name,
               "--replica", str(k), "--heartbeat_ms", "1000",
               "--op_timeout_ms", "2000", "--pace_ms", str(self.a.pace_ms)]
        if self.a.lease:
            cmd.append("--lease_detection")
        if self.a.hsdp:
            cmd += ["--optimizer", "adam"]
        f = open(path, "w")
        p = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT)
        f.close()
        self.procs[k], self.files[k] = p, path
        self.all.append(p)
        return p

    def text(self, k):
        try:
            with open(self.files[k], errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def alive(self, k):
        return k in self.procs and self.procs[k].poll() is None

    def trained(self, k):
        """Admitted and committed a step: it holds the state."""
        return self.alive(k) and re.search(r"^step \d+/", self.text(k),
                                           re.M) is not None

    def max_step(self):
        best = 0
        for k in self.procs:
            for m in re.finditer(r"^step (\d+)/", self.text(k), re.M):
                best = max(best, int(m.group(1)))
        return best

    def ranks(self, k):
        """The PIDs of replica k's ranks (an mpirun's children, by PID)."""
        out = subprocess.run(["pgrep", "-P", str(self.procs[k].pid)],
                             capture_output=True, text=True).stdout
        return [int(x) for x in out.split()]

    def signal(self, k, sig):
        """Sends `sig` to every rank of replica k (SIGSTOP, SIGCONT)."""
        for pid in (self.ranks(k) if self.a.hsdp else []) + \
                [self.procs[k].pid]:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass

    def kill(self, k, one_rank=False):
        """SIGKILLs replica k (every rank), or one rank of it, whose
        launcher then ends the rest at its own pace."""
        ranks = self.ranks(k) if self.a.hsdp else []
        if one_rank and ranks:
            victims = [ranks[-1]]
        else:
            victims = ranks + [self.procs[k].pid]
        t = now_ms()
        for pid in victims:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.procs[k].wait()
        self.stopped.discard(k)
        return t

    def end_all(self):
        for p in self.all:
            if p.poll() is None:
                out = subprocess.run(["pgrep", "-P", str(p.pid)],
                                     capture_output=True, text=True).stdout
                for pid in [int(x) for x in out.split()] + [p.pid]:
                    try:
                        os.kill(pid, signal.SIGCONT)
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                p.wait()

    def records(self):
        """(at_ms, slot, phases) of every recovery line printed."""
        out = []
        for name in os.listdir(self.work):
            m = re.match(rf"{re.escape(self.name)}_r(\d+)_\d+\.out$", name)
            if not m:
                continue
            with open(os.path.join(self.work, name), errors="replace") as f:
                for line in f:
                    r = REC.match(line.strip())
                    if r:
                        out.append((int(r.group(6)), int(m.group(1)),
                                    [float(r.group(i)) for i in range(1, 5)]))
        return sorted(out)


def wait_until(cond, seconds):
    end = time.time() + seconds
    while time.time() < end:
        if cond():
            return True
        time.sleep(0.01)
    return False


def soak(a, work, port):
    rng = random.Random(a.seed)
    kills = stops = 0
    failures = []
    events = []     # (ms, "kill"/"stop"/"cont", job, slot)
    kill_times = []  # (ms, job)
    jobs = []
    j = 0
    t0 = time.time()
    while (kills < a.kills or stops < a.stops) and \
            time.time() - t0 < a.time_limit:
        j += 1
        job = Job(a, work, port, f"soak{j}", a.steps)
        jobs.append(job)
        for k in range(a.replicas):
            job.launch(k)
        shutdown_kill = rng.random() < 0.3
        try:
            # Start-up: sometimes kill a starting replica before the job forms.
            if rng.random() < 0.2 and kills < a.kills:
                time.sleep(rng.uniform(0, 0.3))
                k = rng.randrange(a.replicas)
                events.append((job.kill(k), "kill", j, k))
                kills += 1
                time.sleep(rng.uniform(0, 0.3))
                job.launch(k)
            wait_until(lambda: job.max_step() >= 1, 30)
            while job.max_step() < 0.85 * a.steps and \
                    (kills < a.kills or stops < a.stops):
                time.sleep(rng.uniform(0.05, 0.3))
                # Relaunch whoever ended (killed or evicted).
                for k in range(a.replicas):
                    if not job.alive(k) and job.procs[k].returncode != 0:
                        job.launch(k)
                trained = [k for k in range(a.replicas)
                           if job.trained(k) and k not in job.stopped]
                if len(trained) < 2:
                    continue
                moment = rng.choice(["step", "step", "recovery", "transfer",
                                     "startup", "stop"])
                if moment == "stop" and stops < a.stops:
                    k = rng.choice(trained)
                    job.signal(k, signal.SIGSTOP)
                    events.append((now_ms(), "stop", j, k))
                    job.stopped.add(k)
                    stops += 1
                    time.sleep(rng.uniform(0.05, 2.5))
                    job.signal(k, signal.SIGCONT)
                    job.stopped.discard(k)
                    events.append((now_ms(), "cont", j, k))
                    continue
                if kills >= a.kills:
                    continue
                k = rng.choice(trained)
                one = a.kill == "rank" or (a.kill == "mixed" and
                                           rng.random() < 0.5)
                t = job.kill(k, one_rank=one)
                events.append((t, "kill", j, k))
                kill_times.append((t, j))
                kills += 1
                if moment == "recovery" and len(trained) >= 3 and \
                        kills < a.kills:
                    time.sleep(rng.uniform(0, 0.04))
                    k2 = rng.choice([x for x in trained if x != k])
                    events.append((job.kill(k2), "kill", j, k2))
                    kills += 1
                    job.launch(k2)
                time.sleep(rng.uniform(0, 0.3))
                job.launch(k)
                if moment == "startup" and kills < a.kills:
                    time.sleep(rng.uniform(0, 0.3))
                    events.append((job.kill(k), "kill", j, k))
                    kills += 1
                    job.launch(k)
                elif moment == "transfer" and kills < a.kills:
                    # The joiner, as soon as it is admitted (state transfer).
                    if wait_until(lambda: "membership:" in job.text(k), 10):
                        events.append((job.kill(k), "kill", j, k))
                        kills += 1
                        job.launch(k)
            if shutdown_kill and kills < a.kills:
                wait_until(lambda: job.max_step() >= a.steps - 2, 60)
                trained = [k for k in range(a.replicas) if job.trained(k)]
                if len(trained) >= 2:
                    k = rng.choice(trained)
                    events.append((job.kill(k), "kill", j, k))
                    kills += 1
                    job.launch(k)
            # The end: relaunch whoever ended without PASS until none does
            # (a relaunch after the job ended founds a fresh job alone).
            # The bound: --bound, plus the steps left at 150 ms each (the
            # steps and then the serial reference, on a loaded machine).
            left = max(0, a.steps - job.max_step())
            bound = time.time() + a.bound + 0.15 * left
            while time.time() < bound:
                for k in range(a.replicas):
                    p = job.procs[k]
                    if p.poll() is not None and p.returncode == 3:
                        job.launch(k)  # evicted (it was stopped): again
                if all(job.procs[k].poll() is not None
                       for k in range(a.replicas)):
                    break
                time.sleep(0.05)
            for k in range(a.replicas):
                p = job.procs[k]
                if p.poll() is None:
                    failures.append(f"job {j} replica {k}: hung (still "
                                    f"running {a.bound} s after the chaos)")
                elif p.returncode != 0 or \
                        not re.search(r"^PASS: replica .*parameters identical",
                                      job.text(k), re.M):
                    failures.append(f"job {j} replica {k}: exit "
                                    f"{p.returncode}, no PASS "
                                    f"({job.files[k]})")
        finally:
            job.end_all()
        print(f"job {j}: done; kills {kills}/{a.kills}, stops "
              f"{stops}/{a.stops}, failures {len(failures)}", flush=True)
        if failures:
            break
    # Kill -> first good step: the first recovery line after the kill, with
    # no other event between.
    lat = []
    times = sorted(e[0] for e in events)
    recs = {job.name: job.records() for job in jobs}
    for t, j in kill_times:
        later = [x for x in times if x > t]
        nxt = later[0] if later else float("inf")
        after = [r for r in recs[f"soak{j}"] if t < r[0] < nxt]
        if after:
            lat.append(after[0][0] - t)
    print(f"soak: {kills} kills, {stops} stops in {len(jobs)} jobs, "
          f"{time.time() - t0:.0f} s; kill -> first good step over "
          f"{len(lat)} isolated kills: median {pct(lat, 50):.0f} ms, p99 "
          f"{pct(lat, 99):.0f} ms, max {max(lat) if lat else float('nan')} ms")
    if kills < a.kills or stops < a.stops:
        failures.append(f"only {kills} kills, {stops} stops within "
                        f"--time_limit {a.time_limit} s")
    return failures


def bench(a, work, port):
    rng = random.Random(a.seed)
    job = Job(a, work, port, "bench", 1000000)
    failures = []
    rows = []  # (kill->first good, detect, agree, rebuild, state)
    try:
        for k in range(a.replicas):
            job.launch(k)
        # The step line's DP is the whole data-parallel size (x DP_SHARD).
        full = rf"DP={a.replicas * (2 if a.hsdp else 1)} at"

        def at_full(k):
            lines = re.findall(r"^step \d+/.*$", job.text(k), re.M)
            return bool(lines) and full in lines[-1]
        for i in range(a.kills):
            if not wait_until(lambda: all(at_full(k)
                                          for k in range(a.replicas)), 60):
                failures.append(f"kill {i}: the job never trained at "
                                f"DP={a.replicas}")
                break
            time.sleep(rng.uniform(0.2, 0.4))
            k = rng.randrange(a.replicas)
            seen = {s: len(re.findall(r"^recovery:", job.text(s), re.M))
                    for s in range(a.replicas)}
            t = job.kill(k, one_rank=a.kill == "rank" or (
                a.kill == "mixed" and rng.random() < 0.5))
            survivors = [s for s in range(a.replicas) if s != k]

            def recovered():
                return all(len(re.findall(r"^recovery:", job.text(s), re.M))
                           > seen[s] for s in survivors)
            if not wait_until(recovered, 30):
                failures.append(f"kill {i} (replica {k}): no recovery")
                break
            best = None
            for s in survivors:
                r = [REC.match(x) for x in re.findall(r"^recovery:.*$",
                                                      job.text(s), re.M)]
                r = r[seen[s]]
                row = (int(r.group(6)) - t,
                       *[float(r.group(x)) for x in range(1, 5)])
                if best is None or row[0] < best[0]:
                    best = row
            rows.append(best)
            job.launch(k)
    finally:
        job.end_all()
    if rows:
        cols = list(zip(*rows))
        names = ["kill->first good step", "detect", "agree", "rebuild",
                 "state"]
        mode = "lease" if a.lease else "quorum"
        if a.hsdp:
            mode += f" hsdp-adamw kill={a.kill}"
        print(f"bench {mode} DP={a.replicas}, {len(rows)} kills: " +
              "; ".join(f"{n} median {statistics.median(c):.1f} p99 "
                        f"{pct(c, 99):.1f} ms" for n, c in zip(names, cols)),
              flush=True)
    return failures


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("train_nd")
    ap.add_argument("--mode", choices=["soak", "bench"], default="soak")
    ap.add_argument("--replicas", type=int, default=3)
    ap.add_argument("--kills", type=int, default=200)
    ap.add_argument("--stops", type=int, default=20)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--pace_ms", type=int, default=10)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--lease", action="store_true")
    ap.add_argument("--hsdp", action="store_true")
    ap.add_argument("--kill", choices=["replica", "rank", "mixed"],
                    default="replica")
    ap.add_argument("--tp", type=int, default=1,
                    help="--hsdp: TP inside each replica (ranks 2 x TP)")
    ap.add_argument("--bound", type=float, default=60,
                    help="seconds every process has to end after the chaos")
    ap.add_argument("--time_limit", type=float, default=3600)
    a = ap.parse_args()
    if a.hsdp:
        # Open MPI as root, more ranks than cores, TCP on loopback only.
        os.environ.update(OMPI_ALLOW_RUN_AS_ROOT="1",
                          OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                          OMPI_MCA_rmaps_base_oversubscribe="1",
                          OMPI_MCA_btl_tcp_if_include="lo",
                          OMPI_MCA_oob_tcp_if_include="lo",
                          OMPI_MCA_mpi_yield_when_idle="1")
    # SIGTERM (a ctest timeout) ends the processes too, by their PIDs.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    if shutil.which("redis-server") is None:
        print("FAIL: redis-server not found")
        return 1
    work = tempfile.mkdtemp(prefix="vemesh_chaos.")
    port = free_port()
    redis = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save",
         "", "--appendonly", "no", "--protected-mode", "no", "--logfile",
         os.path.join(work, "redis.log")])
    failures = []
    try:
        def up():
            try:
                socket.create_connection(("127.0.0.1", port), 0.1).close()
                return True
            except OSError:
                return False
        wait_until(up, 5)
        failures = (soak if a.mode == "soak" else bench)(a, work, port)
    finally:
        os.kill(redis.pid, signal.SIGKILL)
        redis.wait()
    what = "chaos soak" if a.mode == "soak" else "kill bench"
    for f in failures:
        print(f"FAIL: {f}")
    if failures:
        print(f"kept {work}")
        return 1
    shutil.rmtree(work, ignore_errors=True)
    print(f"PASS: {what}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
