#include "vemesh/comm/mpi/mpi_agreement.h"

#include <mutex>
#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdint>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "vemesh/comm/mpi/mpi_environment.h"

namespace vemesh {
namespace {

// FNV-1a: the same on every process (absl::Hash is seeded per process).
uint64_t Fingerprint(absl::string_view bytes) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

// Length-prefixed fields, so that no value can fake a separator.
std::string Serialize(absl::Span<const AgreementField> fields) {
  std::string out;
  for (const AgreementField& f : fields) {
    absl::StrAppend(&out, f.name.size(), ":", f.name, f.value.size(), ":",
                    f.value);
  }
  return out;
}

std::vector<AgreementField> Parse(absl::string_view text) {
  std::vector<AgreementField> fields;
  auto next = [&text](std::string* out) {
    size_t colon = text.find(':');
    if (colon == absl::string_view::npos) return false;
    size_t length = 0;
    for (char c : text.substr(0, colon)) length = length * 10 + (c - '0');
    if (colon + 1 + length > text.size()) return false;
    *out = std::string(text.substr(colon + 1, length));
    text.remove_prefix(colon + 1 + length);
    return true;
  };
  AgreementField f;
  while (!text.empty() && next(&f.name) && next(&f.value)) fields.push_back(f);
  return fields;
}

std::string Shorten(absl::string_view value) {
  constexpr size_t kMax = 160;
  if (value.size() <= kMax) return std::string(value);
  return absl::StrCat(value.substr(0, kMax), "... (", value.size(),
                      " characters)");
}

// The buffers of the pending collectives. On a timeout they are leaked on
// purpose: MPI may still write into them when a late rank arrives.
struct Exchange {
  uint64_t fingerprint[2] = {0, 0};
  uint64_t reduced[2] = {0, 0};
  uint64_t length = 0;
  std::string text;
  int differs = INT_MAX;
  int first_differing = INT_MAX;
};

// Keeps abandoned exchanges reachable for the life of the process: MPI may
// still write into them, and a leak checker should not call that a leak.
void Abandon(std::unique_ptr<Exchange> exchange) {
  static std::mutex mu;
  static auto* abandoned = new std::vector<std::unique_ptr<Exchange>>();
  std::lock_guard<std::mutex> lock(mu);
  abandoned->push_back(std::move(exchange));
}

class Waiter {
 public:
  Waiter(MPI_Comm comm, absl::string_view operation, absl::Time deadline)
      : comm_(comm), operation_(operation), deadline_(deadline) {}

  // Polls `request` until it completes or the deadline passes. For the
  // first few milliseconds it only yields between polls (ranks usually
  // arrive together, and a sleep would add its whole length to start-up);
  // then it sleeps a little longer each time, so that ranks that arrived
  // early do not steal the CPU from late ones on oversubscribed cores.
  absl::Status Wait(int code, MPI_Request* request, absl::string_view call) {
    absl::Status status = MpiStatus(code, call);
    if (!status.ok()) return status;
    const absl::Time spin_until = absl::Now() + absl::Milliseconds(5);
    auto pause = std::chrono::microseconds(20);
    while (true) {
      int done = 0;
      status = MpiStatus(MPI_Test(request, &done, MPI_STATUS_IGNORE),
                         "MPI_Test");
      if (!status.ok() || done) return status;
      if (absl::Now() >= deadline_) {
        int rank = -1;
        int size = 0;
        MPI_Comm_rank(comm_, &rank);
        MPI_Comm_size(comm_, &size);
        return absl::DeadlineExceededError(absl::StrCat(
            operation_, ": rank ", rank, " of ", size,
            " waited past the deadline for the other ranks to arrive (",
            call, " did not complete). Some rank never made this call; a "
            "collective is left pending, so MPI is unusable now: end the "
            "job."));
      }
      if (absl::Now() < spin_until) {
        std::this_thread::yield();
        continue;
      }
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::microseconds(1000));
    }
  }

