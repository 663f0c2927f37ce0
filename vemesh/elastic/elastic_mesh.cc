// ElasticMesh's creation: the options checked, the replica launched, the
// control plane reached, the first epoch built. Joining, choosing and
// establishing an epoch, the step and recovery: elastic_join.cc,
// elastic_epoch_choice.cc, elastic_establish.cc, elastic_recovery.cc.

#include "vemesh/elastic/elastic_mesh.h"

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "vemesh/bootstrap/launch.h"
#include "vemesh/comm/nccl/nccl_communicator.h"
#include "vemesh/elastic/internal/elastic_mesh_internal.h"
#include "vemesh/elastic/internal/quorum_round.h"
#include "vemesh/rendezvous/redis/redis_store.h"

namespace vemesh {
namespace {

constexpr char kReplicaDimName[] = "__replica";

// The host communicator with the members of `comm`: an NCCL group's twin,
// `comm` itself for a host backend. The elastic mesh's own agreements (host
// buffers) run on it.
std::shared_ptr<Communicator> HostSideOf(std::shared_ptr<Communicator> comm) {
#ifdef VEMESH_HAVE_NCCL
  if (auto nccl = std::dynamic_pointer_cast<NcclCommunicator>(comm)) {
    return nccl->twin();
  }
#endif
  return comm;
}

absl::Status CheckOptions(DeviceType device_type, const MeshLayout& layout,
                          const ElasticOptions& o) {
  if (device_type != DeviceType::kCpu && device_type != DeviceType::kCuda) {
    return absl::UnimplementedError(absl::StrCat(
        "an elastic mesh on device '", DeviceTypeName(device_type),
        "' is not built: use 'cpu' (Gloo DP groups) or 'cuda' (NCCL DP "
        "groups over Gloo twins)"));
  }
  if (o.replica < 0 || o.replica >= kMaxReplicas) {
    return absl::InvalidArgumentError(
        absl::StrCat("ElasticOptions.replica is ", o.replica,
                     ": expected an id in [0, ", kMaxReplicas, ")"));
  }
  if (!layout.find_dim(o.replica_dim).has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat("ElasticOptions.replica_dim '", o.replica_dim,
                     "' is not a dimension of ", layout.ToString()));
  }
  if (layout.has_rank_table()) {
    return absl::InvalidArgumentError(
        "an elastic mesh numbers its ranks itself: InitOptions.mesh.ranks "
        "must be empty");
  }
  if (o.heartbeat_ttl < absl::Milliseconds(20) ||
      o.heartbeat_ttl > absl::Hours(1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ElasticOptions.heartbeat_ttl is ",
        absl::FormatDuration(o.heartbeat_ttl), ": expected 20ms to 1h"));
  }
  for (const auto& [name, d] :
       {std::pair<const char*, absl::Duration>{"op_timeout", o.op_timeout},
        {"recovery_timeout", o.recovery_timeout},
        {"form_timeout", o.form_timeout}}) {
    if (d <= absl::ZeroDuration() || d == absl::InfiniteDuration()) {
      return absl::InvalidArgumentError(
          absl::StrCat("ElasticOptions.", name, " is ", absl::FormatDuration(d),
                       ": expected a positive, finite time"));
    }
  }
  if (o.min_replicas < 1 || o.min_replicas > kMaxReplicas) {
    return absl::InvalidArgumentError(
        absl::StrCat("ElasticOptions.min_replicas is ", o.min_replicas,
                     ": expected 1 to ", kMaxReplicas));
  }
  if (o.fingerprint_every < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ElasticOptions.fingerprint_every is ", o.fingerprint_every,
        ": expected 0 (only after "
        "membership changes) or a positive step count"));
  }
  if (o.max_step_retries < 0 || o.max_step_retries > 1000) {
    return absl::InvalidArgumentError(
        absl::StrCat("ElasticOptions.max_step_retries is ", o.max_step_retries,
                     ": expected 0 to 1000"));
  }
  if (o.store.empty() && o.control_store == nullptr) {
    return absl::InvalidArgumentError(
        "ElasticOptions.store is empty: expected redis://HOST:PORT");
  }
  return absl::OkStatus();
}

