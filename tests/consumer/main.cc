// Uses the installed headers and library: plans a mesh and prints a rank.
#include <cstdio>

#include "vemesh/mesh_layout.h"

int main() {
  auto layout = vemesh::MeshLayout::Create({2, 2, 2});
  if (!layout.ok()) return 1;
  auto rank = layout->rank_at({1, 0, 1});
  if (!rank.ok() || *rank != 5) return 2;
  std::printf("consumer: %s, rank at [1,0,1] = %lld\n",
              layout->ToString().c_str(), static_cast<long long>(*rank));
  return 0;
}
