#!/usr/bin/env bash
# Sockets per rank after creating a cpu mesh under env:// (issue 32): at 8,
# 16 and 32 ranks (meshes (2,2,2), (2,2,4), (2,4,4)), every rank's sockets
# other than the rendezvous store's are at most the sum over dimensions of
# (group size - 1) plus a small constant (socket_probe.cc checks it and says
# OVER), so they do not grow with the world for a fixed group shape.
#
#   socket_count.sh path/to/socket_probe [worlds...]
set -u
probe=$1; shift
here=$(cd "$(dirname "$0")" && pwd)
worlds=("$@")
if [[ ${#worlds[@]} -eq 0 ]]; then worlds=(8 16 32); fi
declare -A shapes=([8]=2,2,2 [16]=2,2,4 [32]=2,4,4)
failed=0
for n in "${worlds[@]}"; do
  out=$(bash "$here/spawn_env.sh" --limit 150 "$n" "$probe" "${shapes[$n]}" 2>&1)
  rc=$?
  lines=$(grep -c '^sockets rank .*: OK$' <<<"$out")
  max=$(grep -o '[0-9]* groups' <<<"$out" | sort -n | tail -1)
  rank0=$(grep '^sockets rank 0:' <<<"$out")
  echo "world $n mesh (${shapes[$n]}): $lines of $n ranks within the bound; most: $max; $rank0"
  if ((rc != 0 || lines != n)); then
    echo "$out" | grep -v ': OK$' | head -20
    failed=1
  fi
done
if ((failed)); then echo "FAIL [socket_count]"; exit 1; fi
echo "PASS [socket_count]"
