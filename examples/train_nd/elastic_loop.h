// examples/train_nd/elastic_loop.h
//
// train_nd's elastic mode: one launch is one DP replica, the replicas meet
// through the control plane, and training goes on when one dies or joins.
//
//   mpirun -n 2 train_nd --mesh PP=1,DP=3,TP=2 --batch 24
//       --elastic redis://127.0.0.1:6379 --replica 1      (one line)
//
// Per step: snapshot the parameters, train, then ElasticMesh::end_step
// (one verdict for the whole job). A failed step is undone; after a
// membership change the replica re-shards the global batch over the new DP
// size; the library carries the registered parameters (ElasticMesh::
// register_state_dict_fn) to a replica that joined or was one step ahead,
// and compares the replicas' state fingerprints after every change (and
// every --fingerprint_every steps). Replica leaders print
// `membership: epoch E, DP=N ...` at start and at every change; each
// replica's rank 0 ends with PASS/FAIL against the serial reference over the
// steps it trained, whether the parameters are identical on every replica,
// and the live communicator count against the count after start.
//
// --fault STEP:WHERE[:RANK] makes launch rank RANK (default 0) of this
// replica end itself at STEP, for the fault tests: `dp` (SIGKILL before the
// DP gradient all_reduce), `tp` (SIGKILL before the step's first TP
// operation), `stop` (SIGSTOP before the DP all_reduce), `establish`
// (SIGKILL while the first epoch's DP groups are built; STEP ignored),
// `recovery` (SIGKILL on entering the first recovery at or after STEP),
// `corrupt` (no signal: adds 1 to one parameter after committing STEP, which
// the fingerprint check must report as DataLoss on every replica).

#ifndef EXAMPLES_TRAIN_ND_ELASTIC_LOOP_H_
#define EXAMPLES_TRAIN_ND_ELASTIC_LOOP_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "train_options.h"

namespace train_nd {

struct ElasticSettings {
  std::string store;  // redis://HOST:PORT
  int replica = -1;
  int min_replicas = 1;
  std::string job = "train_nd";
  absl::Duration heartbeat_ttl = absl::Seconds(1);
  absl::Duration op_timeout = absl::Seconds(3);
  // Bound of one recovery, retries included (ElasticOptions).
  absl::Duration recovery_timeout = absl::Seconds(60);
  std::string fault;  // STEP:WHERE[:RANK], empty = none
  // Each step lasts at least this long (demos, and fault tests that act
  // from outside at a moment of their choosing).
  absl::Duration pace = absl::ZeroDuration();
  // ElasticOptions::fingerprint_every.
  int fingerprint_every = 0;
  // Leases alone detect a lost replica (ElasticOptions.data_plane_detection
  // off): the baseline of bench/elastic_kill.py.
  bool lease_detection = false;
  // ElasticOptions::agree_every_step (the per-step cost's baseline).
  bool agree_every_step = false;
};

// After each recovery, the replica's rank 0 prints its record once the first
// step after it commits:
//   recovery: detect D ms, agree A ms, rebuild R ms, state S ms; first good
//   step K at=UNIX_MS
// (one line; S is the state broadcast to the joiners, 0 if none; K the
// committed step count; UNIX_MS the wall clock when it committed).
//
// Returns the process exit code: 0 PASS, 1 FAIL or error, 3 evicted.
int RunElastic(const TrainPlan& plan, const ElasticSettings& settings,
               int launch_rank);

}  // namespace train_nd

#endif  // EXAMPLES_TRAIN_ND_ELASTIC_LOOP_H_
