// vemesh/elastic/elastic_mesh.h
//
// The reconfigurable mesh: a DP (replica) dimension that shrinks when a
// replica dies and grows when one (re)joins, while the other dimensions stay
// as their launch made them. docs/ELASTIC.md has the protocol and the
// failure model; this is the API a training loop uses.
//
//   InitOptions o;
//   o.elastic = ElasticOptions{.store = "redis://127.0.0.1:6379",
//                              .replica = k};
//   auto mesh = VESCALE_DEVICE_MESH.init_device_mesh("cpu", {2, 3, 2},
//                                                    {"PP", "DP", "TP"}, o);
//   if (!mesh.ok()) return mesh.status();
//   ElasticMesh& el = *VESCALE_DEVICE_MESH.elastic();
//   int64_t step = el.last_recovery().resume_step;   // 0 for a fresh job
//   // What this rank holds, once: the library sends it to joiners.
//   el.register_state_dict_fn("step", SaveStep(&step), LoadStep(&step));
//   el.register_state_dict_fn("model", SaveModel(), LoadModel());
//   absl::Status s = el.sync_state();  // a joiner receives the state here
//   while (step < steps) {
//     if (s.ok()) s = TrainStep(step);               // DP ops may fail
//     absl::StatusOr<StepVerdict> v = el.end_step(s);  // collective
//     if (!v.ok()) return v.status();  // store lost, states differ
//     if (v->committed) ++step; else RestoreStartOfStep();
//     s = absl::OkStatus();
//     if (v->recover) {
//       absl::StatusOr<Recovery> r = el.recover(step);  // carries the state
//       if (!r.ok()) return r.status();  // e.g. the same bug 3 times in a row
//       std::fprintf(stderr, "%s\n", FormatRecovery(*r).c_str());
//       if (r->evicted) return absl::OkStatus();     // not a member any more
//     }
//   }
//
// The state: register_state_dict_fn takes the torchft Manager's pair of
// callbacks (bytes out, bytes in; replica_state.h). On every membership
// change recover() sends it, along the epoch's DP group (the ranks of one
// shard coordinate, one per replica), from the lowest DP rank holding the
// least committed step to every member that lacks it (it joined) or is one
// step ahead (so no undo is left to the caller), and returns only once every
// receiver loaded it: no step commits before. A failed transfer rebuilds the
// epoch (the receiver stays without state). Then, and every
// ElasticOptions::fingerprint_every committed steps, the ranks of each DP
// group compare a 64-bit hash (Fingerprint64) of their state bytes; a
// difference is DataLoss from recover / end_step / sync_state on every rank,
// naming the replicas and the fingerprints they hold.
// tests/elastic/doc_loop_test.cc runs this loop through a kill, a relaunch and
// a corruption. The registered state is the one protocol: what is not
// registered is not carried (a job that registers nothing is stateless, its
// joiners start from what they hold).
//
// A replica is every rank with one DP coordinate; each replica is its own
// launch (mpirun, srun or torchrun), and its inner dimensions (PP, TP, ...)
// are built by that launch as an ordinary mesh. The registry's mesh is the
// full one (PP x DP x TP with DP = the current member count), and it is
// replaced at every epoch: its DP groups are Gloo groups made under the
// epoch's keys, its other groups the launch's, renumbered to the epoch's
// global ranks. The groups it hands out are long-lived: one
// ReconfigurableCommunicator per dimension, made with the first epoch and
// reconfigured with each (torchft's configure), so a module built once on
// them (FSDP, ZeRO, DDP) keeps training across shrink and grow; between
// epochs (a failed step until recover() returns) they fail Unavailable. The
// mesh object (sizes, coordinates) is per epoch: ask the registry again.
//
// end_step is collective over the whole job: every rank calls it once per
// step with its step's status. It retires the DP groups at once on a failed
// step (which releases a peer blocked on them), then agrees inside the
// replica (one all_reduce of 4 int64 over the launch's ranks, none with one
// rank per replica) on four things: did any rank's step fail, did its
// leader see a newer epoch, is the control plane lost, and the code of a
// failure that no lost member explains (max_step_retries), and over DP
// (an all_reduce of 2 int64) on the epoch seen and the control plane. No
// store round trip: the heartbeat thread's last reading of the record.
// Every rank gets the same verdict, except that a replica may have
// committed one step more than another when a peer died inside end_step's
// own exchange; recover() settles that with `resume_step`, carrying the
// state to the replica one step ahead.
//
// No per-step tax (set_verdict_rides_on_step, strategies::RunElasticLoop):
// a step that ran an operation over the DP group (the gradient reduction)
// sends nothing more over DP: that operation succeeded only with every
// replica in it, and a replica that fails or moves to a newer epoch
// retires its groups, so the others' next DP operation fails at once and
// sends them into recovery. Only the replica's own agreement is left. A
// replica may then commit one step more than another (its step succeeded
// where another's failed after its DP operations, or it had not read the
// newer epoch yet): its next step fails and is undone, and recover()
// settles it as above. A step without a DP operation, and a cuda mesh (an
// NCCL peer's retirement does not end its partners' operation), still
// agree over DP.
//
// Rule for the training step: every operation on the replica's own groups
// (PP, TP) comes before the step's first DP operation. A rank whose DP
// operation failed goes straight to end_step; its partners must not be
// waiting for it in a PP or TP collective by then.

