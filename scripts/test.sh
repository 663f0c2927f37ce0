#!/usr/bin/env bash
# Builds vemesh and runs every test: unit tests, multi-rank MPI tests, the
# training example's checks, the benchmark smoke runs and the consumer check,
# in each build of VEMESH_TEST_PRESETS (default: release, then the sanitizers).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh

# Open MPI refuses root and more ranks than cores unless told; CI runs as root
# on 2 cores.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1

presets=${VEMESH_TEST_PRESETS:-release}
for preset in $presets; do
  echo "=== vemesh: build and test, preset '$preset'"
  cmake --preset "$preset" >/dev/null
  cmake --build --preset "$preset"
  ctest --preset "$preset" --no-tests=error
done
