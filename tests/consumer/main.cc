// Uses the installed headers and library: plans a mesh and prints a rank,
// and parses a Redis address (which links hiredis, a private dependency a
// static libvemesh still needs: the package config must find it). Includes
// the umbrella header, which must compile from the installed tree alone.
#include <cstdio>

#include "vemesh/vemesh.h"

int main() {
  auto layout = vemesh::MeshLayout::Create({2, 2, 2});
  if (!layout.ok()) return 1;
  auto rank = layout->rank_at({1, 0, 1});
  if (!rank.ok() || *rank != 5) return 2;
  // Refused before any connection is tried.
  auto store = vemesh::RedisStore::Connect("not an address");
  if (store.status().code() != absl::StatusCode::kInvalidArgument) return 3;
  std::printf("consumer: %s, rank at [1,0,1] = %lld\n",
              layout->ToString().c_str(), static_cast<long long>(*rank));
  return 0;
}
