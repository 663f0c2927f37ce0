// Uses MeshLayout alone, through vemesh::layout: a CPU-only program that
// plans a mesh and links none of MPI, Gloo, hiredis, CUDA or NCCL
// (tests/consumer/check.cmake reads its ldd).
#include <cstdio>

#include "vemesh/layout/mesh_layout.h"

int main() {
  auto layout = vemesh::MeshLayout::Create({2, 2, 2});
  if (!layout.ok()) return 1;
  auto rank = layout->rank_at({1, 0, 1});
  if (!rank.ok() || *rank != 5) return 2;
  // Bad input answers a status, never a crash.
  if (vemesh::MeshLayout::Create({2, 0}).ok()) return 3;
  std::printf("layout_consumer: %s, rank at [1,0,1] = %lld\n",
              layout->ToString().c_str(), static_cast<long long>(*rank));
  return 0;
}
