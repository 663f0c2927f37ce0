#!/usr/bin/env bash
# Kill -> first good step of the reconfigurable mesh, split into the phases
# of the survivors' recovery record (detect, agree, rebuild, state), at 3 and
# 8 replicas (one train_nd process each, Redis on loopback, heartbeat TTL
# 1 s), with the quorum round (the default) and with leases alone
# (train_nd --lease_detection: the way before issue 28) in the same run:
#
#   bash bench/elastic_kill.sh build/release/examples/train_nd/train_nd [KILLS]
#
# One kill at a time on a job at full strength (tests/elastic/chaos_soak.py
# --mode bench): a random replica SIGKILLed, the survivors' first good step
# timed from the kill (the line's at=UNIX_MS against the kill's clock), the
# replica launched again and trained before the next kill.
set -euo pipefail
bin=$1; kills=${2:-20}
here=$(cd "$(dirname "$0")/.." && pwd)
for n in 3 8; do
  for mode in "" --lease; do
    python3 "$here/tests/elastic/chaos_soak.py" "$bin" --mode bench \
      --replicas "$n" --kills "$kills" $mode | grep -E "^bench|FAIL"
  done
done
