"""Two env:// jobs on one MASTER_PORT, started 0-50 ms apart (promise 18).

Usage: job_race.py <launch_probe> <mode> [seconds] [max_trials]

mode: "ids"   each job has its own VEMESH_JOB_ID
      "noids" the launcher gives no identity (the jobs' environments are
              alike but for the probe's value)
      "token" each job has its own VEMESH_STORE_TOKEN

Each trial starts job A (2 ranks, VEMESH_PROBE_VALUE=1) and, 0-50 ms later,
job B (2 ranks, VEMESH_PROBE_VALUE=1000) on the same free port. Each rank's
all_reduce sums its job's values, so a mesh mixing the jobs sums wrong. A
trial passes when each job either forms alone (both its ranks OK) or fails
on every rank with an error naming the conflict (the port, the other job, a
rank claimed twice, the token); never OK on one rank and not the other,
never a wrong sum, never a bare timeout. Runs trials until `seconds` pass
(default 50) or max_trials (default 200); prints PASS [race.<mode>] and the
counts, or FAIL with the first bad trial's lines.
"""
import os
import random
import re
import socket
import subprocess
import sys
import time

CONFLICT = re.compile(
    r"could not host the store|claimed twice|belongs to job|token|"
    r"another job")


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def start(probe, port, rank, job, mode):
    env = dict(os.environ)
    for name in ("TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "VEMESH_JOB_ID",
                 "VEMESH_STORE_TOKEN", "VEMESH_STORE_TOKEN_FILE"):
        env.pop(name, None)
    env.update(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank),
               LOCAL_WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(port), VEMESH_BOOTSTRAP="env",
               VEMESH_PROBE_VALUE="1" if job == "A" else "1000",
               VEMESH_PROBE_HOLD_MS="150")
    if mode == "ids":
        env["VEMESH_JOB_ID"] = "race-job-" + job
    elif mode == "token":
        env["VEMESH_STORE_TOKEN"] = "token-of-" + job
    return subprocess.Popen([probe, "2"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def verdict(lines):
    """'formed', 'failed' or a reason the job's outcome is wrong."""
    ok = [l for l in lines if re.search(r": OK \(", l)]
    if len(ok) == len(lines):
        return "formed"
    if ok:
        return "mixed outcome: some ranks OK, some not"
    bad = [l for l in lines if not CONFLICT.search(l)]
    if bad:
        return "a rank failed without naming the conflict"
    return "failed"


def main():
    probe, mode = sys.argv[1], sys.argv[2]
    seconds = float(sys.argv[3]) if len(sys.argv) > 3 else 50
    max_trials = int(sys.argv[4]) if len(sys.argv) > 4 else 200
    rng = random.Random(29)
    counts = {}
    trials = 0
    failures = 0
    keep_going = os.environ.get("RACE_KEEP_GOING") == "1"  # count them all
    end = time.monotonic() + seconds
    while time.monotonic() < end and trials < max_trials:
        port = free_port()
        offset = rng.uniform(0, 0.05)
        first, second = ("A", "B") if trials % 2 == 0 else ("B", "A")
        procs = {}
        for rank in (0, 1):
            procs[(first, rank)] = start(probe, port, rank, first, mode)
        time.sleep(offset)
        for rank in (1, 0):
            procs[(second, rank)] = start(probe, port, rank, second, mode)
        out = {}
        for key, p in procs.items():
            try:
                text, _ = p.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                text, _ = p.communicate()
                text += " (killed after 30 s)"
            out[key] = [l for l in text.splitlines() if "probe rank" in l] or [
                "no probe line: " + text.strip()[-300:]]
        trials += 1
        outcome = []
        for job in ("A", "B"):
            lines = out[(job, 0)] + out[(job, 1)]
            v = verdict(lines)
            if any("wrong sum" in l for l in lines):
                v = "a mixed mesh: " + v
            if v not in ("formed", "failed"):
                failures += 1
                if keep_going:
                    outcome.append(v)
                    continue
                print("FAIL [race.%s] trial %d (offset %.0f ms, %s first): job %s: %s"
                      % (mode, trials, offset * 1000, first, job, v))
                for key in sorted(out):
                    print("  job %s rank %d: %s" % (key[0], key[1], " | ".join(out[key])))
                return 1
            outcome.append(v)
        counts[tuple(outcome)] = counts.get(tuple(outcome), 0) + 1
        # Both forming is right when the first ended (its port free again)
        # before the second's rank 0 started: each sum checked its own job.
    summary = ", ".join("A %s/B %s: %d" % (k[0], k[1], v)
                        for k, v in sorted(counts.items()))
    if failures:
        print("FAIL [race.%s] %d of %d trials bad (%s)" % (mode, failures, trials, summary))
        return 1
    print("PASS [race.%s] %d trials in %.0f s (%s)"
          % (mode, trials, seconds - max(0, end - time.monotonic()), summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
