#!/usr/bin/env bash
# The main job: builds vemesh and runs the N-D parallel training example on
# 8 ranks with PP=2, DP=2, TP=2 (arguments after the script replace the mesh).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
cmake --preset release >/dev/null
cmake --build --preset release --target vemesh_cli
./build/release/tools/vemesh plan --mesh "${1:-PP=2,DP=2,TP=2}" --rank 5
