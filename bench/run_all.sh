#!/usr/bin/env bash
# Makes every table of bench/RESULTS.md, printing each with the command that
# made it. Each table is one process or one mpirun job, so its ratios compare
# runs made side by side on the same (noisy) machine.
#
#   bench/run_all.sh [build dir] [output dir]
#   QUICK=1 bench/run_all.sh build/h6   # fewer repetitions
#
# Needs the bench targets built (cmake --build <build> --target
# vemesh_bench_queries vemesh_bench_scale vemesh_bench_init
# vemesh_bench_collectives).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
build=${1:-build}
out=${2:-$build/bench-results}
bin=$build/bench
mkdir -p "$out"

# The MPI environment of the project's MPI tests: root allowed,
# oversubscription, shared memory between the ranks of this one host.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_btl=self,vader,tcp
export OMPI_MCA_btl_vader_single_copy_mechanism=none
export OMPI_MCA_btl_tcp_if_include=lo OMPI_MCA_oob_tcp_if_include=lo
mpirun=(mpirun --oversubscribe --bind-to none)

if [[ -n ${QUICK:-} ]]; then
  q_reps=3; s_reps=1; i_reps=7; c_reps=9
else
  q_reps=10; s_reps=3; i_reps=21; c_reps=31
fi

run() {  # prints the command, then runs it (to stdout, or to file $to)
  echo
  echo "\$ $*${to:+ > $to}"
  if [[ -n ${to:-} ]]; then "$@" > "$to"; else "$@"; fi
}

commit=$(git -C "$here" rev-parse --short HEAD 2>/dev/null || echo "no git")
echo "# vemesh benchmark tables ($(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores, commit $commit)"

echo; echo "## 1. Queries"
to=$out/queries.txt run "$bin/queries" --benchmark_enable_random_interleaving=true \
  --benchmark_repetitions=$q_reps --benchmark_min_time=0.05 \
  --benchmark_report_aggregates_only=true \
  --benchmark_out_format=json --benchmark_out="$out/queries.json"
echo "\$ bench/report.py queries $out/queries.json"
python3 "$here/report.py" queries "$out/queries.json"

echo; echo "## 2. Memory and planning at scale"
to=$out/scale.txt run "$bin/scale" --benchmark_repetitions=$s_reps \
  --benchmark_report_aggregates_only=true \
  --benchmark_out_format=json --benchmark_out="$out/scale.json"
echo "\$ bench/report.py scale $out/scale.json"
python3 "$here/report.py" scale "$out/scale.json"

echo; echo "## 3. Communicator set-up"
for np in 4 8 16; do
  run "${mpirun[@]}" -n $np "$bin/init" --reps=$i_reps
done

echo; echo "## 4. Collective overhead"
for np in 4 8; do
  run "${mpirun[@]}" -n $np "$bin/collectives" --reps=$c_reps
done

echo; echo "## 5. Backends: Gloo vs MPI on the same job"
for np in 4 8; do
  run "${mpirun[@]}" -n $np "$bin/backends" --reps=$((c_reps / 3 + 1))
done

echo; echo "## 6. The TCP store: 1,024-client rendezvous and round trips"
run "$bin/store_rendezvous" --reps=$s_reps
