#!/usr/bin/env bash
# Installs what a fresh Debian 12 machine lacks for vemesh.
#
#   bash scripts/setup.sh           # build the library, examples and tools, run the main job
#   bash scripts/setup.sh --python  # ... and the Python module (pybind11, numpy)
#   bash scripts/setup.sh --torch   # ... and run it under torchrun (python3-torch)
#   bash scripts/setup.sh --test    # ... and build and run every test (scripts/test.sh)
#
# Idempotent: packages already present are not touched, and `apt-get update`
# runs at most once, only when something is missing. CUDA and NCCL are optional
# and never installed here (they are found under /usr/local/cuda when present).
set -euo pipefail

# The library (absl, MPI, Gloo, hiredis), the strategies (Eigen), the tool
# (nlohmann-json) and the main job's launcher (openmpi-bin; procps for the
# scripts' process handling).
packages=(
  cmake g++ make ninja-build pkg-config
  libabsl-dev
  libopenmpi-dev openmpi-bin
  libgloo-dev
  libhiredis-dev
  libeigen3-dev
  nlohmann-json3-dev
  procps
)
# The Python module (python/, VEMESH_BUILD_PYTHON=AUTO builds it when they
# are found): pybind11 and the Python headers; numpy, which it hands mesh
# ranks back as. Not the main job's: about 20 packages of a fresh machine's
# set-up time.
python=(pybind11-dev python3-dev python3-numpy)
# torchrun, the other launcher of the main job (VEMESH_LAUNCHER=torchrun).
torch=("${python[@]}" python3-torch)
# The tests, benchmarks and fuzzers on top.
test_extras=(
  libgtest-dev libgmock-dev libbenchmark-dev
  clang libclang-rt-14-dev   # sanitizer presets and libFuzzer
  clang-format               # scripts/check_format.sh
  redis-server               # RedisStore and elastic tests
  librsvg2-bin               # the planner's SVG checks
  iproute2 util-linux        # emulated hosts (namespaces, veth)
  ccache                     # scripts/test.sh compiles through it when present
  python3-pytest             # the Python module's tests (tests/python/)
  # Multi-host tests: Slurm 22.05 on emulated hosts (tests/multihost/slurm.sh).
  # slurm-wlm-basic-plugins holds srun's mpi_pmix_v4.so, which dlopens the
  # unversioned libpmix.so that only libpmix-dev ships.
  slurmctld slurmd slurm-client munge slurm-wlm-basic-plugins libpmix-dev
)
for arg in "$@"; do
  case "$arg" in
    --python) packages+=("${python[@]}") ;;
    --torch) packages+=("${torch[@]}") ;;
    --test) packages+=("${torch[@]}" "${test_extras[@]}") ;;
    *) echo "setup: unknown argument '$arg' (expected --python, --torch or --test)" >&2; exit 2 ;;
  esac
done

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]} == 0)); then
  echo "setup: all ${#packages[@]} packages present"
  exit 0
fi

echo "setup: installing ${missing[*]}"
if [[ $(id -u) -ne 0 ]]; then SUDO=sudo; else SUDO=; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
# --force-unsafe-io: dpkg skips its fsync per file, most of a fresh machine's
# install time (a minimal Debian 12's set-up: 118 s before, 33 s with this
# and without the Python packages; bench/RESULTS.md section 16). A crash
# mid-install leaves packages to reinstall, as on any interrupted set-up.
$SUDO apt-get install -y -q --no-install-recommends \
  -o Dpkg::Options::=--force-unsafe-io "${missing[@]}"
