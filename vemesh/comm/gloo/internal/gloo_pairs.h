// vemesh/comm/gloo/internal/gloo_pairs.h
//
// Gloo groups whose TCP pairs vemesh connects itself, in one store round
// and one connect phase, instead of gloo::rendezvous::Context's
// connectFullMesh. That one reads the store once or twice per peer and
// connects its pairs one after another, each connect waiting for the
// device loop's next turn (up to 10 ms idle) or for its peer to reach the
// same pair in its own loop: an 8-rank group took 47-94 ms at its last
// rank on a busy 2-core machine, and the wait grows with the group.
//
//   std::vector<PairGroup> groups = {{"g", {0, 1, 2}, /*index=*/1}};
//   auto contexts = ConnectPairGroups(*store, "pfx/pairs/", /*my_id=*/1,
//                                     device, timeout, groups, "group g");
//
// Each rank makes the pairs of all its groups on `device`, posts their
// addresses as one value under `key_prefix + my_id`, reads its groups'
// other members' values (`key_prefix + id`) with wait_get, as many per read
// as fit in about 64 KiB (all of them up to 64 ranks; each value dropped
// once this rank's addresses are taken from it), then connects
// every pair (first the ones it connects out, which never wait for the
// peer, with the device loop kept turning; then the ones it accepts) and
// ends with one barrier per group, in `groups` order (the same on every
// rank, so the barriers cannot wait in a cycle). Collective over the union
// of the groups' members.
//
// Errors: the store's (DeadlineExceeded when a member never posts, by
// now + timeout: its key is then absent, which the caller uses to name
// it); Gloo's, through RunGloo, naming `what`; InvalidArgument when a
// member's value has no address for one of this rank's groups towards it
// (the members' group lists differ).

#ifndef VEMESH_COMM_GLOO_INTERNAL_GLOO_PAIRS_H_
#define VEMESH_COMM_GLOO_INTERNAL_GLOO_PAIRS_H_

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "gloo/context.h"
#include "gloo/transport/device.h"
#include "vemesh/rendezvous/store.h"

namespace vemesh {
namespace gloo_internal {

struct PairGroup {
  std::string name;          // unique among the groups of one call
  std::vector<int> members;  // the members' ids: their values' keys
  int index = -1;            // this rank's place in `members`
};

// One gloo::Context per group, in `groups` order, each with `timeout`.
// `reply_bytes`: about how much one read of the peers' values may bring.
absl::StatusOr<std::vector<std::shared_ptr<gloo::Context>>> ConnectPairGroups(
    Store& store, absl::string_view key_prefix, int my_id,
    const std::shared_ptr<gloo::transport::Device>& device,
    absl::Duration timeout, const std::vector<PairGroup>& groups,
    absl::string_view what, size_t reply_bytes = 64 << 10);

}  // namespace gloo_internal
}  // namespace vemesh

#endif  // VEMESH_COMM_GLOO_INTERNAL_GLOO_PAIRS_H_
