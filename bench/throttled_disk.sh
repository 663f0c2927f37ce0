#!/usr/bin/env bash
# bench/throttled_disk.sh MBPS DIR COMMAND...
#
# Runs COMMAND with reads of the block device that holds DIR limited to MBPS
# megabytes per second (cgroup v1 blkio throttle; root only). Why: on a VM
# whose host caches the virtual disk, a "cold" read after posix_fadvise
# (DONTNEED) is served at memory speed, so a checkpoint load can never be
# disk-bound there; a throttled device is a disk of known speed, the same
# for the baseline read and the load measured in one job. Writes are not
# limited. The cgroup is made for the run and removed after it.
set -euo pipefail
if (($# < 3)); then
  echo "usage: $0 MBPS DIR COMMAND..." >&2
  exit 2
fi
mbps=$1 dir=$2
shift 2
[[ $mbps =~ ^[1-9][0-9]*$ ]] || {
  echo "throttled_disk: MBPS must be a positive integer, got '$mbps'" >&2
  exit 2
}
root=/sys/fs/cgroup/blkio
[[ -w $root ]] || {
  echo "throttled_disk: $root is not writable (needs root and cgroup v1 blkio)" >&2
  exit 2
}
# The whole disk that holds DIR (a partition's parent), as MAJ:MIN.
src=$(df --output=source "$dir" | tail -1)
disk=$(lsblk -no PKNAME "$src" 2>/dev/null | head -1)
[[ -n $disk ]] || disk=$(basename "$src")
[[ -b /dev/$disk ]] || disk=$(lsblk -dno NAME | grep -v '^zram' | head -1)
dev=$(lsblk -dno MAJ:MIN "/dev/$disk" | tr -d ' ')
group=$root/vemesh_throttle_$$
mkdir "$group"
trap 'for _ in 1 2 3 4 5 6 7 8 9 10; do rmdir "$group" 2>/dev/null && break; sleep 0.2; done' EXIT
echo "$dev $((mbps * 1000000))" >"$group/blkio.throttle.read_bps_device"
echo "throttled_disk: reads of /dev/$disk ($dev) limited to $mbps MB/s" >&2
# The command runs in a child shell moved into the group first.
bash -c 'echo $$ >"$1/cgroup.procs"; shift; exec "$@"' _ "$group" "$@"