// A random, non-zero incarnation that fits an int64 (it is shared over the
// replica with an int64 reduction).
int64_t NewIncarnation() {
  std::random_device device;
  std::mt19937_64 gen((uint64_t{device()} << 32) ^ device() ^
                      static_cast<uint64_t>(absl::ToUnixNanos(absl::Now())));
  const int64_t v = static_cast<int64_t>(gen() >> 1);
  return v == 0 ? 1 : v;
}

// The host of "redis://[USER:PASSWORD@]HOST:PORT" (or HOST:PORT).
std::string StoreHost(absl::string_view url) {
  if (absl::StartsWith(url, "redis://")) url.remove_prefix(8);
  if (size_t at = url.rfind('@'); at != absl::string_view::npos) {
    url.remove_prefix(at + 1);
  }
  if (absl::StartsWith(url, "[")) {
    size_t close = url.find(']');
    return std::string(url.substr(1, close == absl::string_view::npos
                                         ? absl::string_view::npos
                                         : close - 1));
  }
  return std::string(url.substr(0, url.rfind(':')));
}

}  // namespace

std::string FormatRecovery(const Recovery& r) {
  if (r.evicted) {
    return absl::StrCat("recovery: evicted in epoch ", r.epoch, " (members ",
                        absl::StrJoin(r.replicas, ", "), ")");
  }
  return absl::StrFormat(
      "recovery: epoch %d, DP=%d [%s], resume at step %d; detect %.1f ms, "
      "agree %.1f ms, build %.1f ms, state %.1f ms; step failed: %s",
      r.epoch, r.dp_size, absl::StrJoin(r.replicas, ", "), r.resume_step,
      absl::ToDoubleMilliseconds(r.detect_time),
      absl::ToDoubleMilliseconds(r.agree_time),
      absl::ToDoubleMilliseconds(r.build_time),
      absl::ToDoubleMilliseconds(r.state_time),
      r.step_status.ok() ? "(no step failed)" : r.step_status.ToString());
}

ElasticMesh::ElasticMesh(DeviceType device_type, MeshLayout requested,
                         ElasticOptions options)
    : device_type_(device_type),
      requested_(std::move(requested)),
      options_(std::move(options)),
      reachable_(std::make_unique<Reachable>()),
      current_epoch_(std::make_shared<std::atomic<int64_t>>(0)),
      known_(std::make_unique<MembershipRecord>()) {}

ElasticMesh::~ElasticMesh() {
  RetireEpoch();
  heartbeat_.reset();
}

