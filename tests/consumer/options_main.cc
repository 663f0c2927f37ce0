// Built by tests/consumer/options_off.cmake against a vemesh built with
// VEMESH_WITH_MPI=OFF, VEMESH_WITH_GLOO=OFF and VEMESH_WITH_REDIS=OFF: each
// stubbed entry point, a store bootstrap's world (a Gloo world) and an MPI
// launch answer Unimplemented naming the option that left their backend
// out. Prints what failed and returns 1.
#include <cstdio>
#include <memory>
#include <string>

#include "vemesh/vemesh.h"

namespace {

int failures = 0;

void Expect(const absl::Status& status, const char* what, const char* option) {
  if (status.code() != absl::StatusCode::kUnimplemented ||
      status.message().find(option) == absl::string_view::npos) {
    std::printf("FAIL %s: expected Unimplemented naming %s, got %s\n", what,
                option, status.ToString().c_str());
    ++failures;
  } else {
    std::printf("ok %s: %s\n", what, status.ToString().c_str());
  }
}

}  // namespace

int main() {
  Expect(vemesh::RedisStore::Connect("127.0.0.1:6379").status(),
         "RedisStore::Connect", "VEMESH_WITH_REDIS");
  auto store = std::make_shared<vemesh::MemoryStore>();
  Expect(vemesh::GlooCommunicator::Create(store, "options", 0, 1, {0},
                                          absl::Seconds(5))
             .status(),
         "GlooCommunicator::Create", "VEMESH_WITH_GLOO");
  vemesh::StoreBootstrap boot(store, 0, 1, "options");
  Expect(boot.world(absl::Now() + absl::Seconds(5), absl::Seconds(5)).status(),
         "StoreBootstrap::world", "VEMESH_WITH_GLOO");
  // No launcher variables: what was an MPI singleton.
  Expect(vemesh::LaunchBootstrap(absl::Now() + absl::Seconds(5)).status(),
         "LaunchBootstrap", "VEMESH_WITH_MPI");
#ifndef VEMESH_NO_MPI
  std::printf("FAIL VEMESH_NO_MPI is not defined\n");
  ++failures;
#endif
  return failures == 0 ? 0 : 1;
}