#ifndef VEMESH_ELASTIC_ELASTIC_MESH_H_
#define VEMESH_ELASTIC_ELASTIC_MESH_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "vemesh/comm/communicator.h"
#include "vemesh/comm/nccl/cuda_device.h"
#include "vemesh/comm/nccl_options.h"
#include "vemesh/comm/reconfigurable_communicator.h"
#include "vemesh/elastic/epoch_communicator.h"
#include "vemesh/elastic/replica_state.h"
#include "vemesh/mesh/device_mesh.h"
#include "vemesh/rendezvous/store.h"

namespace vemesh {

// The protocol's parts (vemesh/elastic/internal/): not part of the API.
class ControlPlane;
class Heartbeat;
class LivenessListener;
struct MembershipRecord;
struct Reachable;

// The exit status of a rank that the elastic mesh ends itself: another rank
// of its replica died (its liveness port refuses) while the epoch's other
// ranks were blocked on this replica, which can never finish a step again
// (this rank hangs in the replica's own groups until its launcher ends it).
// Ending at once releases the survivors in milliseconds (Gloo cannot
// interrupt a collective already waiting; a peer's exit ends it). EX_TEMPFAIL:
// launch the replica again. Only with ElasticOptions::data_plane_detection.
inline constexpr int kExitReplicaLost = 75;

struct ElasticOptions {
  // The dimension whose coordinate is the replica; its size in the shape
  // given to init_device_mesh is the number of replicas that start the job.
  std::string replica_dim = "DP";
  // The control plane: "redis://HOST:PORT" (or HOST:PORT).
  std::string store;
  // Instead of `store`: a store to use as is (tests; a MemoryStore shared by
  // threads). Its set_lease must work.
  std::shared_ptr<Store> control_store;
  // This launch's replica id, in [0, kMaxReplicas). Ids below the starting
  // count form the first epoch; any other id joins a running job.
  int replica = -1;
  // Keys live under vemesh/elastic/JOB/: one store can serve several jobs.
  std::string job = "default";
  // What every replica of the job must share besides the mesh (recorded as
  // "mesh=SHAPE;replica_dim=DIM"): KEY=VALUE fields separated by ';' (train_nd
  // gives its model, batch and optimizer). The job's founder records it; a
  // joiner that differs is refused with InvalidArgument naming each field.
  std::string descriptor;
  // A rank whose lease is not renewed for this long is dead.
  absl::Duration heartbeat_ttl = absl::Seconds(1);
  // Bound of every DP operation (Gloo) and of building a DP group.
  absl::Duration op_timeout = absl::Seconds(5);
  // Bound of one recover() call, retries included.
  absl::Duration recovery_timeout = absl::Seconds(60);
  // Fewer live replicas than this is an error, not an epoch.
  int min_replicas = 1;
  // How long the first epoch waits for every starting replica before it
  // forms with the ones that came (at least min_replicas).
  absl::Duration form_timeout = absl::Seconds(10);
  // The address this rank's Gloo transport listens on and advertises. Empty
  // (the default): the VEMESH_GLOO_HOST environment variable if set, else
  // the address of the interface that reaches the control plane (a UDP
  // socket connected to it), as the env:// store advertises MASTER_ADDR's.
  std::string gloo_host;
  // With state registered (register_state_dict_fn): also compare the
  // replicas' state fingerprints every this many committed steps of an
  // epoch (0: only after each membership change).
  int fingerprint_every = 0;
  // After a failed step, the survivors agree on the next epoch in a quorum
  // round (quorum_round.h): each replica's leader posts that it is alive,
  // a silent member is probed on its liveness port, and the epoch forms
  // as soon as every member has posted or is gone, milliseconds after the
  // loss instead of one lease TTL. false: leases alone decide (the way
  // before; a benchmark's baseline). Either way a replica that is stopped
  // or hung but still has its port open is decided by its lease.
  bool data_plane_detection = true;
  // A step that fails for a reason other than a lost member (a status
  // other than Unavailable, DeadlineExceeded or Aborted on some rank: a
  // caller's bug, a shape error, a non-finite loss) is retried through this
  // many recoveries in a row; the next such failure ends the job: recover()
  // returns it on every rank (naming the replica and the code), instead of
  // forming epochs forever.
  int max_step_retries = 2;
  // end_step's agreement over DP every step (an all_reduce of 2 int64 on
  // the DP group) even in a loop that lets the step carry it
  // (set_verdict_rides_on_step, strategies::RunElasticLoop): the baseline
  // of bench/elastic_overhead.py, the protocol before issue 47.
  bool agree_every_step = false;
  // Fault injection for tests: called at named points ("establish").
  std::function<void(const char* point)> fault_hook;
};

struct StepVerdict {
  // The step's updates stand (false: undo them, the step is to be redone).
  bool committed = false;
  // Call recover() before the next step.
  bool recover = false;
};

struct Recovery {
  // This replica is not in the new epoch; its DP groups are gone.
  bool evicted = false;
  int64_t epoch = 0;
  int dp_size = 0;
  int dp_rank = 0;
  std::vector<int> replicas;  // DP rank order
  // The step every member resumes at (steps committed before it).
  int64_t resume_step = 0;
  // This rank joined without state: the library loads the registered
  // state into it (sync_state or recover), so it must not restore anything
  // else (a checkpoint) over it.
  bool receives_state = false;
  // The recovery record. detect: the failed step, from its start (the
  // previous end_step's return) to the verdict that sent this rank into
  // recovery (the data plane's error included). agree: the epoch agreed
  // (the quorum round, or waiting out a dead replica's lease). build: its
  // groups built. state: state_time below.
  absl::Duration detect_time;
  absl::Duration agree_time;
  absl::Duration build_time;
  // With state registered: the time spent sending it to the replicas that
  // lacked it (or were a step ahead) and comparing the fingerprints. Zero
  // when nothing was sent or the transfer waits for sync_state().
  absl::Duration state_time;
  // The library carried the state in this recovery (the caller must not
  // broadcast it again, and resume_step is already every member's state).
  bool state_carried = false;
  // Why the step failed, as this rank saw it: its own step's status, or
  // the reason its verdict failed (a peer's failure, a lost member).
  absl::Status step_status;
};

// One line for a log: "recovery: epoch E, DP=N [replicas], resume at step
// S; detect D ms, agree A ms, build B ms, state T ms; step failed: STATUS".
std::string FormatRecovery(const Recovery& r);

class ElasticMesh {
 public:
  // Collective over the replica's launch; joins the job (the first epoch,
  // or a running one) and builds the epoch's mesh. The registry calls it.
  static absl::StatusOr<std::unique_ptr<ElasticMesh>> Create(
      DeviceType device_type, const MeshLayout& requested,
      const MeshOptions& inner_options, const ElasticOptions& options);
  ~ElasticMesh();
  ElasticMesh(const ElasticMesh&) = delete;
  ElasticMesh& operator=(const ElasticMesh&) = delete;

