#!/usr/bin/env bash
# Recovery and re-admission times of the reconfigurable mesh, measured on
# the fault tests' own jobs (tests/elastic/elastic_job.sh: 3 replicas x 2
# ranks of train_nd, Redis on loopback, heartbeat TTL 1 s, op timeout 2 s):
#
#   bash bench/elastic_recovery.sh build/release/examples/train_nd/train_nd [RUNS]
#
# dp_kill: replica 1 SIGKILLs itself before the DP all_reduce of step 10.
# From the fault's timestamp: the first survivor's failed step, the new
# epoch agreed and built (recover() returns), the first good step after;
# steps rolled back; the mean step time at DP=3 (before) and DP=2 (after),
# the baseline being the same job's own steps. rejoin: the relaunched
# replica's launch -> its admission (epoch 3 built on the survivors).
set -euo pipefail
bin=$1; runs=${2:-5}
here=$(cd "$(dirname "$0")/.." && pwd)
for scenario in dp_kill rejoin; do
  for i in $(seq "$runs"); do
    out=$(ELASTIC_KEEP=1 bash "$here/tests/elastic/elastic_job.sh" "$bin" "$scenario")
    dir=$(sed -n 's/^kept //p' <<<"$out")
    grep -q "PASS: elastic $scenario" <<<"$out" || { echo "$out"; exit 1; }
    python3 - "$dir" "$scenario" <<'PY'
import re, sys, glob, statistics as st
d, scenario = sys.argv[1], sys.argv[2]
def lines(name):
    return open(f"{d}/{name}.out", errors="replace").read().splitlines()
def at(line):
    return int(re.search(r"at (\d+) ms", line).group(1))
if scenario == "dp_kill":
    fault = min(at(l) for l in lines("r1") if "fault:" in l)
    failed, rebuilt, first_good, before, after, rolled = [], [], [], [], [], []
    for r in ("r0", "r2"):
        L = lines(r)
        fail_i = next(i for i, l in enumerate(L) if re.match(r"step \d+ failed", l))
        mem_i = next(i for i, l in enumerate(L) if l.startswith("membership: epoch 2"))
        failed.append(at(L[fail_i]) - fault)
        rebuilt.append(at(L[mem_i]) - fault)
        good = next(l for l in L[mem_i:] if re.match(r"step \d+/", l))
        first_good.append(at(good) - fault)
        times = [(i, float(re.search(r"time ([\d.]+) ms", l).group(1)))
                 for i, l in enumerate(L) if re.match(r"step \d+/", l)]
        before += [t for i, t in times if i < fail_i][-8:]
        after += [t for i, t in times if i > mem_i][1:9]
        last = max(int(re.match(r"step (\d+)/", l).group(1)) for l in L[:fail_i] if re.match(r"step \d+/", l))
        resume = int(re.search(r"resume at step (\d+)", L[mem_i]).group(1))
        rolled.append(last - resume)
        agreed = float(re.search(r"agreed in ([\d.]+) ms", L[mem_i]).group(1))
        built = float(re.search(r"built in ([\d.]+) ms", L[mem_i]).group(1))
    print(f"dp_kill: kill->first survivor error {min(failed)} ms; "
          f"->recovered (epoch agreed {agreed:.0f} ms + groups built {built:.0f} ms) "
          f"{max(rebuilt)} ms; ->first good step {max(first_good)} ms; "
          f"steps rolled back {max(rolled)}; step time DP=3 {st.mean(before):.2f} ms, "
          f"DP=2 {st.mean(after):.2f} ms (ratio {st.mean(after)/st.mean(before):.2f})")
else:
    L = lines("r1b")
    mem = next(l for l in L if l.startswith("membership: epoch 3"))
    L0 = lines("r0")
    mem0 = next(l for l in L0 if l.startswith("membership: epoch 3"))
    built = float(re.search(r"built in ([\d.]+) ms", mem0).group(1))
    agreed = float(re.search(r"agreed in ([\d.]+) ms", mem0).group(1))
    print(f"rejoin: survivors' growth epoch agreed in {agreed:.1f} ms, built in "
          f"{built:.1f} ms; joiner admitted at {at(mem)} ms, "
          f"survivors resumed at {at(mem0)} ms (difference {at(mem0) - at(mem)} ms)")
PY
    rm -rf "$dir"
  done
done
