#!/usr/bin/env bash
# Installs what a fresh Debian 12 machine lacks to build and test vemesh.
# Idempotent: packages already present are not touched, and `apt-get update`
# runs at most once, only when something is missing. CUDA and NCCL are optional
# and never installed here (they are found under /usr/local/cuda when present).
set -euo pipefail

packages=(
  cmake g++ clang make pkg-config
  libabsl-dev libgtest-dev libgmock-dev libbenchmark-dev
  libopenmpi-dev openmpi-bin
  libgloo-dev
  libhiredis-dev redis-server
  procps
  iproute2 util-linux
  python3-torch
  libeigen3-dev
  librsvg2-bin
  nlohmann-json3-dev
  libclang-rt-14-dev
  # Multi-host tests: Slurm 22.05 on emulated hosts (tests/multihost/slurm.sh).
  # slurm-wlm-basic-plugins holds srun's mpi_pmix_v4.so, which dlopens the
  # unversioned libpmix.so that only libpmix-dev ships.
  slurmctld slurmd slurm-client munge slurm-wlm-basic-plugins libpmix-dev
)

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
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