  absl::StatusOr<StepVerdict> end_step(const absl::Status& step_status);
  // Collective over the survivors: leaves the current epoch, waits for (or
  // makes) the next one, rebuilds and agrees on the step to resume.
  // `committed_steps`: how many steps this rank has committed now.
  absl::StatusOr<Recovery> recover(int64_t committed_steps);

  // The current epoch's full mesh, and what recover / Create last decided.
  const DeviceMesh& mesh() const { return *mesh_; }
  const Recovery& last_recovery() const { return last_; }
  int64_t epoch() const { return current_epoch_->load(); }
  // Whether this rank holds the training state (it trained, or received the
  // state after joining), as the next recover() will tell the others.
  bool has_state() const { return has_state_; }
  // This rank joined but did not receive the state it was sent (the send
  // failed): the next recover() counts it as a newcomer again.
  void mark_stateless() { has_state_ = false; }
  int replica() const { return options_.replica; }
  // The elastic dimension's name (ElasticOptions::replica_dim): its groups
  // join the replicas; every other dimension's stay inside this replica.
  const std::string& replica_dim() const { return options_.replica_dim; }
  // Lets a step that ran an operation over the DP group carry end_step's
  // agreement over DP (see end_step above): for loops that end with one
  // more round without a step (end_step with nothing trained, until it
  // commits without recovery), so that a replica that committed the last
  // step learns of a newer epoch or another replica's failure there, as
  // strategies::RunElasticLoop does (it sets this). Off (the default):
  // end_step agrees over DP every step, and the loop above may end as soon
  // as its last step commits. Every rank of the job must choose alike.
  // ElasticOptions::agree_every_step overrides it.
  void set_verdict_rides_on_step(bool rides) { verdict_rides_ = rides; }
  bool verdict_rides_on_step() const {
    return verdict_rides_ && !options_.agree_every_step;
  }
  // end_step's agreements over DP so far (benches and tests): a step that
  // rode on its DP operations adds none.
  int64_t dp_agreements() const { return dp_agreements_; }
  // The training state of this rank, the shape of torchft's Manager: the
  // library calls `state_dict` for the bytes of entry `name` and
  // `load_state_dict` to replace it (replica_state.h). Register the same
  // names on every rank, before sync_state(). What is not registered is not
  // carried.
  absl::Status register_state_dict_fn(
      const std::string& name, ReplicaState::StateDictFn state_dict,
      ReplicaState::LoadStateDictFn load_state_dict);
  // Or the entry's live bytes, sent from, received into and fingerprinted
  // in place (no copy; ReplicaState::RegisterBytes).
  absl::Status register_state_bytes(const std::string& name,
                                    ReplicaState::BytesFn bytes);
  // The 64-bit fingerprint of the state registered on this rank
  // (ReplicaState::Fingerprint): what the replicas compare.
  absl::StatusOr<uint64_t> state_fingerprint() const {
    return state_.Fingerprint();
  }
  // Collective over the epoch's members, once after registering (before the
  // first step): a replica that joined receives the state here from a
  // member holding the same shard coordinate, the members that owe it send
  // it, and every rank compares the state fingerprints along the replicate
  // dimension. recover() does the same itself for every later change.
  // Errors: DataLoss when the replicas' states differ (naming them); a
  // failed transfer leaves this rank without state and retires the epoch
  // (Aborted or Unavailable): pass it to end_step as the step's status.
  absl::Status sync_state();
  // A new communicator over this replica's own ranks (its launch, every
  // dimension but the elastic one), for the replica's work alone, such as
  // its checkpoints (strategies::RunElasticLoop makes its checkpoint's world
  // here). Collective over the replica's ranks; never the agreement's own
  // communicator, and untouched by membership changes.
  absl::StatusOr<std::shared_ptr<Communicator>> new_replica_group();
  // Called by the registry after each epoch's mesh is made (publishes it).
  void set_publisher(std::function<absl::Status(const DeviceMesh&)> publish) {
    publish_ = std::move(publish);
  }

