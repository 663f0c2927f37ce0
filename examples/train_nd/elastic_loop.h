// examples/train_nd/elastic_loop.h
//
// train_nd's elastic mode: one launch is one DP replica (under HSDP one
// DP_REPLICATE coordinate), the replicas meet through the control plane,
// and training goes on when one dies or joins.
//
//   mpirun -n 2 train_nd --mesh PP=1,DP=3,TP=2 --batch 24
//       --elastic redis://127.0.0.1:6379 --replica 1      (one line)
//
// The library does the rest (vemesh/strategies/elastic_loop.h): this file
// names the model and how it trains (DataParallelTrainer), gives the step,
// and re-slices the data after a membership change. The loop's lines
// (membership, step, recovery, checkpoint) are the library's; each
// replica's rank 0 ends with
//   PASS|FAIL: replica K: loss curve vs serial reference over steps A..B
//   (N steps): max relative difference D (step S) <|>= TOL; parameters
//   identical|DIFFERENT across DP=R replicas; X recoveries; communicators C
//   (after start C0)
// (one line): the steps it trained against the serial run
// (strategies::CompareLossCurve), the loop's end-of-job comparison of the
// replicas, and its communicator counts. --fault (fault_injection.h) is for
// the fault tests.

#ifndef EXAMPLES_TRAIN_ND_ELASTIC_LOOP_H_
#define EXAMPLES_TRAIN_ND_ELASTIC_LOOP_H_

#include <string>

#include "absl/time/time.h"
#include "train_options.h"
#include "vemesh/elastic/elastic_mesh.h"

namespace train_nd {

struct ElasticSettings {
  // The flags' values; train_nd adds replica_dim, descriptor, fault_hook.
  vemesh::ElasticOptions options;
  std::string fault;  // --fault STEP:WHERE[:RANK], empty = none
  // Each step lasts at least this long (demos, fault tests).
  absl::Duration pace = absl::ZeroDuration();
};

// The process exit code: 0 PASS, 1 FAIL or error, 3 evicted.
int RunElastic(const TrainPlan& plan, const ElasticSettings& settings,
               int launch_rank);

}  // namespace train_nd

#endif  // EXAMPLES_TRAIN_ND_ELASTIC_LOOP_H_
