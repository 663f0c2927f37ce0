#include "vemesh/comm/work.h"

#include <sched.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "vemesh/comm/communicator.h"

namespace vemesh {
namespace {

// How often a waiting thread looks at an unfinished operation. A backend's
// progress (MPI's, notably) happens inside Poll, so the first looks come
// back to back; then, for a few milliseconds, each look is followed by a
// yield (unless Poll yields by itself); a long wait sleeps between looks so
// that oversubscribed ranks (8 on 2 cores in the tests) leave the CPU to the
// rank they wait for.
constexpr int kSpinPolls = 256;
constexpr absl::Duration kYieldPhase = absl::Milliseconds(5);
constexpr absl::Duration kLongSleep = absl::Microseconds(100);

}  // namespace

Work::Work(std::shared_ptr<Communicator> owner, std::string name)
    : owner_(std::move(owner)), name_(std::move(name)) {}

Work::~Work() = default;

void Work::Finish(absl::Status status) {
  done_ = true;
  status_ = std::move(status);
}

bool Work::test() {
  if (done_) return true;
  if (std::optional<absl::Status> result = Poll()) {
    Finish(*std::move(result));
    return true;
  }
  if (owner_ != nullptr && owner_->aborted() && LeavesOnAbort()) {
    Finish(owner_->AbortedError(name_));
    return true;
  }
  return false;
}

absl::Status Work::wait(absl::Time deadline) {
  const absl::Time start = absl::Now();
  for (int polls = 0; !done_; ++polls) {
    if (test()) break;
    if (polls < kSpinPolls) continue;
    const absl::Time now = absl::Now();
    if (now >= deadline) {
      const absl::Status late = absl::DeadlineExceededError(absl::StrCat(
          name_, " on a ",
          owner_ != nullptr ? owner_->backend() : absl::string_view("?"),
          " communicator did not finish within ",
          absl::FormatDuration(deadline - start),
          "; the communicator is aborted (a peer never joined or is stuck)"));
      if (owner_ != nullptr) owner_->abort(late.message());
      // The backend may still write into the buffers: until it lets go.
      while (!LeavesOnAbort() && !Poll().has_value()) {
        absl::SleepFor(absl::Milliseconds(1));
      }
      Finish(late);
      break;
    }
    if (now - start < kYieldPhase) {
      if (!PollYields()) sched_yield();
    } else {
      absl::SleepFor(std::min(kLongSleep, deadline - now));
    }
  }
  return status_;
}

absl::Status Work::status() const {
  if (done_) return status_;
  return absl::FailedPreconditionError(
      absl::StrCat(name_, " is still running: wait() or test() first"));
}

namespace {

class Completed final : public Work {
 public:
  Completed(std::shared_ptr<Communicator> owner, std::string name,
            absl::Status status)
      : Work(std::move(owner), std::move(name)), result_(std::move(status)) {}

 protected:
  std::optional<absl::Status> Poll() override { return result_; }

 private:
  absl::Status result_;
};

}  // namespace

std::shared_ptr<Work> CompletedWork(std::shared_ptr<Communicator> owner,
                                    std::string name, absl::Status status) {
  return std::make_shared<Completed>(std::move(owner), std::move(name),
                                     std::move(status));
}

}  // namespace vemesh
