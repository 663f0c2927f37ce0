#include "vemesh/bootstrap/mpi/mpi_bootstrap.h"

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "vemesh/bootstrap/mpi/internal/arrival_report.h"
#include "vemesh/comm/mpi/mpi_communicator.h"
#include "vemesh/comm/mpi/mpi_environment.h"
#include "vemesh/comm/mpi/mpi_request.h"

namespace vemesh {
namespace {

// The buffers of one all-gather. On a timeout they are kept for the life of
// the process: MPI may still write into them when a late rank arrives, and a
// leak checker should not call that a leak.
struct Exchange {
  // One fixed-size block per rank: the length, then the bytes when they fit
  // (so the usual small exchange is one collective).
  std::string block;
  std::string blocks;
  std::string send;
  std::string recv;
  std::vector<int> counts;
  std::vector<int> displacements;
  // The closing step's copy of the communicator (freed once made).
  MPI_Comm closing = MPI_COMM_NULL;
};

constexpr int kBlockBytes = 256;
const absl::Duration kOutcomeGrace = absl::Seconds(2);
constexpr size_t kInlineBytes = kBlockBytes - sizeof(uint64_t);

// What a rank whose all-gather completed but whose closing step did not
// knows: everyone came, and the others had given up by then.
std::string LateVerdict() {
  return "every rank arrived at the all-gather, but the others gave up before "
         "its closing step (this rank, or another, came after their "
         "deadline)";
}

void Abandon(std::unique_ptr<Exchange> exchange) {
  static std::mutex mu;
  static auto* abandoned = new std::vector<std::unique_ptr<Exchange>>();
  std::lock_guard<std::mutex> lock(mu);
  abandoned->push_back(std::move(exchange));
}

}  // namespace

absl::StatusOr<std::shared_ptr<MpiBootstrap>> MpiBootstrap::Create(
    MPI_Comm base, std::string reason, absl::Time deadline) {
  const absl::Time start = absl::Now();
  if (base == MPI_COMM_WORLD) {
    absl::Status status = EnsureMpiInitialized(deadline);
    if (!status.ok()) return status;
  } else if (MpiWasAbandoned()) {
    return MpiAbandonedError("MpiBootstrap");
  } else if (!MpiIsUsable()) {
    return absl::FailedPreconditionError(
        "MpiBootstrap: MPI is not initialised (or already finalised)");
  }
  absl::StatusOr<MPI_Comm> held = BoundedCommIdup(base, deadline);
  const absl::Status& status = held.status();
  if (absl::IsDeadlineExceeded(status)) {
    // The first collective of the bootstrap: the ranks that came ask ranks
    // 0 and 1 who did not, over `base` (the copy does not exist yet).
    int rank = 0;
    int size = 0;
    MPI_Comm_rank(base, &rank);
    MPI_Comm_size(base, &size);
    const std::string verdict = ReportArrival(base, rank, size, HostIdentity(),
                                              ArrivalGrace(deadline - start));
    AbandonMpi(absl::StrCat("rank ", rank, " of ", size,
                            ", MPI_Comm_idup of the bootstrap: ", verdict));
    return absl::DeadlineExceededError(absl::StrCat(
        "rank ", rank, " of ", size, ": ", verdict, "; ", status.message()));
  }
  if (!status.ok()) return status;
  MPI_Comm comm = *held;
  int rank = 0;
  int size = 0;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
  return std::shared_ptr<MpiBootstrap>(
      new MpiBootstrap(base, comm, rank, size, std::move(reason)));
}

MpiBootstrap::MpiBootstrap(MPI_Comm base, MPI_Comm comm, int rank, int size,
                           std::string reason)
    : base_(base),
      comm_(comm),
      rank_(rank),
      size_(size),
      reason_(std::move(reason)) {}

MpiBootstrap::~MpiBootstrap() {
  // A communicator with an abandoned request must not be freed (MPI would
  // wait for it); after MPI_Finalize there is nothing to free; a thread
  // that may not call MPI leaves it to MPI_Finalize.
  if (!broken_ && MpiIsUsable() && CheckMpiThread("").ok()) {
    MPI_Comm_free(&comm_);
  }
}

absl::Status MpiBootstrap::CheckUsable() const {
  if (broken_ || MpiWasAbandoned()) {
    return MpiAbandonedError("the MPI bootstrap (mesh creation, flatten)");
  }
  if (!MpiIsUsable()) {
    return absl::FailedPreconditionError(
        "MPI was finalised: the MPI bootstrap cannot be used any more");
  }
  return CheckMpiThread("the MPI bootstrap (mesh creation, flatten)");
}

absl::StatusOr<std::vector<std::string>> MpiBootstrap::all_gather(
    absl::string_view data, absl::Time deadline) {
  std::lock_guard<std::mutex> lock(mu_);
  absl::Status status = CheckUsable();
  if (!status.ok()) return status;
  return Gather(data, deadline, nullptr);
}

absl::StatusOr<Bootstrap::GatheredWorld> MpiBootstrap::all_gather_and_world(
    absl::string_view data, absl::Time deadline, absl::Duration) {
  std::lock_guard<std::mutex> lock(mu_);
  absl::Status status = CheckUsable();
  if (!status.ok()) return status;
  GatheredWorld out;
  auto gathered = Gather(data, deadline, &out.world);
  if (!gathered.ok()) return gathered.status();
  out.gathered = *std::move(gathered);
  return out;
}

absl::StatusOr<std::vector<std::string>> MpiBootstrap::Gather(
    absl::string_view data, absl::Time deadline,
    std::shared_ptr<Communicator>* world) {
  const absl::Time start = absl::Now();
  absl::Status status;
  auto exchange = std::make_unique<Exchange>();
  Exchange& x = *exchange;
  x.send = std::string(data);
  const uint64_t length = data.size();
  x.block.assign(kBlockBytes, '\0');
  std::memcpy(x.block.data(), &length, sizeof(length));
  std::memcpy(x.block.data() + sizeof(length), data.data(),
              std::min<size_t>(data.size(), kInlineBytes));
  x.blocks.resize(kBlockBytes * static_cast<size_t>(size_));
  MPI_Request request = MPI_REQUEST_NULL;
  // What a rank knows at a deadline: after the first step, which ranks
  // never arrived (asked of ranks 0 and 1, only now); after a later one,
  // that every rank arrived but the others gave up first.
  auto step = [&](int code, absl::string_view call, absl::Time by, bool first) {
    absl::Status s = MpiStatus(code, call);
    if (s.ok()) s = WaitForMpiRequest(&request, by, call);
    if (absl::IsDeadlineExceeded(s)) {
      broken_ = true;
      const std::string known =
          first ? ReportArrival(comm_, rank_, size_, HostIdentity(),
                                ArrivalGrace(deadline - start))
                : LateVerdict();
      AbandonMpi(
          absl::StrCat("rank ", rank_, " of ", size_, ", ", call, ": ", known));
      Abandon(std::move(exchange));
      return absl::DeadlineExceededError(absl::StrCat(
          "rank ", rank_, " of ", size_, ": ", known, "; ", s.message()));
    }
    return s;
  };
  status = step(
      MPI_Iallgather(x.block.data(), kBlockBytes, MPI_CHAR, x.blocks.data(),
                     kBlockBytes, MPI_CHAR, comm_, &request),
      "MPI_Iallgather", deadline, /*first=*/true);
  if (!status.ok()) return status;
  std::vector<uint64_t> lengths(static_cast<size_t>(size_));
  bool inline_only = true;
  for (int r = 0; r < size_; ++r) {
    std::memcpy(&lengths[r], x.blocks.data() + kBlockBytes * r,
                sizeof(uint64_t));
    inline_only = inline_only && lengths[r] <= kInlineBytes;
  }
  std::vector<std::string> out;
  out.reserve(static_cast<size_t>(size_));
  if (inline_only) {
    for (int r = 0; r < size_; ++r) {
      out.push_back(
          x.blocks.substr(kBlockBytes * r + sizeof(uint64_t), lengths[r]));
    }
  } else {
    uint64_t total = 0;
    x.counts.resize(static_cast<size_t>(size_));
    x.displacements.resize(static_cast<size_t>(size_));
    for (int r = 0; r < size_; ++r) {
      x.displacements[r] = static_cast<int>(total);
      x.counts[r] = static_cast<int>(lengths[r]);
      total += lengths[r];
      if (lengths[r] > INT_MAX || total > INT_MAX) {
        // Every rank sees the same lengths, so every rank stops here.
        return absl::InvalidArgumentError(
            absl::StrCat("MPI bootstrap all_gather: ", total,
                         " bytes in all is more than MPI's int counts allow (",
                         INT_MAX, ")"));
      }
    }
    x.recv.resize(total);
    status =
        step(MPI_Iallgatherv(x.send.data(), static_cast<int>(length), MPI_CHAR,
                             x.recv.data(), x.counts.data(),
                             x.displacements.data(), MPI_CHAR, comm_, &request),
             "MPI_Iallgatherv", deadline + kOutcomeGrace, false);
    if (!status.ok()) return status;
    for (int r = 0; r < size_; ++r) {
      out.push_back(x.recv.substr(x.displacements[r], x.counts[r]));
    }
  }
  // Outcome agreement, always the last step: a rank that arrives after the
  // others gave up still completes their abandoned all-gather. A step that
  // only ranks whose gather completed in time post tells it: it completes
  // for all (everyone was on time) or for none (the late rank then fails at
  // its own deadline too). The grace covers ranks whose gather completed a
  // moment apart around the deadline.
  //
  // The step is an MPI_Comm_idup of the bootstrap's communicator, whatever
  // the caller: mesh creation keeps the copy as its world (one collective
  // fewer than a separate closing step and a separate dup); a plain
  // all_gather frees it. One kind of step for every caller keeps ranks that
  // are in different vemesh calls (one flattening while the others re-init)
  // matched collective for collective, so the fingerprints can tell them so.
  if (world != nullptr) {
    auto dup = MpiCommunicator::Dup(comm_, deadline + kOutcomeGrace);
    if (absl::IsDeadlineExceeded(dup.status())) {
      // Dup has marked MPI abandoned; the gather's buffers are complete.
      broken_ = true;
      AbandonMpi(absl::StrCat("rank ", rank_, " of ", size_,
                              ", MPI_Comm_idup (outcome): ", LateVerdict()));
      return absl::DeadlineExceededError(
          absl::StrCat("rank ", rank_, " of ", size_, ": ", LateVerdict(), "; ",
                       dup.status().message()));
    }
    if (!dup.ok()) return dup.status();
    *world = std::shared_ptr<Communicator>(*std::move(dup));
    return out;
  }
  status = step(MPI_Comm_idup(comm_, &x.closing, &request),
                "MPI_Comm_idup (outcome)", deadline + kOutcomeGrace, false);
  if (!status.ok()) return status;
  MPI_Comm_free(&x.closing);
  return out;
}

absl::StatusOr<std::shared_ptr<Communicator>> MpiBootstrap::world(
    absl::Time deadline, absl::Duration) {
  std::lock_guard<std::mutex> lock(mu_);
  absl::Status status = CheckUsable();
  if (!status.ok()) return status;
  // A copy of the private communicator (same members as `base_`, so the
  // same ranks), bounded by the deadline like every bootstrap step.
  auto world = MpiCommunicator::Dup(comm_, deadline);
  if (absl::IsDeadlineExceeded(world.status())) {
    broken_ = true;
    AbandonMpi(absl::StrCat("rank ", rank_, " of ", size_,
                            ", MPI_Comm_idup of the bootstrap's world"));
  }
  if (!world.ok()) return world.status();
  return std::shared_ptr<Communicator>(*std::move(world));
}

}  // namespace vemesh
