#!/usr/bin/env bash
# Builds the libFuzzer targets (preset 'fuzz') and runs each one for
# VEMESH_FUZZ_SECONDS (default 15) from its seed corpus in fuzz/corpus/.
# New inputs go to a scratch directory, never into the repository; a crash
# leaves its input under build/fuzz/artifacts/ and fails the script.
# Prints one line per target: executions, coverage, corpus size.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${VEMESH_FUZZ_SECONDS:-15}
targets="mesh_spec_fuzzer mesh_layout_fuzzer store_request_fuzzer store_auth_fuzzer membership_fuzzer
         job_descriptor_fuzzer plan_input_fuzzer checkpoint_manifest_fuzzer safetensors_header_fuzzer"

cmake --preset fuzz >/dev/null
# Only the fuzz targets: the rest of the preset (MPI library, CLI) is not
# fuzzed and would cost build time.
cmake --build --preset fuzz --target $targets

artifacts=build/fuzz/artifacts
mkdir -p "$artifacts"
# Two targets at a time (2 cores): each still fuzzes for its full time.
fuzz_one() {
  local t=$1 work log rc=0
  work=$(mktemp -d)
  log=build/fuzz/$t.log
  # Scratch corpus first (libFuzzer writes there), the seeds second.
  build/fuzz/fuzz/$t -max_total_time="$seconds" -print_final_stats=1 \
      -artifact_prefix="$artifacts/$t-" -rss_limit_mb=2048 -timeout=10 \
      "$work" "fuzz/corpus/$t" >"$log" 2>&1 || rc=$?
  local execs cov
  execs=$(grep -o 'stat::number_of_executed_units: [0-9]*' "$log" | grep -o '[0-9]*$' || echo "?")
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | grep -o '[0-9]*$' || echo "?")
  echo "vemesh: fuzz $t: $execs executions in ${seconds}s, $cov coverage edges," \
       "$(ls "$work" | wc -l) new corpus inputs, status $([ $rc = 0 ] && echo clean || echo FAILED)"
  if [ $rc != 0 ]; then
    echo "vemesh: fuzz $t FAILED; last lines of $log:"
    tail -40 "$log"
  fi
  rm -rf "$work"
  return $rc
}

status=0
pids=()
for t in $targets; do
  echo "=== vemesh: fuzz $t for ${seconds}s"
  fuzz_one "$t" &
  pids+=($!)
  if [ ${#pids[@]} = 2 ]; then
    wait "${pids[0]}" || status=1
    pids=("${pids[1]}")
  fi
done
for p in "${pids[@]}"; do
  wait "$p" || status=1
done
exit $status