 private:
  MPI_Comm comm_;
  absl::string_view operation_;
  absl::Time deadline_;
};

}  // namespace

absl::Status CheckAgreement(MPI_Comm comm, absl::string_view operation,
                            absl::Span<const AgreementField> fields,
                            absl::Time deadline) {
  if (!MpiIsUsable()) {
    return absl::FailedPreconditionError(
        absl::StrCat(operation, ": MPI is not initialised (or finalised)"));
  }
  int rank = 0;
  absl::Status status = MpiStatus(MPI_Comm_rank(comm, &rank), "MPI_Comm_rank");
  if (!status.ok()) return status;

  auto exchange = std::make_unique<Exchange>();
  Exchange& x = *exchange;
  const std::string mine = Serialize(fields);
  const uint64_t h = Fingerprint(mine);
  // max(h) and max(~h) = ~min(h): equal everywhere iff max == min.
  x.fingerprint[0] = h;
  x.fingerprint[1] = ~h;
  Waiter waiter(comm, operation, deadline);
  MPI_Request request = MPI_REQUEST_NULL;

  // Runs one step; on a timeout the buffers must outlive this call.
  auto step = [&](int code, absl::string_view call) {
    absl::Status s = waiter.Wait(code, &request, call);
    if (absl::IsDeadlineExceeded(s)) Abandon(std::move(exchange));
    return s;
  };

  status = step(MPI_Iallreduce(x.fingerprint, x.reduced, 2, MPI_UINT64_T,
                               MPI_MAX, comm, &request),
                "MPI_Iallreduce");
  if (!status.ok()) return status;
  if (x.reduced[0] == ~x.reduced[1]) return absl::OkStatus();

  // They disagree (every rank knows it). Find the first rank that differs
  // from rank 0, then fetch what it passed.
  auto fetch = [&](int root) -> absl::Status {
    x.length = rank == root ? mine.size() : 0;
    absl::Status s = step(
        MPI_Ibcast(&x.length, 1, MPI_UINT64_T, root, comm, &request),
        "MPI_Ibcast");
    if (!s.ok()) return s;
    x.text = rank == root ? mine : std::string(x.length, '\0');
    return step(MPI_Ibcast(x.text.data(), static_cast<int>(x.length),
                           MPI_CHAR, root, comm, &request),
                "MPI_Ibcast");
  };
  status = fetch(0);
  if (!status.ok()) return status;
  const std::string at_zero = x.text;
  x.differs = at_zero == mine ? INT_MAX : rank;
  status = step(MPI_Iallreduce(&x.differs, &x.first_differing, 1, MPI_INT,
                               MPI_MIN, comm, &request),
                "MPI_Iallreduce");
  if (!status.ok()) return status;
  const int other = x.first_differing;
  if (other == INT_MAX) {
    return absl::InternalError(absl::StrCat(
        operation, ": ranks' fingerprints differ but their arguments match"));
  }
  status = fetch(other);
  if (!status.ok()) return status;

  std::vector<AgreementField> zero_fields = Parse(at_zero);
  std::vector<AgreementField> other_fields = Parse(x.text);
  std::string detail;
  for (size_t i = 0; i < zero_fields.size() && i < other_fields.size(); ++i) {
    if (zero_fields[i].value == other_fields[i].value) continue;
    absl::StrAppend(&detail, detail.empty() ? "" : "; ", "rank ", other,
                    " passed ", other_fields[i].name, " ",
                    Shorten(other_fields[i].value), " but rank 0 passed ",
                    Shorten(zero_fields[i].value));
  }
  if (detail.empty()) {
    detail = absl::StrCat("rank ", other, " passed different arguments from rank 0");
  }
  return absl::InvalidArgumentError(absl::StrCat(
      operation, ": the ranks disagree on their arguments (every rank must "
                 "pass the same): ",
      detail));
}

}  // namespace vemesh
