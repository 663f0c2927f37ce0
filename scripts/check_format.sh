#!/usr/bin/env bash
# Checks that every C++ file under vemesh/, tools/, python/, examples/, tests/
# and bench/ is formatted as the repository's .clang-format says (Google
# style, 80 columns). Changes nothing: lists the files that differ and exits
# 1 if there are any, 0 if none. To format one file: clang-format -i FILE.
#
#   bash scripts/check_format.sh            # every C++ folder
#   bash scripts/check_format.sh vemesh/layout   # only some folders
set -u
cd "$(dirname "$0")/.."
command -v clang-format >/dev/null ||
  { echo "check_format: clang-format not found" >&2; exit 2; }
dirs=("$@")
[ ${#dirs[@]} -eq 0 ] && dirs=(vemesh tools python examples tests bench)
differ=0
total=0
while IFS= read -r -d '' f; do
  total=$((total + 1))
  if ! clang-format --dry-run -Werror "$f" >/dev/null 2>&1; then
    echo "$f"
    differ=$((differ + 1))
  fi
done < <(find "${dirs[@]}" -type f \( -name '*.h' -o -name '*.cc' \) -print0 | sort -z)
if [ "$differ" -ne 0 ]; then
  echo "check_format: $differ of $total files differ from .clang-format" >&2
  exit 1
fi
echo "check_format: $total files formatted"
