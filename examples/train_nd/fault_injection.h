// examples/train_nd/fault_injection.h
//
// train_nd's --fault STEP:WHERE[:RANK], for the elastic fault tests
// (tests/elastic/elastic_job.sh): not part of training. Launch rank RANK
// (default 0) of this replica ends itself at STEP: `dp` (SIGKILL before the
// DP gradient all_reduce), `tp` (SIGKILL before the step's first TP
// operation), `stop` (SIGSTOP before the DP all_reduce), `establish`
// (SIGKILL while the first epoch's DP groups are built; STEP ignored),
// `recovery` (SIGKILL on entering the first recovery at or after STEP),
// `corrupt` (no signal: adds 1 to one parameter after committing STEP, which
// the fingerprint check must report as DataLoss on every replica).

#ifndef EXAMPLES_TRAIN_ND_FAULT_INJECTION_H_
#define EXAMPLES_TRAIN_ND_FAULT_INJECTION_H_

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "vemesh/strategies/elastic_loop.h"

namespace train_nd {

class FaultInjection {
 public:
  // InvalidArgument naming --fault and the expected form; "" injects none.
  static absl::StatusOr<FaultInjection> Parse(const std::string& text,
                                              int launch_rank);
  // At the point `where` of step `step` (-1: any step).
  void At(const char* where, int64_t step) const;
  // Wires `corrupt` and `recovery` into the loop's hooks (kept), and the
  // library's own fault points (ElasticOptions::fault_hook).
  void Wrap(vemesh::strategies::ElasticLoopHooks& hooks,
            vemesh::strategies::TrainingState& state) const;
  std::function<void(const char*)> library_hook() const;

 private:
  int step_ = -1;
  std::string where_;  // "" = none
  int rank_ = 0;
  int launch_rank_ = 0;
};

}  // namespace train_nd

#endif  // EXAMPLES_TRAIN_ND_FAULT_INJECTION_H_