absl::StatusOr<std::unique_ptr<ElasticMesh>> ElasticMesh::Create(
    DeviceType device_type, const MeshLayout& requested,
    const MeshOptions& inner_options, const ElasticOptions& options) {
  if (absl::Status s = CheckOptions(device_type, requested, options); !s.ok()) {
    return s;
  }
  // A write to a replica that just died is Unavailable, not SIGPIPE: the Gloo
  // backend writes with SIGPIPE blocked (vemesh/base/sigpipe.h).
  std::unique_ptr<ElasticMesh> el(
      new ElasticMesh(device_type, requested, options));
  el->replica_dim_ = *requested.find_dim(options.replica_dim);

  // The replica's own mesh: every dimension but the replica one.
  std::vector<int64_t> shape;
  std::vector<std::string> names;
  for (int64_t d = 0; d < requested.ndim(); ++d) {
    if (d == el->replica_dim_) {
      el->inner_dim_of_.push_back(-1);
      continue;
    }
    el->inner_dim_of_.push_back(static_cast<int64_t>(names.size()));
    shape.push_back(requested.dim_size(d).value_or(1));
    names.push_back(requested.dim_name(d));
  }
  if (names.empty()) {
    shape = {1};
    names = {kReplicaDimName};
  }
  auto inner_layout = MeshLayout::Create(shape, names);
  if (!inner_layout.ok()) return inner_layout.status();
  auto inner = DeviceMesh::Create(device_type, *inner_layout, inner_options);
  if (!inner.ok()) return inner.status();
  el->inner_ = *inner;
  // cuda: each epoch's DP group is an NCCL communicator on the device the
  // launch's mesh bound.
  el->cuda_request_ = CudaDeviceRequest{
      inner_options.cuda_device, inner->host_local_rank(), inner->host_size()};
  el->nccl_options_ = inner_options.nccl;
  // The replica's agreement runs on a communicator of its own, never on one
  // the training step uses: a rank that left its step early must not meet
  // its partner inside another collective. On cuda it is the host side (an
  // NCCL group's twin): its buffers are host memory.
  auto replica_comm = names.size() == 1
                          ? inner->get_group(names[0])
                          : inner->flatten(names, kReplicaDimName);
  if (!replica_comm.ok()) return replica_comm.status();
  replica_comm = HostSideOf(*replica_comm);
  if (names.size() == 1) {
    replica_comm = (*replica_comm)->split(0, (*replica_comm)->rank());
    if (!replica_comm.ok()) return replica_comm.status();
  }
  if ((*replica_comm)->backend() == BackendName(Backend::kNccl)) {
    return absl::InternalError(
        "elastic mesh: the replica's NCCL group has no host twin");
  }
  el->replica_comm_ = *replica_comm;
  el->inner_rank_ = el->replica_comm_->rank();
  el->inner_size_ = el->replica_comm_->size();

  // This launch's incarnation: rank 0's, for every rank of the replica.
  int64_t incarnation = el->inner_rank_ == 0 ? NewIncarnation() : 0;
  if (absl::Status s = el->ReplicaMax(absl::MakeSpan(&incarnation, 1));
      !s.ok()) {
    return s;
  }
  el->incarnation_ = static_cast<uint64_t>(incarnation);
  el->store_name_ = options.control_store != nullptr
                        ? std::string("ElasticOptions.control_store")
                        : options.store;
  el->descriptor_ = absl::StrCat("mesh=", requested.ToString(),
                                 ";replica_dim=", options.replica_dim);
  // Every member must run the same fingerprint checks (they are
  // collectives): a joiner with another period is refused.
  if (options.fingerprint_every > 0) {
    absl::StrAppend(&el->descriptor_,
                    ";fingerprint_every=", options.fingerprint_every);
  }
  // And the same bound on a step's own failures (every member must decide
  // alike when the job ends).
  if (options.max_step_retries != ElasticOptions{}.max_step_retries) {
    absl::StrAppend(&el->descriptor_,
                    ";max_step_retries=", options.max_step_retries);
  }
  if (!options.descriptor.empty()) {
    absl::StrAppend(&el->descriptor_, ";", options.descriptor);
  }
  el->guard_->descriptor = el->descriptor_;
  // The address the DP groups advertise: the store's rule (the interface
  // that reaches the control plane), overridable.
  el->gloo_host_ = options.gloo_host;
  if (const char* forced = std::getenv("VEMESH_GLOO_HOST");
      el->gloo_host_.empty() && forced != nullptr && *forced != 0) {
    el->gloo_host_ = forced;
  }
  if (el->gloo_host_.empty()) {
    if (options.control_store != nullptr) {
      el->gloo_host_ = "127.0.0.1";
    } else {
      auto host = LocalAddressTowards(StoreHost(options.store));
      if (!host.ok()) return host.status();
      el->gloo_host_ = *host;
    }
  }

  // The control plane: one connection for the protocol, one for the
  // heartbeat (its renewals must not queue behind a slow call, and each is
  // bounded by a quarter of the TTL so that one stalled call cannot let
  // the lease lapse unnoticed).
  std::shared_ptr<Store> store = options.control_store;
  std::shared_ptr<Store> beat_store = options.control_store;
  absl::Status connected;
  if (store == nullptr) {
    RedisStoreOptions ro;
    ro.connect_timeout = options.op_timeout;
    ro.op_timeout = options.op_timeout;
    auto a = RedisStore::Connect(options.store, ro);
    RedisStoreOptions beat = ro;
    beat.op_timeout = std::min(options.op_timeout, options.heartbeat_ttl / 4);
    auto b = a.ok() ? RedisStore::Connect(options.store, beat) : a;
    if (a.ok() && b.ok()) {
      store = *a;
      beat_store = *b;
    } else {
      connected = a.ok() ? b.status() : a.status();
    }
  }
  std::unique_ptr<Heartbeat> heartbeat;
  if (connected.ok()) {
    el->control_ =
        std::make_unique<ControlPlane>(store, options.job, el->inner_size_);
    // A Redis restarting is waited for within a lease TTL (the leases
    // outlive that long), in a step's verdict and in a recovery alike.
    el->control_->set_retry_for(options.heartbeat_ttl);
    // The replica's rank 0 also writes the record back if the store lost it
    // (on the heartbeat's thread: a long step must not delay it).
    std::function<void()> guard;
    if (el->inner_rank_ == 0) {
      guard = [g = el->guard_,
               cp = std::make_shared<ControlPlane>(beat_store, options.job,
                                                   el->inner_size_),
               ttl = options.heartbeat_ttl, renewals = int64_t{0}]() mutable {
        std::string record;
        {
          std::lock_guard<std::mutex> lock(g->mu);
          record = g->record;
        }
        (void)cp->RestoreIfAbsent(record, g->descriptor);
        // A store that lost its keys (restarted empty): every live rank's
        // lease is back within a TTL; absent ones prove nothing till then.
        (void)cp->NoteStoreUp(ttl);
        // The reading end_step uses instead of its own round trip: every
        // other renewal (each TTL/2, fresh enough for end_step's window of
        // one TTL), so that the renewals' own spacing stays short.
        if (++renewals % 2 != 0) return;
        const absl::Time began = absl::Now();
        absl::StatusOr<ControlPlane::Reading> now = cp->Read();
        if (!now.ok()) return;
        std::lock_guard<std::mutex> lock(g->mu);
        // Older than what the training thread learned meanwhile (Remember):
        // it would make end_step read the store until the next reading.
        if (began < g->remembered_at) return;
        g->seen_epoch = now->record.epoch;
        g->joiners_waiting = !now->record.pending.empty();
        g->read_at = absl::Now();
      };
    }
    auto hb = Heartbeat::Start(
        beat_store,
        el->control_->LeaseKey(options.replica, el->incarnation_,
                               el->inner_rank_),
        options.heartbeat_ttl, std::move(guard));
    if (hb.ok()) {
      el->heartbeat_ = *std::move(hb);
    } else {
      connected = hb.status();
    }
  }
  // Every rank of the replica leaves together: one that could not reach
  // the store must not leave the others waiting for it.
  int64_t failed = connected.ok() ? 0 : 1;
  if (absl::Status s = el->ReplicaMax(absl::MakeSpan(&failed, 1)); !s.ok()) {
    return s;
  }
  if (!connected.ok()) return connected;
  if (failed != 0) {
    return absl::UnavailableError(absl::StrCat(
        "replica ", options.replica,
        ": another rank of this replica could not reach the control plane '",
        options.store, "'"));
  }

  // Every rank's liveness port, advertised for this incarnation: the others'
  // quorum rounds tell a replica with a killed rank by it (without it,
  // leases decide).
  if (options.data_plane_detection) {
    auto on_message = [guard = el->guard_, inc = el->incarnation_,
                       replica = options.replica,
                       rank = el->inner_rank_](absl::string_view text) {
      OnAbortMessage(*guard, inc, replica, rank, text);
    };
    auto listener =
        LivenessListener::Start(el->gloo_host_, std::move(on_message));
    if (listener.ok()) {
      // Kept whatever the set answers: a set that reached the store but
      // timed out here must not leave an advertised port closed.
      (void)el->control_->store()->set(
          el->control_->ProbeKey(options.replica, el->incarnation_,
                                 el->inner_rank_),
          (*listener)->address());
      el->liveness_ = *std::move(listener);
    }
  }
  auto record = el->ShareRecord(
      el->inner_rank_ == 0
          ? el->Join()
          : absl::StatusOr<MembershipRecord>(MembershipRecord{}));
  if (!record.ok()) return record.status();
  if (el->liveness_ != nullptr) {
    // Every rank advertised before ShareRecord: the replica's other ranks'
    // ports, which OnAbortMessage probes.
    std::vector<std::string> mates;
    auto where =
        el->control_->ProbeAddresses(options.replica, el->incarnation_);
    for (int r = 0; where.ok() && r < el->inner_size_; ++r) {
      const std::string& at = (*where)[r];
      // Only a port seen answering from here: the refusal of an address
      // wrong from this host (another host's loopback) proves nothing.
      if (r != el->inner_rank_ && !at.empty() &&
          ProbeLiveness(at, elastic_internal::kProbeTimeout) ==
              Liveness::kListening) {
        mates.push_back(at);
      }
    }
    std::lock_guard<std::mutex> lock(el->guard_->mu);
    el->guard_->mates = std::move(mates);
  }
  // The first epoch's members start together from their initial state (a
  // replica that saw the job unformed and was admitted to epoch 1); a
  // replica admitted later has none until a member sends it.
  // Only rank 0 joined: its view is the replica's.
  int64_t stateful = el->inner_rank_ == 0 && el->joined_unformed_ &&
                     record->epoch == el->formed_from_ + 1;
  if (absl::Status s = el->ReplicaMax(absl::MakeSpan(&stateful, 1)); !s.ok()) {
    return s;
  }
  el->has_state_ = stateful == 1;
  auto first = el->Rebuild(record->epoch - 1, *record, el->has_state_ ? 0 : -1);
  if (!first.ok()) return first.status();
  if (first->evicted) {
    return absl::UnavailableError(
        absl::StrCat("replica ", options.replica, " was admitted to ",
                     MembershipText(*record), " but left out of epoch ",
                     first->epoch, " before it could build its groups"));
  }
  return el;
}

