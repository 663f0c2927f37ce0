#include "vemesh/bootstrap/bootstrap.h"

#include <unistd.h>

#include <cstdlib>
#include <utility>

namespace vemesh {

absl::Status Bootstrap::barrier(absl::Time deadline) {
  return all_gather("", deadline).status();
}

absl::StatusOr<Bootstrap::GatheredWorld> Bootstrap::all_gather_and_world(
    absl::string_view data, absl::Time deadline, absl::Duration op_timeout) {
  GatheredWorld out;
  auto gathered = all_gather(data, deadline);
  if (!gathered.ok()) return gathered.status();
  out.gathered = *std::move(gathered);
  auto world = this->world(deadline, op_timeout);
  if (!world.ok()) return world.status();
  out.world = *std::move(world);
  return out;
}

std::string HostIdentity() {
  if (const char* id = std::getenv("VEMESH_HOST_ID"); id != nullptr && *id) {
    return id;
  }
  // The host's name does not change under a running job: asked once (a
  // system call per mesh creation was a microsecond of every rank's CPU).
  static const std::string* const host = [] {
    char name[256] = {};
    if (gethostname(name, sizeof(name) - 1) != 0) {
      return new std::string("localhost");
    }
    return new std::string(name);
  }();
  return *host;
}

}  // namespace vemesh
