#!/usr/bin/env bash
# Builds vemesh and runs every test: unit tests, multi-rank MPI tests, the
# training example's checks, the benchmark smoke runs and the consumer check,
# in each build of VEMESH_TEST_PRESETS (default: release, then ASan+UBSan and
# TSan), then the fuzzers (scripts/fuzz.sh). Prints each step's time.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh

# Open MPI refuses root and more ranks than cores unless told; CI runs as root
# on 2 cores.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1

presets=${VEMESH_TEST_PRESETS:-release asan tsan}
timings=()
for preset in $presets; do
  echo "=== vemesh: build and test, preset '$preset'"
  start=$SECONDS
  cmake --preset "$preset" >/dev/null
  cmake --build --preset "$preset"
  built=$SECONDS
  ctest --preset "$preset" --no-tests=error
  timings+=("preset $preset: build $((built - start))s, test $((SECONDS - built))s")
  echo "=== vemesh: ${timings[-1]}"
done

# libFuzzer targets, each for VEMESH_FUZZ_SECONDS (default 60); VEMESH_FUZZ=0
# skips them.
if [ "${VEMESH_FUZZ:-1}" != 0 ]; then
  start=$SECONDS
  bash scripts/fuzz.sh
  timings+=("fuzz: $((SECONDS - start))s")
fi
printf '=== vemesh: %s\n' "${timings[@]}"
