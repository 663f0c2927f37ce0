// ElasticMesh::Establish: an epoch's groups and mesh built from its
// record, the resume step agreed; RetireEpoch releases them.

#include <cstdint>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "vemesh/comm/gloo/gloo_communicator.h"
#include "vemesh/comm/nccl/nccl_communicator.h"
#include "vemesh/elastic/elastic_mesh.h"
#include "vemesh/elastic/internal/elastic_mesh_internal.h"

namespace vemesh {
namespace {

constexpr int64_t kNoState = std::numeric_limits<int64_t>::max();

}  // namespace

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
    auto comm = std::make_shared<EpochCommunicator>(inner, ranks, record.epoch,
                                                    current_epoch_);
    epoch_comms_.push_back(comm);
    if (d == replica_dim_ && device_group != nullptr) {
      comm->set_timeout(options_.op_timeout);
    } else if (d == replica_dim_) {
      dp_ = comm;
    }
    // What the mesh hands out: the dimension's long-lived group, now over
    // this epoch's.
    if (groups_.size() <= static_cast<size_t>(d)) {
      groups_.push_back(std::make_shared<ReconfigurableCommunicator>(
          requested_.dim_names()[d], std::string(comm->backend())));
      // An NCCL operation is bounded by the timeout of the communicator it
      // is called on (a Gloo one bounds itself).
      if (d == replica_dim_ && device_group != nullptr) {
        groups_[d]->set_timeout(options_.op_timeout);
      }
    }
    if (absl::Status s =
            groups_[d]->configure(comm, std::move(ranks), record.epoch);
        !s.ok()) {
      return s;
    }
    groups.push_back(groups_[d]);
  }
  {
    std::lock_guard<std::mutex> lock(guard_->mu);
    guard_->live_epoch = record.epoch;
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
        inner_rank_ == 0 ? reachable_.get() : nullptr);
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
  // And the step failures that were no lost member's (end_step counts them
  // in the replica that saw one): every member takes the largest count.
  // Packed (count, code, replica) so that the three come from one replica.
  const int64_t step_error_key =
      step_errors_ == 0 ? 0
                        : (step_errors_ << 40) | (step_error_code_ << 32) |
                              (step_error_replica_ & 0xffffffff);
  int64_t most[3] = {has_state_ ? 0 : 1, has_state_ ? committed : -1,
                     step_error_key};
  if (status.ok() && n > 1) {
    status =
        (*group)->all_reduce(least, least, 2, DataType::kInt64, ReduceOp::kMin);
  }
  if (status.ok() && n > 1) {
    status =
        (*group)->all_reduce(most, most, 3, DataType::kInt64, ReduceOp::kMax);
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
  step_errors_ = most[2] >> 40;
  step_error_code_ = (most[2] >> 32) & 0xff;
  step_error_replica_ = most[2] & 0xffffffff;
  if (step_errors_ > options_.max_step_retries && step_error_code_ != 0) {
    // Not a lost member: another epoch would fail the same way. Every
    // member ends here with the same code (no livelock).
    RetireEpoch();
    return absl::Status(
        static_cast<absl::StatusCode>(step_error_code_),
        absl::StrCat(
            "the step failed ", step_errors_, " times in a row with ",
            absl::StatusCodeToString(
                static_cast<absl::StatusCode>(step_error_code_)),
            " on replica ", step_error_replica_,
            ", which is not a lost member: the job ends (ElasticOptions."
            "max_step_retries = ",
            options_.max_step_retries, ")",
            step_status_.ok() || elastic_internal::IsRetryable(step_status_)
                ? ""
                : absl::StrCat("; this rank's step: ",
                               step_status_.message())));
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
  // The lowest DP rank holding the least committed state sends it.
  state_root_ = static_cast<int>(least[1] % n);
  MarkStep();
  return r;
}

void ElasticMesh::RetireEpoch() {
  // NCCL's rule after any abort: the epoch's NCCL communicators are
  // released with ncclCommAbort, all in one ncclGroupStart/ncclGroupEnd,
  // never ncclCommDestroy (which flushes with peers that may be gone).
  // Idempotent: one a timed-out operation aborted already is skipped.
  AbortCommunicators(epoch_device_groups_, "its elastic mesh epoch ended");
  epoch_device_groups_.clear();
  {
    std::lock_guard<std::mutex> lock(guard_->mu);
    guard_->live_epoch = -1;
  }
  for (const auto& g : groups_) {
    (void)g->unconfigure(absl::UnavailableError(absl::StrCat(
        g->name(), " is between membership epochs (epoch ", epoch(),
        " ended): the elastic mesh's recover() reconfigures it")));
  }
  for (const auto& c : epoch_comms_) c->retire();
  epoch_comms_.clear();
  dp_.reset();
}

}  // namespace vemesh
