#!/usr/bin/env bash
# The main job's build (library + train_nd, release, Ninja, -j2, no ccache)
# file by file against unity batches, side by side, ROUNDS times alternating,
# each from an empty build folder; then the ten heaviest translation units
# of the last build of each (from Ninja's log). bench/RESULTS.md section 16.
#
#   bash bench/compile_time.sh [ROUNDS] [SCRATCH]   # default 1, /tmp/vemesh_compile
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-1}
scratch=${2:-/tmp/vemesh_compile}
mkdir -p "$scratch"
# ccache would serve the second build from the first.
export CCACHE_DISABLE=1
unset CMAKE_CXX_COMPILER_LAUNCHER

build() {  # build <name> <unity ON|OFF>: prints the wall seconds
  local dir=$scratch/$1
  rm -rf "$dir"
  cmake --preset release -B "$dir" -DVEMESH_UNITY_BUILD="$2" -DVEMESH_BUILD_TESTS=OFF \
    -DVEMESH_BUILD_BENCH=OFF >/dev/null
  local start=$(date +%s.%N)
  cmake --build "$dir" --target train_nd -j 2 >/dev/null
  echo "$(date +%s.%N) - $start" | bc
}

heaviest() {  # the ten longest compile steps of a build folder
  awk 'NR > 1 && $4 ~ /\.o$/ {printf "%6.1f s  %s\n", ($2 - $1) / 1000, $4}' \
    "$scratch/$1/.ninja_log" | sort -rn | head -10
}

echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
for ((r = 1; r <= rounds; ++r)); do
  a=$(build files OFF)
  b=$(build unity ON)
  printf 'round %d: file by file %.1f s, unity %.1f s, ratio %.2f (load %s)\n' \
    "$r" "$a" "$b" "$(echo "$b / $a" | bc -l)" "$(cut -d' ' -f1 /proc/loadavg)"
done
echo "--- ten heaviest, file by file"
heaviest files
echo "--- ten heaviest, unity batches"
heaviest unity
