#include "vemesh/elastic/elastic_mesh.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <random>
#include <thread>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "vemesh/bootstrap/launch.h"
#include "vemesh/comm/gloo/gloo_communicator.h"
#include "vemesh/comm/nccl/nccl_communicator.h"
#include "vemesh/elastic/quorum_round.h"
#include "vemesh/rendezvous/redis/redis_store.h"

namespace vemesh {
namespace {

constexpr char kReplicaDimName[] = "__replica";
constexpr int64_t kNoState = std::numeric_limits<int64_t>::max();
// Bounds the retries of one recover() besides its deadline.
constexpr int kMaxEpochAttempts = 64;
// How often a waiting leader reads the record again.
constexpr absl::Duration kPollPeriod = absl::Milliseconds(5);
// How long a quorum round waits for a silent member's port to answer.
constexpr absl::Duration kProbeTimeout = absl::Milliseconds(20);
// How often a quorum round reads the posts (each read is one get per
// member): at first every millisecond, the normal period after
// kQuorumFastFor (a silent member then waits for its lease anyway).
constexpr absl::Duration kQuorumPollPeriod = absl::Milliseconds(1);
constexpr absl::Duration kQuorumFastFor = absl::Milliseconds(50);

bool IsRetryable(const absl::Status& s) {
  return absl::IsUnavailable(s) || absl::IsDeadlineExceeded(s) ||
         absl::IsAborted(s);
}

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
  if (o.store.empty() && o.control_store == nullptr) {
    return absl::InvalidArgumentError(
        "ElasticOptions.store is empty: expected redis://HOST:PORT");
  }
  return absl::OkStatus();
}

std::vector<int> Without(const std::vector<int>& from,
                         const std::vector<int>& drop) {
  std::vector<int> out;
  for (int id : from) {
    if (std::find(drop.begin(), drop.end(), id) == drop.end()) {
      out.push_back(id);
    }
  }
  return out;
}

// The record after `rec`: `kept` members (in their order) then `joiners`,
// their incarnations carried over; the rest of `rec.pending` stays pending
// unless it is in `dead`.
MembershipRecord NextEpoch(const MembershipRecord& rec,
                           const std::vector<int>& kept,
                           const std::vector<int>& joiners,
                           const std::vector<int>& dead) {
  MembershipRecord next;
  next.epoch = rec.epoch + 1;
  next.members = kept;
  next.members.insert(next.members.end(), joiners.begin(), joiners.end());
  next.pending = Without(Without(rec.pending, joiners), dead);
  for (const std::vector<int>* list : {&next.members, &next.pending}) {
    for (int id : *list) {
      if (uint64_t inc = rec.incarnation_of(id); inc != 0) {
        next.incarnations[id] = inc;
      }
    }
  }
  return next;
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

ElasticMesh::ElasticMesh(DeviceType device_type, MeshLayout requested,
                         ElasticOptions options)
    : device_type_(device_type),
      requested_(std::move(requested)),
      options_(std::move(options)),
      current_epoch_(std::make_shared<std::atomic<int64_t>>(0)) {}

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
    // The replica's rank 0 also writes the record back if the store lost it
    // (on the heartbeat's thread: a long step must not delay it).
    std::function<void()> guard;
    if (el->inner_rank_ == 0) {
      guard = [g = el->guard_, cp = std::make_shared<ControlPlane>(
                                   beat_store, options.job, el->inner_size_)] {
        std::string record;
        {
          std::lock_guard<std::mutex> lock(g->mu);
          record = g->record;
        }
        (void)cp->RestoreIfAbsent(record, g->descriptor);
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

  // The leader's liveness port, advertised for this incarnation: the others'
  // quorum rounds tell a killed replica by it (without it, leases decide).
  if (el->inner_rank_ == 0 && options.data_plane_detection) {
    auto listener = LivenessListener::Start(el->gloo_host_);
    if (listener.ok() &&
        el->control_->store()
            ->set(el->control_->ProbeKey(options.replica, el->incarnation_),
                  (*listener)->address())
            .ok()) {
      el->liveness_ = *std::move(listener);
    }
  }
  auto record = el->ShareRecord(
      el->inner_rank_ == 0
          ? el->Join()
          : absl::StatusOr<MembershipRecord>(MembershipRecord{}));
  if (!record.ok()) return record.status();
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

absl::Status ElasticMesh::ReplicaMax(absl::Span<int64_t> values) {
  if (inner_size_ == 1) return absl::OkStatus();
  return replica_comm_->all_reduce(values.data(), values.data(), values.size(),
                                   DataType::kInt64, ReduceOp::kMax);
}

absl::StatusOr<MembershipRecord> ElasticMesh::ShareRecord(
    absl::StatusOr<MembershipRecord> mine) {
  if (inner_size_ == 1) return mine;
  // [status code, text length], then the text (a record or an error).
  std::string text;
  int64_t head[2] = {0, 0};
  if (inner_rank_ == 0) {
    head[0] = static_cast<int64_t>(mine.status().code());
    text = mine.ok() ? EncodeMembership(*mine)
                     : std::string(mine.status().message());
    head[1] = static_cast<int64_t>(text.size());
  }
  if (absl::Status s = replica_comm_->broadcast(head, 2, DataType::kInt64, 0);
      !s.ok()) {
    return s;
  }
  if (head[1] < 0 || head[1] > int64_t{1} << 20) {
    return absl::InternalError(
        absl::StrCat("replica leader sent a record of ", head[1], " bytes"));
  }
  std::vector<int64_t> words((head[1] + 7) / 8, 0);
  if (inner_rank_ == 0 && !text.empty()) {
    std::memcpy(words.data(), text.data(), text.size());
  }
  if (!words.empty()) {
    absl::Status s = replica_comm_->broadcast(words.data(), words.size(),
                                              DataType::kInt64, 0);
    if (!s.ok()) return s;
  }
  if (inner_rank_ == 0) return mine;
  text.assign(reinterpret_cast<const char*>(words.data()),
              static_cast<size_t>(head[1]));
  if (head[0] != 0) {
    return absl::Status(static_cast<absl::StatusCode>(head[0]),
                        absl::StrCat("(from this replica's rank 0) ", text));
  }
  return ParseMembership(text);
}

absl::StatusOr<MembershipRecord> ElasticMesh::Join() {
  const int me = options_.replica;
  const int64_t starting = requested_.dim_size(replica_dim_).value_or(1);
  const absl::Time start = absl::Now();
  const absl::Time form_deadline = start + options_.form_timeout;
  const absl::Time deadline =
      start + options_.form_timeout + options_.recovery_timeout;
  // A missing record may be one the store lost while replicas still train
  // (Redis restarted empty): their heartbeat threads write it back within a
  // renewal period, so a newcomer waits two TTLs before it founds a job.
  const absl::Duration patience = options_.heartbeat_ttl * 2;
  std::optional<absl::Time> absent_since;
  std::optional<absl::Time> all_dead_since;
  absl::Time next_dead_check = absl::InfinitePast();
  bool checked = false;
  while (absl::Now() < deadline) {
    auto now = control_->Read();
    if (!now.ok()) return now.status();
    const MembershipRecord& rec = now->record;
    if (now->text.empty()) {
      if (!absent_since.has_value()) absent_since = absl::Now();
      if (absl::Now() - *absent_since < patience) {
        absl::SleepFor(kPollPeriod * 4);
        continue;
      }
    } else {
      absent_since.reset();
    }
    // A job whose members are all dead (it ended: PASS, failure, or below
    // min_replicas) is over: this launch starts a fresh one under the same
    // name, its epochs numbered on from the old ones (their keys stay).
    // (Checked every TTL/4, not at every poll: a joiner of a live job must
    // not load the store while it waits for its step boundary.)
    if (!rec.members.empty() && !rec.admits(me, incarnation_) &&
        absl::Now() >= next_dead_check) {
      next_dead_check = absl::Now() + options_.heartbeat_ttl / 4;
      auto alive = control_->AliveOf(rec, rec.members);
      if (!alive.ok()) return alive.status();
      if (!alive->empty()) {
        all_dead_since.reset();
      } else if (!all_dead_since.has_value()) {
        all_dead_since = absl::Now();
      } else if (absl::Now() - *all_dead_since >= patience) {
        MembershipRecord fresh;
        fresh.epoch = rec.epoch;
        fresh.pending = Without(rec.pending, {me});
        fresh.pending.push_back(me);
        for (int id : fresh.pending) {
          if (uint64_t inc = rec.incarnation_of(id); inc != 0) {
            fresh.incarnations[id] = inc;
          }
        }
        fresh.incarnations[me] = incarnation_;
        if (absl::Status s = control_->SetDescriptor(descriptor_); !s.ok()) {
          return s;
        }
        if (auto t = control_->Transition(*now, fresh); !t.ok()) {
          return t.status();
        }
        all_dead_since.reset();
        checked = false;
        continue;
      }
    }
    // Admission: this launch must train the job's mesh, model and batch.
    if (!checked) {
      if (absl::Status s = control_->CheckDescriptor(descriptor_, me);
          !s.ok()) {
        return s;
      }
      checked = true;
    }
    if (rec.members.empty()) {
      joined_unformed_ = true;
      formed_from_ = rec.epoch;
    }
    if (rec.admits(me, incarnation_)) return rec;
    if (rec.has_member(me)) {
      // An earlier launch of this replica is still listed: the members drop
      // it at their next recovery (its leases are not this launch's).
      absl::SleepFor(kPollPeriod);
      continue;
    }
    if (!rec.has_pending(me) || rec.incarnation_of(me) != incarnation_) {
      MembershipRecord next = rec;
      if (!rec.has_pending(me)) next.pending.push_back(me);
      next.incarnations[me] = incarnation_;
      if (auto t = control_->Transition(*now, next); !t.ok()) {
        return t.status();
      }
      continue;
    }
    if (rec.members.empty()) {
      auto alive = control_->AliveOf(rec, rec.pending);
      if (!alive.ok()) return alive.status();
      const int64_t starters = std::count_if(
          alive->begin(), alive->end(), [&](int id) { return id < starting; });
      if (starters == starting ||
          (absl::Now() >= form_deadline &&
           static_cast<int>(alive->size()) >= options_.min_replicas)) {
        std::vector<int> starters_sorted = *alive;
        std::sort(starters_sorted.begin(), starters_sorted.end());
        const MembershipRecord first = NextEpoch(rec, {}, starters_sorted, {});
        if (auto t = control_->Transition(*now, first); !t.ok()) {
          return t.status();
        }
        continue;
      }
    }
    absl::SleepFor(kPollPeriod);
  }
  auto last = control_->Read();
  return absl::DeadlineExceededError(absl::StrCat(
      "replica ", me, " was not admitted within ",
      absl::FormatDuration(deadline - start), "; the record is ",
      last.ok() ? MembershipText(last->record) : last.status().ToString(),
      " (a running job admits a replica at its next step boundary; a new "
      "job forms once all ",
      starting, " starting replicas are alive, or ", options_.min_replicas,
      " after form_timeout)"));
}

absl::StatusOr<MembershipRecord> ElasticMesh::ChooseEpoch(int64_t failed,
                                                          absl::Time deadline) {
  // A killed replica's leases outlive it by up to one TTL: wait that long
  // (and a little) for the store to tell the dead from the living before
  // re-forming the same members.
  const absl::Time settle = absl::Now() + options_.heartbeat_ttl * 3 / 2;
  // The quorum round over the failed epoch's members (data_plane_detection).
  std::optional<QuorumRound> round;
  const absl::Time round_start = absl::Now();
  while (absl::Now() < deadline) {
    auto now = control_->Read();
    if (!now.ok()) return now.status();
    const MembershipRecord& rec = now->record;
    if (rec.epoch < failed && known_.epoch == failed) {
      // The store lost the record (Redis restarted empty, or an older
      // snapshot): the members' own copy is the job's, never a newcomer's.
      if (auto t = control_->Transition(*now, known_); !t.ok()) {
        return t.status();
      }
      continue;
    }
    if (rec.epoch < failed) {
      return absl::UnavailableError(
          absl::StrCat("the elastic control plane '", store_name_,
                       "' lost its record: it "
                       "holds epoch ",
                       rec.epoch, " but this job reached epoch ", failed,
                       " (was Redis restarted without persistence?)"));
    }
    // The others went on without this launch: it is evicted, whoever is
    // alive now.
    // (Or the job ended and a fresh one is forming under its name.)
    if ((rec.epoch > failed || rec.members.empty()) &&
        !rec.admits(options_.replica, incarnation_)) {
      return rec;
    }
    if (options_.data_plane_detection && rec.epoch == failed &&
        rec.admits(options_.replica, incarnation_)) {
      if (!round.has_value()) {
        round.emplace(*control_, rec, options_.replica, incarnation_,
                      kProbeTimeout, reachable_.incarnations, reachable_.hosts);
        if (absl::Status s = round->Post(); !s.ok()) return s;
      }
      auto posted = round->Poll();
      if (!posted.ok()) return posted.status();
      if (posted->has_value()) {
        // Every member posted or is gone: the next epoch is those that
        // posted, with the joiners that are alive.
        auto joiners = control_->AliveOf(rec, rec.pending);
        if (!joiners.ok()) return joiners.status();
        const MembershipRecord next =
            NextEpoch(rec, **posted, *joiners, Without(rec.pending, *joiners));
        if (static_cast<int>(next.members.size()) < options_.min_replicas) {
          return absl::UnavailableError(
              absl::StrCat("only ", next.members.size(), " replica(s) alive [",
                           absl::StrJoin(next.members, ", "), "] after ",
                           MembershipText(rec), ": min_replicas is ",
                           options_.min_replicas));
        }
        if (auto t = control_->Transition(*now, next); !t.ok()) {
          return t.status();
        }
        continue;  // read what won
      }
    }
    auto alive = control_->AliveOf(rec, rec.members);
    if (!alive.ok()) return alive.status();
    // This launch proposes: it counts itself alive even if a renewal of its
    // own lease is late (the members' order is kept).
    if (rec.has_member(options_.replica)) {
      std::vector<int> absent = Without(rec.members, *alive);
      *alive = Without(rec.members, Without(absent, {options_.replica}));
    }
    if (rec.epoch > failed && *alive == rec.members) return rec;
    if (rec.epoch > failed || *alive != rec.members || absl::Now() >= settle) {
      auto joiners = control_->AliveOf(rec, rec.pending);
      if (!joiners.ok()) return joiners.status();
      const MembershipRecord next =
          NextEpoch(rec, *alive, *joiners, Without(rec.pending, *joiners));
      if (static_cast<int>(next.members.size()) < options_.min_replicas) {
        return absl::UnavailableError(absl::StrCat(
            "only ", next.members.size(), " replica(s) alive [",
            absl::StrJoin(next.members, ", "), "] after ", MembershipText(rec),
            ": min_replicas is ", options_.min_replicas));
      }
      if (auto t = control_->Transition(*now, next); !t.ok()) {
        return t.status();
      }
      continue;  // read what won
    }
    absl::SleepFor(round.has_value() &&
                           absl::Now() - round_start < kQuorumFastFor
                       ? kQuorumPollPeriod
                       : kPollPeriod);
  }
  return absl::DeadlineExceededError(
      absl::StrCat("no epoch after ", failed,
                   " could be agreed before the recovery "
                   "deadline (ElasticOptions.recovery_timeout ",
                   absl::FormatDuration(options_.recovery_timeout), ")"));
}

int64_t ElasticMesh::FullRank(int inner_rank, int dp_index, int dp_size) const {
  auto inner_or = inner_->layout().coordinate_of(inner_rank);
  if (!inner_or.ok()) return -1;  // not reached: the launch's ranks fit
  const Coordinate& inner = *inner_or;
  int64_t rank = 0;
  for (int64_t d = 0; d < requested_.ndim(); ++d) {
    const bool is_dp = d == replica_dim_;
    const int64_t size = is_dp ? dp_size : requested_.dim_size(d).value_or(1);
    const int64_t at = is_dp ? dp_index : inner[inner_dim_of_[d]];
    rank = rank * size + at;
  }
  return rank;
}

absl::StatusOr<DeviceMesh> ElasticMesh::FullMesh(
    const MembershipRecord& record, std::shared_ptr<Communicator> dp_group,
    std::shared_ptr<Communicator> device_group) {
  const int n = static_cast<int>(record.members.size());
  const int me = record.dp_rank_of(options_.replica);
  std::vector<int64_t> shape = requested_.shape();
  shape[replica_dim_] = n;
  auto layout = MeshLayout::Create(shape, requested_.dim_names());
  if (!layout.ok()) return layout.status();
  std::vector<std::shared_ptr<Communicator>> groups;
  for (int64_t d = 0; d < requested_.ndim(); ++d) {
    std::shared_ptr<Communicator> inner =
        device_group != nullptr ? device_group : dp_group;
    std::vector<int> ranks;
    if (d == replica_dim_) {
      // The DP group was made with the epoch's global ranks.
      ranks.assign(dp_group->ranks().begin(), dp_group->ranks().end());
    } else {
      auto g = inner_->get_group(inner_dim_of_[d]);
      if (!g.ok()) return g.status();
      inner = *g;
      for (int q : inner->ranks()) {
        ranks.push_back(static_cast<int>(FullRank(q, me, n)));
      }
    }
    if (d == replica_dim_ && device_group != nullptr) {
      // The mesh's DP group is the NCCL one, bounded as a Gloo group is;
      // the mesh's own agreements and state transfer stay on its twin.
      dp_ = std::make_shared<EpochCommunicator>(dp_group, ranks, record.epoch,
                                                current_epoch_);
      epoch_comms_.push_back(dp_);
    }
    auto comm = std::make_shared<EpochCommunicator>(
        inner, std::move(ranks), record.epoch, current_epoch_);
    epoch_comms_.push_back(comm);
    if (d == replica_dim_ && device_group != nullptr) {
      comm->set_timeout(options_.op_timeout);
    } else if (d == replica_dim_) {
      dp_ = comm;
    }
    groups.push_back(std::move(comm));
  }
  return DeviceMesh::FromGroups(device_type_, *std::move(layout),
                                FullRank(inner_rank_, me, n), std::move(groups),
                                inner_->host_local_rank(), inner_->host_size());
}

absl::StatusOr<Recovery> ElasticMesh::Establish(const MembershipRecord& record,
                                                int64_t committed) {
  const int n = static_cast<int>(record.members.size());
  const int me = record.dp_rank_of(options_.replica);
  std::vector<int> ranks;
  for (int j = 0; j < n; ++j) {
    ranks.push_back(static_cast<int>(FullRank(inner_rank_, j, n)));
  }
  if (options_.fault_hook) options_.fault_hook("establish");
  // A replica holds the state only if every one of its ranks does (one
  // that failed to receive its shard makes the whole replica a newcomer).
  int64_t stateless = has_state_ ? 0 : 1;
  if (absl::Status s = ReplicaMax(absl::MakeSpan(&stateless, 1)); !s.ok()) {
    return s;
  }
  has_state_ = stateless == 0;
  // The group's timeout bounds its rendezvous and every later operation:
  // always op_timeout, even when that runs past the recovery deadline by
  // up to one op_timeout (a shorter one would fail the epoch's operations).
  // Each member also records the address it advertises, so that a group
  // that cannot form names the addresses tried.
  const std::string prefix = control_->GroupPrefix(record.epoch, inner_rank_);
  (void)control_->store()->set(absl::StrCat(prefix, "/vemesh_host/", me),
                               gloo_host_);
  // A member that died as the epoch formed is told by its port, not by
  // the group's rendezvous timing out (epoch_gate.h).
  absl::Status gate = absl::OkStatus();
  if (n > 1 && options_.data_plane_detection) {
    EpochGate g(
        *control_, record, prefix,
        absl::StrCat(control_->GroupPrefix(record.epoch, 0), "/vemesh_gone"),
        inner_rank_ == 0 ? &reachable_ : nullptr);
    gate = g.Await(absl::Now() + options_.op_timeout);
  }
  absl::StatusOr<std::shared_ptr<GlooCommunicator>> group =
      gate.ok()
          ? GlooCommunicator::Create(control_->store(), prefix, me, n, ranks,
                                     options_.op_timeout, gloo_host_)
          : absl::StatusOr<std::shared_ptr<GlooCommunicator>>(gate);
  if (!group.ok()) {
    std::vector<std::string> tried;
    for (int j = 0; j < n; ++j) {
      auto host =
          control_->store()->get(absl::StrCat(prefix, "/vemesh_host/", j));
      tried.push_back(absl::StrCat("DP rank ", j, " (replica ",
                                   record.members[j], ") at ",
                                   host.ok() ? *host : "(never advertised)"));
    }
    group = absl::Status(
        group.status().code(),
        absl::StrCat(group.status().message(),
                     "; addresses tried: ", absl::StrJoin(tried, ", "),
                     " (each rank advertises its interface towards the "
                     "control plane; set VEMESH_GLOO_HOST or "
                     "ElasticOptions.gloo_host to another)"));
  }
  // Agree on the step to resume: the least that a member with state has
  // committed (one may be a step ahead), and whether anyone lacks state.
  absl::Status status = group.status();
  // And the source of the state: the lowest DP rank that has it at the
  // least committed step (committed * n + dp rank, so that one min says).
  int64_t least[2] = {has_state_ ? committed : kNoState,
                      has_state_ ? committed * n + me : kNoState};
  int64_t most[2] = {has_state_ ? 0 : 1, has_state_ ? committed : -1};
  if (status.ok() && n > 1) {
    status =
        (*group)->all_reduce(least, least, 2, DataType::kInt64, ReduceOp::kMin);
  }
  if (status.ok() && n > 1) {
    status =
        (*group)->all_reduce(most, most, 2, DataType::kInt64, ReduceOp::kMax);
  }
  // cuda: the epoch's NCCL DP group, over the Gloo group as its twin (the
  // unique id goes over it, whose rendezvous went through the control
  // plane). Released with ncclCommAbort when the epoch ends (RetireEpoch).
  std::shared_ptr<Communicator> device_group;
  if (status.ok() && device_type_ == DeviceType::kCuda) {
    auto made = CreateNcclCommunicator(*group, cuda_request_, nccl_options_);
    if (made.ok()) {
      device_group = *std::move(made);
      device_group->set_timeout(options_.op_timeout);
      epoch_device_groups_.push_back(device_group);
    } else {
      status = made.status();
    }
  }
  int64_t failed = status.ok() ? 0 : 1;
  if (absl::Status s = ReplicaMax(absl::MakeSpan(&failed, 1)); !s.ok()) {
    RetireEpoch();
    return s;
  }
  if (failed != 0) {
    RetireEpoch();
    if (status.ok()) {
      status = absl::UnavailableError(
          "another rank of this replica could not join its DP group");
    }
    return absl::Status(
        status.code(),
        absl::StrCat("epoch ", record.epoch, " (", MembershipText(record),
                     "): DP group not built: ", status.message()));
  }
  if (least[0] == kNoState) {
    return absl::FailedPreconditionError(absl::StrCat(
        "no member of ", MembershipText(record),
        " holds the training state: every replica that trained is gone"));
  }
  if (has_state_ && (committed < least[0] || committed > least[0] + 1)) {
    return absl::InternalError(
        absl::StrCat("replica ", options_.replica, " committed ", committed,
                     " steps but the members resume at ", least[0],
                     ": more than one step apart"));
  }
  current_epoch_->store(record.epoch);
  auto mesh = FullMesh(record, *std::move(group), std::move(device_group));
  if (!mesh.ok()) return mesh.status();
  mesh_ = *std::move(mesh);
  if (publish_) {
    if (absl::Status s = publish_(*mesh_); !s.ok()) return s;
  }
  Recovery r;
  r.receives_state = !has_state_;
  // With registered state the library carries it (CarryState): to every
  // member without it and to one a step ahead (it then needs no undo).
  receive_pending_ = !has_state_ || committed > least[0];
  transfer_pending_ = most[0] != 0 || most[1] > least[0];
  steps_since_fingerprint_ = 0;
  // Counted as holding state from now on: the transfer follows at once, and
  // the caller says mark_stateless() if it fails.
  has_state_ = true;
  r.epoch = record.epoch;
  r.dp_size = n;
  r.dp_rank = me;
  r.replicas = record.members;
  r.resume_step = least[0];
  r.state_root = static_cast<int>(least[1] % n);
  r.transfer_state = most[0] != 0;
  return r;
}

absl::StatusOr<Recovery> ElasticMesh::Rebuild(
    int64_t failed, std::optional<MembershipRecord> first, int64_t committed) {
  const absl::Time deadline = absl::Now() + options_.recovery_timeout;
  absl::Duration agree_time;
  absl::Duration build_time;
  absl::Status last_error;
  for (int attempt = 0; attempt < kMaxEpochAttempts; ++attempt) {
    if (absl::Now() >= deadline) break;
    const absl::Time agree_start = absl::Now();
    MembershipRecord record;
    if (first.has_value()) {
      record = *std::move(first);
      first.reset();
    } else {
      auto shared = ShareRecord(
          inner_rank_ == 0
              ? ChooseEpoch(failed, deadline)
              : absl::StatusOr<MembershipRecord>(MembershipRecord{}));
      if (!shared.ok() && !last_error.ok()) {
        // Why the epochs before failed (a group that cannot form names the
        // addresses tried).
        return absl::Status(shared.status().code(),
                            absl::StrCat(shared.status().message(),
                                         "; last: ", last_error.message()));
      }
      if (!shared.ok()) return shared.status();
      record = *std::move(shared);
    }
    if (!record.admits(options_.replica, incarnation_)) {
      Remember(MembershipRecord{});
      current_epoch_->store(record.epoch);
      last_ = Recovery{};
      last_.evicted = true;
      last_.dp_rank = -1;
      last_.epoch = record.epoch;
      last_.dp_size = static_cast<int>(record.members.size());
      last_.replicas = record.members;
      return last_;
    }
    const absl::Time build_start = absl::Now();
    agree_time += build_start - agree_start;
    auto r = Establish(record, committed);
    build_time += absl::Now() - build_start;
    if (r.ok() && !state_.empty()) {
      // The library carries the registered state before any step commits.
      last_ = *r;
      const absl::Time state_start = absl::Now();
      const bool carried = transfer_pending_;
      absl::Status s =
          CarryState(absl::StrCat("after the change to epoch ", record.epoch));
      r->state_time = absl::Now() - state_start;
      r->state_carried = carried && s.ok();
      if (absl::IsDataLoss(s) || (!s.ok() && !IsRetryable(s))) return s;
      if (!s.ok()) r = s;  // retired: the next epoch
    }
    if (r.ok()) {
      Remember(record);
      if (inner_rank_ == 0 && options_.data_plane_detection) {
        // Which members' ports answer from here (a port that never did
        // may be an address wrong from this host: its refusal proves
        // nothing).
        for (int id : record.members) {
          const uint64_t inc = record.incarnation_of(id);
          if (id == options_.replica || reachable_.incarnations.count(inc)) {
            continue;
          }
          auto where = control_->store()->get(control_->ProbeKey(id, inc));
          if (where.ok() &&
              ProbeLiveness(*where, kProbeTimeout) == Liveness::kListening) {
            reachable_.Answered(inc, *where);
          }
        }
      }
      last_ = *r;
      last_.detect_time = detect_time_;
      last_.agree_time = agree_time;
      last_.build_time = build_time;
      return last_;
    }
    if (!IsRetryable(r.status())) return r.status();
    last_error = r.status();
    RetireEpoch();
    failed = record.epoch;
  }
  return absl::DeadlineExceededError(
      absl::StrCat("replica ", options_.replica, ": no epoch after ", failed,
                   " could be built within ElasticOptions.recovery_timeout (",
                   absl::FormatDuration(options_.recovery_timeout), ")",
                   last_error.ok() ? "" : "; last: ", last_error.message()));
}

void ElasticMesh::Remember(const MembershipRecord& record) {
  known_ = record;
  std::lock_guard<std::mutex> lock(guard_->mu);
  guard_->record = record.epoch == 0 ? "" : EncodeMembership(record);
}

void ElasticMesh::RetireEpoch() {
  // NCCL's rule after any abort: the epoch's NCCL communicators are
  // released with ncclCommAbort, all in one ncclGroupStart/ncclGroupEnd,
  // never ncclCommDestroy (which flushes with peers that may be gone).
  // Idempotent: one a timed-out operation aborted already is skipped.
  AbortCommunicators(epoch_device_groups_, "its elastic mesh epoch ended");
  epoch_device_groups_.clear();
  for (const auto& c : epoch_comms_) c->retire();
  epoch_comms_.clear();
  dp_.reset();
}

absl::StatusOr<StepVerdict> ElasticMesh::end_step(
    const absl::Status& step_status) {
  if (last_.evicted) {
    return absl::FailedPreconditionError(absl::StrCat(
        "replica ", options_.replica, " was evicted in epoch ", last_.epoch,
        ": it takes no part in the job's steps; launch it again to rejoin"));
  }
  int64_t failed = step_status.ok() ? 0 : 1;
  // Retire at once: a peer blocked on our DP group gets a closed connection
  // now instead of waiting out its timeout.
  if (failed != 0) RetireEpoch();
  int64_t seen = -1;
  int64_t lost = 0;
  absl::Status lost_status = heartbeat_ ? heartbeat_->lost() : absl::OkStatus();
  std::optional<absl::StatusOr<ControlPlane::Reading>> read;
  if (!lost_status.ok()) {
    // A late renewal (this process was stopped, or the store blinked) is
    // not a lost control plane if the store answers now: the record then
    // says whether the others went on without this replica (evicted).
    read = control_->Read();
    if (read->ok()) lost_status = absl::OkStatus();
  }
  if (!lost_status.ok()) lost = 1;
  if (inner_rank_ == 0 && lost == 0) {
    absl::StatusOr<ControlPlane::Reading> now =
        read.has_value() ? *std::move(read) : control_->Read();
    if (!now.ok()) now = control_->Read();  // one retry: a blip is not a loss
    if (now.ok() && now->record.epoch < epoch() && known_.epoch == epoch()) {
      // The store lost the record (Redis restarted empty, or an older
      // snapshot): the members write theirs back; a newcomer waits for that.
      auto t = control_->Transition(*now, known_);
      if (t.ok() && t->record.epoch >= epoch()) now = *std::move(t);
    }
    if (now.ok() && now->record.epoch < epoch()) {
      now = absl::UnavailableError(
          absl::StrCat("it lost its record (epoch ", now->record.epoch, " < ",
                       epoch(), "; was Redis restarted without persistence?)"));
    }
    if (!now.ok()) {
      lost = 1;
      lost_status = now.status();
    } else {
      seen = now->record.epoch;
      // DP rank 0's leader admits the replicas waiting to join, here at a
      // step boundary, by making the next epoch.
      const MembershipRecord& rec = now->record;
      if (rec.epoch == epoch() && !rec.pending.empty() && last_.dp_rank == 0) {
        auto joiners = control_->AliveOf(rec, rec.pending);
        if (joiners.ok() && !joiners->empty()) {
          const MembershipRecord next =
              NextEpoch(rec, rec.members, *joiners, {});
          auto t = control_->Transition(*now, next);
          if (t.ok()) seen = t->record.epoch;
        }
      }
    }
  }
  int64_t agreed[3] = {failed, seen, lost};
  if (failed == 0 && dp_ != nullptr) {
    int64_t dp_view[2] = {seen, lost};
    absl::Status s =
        dp_->all_reduce(dp_view, dp_view, 2, DataType::kInt64, ReduceOp::kMax);
    if (s.ok()) {
      agreed[1] = dp_view[0];
      agreed[2] = dp_view[1];
    } else {
      agreed[0] = 1;
      RetireEpoch();
    }
  }
  if (absl::Status s = ReplicaMax(absl::MakeSpan(agreed, 3)); !s.ok()) {
    return s;
  }
  if (agreed[2] != 0) {
    return absl::UnavailableError(
        absl::StrCat("the elastic control plane '", store_name_, "' is lost: ",
                     lost_status.ok() ? "another rank could not reach it"
                                      : std::string(lost_status.message())));
  }
  StepVerdict v;
  v.committed = agreed[0] == 0;
  v.recover = agreed[0] != 0 || agreed[1] > epoch();
  // Every N committed steps of an epoch (the same count on every member):
  // the replicas' states must still agree.
  if (v.committed && !v.recover && options_.fingerprint_every > 0 &&
      !state_.empty() && dp_ != nullptr &&
      ++steps_since_fingerprint_ >= options_.fingerprint_every) {
    absl::Status s = CarryState(absl::StrCat("after ", steps_since_fingerprint_,
                                             " steps of epoch ", epoch()));
    if (absl::IsDataLoss(s) || (!s.ok() && !IsRetryable(s))) return s;
    if (!s.ok()) v.recover = true;
  }
  const absl::Time now = absl::Now();
  if (v.recover) detect_time_ = now - step_began_;
  step_began_ = now;
  return v;
}

absl::Status ElasticMesh::register_state_dict_fn(
    const std::string& name, ReplicaState::StateDictFn state_dict,
    ReplicaState::LoadStateDictFn load_state_dict) {
  return state_.Register(name, std::move(state_dict),
                         std::move(load_state_dict));
}

absl::Status ElasticMesh::register_state_bytes(const std::string& name,
                                               ReplicaState::BytesFn bytes) {
  return state_.RegisterBytes(name, std::move(bytes));
}

absl::Status ElasticMesh::CarryState(absl::string_view where) {
  absl::Status s;
  if (dp_ == nullptr) {
    s = absl::FailedPreconditionError(
        absl::StrCat("epoch ", epoch(), " was retired: call recover() first"));
  }
  if (s.ok() && transfer_pending_) {
    s = state_.Transfer(*dp_, last_.state_root, receive_pending_);
  }
  if (s.ok()) s = state_.CompareFingerprints(*dp_, last_.replicas, where);
  // The replica agrees: one rank's failure (its own shard coordinate) is
  // the whole replica's.
  int64_t code = s.ok() ? 0 : absl::IsDataLoss(s) ? 2 : 1;
  if (absl::Status r = ReplicaMax(absl::MakeSpan(&code, 1)); !r.ok()) {
    return r;
  }
  if (code == 0) {
    transfer_pending_ = false;
    receive_pending_ = false;
    steps_since_fingerprint_ = 0;
    return absl::OkStatus();
  }
  if (s.ok()) {
    s = code == 2 ? absl::DataLossError(absl::StrCat(
                        "the replicas' states differ ", where,
                        " at another shard coordinate of replica ",
                        options_.replica, " (its other ranks name them)"))
                  : absl::AbortedError(absl::StrCat(
                        "another rank of replica ", options_.replica,
                        " failed its state transfer ", where));
  }
  if (code == 1) {
    // This rank stays without state; the epoch is to be rebuilt.
    if (receive_pending_) has_state_ = false;
    RetireEpoch();
    if (!IsRetryable(s)) s = absl::AbortedError(s.message());
  }
  return s;
}

absl::Status ElasticMesh::sync_state() {
  if (last_.evicted) {
    return absl::FailedPreconditionError(
        absl::StrCat("replica ", options_.replica, " was evicted in epoch ",
                     last_.epoch, ": launch it again to rejoin"));
  }
  if (state_.empty()) {
    return absl::FailedPreconditionError(
        "sync_state: no state registered (register_state_dict_fn first)");
  }
  const absl::Time start = absl::Now();
  absl::Status s = CarryState(absl::StrCat("at the start of epoch ", epoch()));
  last_.state_time += absl::Now() - start;
  return s;
}

absl::StatusOr<Recovery> ElasticMesh::recover(int64_t committed_steps) {
  if (last_.evicted) {
    return absl::FailedPreconditionError(
        absl::StrCat("replica ", options_.replica, " was evicted in epoch ",
                     last_.epoch, ": launch it again to rejoin"));
  }
  const int64_t failed = epoch();
  RetireEpoch();
  auto r = Rebuild(failed, std::nullopt, committed_steps);
  detect_time_ = absl::ZeroDuration();
  step_began_ = absl::Now();
  return r;
}

}  // namespace vemesh
