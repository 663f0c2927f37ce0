#include "vemesh/comm/reconfigurable_communicator.h"

#include <optional>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "vemesh/base/status_macros.h"
#include "vemesh/comm/backend.h"
#include "vemesh/comm/forwarded_work.h"
#include "vemesh/comm/work.h"

namespace vemesh {

ReconfigurableCommunicator::ReconfigurableCommunicator(std::string name,
                                                       std::string backend)
    : name_(std::move(name)), backend_(std::move(backend)) {
  // No member known yet: a group of one whose global rank is -1.
  views_.push_back(std::make_unique<const View>(View{{-1}, 0}));
  view_.store(views_.back().get(), std::memory_order_release);
}

ReconfigurableCommunicator::~ReconfigurableCommunicator() = default;

absl::Status ReconfigurableCommunicator::configure(
    std::shared_ptr<Communicator> inner, std::vector<int> global_ranks,
    int64_t generation) {
  const std::string what =
      absl::StrCat("ReconfigurableCommunicator '", name_, "' configure (",
                   "generation ", generation, ")");
  if (inner == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": the group is null; expected a communicator"));
  }
  if (inner->backend() != backend_) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": the group is on ", inner->backend(),
                     "; expected ", backend_, " (fixed at construction)"));
  }
  if (static_cast<int>(global_ranks.size()) != inner->size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": ", global_ranks.size(), " global ranks for a group of ",
        inner->size(), "; expected one per member"));
  }
  absl::flat_hash_set<int> seen;
  for (size_t i = 0; i < global_ranks.size(); ++i) {
    if (global_ranks[i] < 0 || !seen.insert(global_ranks[i]).second) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, ": global rank ", global_ranks[i], " at index ", i,
          global_ranks[i] < 0 ? " is negative" : " is listed twice",
          "; expected distinct ranks >= 0"));
    }
  }
  auto view = std::make_unique<const View>(
      View{std::move(global_ranks), inner->rank()});
  std::shared_ptr<Communicator> before;
  std::unique_ptr<const View> retired;
  {
    std::lock_guard<std::mutex> lock(mu_);
    before = std::move(inner_);
    inner_ = std::move(inner);
    why_ = absl::OkStatus();
    generation_ = generation;
    views_.push_back(std::move(view));
    view_.store(views_.back().get(), std::memory_order_release);
    if (views_.size() > static_cast<size_t>(kKeptConfigurations)) {
      retired = std::move(views_.front());
      views_.pop_front();
    }
    ForgetGroupRanks();
    // The abort was of the group before; the new one starts usable.
    ClearAborted();
  }
  // `before` and `retired` are freed here, outside the lock (a Gloo group
  // closes its connections once no operation holds it).
  return absl::OkStatus();
}

absl::Status ReconfigurableCommunicator::unconfigure(absl::Status why) {
  if (why.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ReconfigurableCommunicator '", name_,
        "' unconfigure: the status is OK; expected the error later "
        "operations answer (e.g. Unavailable: between membership epochs)"));
  }
  std::shared_ptr<Communicator> last;
  {
    std::lock_guard<std::mutex> lock(mu_);
    last = std::move(inner_);
    why_ = std::move(why);
  }
  // Freed here, outside the lock.
  return absl::OkStatus();
}

int64_t ReconfigurableCommunicator::generation() const {
  std::lock_guard<std::mutex> lock(mu_);
  return generation_;
}

bool ReconfigurableCommunicator::configured() const {
  std::lock_guard<std::mutex> lock(mu_);
  return inner_ != nullptr;
}

int ReconfigurableCommunicator::rank() const {
  return view_.load(std::memory_order_acquire)->rank;
}

int ReconfigurableCommunicator::size() const {
  return static_cast<int>(view_.load(std::memory_order_acquire)->ranks.size());
}

absl::Span<const int> ReconfigurableCommunicator::ranks() const {
  return view_.load(std::memory_order_acquire)->ranks;
}

absl::StatusOr<std::shared_ptr<Communicator>> ReconfigurableCommunicator::Use(
    absl::string_view op) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (inner_ != nullptr) return inner_;
  if (!why_.ok()) {
    return absl::Status(
        why_.code(), absl::StrCat(op, " on '", name_, "': ", why_.message()));
  }
  return absl::FailedPreconditionError(absl::StrCat(
      op, " on '", name_,
      "': no group is configured yet; configure() one first (an elastic "
      "mesh does when its first epoch forms)"));
}

absl::Status ReconfigurableCommunicator::CheckUsable(
    absl::string_view op) const {
  return Use(op).status();
}

Communicator::WorkOr ReconfigurableCommunicator::Start(const Operation& op) {
  VEMESH_ASSIGN_OR_RETURN(std::shared_ptr<Communicator> c, Use(op.Name()));
  return StartForwarded(Self(), *c, op);
}

void ReconfigurableCommunicator::OnAbort() {
  std::shared_ptr<Communicator> c;
  {
    std::lock_guard<std::mutex> lock(mu_);
    c = inner_;
  }
  // One call for one communicator still goes through AbortCommunicators:
  // an NCCL one is then released inside ncclGroupStart/ncclGroupEnd.
  if (c != nullptr) {
    AbortCommunicators({c}, absl::StrCat("its reconfigurable communicator '",
                                         name_, "' was aborted"));
  }
}

absl::StatusOr<std::shared_ptr<Communicator>> ReconfigurableCommunicator::split(
    int, int) {
  return absl::UnimplementedError(absl::StrCat(
      "split of the reconfigurable communicator '", name_,
      "': its groups are configured by their owner (the elastic mesh); split "
      "a configured group, or the communicator it was split from, instead"));
}

NativeHandle ReconfigurableCommunicator::native_handle() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (inner_ == nullptr) return NativeHandle{backend_, nullptr};
  return inner_->native_handle();
}

}  // namespace vemesh
