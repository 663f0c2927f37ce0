#include "fault_injection.h"

#include <signal.h>

#include <cstdio>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"

namespace train_nd {

absl::StatusOr<FaultInjection> FaultInjection::Parse(const std::string& text,
                                                     int launch_rank) {
  FaultInjection f;
  f.launch_rank_ = launch_rank;
  if (text.empty()) return f;
  std::vector<std::string> parts = absl::StrSplit(text, ':');
  const bool known =
      parts.size() >= 2 && (parts[1] == "dp" || parts[1] == "tp" ||
                            parts[1] == "stop" || parts[1] == "establish" ||
                            parts[1] == "recovery" || parts[1] == "corrupt");
  if (parts.size() < 2 || parts.size() > 3 || !known ||
      !absl::SimpleAtoi(parts[0], &f.step_) ||
      (parts.size() == 3 && !absl::SimpleAtoi(parts[2], &f.rank_))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--fault=", text,
        ": expected STEP:WHERE[:RANK] with WHERE one of dp, tp, stop, "
        "establish, recovery, corrupt"));
  }
  f.where_ = parts[1];
  return f;
}

// Ends this process the way a crash or a hang would.
void FaultInjection::At(const char* where, int64_t step) const {
  if (where_ != where || rank_ != launch_rank_) return;
  if (step >= 0 && step != step_) return;
  std::fprintf(stderr,
               "train_nd: fault: %s at step %d on launch rank %d at %lld ms\n",
               where, static_cast<int>(step), launch_rank_,
               static_cast<long long>(absl::ToUnixMillis(absl::Now())));
  std::fflush(stderr);
  raise(where_ == "stop" ? SIGSTOP : SIGKILL);
}

std::function<void(const char*)> FaultInjection::library_hook() const {
  return [f = *this](const char* point) { f.At(point, -1); };
}

void FaultInjection::Wrap(vemesh::strategies::ElasticLoopHooks& hooks,
                          vemesh::strategies::TrainingState& state) const {
  if (where_ == "recovery") {
    hooks.before_recover = [f = *this](int64_t step) {
      if (step >= f.step_) f.At("recovery", -1);
    };
  }
  if (where_ != "corrupt" || rank_ != launch_rank_) return;
  hooks.on_commit = [f = *this, &state, next = hooks.on_commit](int64_t step,
                                                                double loss) {
    if (next) next(step, loss);
    if (step != f.step_) return;
    std::fprintf(stderr,
                 "train_nd: fault: corrupt after step %lld on launch rank %d\n",
                 static_cast<long long>(step), f.launch_rank_);
    // The first value of the first registered buffer (a parameter).
    auto entries = state.elastic_state();
    if (entries.ok() && !entries->empty() && (*entries)[0].bytes &&
        (*entries)[0].bytes().size() >= sizeof(double)) {
      reinterpret_cast<double*>((*entries)[0].bytes().data())[0] += 1.0;
    }
  };
}

}  // namespace train_nd
