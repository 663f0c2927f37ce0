// GlooCommunicator in a build with VEMESH_WITH_GLOO=OFF (vemesh/CMakeLists.txt
// compiles this file instead of comm/gloo/*.cc): no Gloo is looked for or
// linked, and Create, the only way to make a GlooCommunicator, answers
// Unimplemented naming the option. What builds a Gloo group (a store
// bootstrap's world, a cpu mesh under env://, an elastic epoch) then fails
// with that reason instead of failing to link.
#include "vemesh/comm/gloo/gloo_communicator.h"

#include "absl/strings/str_cat.h"

namespace vemesh {

absl::StatusOr<std::shared_ptr<GlooCommunicator>> GlooCommunicator::Create(
    std::shared_ptr<Store>, absl::string_view prefix, int rank, int size,
    std::vector<int>, absl::Duration, absl::string_view) {
  return absl::UnimplementedError(absl::StrCat(
      "GlooCommunicator: vemesh was built with VEMESH_WITH_GLOO=OFF (rebuild "
      "with it ON and libgloo-dev installed); cannot create group '",
      prefix, "' (rank ", rank, " of ", size, ")"));
}

absl::StatusOr<std::shared_ptr<GlooCommunicator>> GlooCommunicator::CreateLazy(
    std::shared_ptr<Store> store, absl::string_view prefix, int rank, int size,
    std::vector<int> ranks, absl::Duration timeout,
    absl::string_view hostname) {
  return Create(std::move(store), prefix, rank, size, std::move(ranks), timeout,
                hostname);
}

// Never reached: no GlooCommunicator exists in this build.
absl::StatusOr<std::shared_ptr<GlooCommunicator>> GlooCommunicator::subgroup(
    absl::string_view name, std::vector<int>) {
  return absl::UnimplementedError(
      absl::StrCat("GlooCommunicator::subgroup '", name,
                   "': built with VEMESH_WITH_GLOO=OFF"));
}

absl::StatusOr<std::vector<std::shared_ptr<GlooCommunicator>>>
GlooCommunicator::subgroups(absl::string_view batch,
                            std::vector<SubgroupSpec>) {
  return absl::UnimplementedError(
      absl::StrCat("GlooCommunicator::subgroups '", batch,
                   "': built with VEMESH_WITH_GLOO=OFF"));
}

absl::StatusOr<std::vector<std::shared_ptr<Communicator>>>
GlooCommunicator::split_many(absl::Span<const SplitRequest> requests,
                             absl::Time deadline) {
  return Communicator::split_many(requests, deadline);
}

StoreScope GlooCommunicator::store_scope() const { return {}; }

GlooCommunicator* GlooCommunicator::UnconnectedWorld(Communicator*) {
  return nullptr;
}

std::shared_ptr<GlooCommunicator> GlooCommunicator::Of(
    const std::shared_ptr<Communicator>&) {
  return nullptr;
}

}  // namespace vemesh