 private:
  ElasticMesh(DeviceType device_type, MeshLayout requested,
              ElasticOptions options);

  // The replica's leader (inner rank 0) waits until the record lists this
  // replica; every rank of the replica gets it.
  absl::StatusOr<MembershipRecord> Join();
  // Leader: the epoch after `failed`, made if nobody has yet.
  absl::StatusOr<MembershipRecord> ChooseEpoch(int64_t failed,
                                               absl::Time deadline);
  // Leader's answer (record or error) to every rank of the replica.
  absl::StatusOr<MembershipRecord> ShareRecord(
      absl::StatusOr<MembershipRecord> mine);
  // Builds `record`'s DP group and agrees on the resume step.
  absl::StatusOr<Recovery> Establish(const MembershipRecord& record,
                                     int64_t committed);
  // The recovery loop from a failed epoch (or from `first`).
  absl::StatusOr<Recovery> Rebuild(int64_t failed,
                                   std::optional<MembershipRecord> first,
                                   int64_t committed);
  // Max of `values` over the replica's ranks (never fails but on a
  // replica-internal error, which its launcher turns into the replica's end).
  absl::Status ReplicaMax(absl::Span<int64_t> values);
  // With state registered: the pending transfer of the current epoch (if
  // any), then the fingerprint comparison; agreed over the replica.
  absl::Status CarryState(absl::string_view where);
  void RetireEpoch();
  // A step starts (end_step, recover, sync_state and Establish return):
  // its detect time and the DP group's operation count are taken from here.
  void MarkStep();
  // `device_group` (cuda: the epoch's NCCL DP group, else null) is the
  // mesh's DP group; `dp_group` (Gloo) then carries the mesh's agreements.
  absl::StatusOr<DeviceMesh> FullMesh(
      const MembershipRecord& record, std::shared_ptr<Communicator> dp_group,
      std::shared_ptr<Communicator> device_group);
  int64_t FullRank(int inner_rank, int dp_index, int dp_size) const;

