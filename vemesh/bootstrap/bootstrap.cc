#include "vemesh/bootstrap/bootstrap.h"

#include <unistd.h>

#include <cstdlib>

namespace vemesh {

absl::Status Bootstrap::barrier(absl::Time deadline) {
  return all_gather("", deadline).status();
}

std::string HostIdentity() {
  if (const char* id = std::getenv("VEMESH_HOST_ID"); id != nullptr && *id) {
    return id;
  }
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) return "localhost";
  return name;
}

}  // namespace vemesh
