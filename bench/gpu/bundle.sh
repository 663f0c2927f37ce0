#!/usr/bin/env bash
# Packs what a GPU machine needs to run vemesh's NCCL tests and timings into
# .gpu/ (ignored by git), to be copied there and run:
#
#   bash bench/gpu/bundle.sh     # on the build machine, after a release build with NCCL
#   bash .gpu/run.sh             # on the GPU machine (bench/gpu/run.sh, copied in);
#                                # logs go to $OUT (default: the current folder)
#
# The GPU machine is expected to have CUDA and NCCL but none of the Debian
# packages: the test and benchmark binaries travel with the shared libraries
# they load (Abseil, Open MPI and its plugins, hwloc, libevent, PMIx, Gloo),
# and Open MPI's tree is unpacked where Debian puts it, so its plugins are
# found. Earlier logs (one H100) are in bench/gpu/logs/.
set -euo pipefail
cd "$(dirname "$0")/../.."
b=build/release
grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || { mkdir -p .git/info; echo '/.gpu/' >> .git/info/exclude; }
rm -rf .gpu && mkdir -p .gpu/bin .gpu/lib
cp "$b/tests/comm/nccl_communicator_test" "$b/bench/nccl_init" .gpu/bin/
for f in "$b/tests/comm/nccl_split_test" "$b/tests/comm/cuda_device_test" "$b/examples/hsdp/hsdp"; do
  [[ -x $f ]] && cp "$f" .gpu/bin/
done
cp tests/launch/spawn_env.sh .gpu/
cp bench/gpu/run.sh .gpu/run.sh
skip='/libc.so|/libm.so|libstdc|libgcc_s|ld-linux|libcuda|libnccl|libcudart|libpthread|libdl.so|librt.so'
{ for f in .gpu/bin/* /usr/lib/x86_64-linux-gnu/openmpi/lib/openmpi3/*.so; do ldd "$f"; done; } 2>/dev/null |
  awk '/=>/{print $3}' | sort -u | grep -v -E "$skip" | while read -r lib; do cp -Ln "$lib" .gpu/lib/; done
tar czf .gpu/ompi.tgz /usr/lib/x86_64-linux-gnu/openmpi /usr/lib/x86_64-linux-gnu/pmix2 \
  /usr/share/openmpi /usr/share/pmix /etc/openmpi /usr/bin/orted 2>/dev/null || true  # (a missing folder is fine)
du -sh .gpu
