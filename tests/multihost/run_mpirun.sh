#!/usr/bin/env bash
# One MPI job across emulated hosts: makes HOSTS hosts (hosts.sh), writes a
# hostfile with SLOTS slots each, and runs `mpirun` inside node0, reaching
# the others through nsrsh, with Open MPI's TCP traffic (data and
# out-of-band) on the hosts' own interface. Bounded: mpirun is ended after
# LIMIT seconds, and every host (with whatever still runs there) is torn
# down on exit.
#
#   run_mpirun.sh [--hosts 2] [--slots 4] [--map-by slot|node] [--limit 60]
#                 [--check "check_probe.py args"] [--expect REGEX] program [args...]
#
# --expect REGEX: the output must match it (grep -E), e.g. train_nd's
# "PASS: loss curve".
# --check pipes the job's output through check_probe.py with those
# arguments (the job's exit code and the checker's must both be 0).
set -u
here=$(cd "$(dirname "$0")" && pwd)
hosts=2 slots=4 map_by=slot limit=60 check="" expect=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --hosts) hosts=$2; shift 2 ;;
    --slots) slots=$2; shift 2 ;;
    --map-by) map_by=$2; shift 2 ;;
    --limit) limit=$2; shift 2 ;;
    --check) check=$2; shift 2 ;;
    --expect) expect=$2; shift 2 ;;
    *) break ;;
  esac
done
# shellcheck source=hosts.sh
source "$here/hosts.sh"
mh_require_root_or_skip
mh_up "$hosts" || { echo "FAIL: could not make $hosts emulated hosts"; exit 1; }
hostfile=$(mh_hostfile "$slots")
np=$((hosts * slots))

# Open MPI's TCP on the hosts' interface only; ranks yield (hosts.sh).
mh_mpi_env
out="$MH_STATE/job.out"
echo "run_mpirun: $hosts hosts x $slots slots, --map-by $map_by, np=$np: $*"
start=$SECONDS
mh_exec node0 timeout -k 5 "$limit" \
  mpirun --mca plm_rsh_agent "$MH_RSH" --hostfile "$hostfile" \
         --map-by "$map_by" --bind-to none -np "$np" "$@" >"$out" 2>&1
rc=$?
cat "$out"
echo "run_mpirun: mpirun exited $rc after $((SECONDS - start)) s"
if ((rc == 124 || rc == 137)); then
  echo "FAIL: the job did not end within ${limit}s"
fi
mh_verdict "$rc" "$out" "$np" "$check" "$expect"
