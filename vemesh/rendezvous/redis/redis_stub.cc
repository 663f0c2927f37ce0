// RedisStore in a build with VEMESH_WITH_REDIS=OFF (vemesh/CMakeLists.txt
// compiles this file instead of redis_store.cc): no hiredis is looked for
// or linked, and Connect, the only way to make a RedisStore, answers
// Unimplemented naming the option. An elastic job whose control plane is a
// Redis address then fails with that reason instead of failing to link.
#include "vemesh/rendezvous/redis/redis_store.h"

#include "absl/strings/str_cat.h"

namespace vemesh {

absl::StatusOr<std::shared_ptr<RedisStore>> RedisStore::Connect(
    absl::string_view address, RedisStoreOptions) {
  return absl::UnimplementedError(absl::StrCat(
      "RedisStore: vemesh was built with VEMESH_WITH_REDIS=OFF (rebuild with "
      "it ON and libhiredis-dev installed); cannot connect to '",
      address, "'"));
}

}  // namespace vemesh
