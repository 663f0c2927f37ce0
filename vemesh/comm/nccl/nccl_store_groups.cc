// NCCL communicators for several groups at once, their unique ids and the
// ranks' agreement going through a store (nccl_communicator.h:
// CreateNcclGroupsOverStore): no world-sized NCCL or host state.

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "vemesh/comm/nccl/internal/cuda_resources.h"
#include "vemesh/comm/nccl/internal/nccl_api.h"
#include "vemesh/comm/nccl/internal/nccl_poll.h"
#include "vemesh/comm/nccl/internal/nccl_status.h"
#include "vemesh/comm/nccl/nccl_communicator.h"

namespace vemesh {
namespace {

// What a rank posts under <prefix>/ok/<rank>: "ok", or why it failed.
constexpr absl::string_view kOk = "ok";
// How long world rank 0 waits for the others to read a failed verdict.
constexpr absl::Duration kGrace = absl::Seconds(2);

// World rank 0's verdict over the world's flags: "" when every rank is
// ready, else the failed ranks as "4, 5".
absl::StatusOr<std::string> Judge(Store& store, const std::string& prefix,
                                  int world_size, absl::Time deadline) {
  std::vector<std::string> keys;
  keys.reserve(static_cast<size_t>(world_size));
  for (int r = 0; r < world_size; ++r) {
    keys.push_back(absl::StrCat(prefix, "/ok/", r));
  }
  auto flags = store.wait_get(keys, deadline);
  if (!flags.ok()) return flags.status();
  std::vector<int> failed;
  for (int r = 0; r < world_size; ++r) {
    if ((*flags)[r] != kOk) failed.push_back(r);
  }
  return absl::StrJoin(failed, ", ");
}

}  // namespace

absl::StatusOr<std::vector<std::shared_ptr<Communicator>>>
CreateNcclGroupsOverStore(const std::shared_ptr<Store>& store,
                          absl::string_view prefix_view, int world_rank,
                          int world_size, std::vector<NcclStoreGroup> groups,
                          const CudaDeviceRequest& request,
                          absl::Duration timeout, const NcclOptions& options) {
  if (store == nullptr || world_size < 1 || world_rank < 0 ||
      world_rank >= world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("CreateNcclGroupsOverStore: rank ", world_rank, " of ",
                     world_size, store == nullptr ? " with no store" : "",
                     ": expected a store and 0 <= rank < size"));
  }
  for (const NcclStoreGroup& g : groups) {
    if (g.twin == nullptr || g.name.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("CreateNcclGroupsOverStore: group '", g.name,
                       "' needs a name and a host twin"));
    }
  }
  const std::string prefix(prefix_view);
  const absl::Time deadline = DeadlineAfter(timeout);
  const size_t n = groups.size();

  // (1) Everything that can fail locally, before anything is posted.
  std::optional<DeviceGuard> guard;
  const PreparedDevice prepared = PrepareDevice(request, &guard);
  const int device = prepared.device;
  absl::Status local = prepared.status;
  std::vector<cudaStream_t> streams(n, nullptr);
  std::vector<void*> scratch(n, nullptr);
  std::vector<ncclUniqueId> ids(n);
  for (size_t i = 0; i < n; ++i) {
    std::memset(&ids[i], 0, sizeof(ncclUniqueId));
    if (local.ok()) local = MakeStream(&streams[i], &scratch[i]);
    if (local.ok() && groups[i].twin->rank() == 0) {
      local = NcclStatus(Nccl().ncclGetUniqueId(&ids[i]), "ncclGetUniqueId");
    }
  }
  std::vector<ncclComm_t> comms(n, nullptr);
  auto fail = [&](absl::Status status) {
    for (size_t i = 0; i < n; ++i) {
      if (comms[i] != nullptr) Nccl().ncclCommAbort(comms[i]);
      FreeStream(streams[i], scratch[i]);
    }
    return status;
  };

  // (2) The posts: this rank's flag, the ids of the groups it roots (empty
  // when it failed, so that no member waits for an id that never comes).
  absl::Status posted = store->set(absl::StrCat(prefix, "/ok/", world_rank),
                                   local.ok() ? kOk : local.message());
  for (size_t i = 0; posted.ok() && i < n; ++i) {
    if (groups[i].twin->rank() != 0) continue;
    posted = store->set(
        absl::StrCat(prefix, "/id/", groups[i].name),
        local.ok() ? absl::string_view(reinterpret_cast<const char*>(&ids[i]),
                                       sizeof(ncclUniqueId))
                   : absl::string_view());
  }
  if (posted.ok() && world_rank == 0) {
    auto verdict = Judge(*store, prefix, world_size, deadline);
    posted = verdict.ok()
                 ? store->set(absl::StrCat(prefix, "/verdict"), *verdict)
                 : verdict.status();
  }
  if (!posted.ok()) {
    return fail(absl::Status(
        posted.code(),
        absl::StrCat("NCCL communicators not created: ", posted.message())));
  }

  // (3) The verdict and this rank's groups' ids, in one wait.
  std::vector<std::string> keys = {absl::StrCat(prefix, "/verdict")};
  for (const NcclStoreGroup& g : groups) {
    keys.push_back(absl::StrCat(prefix, "/id/", g.name));
  }
  auto values = store->wait_get(keys, deadline);
  if (!values.ok()) {
    return fail(absl::Status(values.status().code(),
                             absl::StrCat("NCCL communicators not created: ",
                                          values.status().message())));
  }
  const std::string& failed = (*values)[0];
  if (!failed.empty()) {
    // The store may live in world rank 0's process (torchrun): it waits a
    // little for the others to have read the verdict before it fails.
    (void)store->set(absl::StrCat(prefix, "/read/", world_rank), "");
    if (world_rank == 0) {
      std::vector<std::string> read;
      for (int r = 1; r < world_size; ++r) {
        read.push_back(absl::StrCat(prefix, "/read/", r));
      }
      (void)store->wait(read, std::min(deadline, absl::Now() + kGrace));
    }
    // This rank's own reason keeps its code (InvalidArgument for a bad
    // "cuda:N"); the others learn that some rank failed.
    return fail(absl::Status(
        local.ok() ? absl::StatusCode::kFailedPrecondition : local.code(),
        absl::StrCat(
            "NCCL communicator not created: rank(s) ", failed,
            " could not prepare their GPU",
            local.ok() ? "" : absl::StrCat("; this rank: ", local.message()))));
  }
  if (!local.ok()) return fail(local);  // cannot be: the verdict names us
  for (size_t i = 0; i < n; ++i) {
    const std::string& id = (*values)[i + 1];
    if (id.size() != sizeof(ncclUniqueId)) {
      return fail(absl::InternalError(absl::StrCat(
          "the unique id of '", groups[i].name, "' under ", prefix, " has ",
          id.size(), " bytes: expected ", sizeof(ncclUniqueId))));
    }
    std::memcpy(&ids[i], id.data(), sizeof(ncclUniqueId));
  }

  // (4) Every group's ncclCommInitRankConfig, issued at once (non-blocking:
  // NCCL builds them concurrently), then all polled until ready.
  std::vector<ncclConfig_t> configs(n, NonBlockingConfig());
  absl::Status status;
  for (size_t i = 0; i < n && status.ok(); ++i) {
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 27, 0)
    configs[i].commName = groups[i].name.c_str();