void ElasticMesh::OnAbortMessage(Guard& guard, uint64_t incarnation,
                                 int replica, int rank,
                                 absl::string_view text) {
  std::vector<absl::string_view> f = absl::StrSplit(text, ' ');
  uint64_t inc = 0;
  int64_t epoch = 0;
  if (f.size() != 3 || f[0] != "abort" || !absl::SimpleHexAtoi(f[1], &inc) ||
      inc != incarnation || !absl::SimpleAtoi(f[2], &epoch)) {
    return;  // not for this incarnation (or not a message): ignored
  }
  std::vector<std::string> mates;
  {
    std::lock_guard<std::mutex> lock(guard.mu);
    // Not in that epoch any more, or told already (once is enough).
    if (guard.live_epoch != epoch || guard.told_epoch == epoch) return;
    guard.told_epoch = epoch;
    mates = guard.mates;
  }
  // Gloo cannot interrupt a collective already waiting (and a group that
  // closed its own connections no longer hears its peers), but a peer's
  // exit ends it at once. A rank whose replica lost another rank can never
  // finish a step again (its main thread hangs in the replica's own groups
  // until the launcher ends it): it ends now, so that its peers are
  // released in milliseconds instead of at the op timeout. A rank of a
  // whole replica does nothing.
  for (const std::string& mate : mates) {
    // A mate that is a thread of this process (ranks as threads, in tests)
    // closed its port by leaving, not by dying.
    if (ListenerStartedHere(mate)) continue;
    if (ProbeLiveness(mate, elastic_internal::kProbeTimeout) ==
        Liveness::kGone) {
      std::fprintf(stderr,
                   "vemesh: replica %d rank %d: another rank of this replica "
                   "is gone (its liveness port %s refuses) in epoch %lld: "
                   "ending this process (exit %d) so that its peers go on\n",
                   replica, rank, mate.c_str(), static_cast<long long>(epoch),
                   kExitReplicaLost);
      std::fflush(nullptr);
      std::_Exit(kExitReplicaLost);
    }
  }
}

absl::StatusOr<std::shared_ptr<Communicator>> ElasticMesh::new_replica_group() {
  // A split of the agreement's communicator: the same ranks in the same
  // order, its own traffic.
  return replica_comm_->split(0, replica_comm_->rank());
}

absl::Status ElasticMesh::ReplicaMax(absl::Span<int64_t> values) {
  if (inner_size_ == 1) return absl::OkStatus();
  return replica_comm_->all_reduce(values.data(), values.data(), values.size(),
                                   DataType::kInt64, ReduceOp::kMax);
}

}  // namespace vemesh
