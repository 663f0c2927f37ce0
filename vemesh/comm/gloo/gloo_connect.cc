// GlooCommunicator's creation: the checks, the tcp device, the rendezvous
// of a group (at once, or lazily on first use).

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gloo/transport/tcp/attr.h"
#include "gloo/transport/tcp/device.h"
#include "vemesh/base/sigpipe.h"
#include "vemesh/base/status_macros.h"
#include "vemesh/comm/gloo/gloo_communicator.h"
#include "vemesh/comm/gloo/internal/gloo_error.h"
#include "vemesh/comm/gloo/internal/gloo_pairs.h"
#include "vemesh/rendezvous/prefix_store.h"

namespace vemesh {
namespace {

absl::Status CheckCreate(const std::shared_ptr<Store>& store, int rank,
                         int size, const std::vector<int>& global_ranks,
                         absl::Duration timeout) {
  if (store == nullptr) {
    return absl::InvalidArgumentError("GlooCommunicator::Create needs a store");
  }
  if (size < 1 || rank < 0 || rank >= size) {
    return absl::InvalidArgumentError(
        absl::StrCat("GlooCommunicator::Create: rank ", rank,
                     " is outside a group of ", size, " ranks"));
  }
  if (global_ranks.size() != static_cast<size_t>(size)) {
    return absl::InvalidArgumentError(
        absl::StrCat("GlooCommunicator::Create: ", global_ranks.size(),
                     " global ranks for a group of ", size));
  }
  if (timeout < absl::Milliseconds(1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("GlooCommunicator::Create: timeout ",
                     absl::FormatDuration(timeout), " is below 1ms"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<gloo::transport::Device>> MakeDevice(
    absl::string_view hostname) {
  std::shared_ptr<gloo::transport::Device> device;
  // The device's I/O thread, started here, inherits SIGPIPE blocked.
  ScopedSigpipeBlock no_sigpipe;
  absl::Status status = RunGloo("gloo tcp device", [&] {
    gloo::transport::tcp::attr attr;
    attr.hostname = std::string(hostname);
    device = gloo::transport::tcp::CreateDevice(attr);
  });
  if (!status.ok()) return status;
  return device;
}

}  // namespace

absl::StatusOr<std::shared_ptr<GlooCommunicator>> GlooCommunicator::Create(
    std::shared_ptr<Store> store, absl::string_view prefix, int rank, int size,
    std::vector<int> global_ranks, absl::Duration timeout,
    absl::string_view hostname) {
  VEMESH_RETURN_IF_ERROR(CheckCreate(store, rank, size, global_ranks, timeout));
  VEMESH_ASSIGN_OR_RETURN(auto device, MakeDevice(hostname));
  return Connect(std::move(store), std::string(prefix), rank, size,
                 std::move(global_ranks), timeout, std::string(hostname),
                 std::move(device));
}

absl::StatusOr<std::shared_ptr<GlooCommunicator>> GlooCommunicator::CreateLazy(
    std::shared_ptr<Store> store, absl::string_view prefix, int rank, int size,
    std::vector<int> global_ranks, absl::Duration timeout,
    absl::string_view hostname) {
  VEMESH_RETURN_IF_ERROR(CheckCreate(store, rank, size, global_ranks, timeout));
  VEMESH_ASSIGN_OR_RETURN(auto device, MakeDevice(hostname));
  return std::shared_ptr<GlooCommunicator>(
      new GlooCommunicator(std::move(store), std::string(prefix), rank, size,
                           std::move(global_ranks), timeout,
                           std::string(hostname), std::move(device), nullptr));
}

absl::StatusOr<std::shared_ptr<gloo::Context>> GlooCommunicator::ConnectContext(
    const std::shared_ptr<Store>& store, const std::string& prefix, int rank,
    int size, absl::Duration timeout, const std::vector<int>& ranks,
    const std::shared_ptr<gloo::transport::Device>& device, bool lazy) {
  auto group = std::make_shared<PrefixStore>(store, prefix);
  // Every pair in one connect phase (gloo_pairs.h): each rank posts its
  // addresses under "pairs/<rank>" and reads the others' in runs of about
  // 64 KiB (one read up to 64 ranks).
  std::vector<gloo_internal::PairGroup> mesh(1);
  mesh[0].name = "mesh";
  mesh[0].index = rank;
  for (int r = 0; r < size; ++r) mesh[0].members.push_back(r);
  auto contexts = gloo_internal::ConnectPairGroups(
      *group, "pairs/", rank, device, timeout, mesh,
      absl::StrCat("gloo rendezvous of rank ", rank, " of ", size, " under '",
                   prefix, "'"));
  if (contexts.ok()) return std::move((*contexts)[0]);
  const absl::Status status = contexts.status();
  if (!absl::IsDeadlineExceeded(status)) return status;
  // Name the peers that never posted their addresses: gone, or never made
  // this call.
  std::vector<std::string> missing;
  for (int r = 0; r < size; ++r) {
    if (r == rank) continue;
    if (!group->get(absl::StrCat("pairs/", r)).ok()) {
      missing.push_back(
          absl::StrCat(r, " (global rank ",
                       r < static_cast<int>(ranks.size()) ? ranks[r] : r, ")"));
    }
  }
  if (missing.empty()) return status;
  // Creation keeps its DeadlineExceeded (a rank never came); a lazy connect
  // on first use says the peer is unavailable, as a lost connection does.
  return absl::Status(
      lazy ? absl::StatusCode::kUnavailable
           : absl::StatusCode::kDeadlineExceeded,
      absl::StrCat("gloo group '", prefix, "': peer rank(s) ",
                   absl::StrJoin(missing, ", "), " never connected within ",
                   absl::FormatDuration(timeout),
                   " (gone, or never made this call); rank ", rank, " of ",
                   size, " gives up: ", status.message()));
}

absl::StatusOr<std::shared_ptr<GlooCommunicator>> GlooCommunicator::Connect(
    std::shared_ptr<Store> store, std::string prefix, int rank, int size,
    std::vector<int> ranks, absl::Duration timeout, std::string hostname,
    std::shared_ptr<gloo::transport::Device> device) {
  VEMESH_ASSIGN_OR_RETURN(
      auto context,
      ConnectContext(store, prefix, rank, size, timeout, ranks, device,
                     /*lazy=*/false));
  return std::shared_ptr<GlooCommunicator>(new GlooCommunicator(
      std::move(store), std::move(prefix), rank, size, std::move(ranks),
      timeout, std::move(hostname), std::move(device), std::move(context)));
}

absl::Status GlooCommunicator::EnsureConnected() {
  if (connected_.load()) return absl::OkStatus();
  if (!connect_error_.ok()) return connect_error_;
  auto context = ConnectContext(store_, prefix_, rank_, size_, gloo_timeout_,
                                ranks_, device_, /*lazy=*/true);
  if (!context.ok()) {
    connect_error_ = context.status();
    return connect_error_;
  }
  context_ = *std::move(context);
  connected_.store(true);
  return absl::OkStatus();
}

NativeHandle GlooCommunicator::native_handle() const {
  return NativeHandle{BackendName(Backend::kGloo), context_.get()};
}

GlooCommunicator* GlooCommunicator::UnconnectedWorld(Communicator* comm) {
  auto* gloo = dynamic_cast<GlooCommunicator*>(comm);
  return gloo != nullptr && !gloo->connected() ? gloo : nullptr;
}

std::shared_ptr<GlooCommunicator> GlooCommunicator::Of(
    const std::shared_ptr<Communicator>& comm) {
  return std::dynamic_pointer_cast<GlooCommunicator>(comm);
}

}  // namespace vemesh
