// GlooCommunicator's creation: the checks, the tcp device, the rendezvous
// of a group (at once, or lazily on first use).

#include <chrono>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gloo/barrier.h"
#include "gloo/rendezvous/context.h"
#include "gloo/transport/tcp/attr.h"
#include "gloo/transport/tcp/device.h"
#include "vemesh/base/sigpipe.h"
#include "vemesh/base/status_macros.h"
#include "vemesh/comm/gloo/gloo_communicator.h"
#include "vemesh/comm/gloo/internal/gloo_error.h"
#include "vemesh/comm/gloo/internal/gloo_store.h"
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
  GlooStore rendezvous(group, timeout);
  // What connectFullMesh asks for, peer by peer: "rank_<r>" (the lower
  // ranks' hostnames, for its local rank) and "<r>" (every peer's pair
  // addresses: size - 1 of at most kPairAddressBytes each). Fetched in runs
  // whose reply stays within kPrefetchReplyBytes (gloo_store.h): all of
  // them at once up to 16 ranks, one at a time (two round trips, was
  // three) from 256.
  constexpr size_t kPairAddressBytes = 256;
  constexpr size_t kPrefetchReplyBytes = 64 << 10;
  std::vector<std::string> hostnames, addresses;
  for (int r = 0; r < size; ++r) {
    if (r < rank) hostnames.push_back(absl::StrCat("rank_", r));
    if (r != rank) addresses.push_back(absl::StrCat(r));
  }
  rendezvous.set_prefetch(
      {std::move(hostnames), std::move(addresses)},
      kPrefetchReplyBytes / (static_cast<size_t>(size) * kPairAddressBytes));
  std::shared_ptr<gloo::rendezvous::Context> context;
  ScopedSigpipeBlock no_sigpipe;  // connecting and the barrier write here
  absl::Status status = RunGloo(
      absl::StrCat("gloo rendezvous of rank ", rank, " of ", size, " under '",
                   prefix, "'"),
      [&] {
        context = std::make_shared<gloo::rendezvous::Context>(rank, size);
        context->setTimeout(absl::ToChronoMilliseconds(timeout));
        std::shared_ptr<gloo::transport::Device> shared_device = device;
        context->connectFullMesh(rendezvous, shared_device);
        // connectFullMesh can return before the peers have finished: a TCP
        // connect completes in the kernel before the listener accepts it.
        // A rank that returned and at once dropped the group would close a
        // socket its peer is still accepting. The barrier holds every rank
        // until all are connected. It uses tag 0; collectives start at 1.
        gloo::BarrierOptions barrier(context);
        barrier.setTag(0);
        gloo::barrier(barrier);
      });
  if (status.ok()) return std::shared_ptr<gloo::Context>(std::move(context));
  // The store's own code (DeadlineExceeded: a rank never came) says more
  // than the IoException that carried it through Gloo.
  absl::Status store_error = rendezvous.error();
  if (store_error.ok()) return status;
  if (!absl::IsDeadlineExceeded(store_error)) {
    return absl::Status(store_error.code(), status.message());
  }
  // Name the peers that never published their address (Gloo's key
  // "rank_<r>"): gone, or never made this call.
  std::vector<std::string> missing;
  for (int r = 0; r < size; ++r) {
    if (r == rank) continue;
    if (!group->get(absl::StrCat("rank_", r)).ok()) {
      missing.push_back(
          absl::StrCat(r, " (global rank ",
                       r < static_cast<int>(ranks.size()) ? ranks[r] : r, ")"));
    }
  }
  if (missing.empty()) {
    return absl::Status(store_error.code(), status.message());
  }
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