#endif
    status = NcclStatus(
        Nccl().ncclCommInitRankConfig(&comms[i], groups[i].twin->size(), ids[i],
                                      groups[i].twin->rank(), &configs[i]),
        absl::StrCat("ncclCommInitRankConfig of '", groups[i].name, "'"));
  }
  for (size_t i = 0; i < n && status.ok(); ++i) {
    status = AwaitReady(
        comms[i],
        absl::StrCat("ncclCommInitRankConfig of '", groups[i].name, "'"),
        deadline);
  }
  if (!status.ok()) return fail(status);

  std::vector<std::shared_ptr<Communicator>> out;
  out.reserve(n);
  auto lineage = std::make_shared<std::atomic<bool>>(false);
  for (size_t i = 0; i < n; ++i) {
    auto* comm =
        new NcclCommunicator(std::move(groups[i].twin), device, options,
                             comms[i], streams[i], scratch[i]);
    comm->lineage_aborted_ = lineage;
    out.push_back(std::shared_ptr<Communicator>(comm));
  }
  return out;
}

absl::StatusOr<std::vector<std::shared_ptr<Communicator>>>
CreateNcclGroupsOverWorld(const std::shared_ptr<Communicator>& world,
                          absl::string_view batch,
                          absl::Span<const SplitRequest> requests,
                          const CudaDeviceRequest& request,
                          absl::Duration timeout, const NcclOptions& options) {
  if (world == nullptr) {
    return absl::InvalidArgumentError(
        "CreateNcclGroupsOverWorld: no host world");
  }
  const StoreScope scope = world->store_scope();
  if (scope.store == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "CreateNcclGroupsOverWorld: the ", world->backend(),
        " host world met through no store: make the NCCL world over it "
        "instead (CreateNcclCommunicator)"));
  }
  // The groups' host twins, among their members only.
  VEMESH_ASSIGN_OR_RETURN(auto twins, world->split_many(requests));
  std::vector<NcclStoreGroup> groups;
  std::vector<size_t> index;  // the request of each group
  for (size_t i = 0; i < twins.size(); ++i) {
    if (twins[i] == nullptr) continue;
    const SplitRequest& r = requests[i];
    const int first =
        r.members.empty() ? twins[i]->ranks().front() : r.members.front();
    groups.push_back(
        {absl::StrCat(r.name.empty() ? absl::StrCat(i) : r.name, "/", first),
         std::move(twins[i])});
    index.push_back(i);
  }
  VEMESH_ASSIGN_OR_RETURN(
      auto made, CreateNcclGroupsOverStore(
                     scope.store, absl::StrCat(scope.prefix, "/nccl/", batch),
                     world->rank(), world->size(), std::move(groups), request,
                     timeout, options));
  std::vector<std::shared_ptr<Communicator>> out(requests.size());
  for (size_t g = 0; g < made.size(); ++g) out[index[g]] = std::move(made[g]);
  return out;
}

}  // namespace vemesh