  const DeviceType device_type_;
  const MeshLayout requested_;  // the shape asked for (DP = starting count)
  const ElasticOptions options_;
  int64_t replica_dim_ = 0;
  std::optional<DeviceMesh> inner_;    // the replica's launch: all dims but DP
  std::vector<int64_t> inner_dim_of_;  // full dim -> inner dim, -1 for DP
  std::shared_ptr<Communicator> replica_comm_;  // every rank of the replica
  int inner_rank_ = 0;
  int inner_size_ = 1;
  std::unique_ptr<ControlPlane> control_;
  std::unique_ptr<Heartbeat> heartbeat_;
  // This rank's liveness port (liveness_probe.h); null if it could not open.
  std::unique_ptr<LivenessListener> liveness_;
  // The incarnations (and hosts) whose liveness port answered this leader
  // (probed once after each epoch is built, and while one forms): only
  // their refusal means gone.
  std::unique_ptr<Reachable> reachable_;
  absl::Time step_began_ = absl::Now();  // the last end_step's return
  // dp_ and its started() at MarkStep: a step that started an operation on
  // the same group since rode on it (no DP agreement in end_step).
  std::pair<const EpochCommunicator*, int64_t> step_mark_{nullptr, 0};
  int64_t dp_agreements_ = 0;
  bool verdict_rides_ = false;
  absl::Duration detect_time_;  // of the verdict that asks recovery
  const std::shared_ptr<std::atomic<int64_t>> current_epoch_;
  std::vector<std::shared_ptr<EpochCommunicator>> epoch_comms_;
  // The groups the mesh hands out, one per dimension, made with the first
  // epoch and reconfigured with each (torchft's configure): a module built
  // once over them (FSDP, ZeRO, DDP) follows the membership. Between epochs
  // they fail Unavailable.
  std::vector<std::shared_ptr<ReconfigurableCommunicator>> groups_;
  // The host DP group: end_step's agreement, state transfer, fingerprints.
  std::shared_ptr<EpochCommunicator> dp_;
  // cuda: the current epoch's NCCL communicators (its DP group), aborted
  // together when it ends; and where and how the next are made.
  std::vector<std::shared_ptr<Communicator>> epoch_device_groups_;
  CudaDeviceRequest cuda_request_;
  NcclOptions nccl_options_;
  std::optional<DeviceMesh> mesh_;
  Recovery last_;
  bool has_state_ = false;
  ReplicaState state_;
  // The current epoch's state transfer is still to be done (Create's, which
  // runs before the caller can register), and this rank then receives.
  bool transfer_pending_ = false;
  bool receive_pending_ = false;
  int state_root_ = 0;  // the DP rank the pending transfer sends from
  int64_t steps_since_fingerprint_ = 0;
  // Step failures that were not a lost member, in a row (agreed by every
  // member at each epoch), the largest such status code and its replica.
  int64_t step_errors_ = 0;
  int64_t step_error_code_ = 0;
  int64_t step_error_replica_ = -1;
  absl::Status step_status_;  // of the failed step that asked recovery
  std::function<absl::Status(const DeviceMesh&)> publish_;
  uint64_t incarnation_ = 0;      // this launch's (membership.h)
  bool joined_unformed_ = false;  // Join saw the job before its first epoch
  int64_t formed_from_ = -1;      // ... and at this epoch number
  // The record of the epoch this replica is in, and the job's descriptor:
  // what the heartbeat thread of the replica's rank 0 writes back if the
  // store loses them (a Redis restarted empty).
  // The same thread also reads the record after each renewal, so that a
  // step's end_step needs no store round trip: the last reading (epoch,
  // whether replicas wait to join, when) is what end_step uses while it is
  // younger than the heartbeat TTL.
  struct Guard {
    std::mutex mu;
    std::string record;  // under mu
    std::string descriptor;
    int64_t seen_epoch = -1;                    // under mu
    bool joiners_waiting = false;               // under mu
    absl::Time read_at = absl::InfinitePast();  // under mu
    // The last Remember: a reading that began before it is dropped.
    absl::Time remembered_at = absl::InfinitePast();  // under mu
    // The epoch this rank is in (-1 between epochs), for the liveness
    // listener's OnAbortMessage; the epoch in which this rank told the
    // others (AbortEpochPeers), or was told (once per epoch is enough).
    int64_t live_epoch = -1;  // under mu
    int64_t told_epoch = -1;  // under mu
    // This replica's other ranks' liveness ports (read once at start).
    std::vector<std::string> mates;  // under mu
  };
  // The liveness listener's handler of "abort INCARNATION EPOCH"
  // (AbortEpochPeers): ends the process (kExitReplicaLost) if another rank
  // of its replica is gone.
  static void OnAbortMessage(Guard& guard, uint64_t incarnation, int replica,
                             int rank, absl::string_view text);
  // Tells every other rank of the epoch (its liveness port) that this
  // rank's step lost a peer: a replica that cannot progress (one of its
  // ranks died, the others hang in its own groups until its launcher ends
  // them) ends its live ranks at once, which releases the ranks blocked
  // with them in milliseconds, not at the op timeout. Once per epoch, by
  // the first rank that fails.
  void AbortEpochPeers(int64_t epoch);
  void Remember(const MembershipRecord& record);
  std::shared_ptr<Guard> guard_ = std::make_shared<Guard>();
  std::unique_ptr<MembershipRecord> known_;
  std::string descriptor_;
  std::string gloo_host_;
  std::string store_name_;  // for messages
};

}  // namespace vemesh

#endif  // VEMESH_ELASTIC_ELASTIC_MESH_H_
