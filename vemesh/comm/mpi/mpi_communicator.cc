#include "vemesh/comm/mpi/mpi_communicator.h"

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <functional>
#include <mutex>
#include <numeric>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "vemesh/base/log.h"
#include "vemesh/base/status_macros.h"
#include "vemesh/comm/internal/host_reduce.h"
#include "vemesh/comm/mpi/internal/mpi_agreement.h"
#include "vemesh/comm/mpi/internal/mpi_datatypes.h"
#include "vemesh/comm/mpi/mpi_environment.h"
#include "vemesh/comm/mpi/mpi_request.h"

namespace vemesh {
namespace {

// vemesh owns its communicators, so one tag is enough for point to point,
// and MPI's non-overtaking rule keeps two ranks' messages in order.
constexpr int kTag = 0;

// Frees a communicator we made, on an error path.
void FreeQuietly(MPI_Comm* comm) {
  if (*comm != MPI_COMM_NULL && MpiIsUsable()) MPI_Comm_free(comm);
}

// What a started operation's requests use, kept together so that an
// abandoned operation (aborted, past its deadline, its Work let go of
// unfinished) can be kept alive as a whole while MPI may still touch it.
struct MpiRequests {
  std::vector<MPI_Request> requests;
  std::vector<MPI_Status> statuses;
  std::vector<bool> done;
  // For a receive: its index in the operation's P2POps; -1 otherwise.
  std::vector<int> p2p_index;
  std::vector<int> counts, displs, counts2, displs2;
  // The agreement check's exchange (internal/mpi_agreement.h).
  MPI_Request summary = MPI_REQUEST_NULL;
  MpiOpSummary mine;
  std::vector<MpiOpSummary> all;

  void Add(MPI_Request request, int p2p = -1) {
    requests.push_back(request);
    statuses.emplace_back();
    done.push_back(false);
    p2p_index.push_back(p2p);
  }
  bool Pending() const {
    return summary != MPI_REQUEST_NULL ||
           std::find(done.begin(), done.end(), false) != done.end();
  }
};

// One operation's MPI side, shared by its Work and, for a checked
// collective, its communicator's launch queue: it holds no communicator, so
// an operation whose Work was let go of before its data was posted is
// still posted in its turn, and nothing keeps the communicator alive.
struct MpiLaunch {
  Operation op;  // its count lists and P2POps outlive the requests
  std::string name;
  MpiRequests state;
  // Runs once every request completed: checks receive counts, finishes avg.
  std::function<absl::Status(MpiLaunch&)> finish;
  bool resolved = false;   // under the queue's mutex
  absl::Status agreement;  // under the queue's mutex: OK once posted

  // InvalidArgument when receive `i` got another count than it asked for.
  absl::Status CheckReceived(size_t i) {
    const P2POp& p = op.p2p[state.p2p_index[i]];
    int got = 0;
    absl::Status s =
        MpiStatus(MPI_Get_count(&state.statuses[i], MpiDataType(p.type), &got),
                  "MPI_Get_count");
    if (!s.ok()) return s;
    if (got == MPI_UNDEFINED || static_cast<size_t>(got) != p.count) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": the receive from rank ", p.peer, " expected ",
                       p.count, " ", DataTypeName(p.type), " elements but got ",
                       got == MPI_UNDEFINED ? std::string("a partial element")
                                            : absl::StrCat(got)));
    }
    return absl::OkStatus();
  }
};

// Keeps abandoned operations' state alive for the rest of the process:
// MPI may still complete them (a peer arrives late) and write there.
void Abandon(std::shared_ptr<MpiLaunch> launch) {
  static std::mutex mu;
  static auto* kept = new std::vector<std::shared_ptr<MpiLaunch>>();
  std::lock_guard<std::mutex> lock(mu);
  kept->push_back(std::move(launch));
}

class MpiWork final : public Work {
 public:
  MpiWork(std::shared_ptr<Communicator> owner, const Operation& op, int size)
      : Work(std::move(owner), op.Describe()),
        size_(size),
        launch_(std::make_shared<MpiLaunch>()) {
    launch_->op = op;
    launch_->name = name();
  }

  ~MpiWork() override;

  const std::shared_ptr<MpiLaunch>& launch() const { return launch_; }
  // A checked collective: its data waits in `queue` for the agreement.
  void set_queue(std::shared_ptr<MpiLaunchQueue> queue) {
    queue_ = std::move(queue);
  }

  // MPI_Test yields the core itself on an oversubscribed host.
  bool PollYields() const override { return true; }

  std::optional<absl::Status> Poll() override;

  // Tests the data requests once the data is posted.
  std::optional<absl::Status> PollData() {
    MpiRequests& s = launch_->state;
    for (size_t i = 0; i < s.requests.size(); ++i) {
      if (s.done[i]) continue;
      int flag = 0;
      const int code = MPI_Test(&s.requests[i], &flag, &s.statuses[i]);
      if (code == MPI_SUCCESS) {
        if (flag) s.done[i] = true;
        continue;
      }
      // MPI completed (and freed) the failed request.
      s.done[i] = s.requests[i] == MPI_REQUEST_NULL;
      absl::Status failed = Failed(i, code);
      // A count mismatch is this operation's own: its other transfers still
      // finish (the peers are there), so nothing is left behind. Anything
      // else ends the wait at once.
      if (!absl::IsInvalidArgument(failed) || !s.done[i]) return failed;
      if (first_error_.ok()) first_error_ = std::move(failed);
    }
    if (s.Pending()) return std::nullopt;
    if (!first_error_.ok()) return first_error_;
    return launch_->finish ? launch_->finish(*launch_) : absl::OkStatus();
  }

 private:
  absl::Status Failed(size_t i, int code) {
    int cls = code;
    MPI_Error_class(code, &cls);
    const int p2p = launch_->state.p2p_index[i];
    if (cls == MPI_ERR_TRUNCATE && p2p >= 0) {
      const P2POp& p = launch_->op.p2p[p2p];
      return absl::InvalidArgumentError(absl::StrCat(
          name(), ": the receive from rank ", p.peer, " expected ", p.count,
          " ", DataTypeName(p.type),
          " elements but got more (MPI_ERR_TRUNCATE): the ranks disagree on "
          "the count"));
    }
    absl::Status s = MpiStatus(code, "MPI_Test");
    return absl::Status(s.code(), absl::StrCat(name(), ": ", s.message()));
  }

  int size_;
  std::shared_ptr<MpiLaunch> launch_;
  std::shared_ptr<MpiLaunchQueue> queue_;
  absl::Status first_error_;  // a count mismatch, reported once all finished
};

// Posts `work`'s MPI requests (the operation's data) on `comm`, where this
// rank is `me` of `n`.
absl::Status PostData(MPI_Comm comm, int me, int n, MpiLaunch& work) {
  const Operation& op = work.op;
  const MPI_Datatype type = MpiDataType(op.type);
  const MPI_Op reduce = MpiReduceOp(op.op, op.type);
  MpiRequests& s = work.state;
  auto count = [](size_t c) { return static_cast<int>(c); };
  // Counts and displacements (elements) of blocks laid out in rank order.
  auto layout = [&](const std::vector<size_t>& c, std::vector<int>* counts,
                    std::vector<int>* displs) {
    counts->resize(c.size());
    displs->resize(c.size());
    int at = 0;
    for (size_t i = 0; i < c.size(); ++i) {
      (*counts)[i] = count(c[i]);
      (*displs)[i] = at;
      at += (*counts)[i];
    }
  };

  // The base lets send and recv be the same buffer only for all_reduce and
  // reduce (MPI_IN_PLACE); elsewhere the one a rank does not use is not
  // passed to MPI, so MPI never sees the same buffer twice.
  const void* send = op.send;
  const bool same = op.send != nullptr && op.send == op.recv;

  int code = MPI_SUCCESS;
  MPI_Request r = MPI_REQUEST_NULL;
  const char* call = "";
  switch (op.kind) {
    case OpKind::kBarrier:
      call = "MPI_Ibarrier";
      code = MPI_Ibarrier(comm, &r);
      break;
    case OpKind::kBroadcast:
      call = "MPI_Ibcast";
      code = MPI_Ibcast(op.recv, count(op.count), type, op.root, comm, &r);
      break;
    case OpKind::kAllReduce:
      call = "MPI_Iallreduce";
      code = MPI_Iallreduce(same ? MPI_IN_PLACE : send, op.recv,
                            count(op.count), type, reduce, comm, &r);
      break;
    case OpKind::kReduce:
      call = "MPI_Ireduce";
      code = MPI_Ireduce(same && me == op.root ? MPI_IN_PLACE : send,
                         me == op.root ? op.recv : nullptr, count(op.count),
                         type, reduce, op.root, comm, &r);
      break;
    case OpKind::kAllGather:
      call = "MPI_Iallgather";
      code = MPI_Iallgather(send, count(op.count), type, op.recv,
                            count(op.count), type, comm, &r);
      break;
    case OpKind::kAllGatherV:
      call = "MPI_Iallgatherv";
      layout(op.recv_counts, &s.counts, &s.displs);
      code = MPI_Iallgatherv(send, s.counts[me], type, op.recv, s.counts.data(),
                             s.displs.data(), type, comm, &r);
      break;
    case OpKind::kReduceScatter:
      call = "MPI_Ireduce_scatter_block";
      code = MPI_Ireduce_scatter_block(send, op.recv, count(op.count), type,
                                       reduce, comm, &r);
      break;
    case OpKind::kReduceScatterV:
      call = "MPI_Ireduce_scatter";
      layout(op.recv_counts, &s.counts, &s.displs);
      code = MPI_Ireduce_scatter(send, op.recv, s.counts.data(), type, reduce,
                                 comm, &r);
      break;
    case OpKind::kGather:
      call = "MPI_Igather";
      code = MPI_Igather(send, count(op.count), type,
                         me == op.root ? op.recv : nullptr, count(op.count),
                         type, op.root, comm, &r);
      break;
    case OpKind::kScatter:
      call = "MPI_Iscatter";
      code = MPI_Iscatter(me == op.root ? send : nullptr, count(op.count), type,
                          op.recv, count(op.count), type, op.root, comm, &r);
      break;
    case OpKind::kAllToAll:
      call = "MPI_Ialltoall";
      code = MPI_Ialltoall(send, count(op.count), type, op.recv,
                           count(op.count), type, comm, &r);
      break;
    case OpKind::kAllToAllV:
      call = "MPI_Ialltoallv";
      layout(op.send_counts, &s.counts, &s.displs);
      layout(op.recv_counts, &s.counts2, &s.displs2);
      code =
          MPI_Ialltoallv(send, s.counts.data(), s.displs.data(), type, op.recv,
                         s.counts2.data(), s.displs2.data(), type, comm, &r);
      break;
    case OpKind::kBatch:
      // One request per transfer, posted in the caller's order.
      for (size_t i = 0; i < op.p2p.size(); ++i) {
        const P2POp& p = op.p2p[i];
        const MPI_Datatype t = MpiDataType(p.type);
        if (t == MPI_DATATYPE_NULL) {
          return absl::InternalError(absl::StrCat(
              op.Describe(), ": MPI could not make a datatype for ",
              DataTypeName(p.type), ": ", MpiHalfTypesStatus().message()));
        }
        MPI_Request one = MPI_REQUEST_NULL;
        if (p.kind == P2POp::Kind::kSend) {
          call = "MPI_Isend";
          code = MPI_Isend(p.data, count(p.count), t, p.peer, kTag, comm, &one);
        } else {
          call = "MPI_Irecv";
          code = MPI_Irecv(p.data, count(p.count), t, p.peer, kTag, comm, &one);
        }
        // What was posted before a failure stays with the Work, which
        // abandons it when let go of.
        if (code != MPI_SUCCESS) break;
        s.Add(one, p.kind == P2POp::Kind::kRecv ? static_cast<int>(i) : -1);
      }
      break;
  }
  if (code != MPI_SUCCESS) {
    absl::Status failed = MpiStatus(code, call);
    return absl::Status(failed.code(),
                        absl::StrCat(op.Describe(), ": ", failed.message()));
  }
  if (op.kind != OpKind::kBatch) s.Add(r);

  // What completes the operation once MPI is done with it.
  if (op.kind == OpKind::kBatch) {
    work.finish = [](MpiLaunch& w) {
      MpiRequests& st = w.state;
      for (size_t i = 0; i < st.requests.size(); ++i) {
        if (st.p2p_index[i] < 0) continue;
        VEMESH_RETURN_IF_ERROR(w.CheckReceived(i));
      }
      return absl::OkStatus();
    };
  } else if (op.op == ReduceOp::kAvg &&
             (op.kind == OpKind::kAllReduce || op.kind == OpKind::kReduce ||
              op.kind == OpKind::kReduceScatter ||
              op.kind == OpKind::kReduceScatterV)) {
    size_t elements = op.count;
    if (op.kind == OpKind::kReduce && me != op.root) elements = 0;
    if (op.kind == OpKind::kReduceScatterV) elements = op.recv_counts[me];
    if (elements > 0) {
      work.finish = [elements, n](MpiLaunch& w) {
        HostDivide(w.op.recv, elements, w.op.type, n);
        return absl::OkStatus();
      };
    }
  }
  return absl::OkStatus();
}

}  // namespace

// The checked collectives of one communicator, oldest first: each one's
// summary is exchanged, then its data posted, strictly one after the other
// and in issue order, so that every rank calls MPI's collectives on the
// communicator in the same order (a summary posted while an older
// operation's data waits would meet that data on another rank).
class MpiLaunchQueue {
 public:
  MpiLaunchQueue(MPI_Comm comm, int rank, int size)
      : comm_(comm), rank_(rank), size_(size) {}

  std::mutex& mu() { return mu_; }
  void Push(std::shared_ptr<MpiLaunch> launch) {
    waiting_.push_back(std::move(launch));
  }
  bool empty() const { return waiting_.empty(); }

  // Moves the oldest operations on as far as MPI lets them without
  // blocking (under mu()).
  void Drive() {
    while (!waiting_.empty()) {
      MpiLaunch& w = *waiting_.front();
      MpiRequests& s = w.state;
      if (s.all.empty()) {  // its summary not posted yet
        s.mine = SummarizeOp(w.op);
        s.all.resize(static_cast<size_t>(size_));
        const int code = MPI_Iallgather(&s.mine, sizeof(MpiOpSummary), MPI_BYTE,
                                        s.all.data(), sizeof(MpiOpSummary),
                                        MPI_BYTE, comm_, &s.summary);
        if (code != MPI_SUCCESS) {
          Pop(w, MpiStatus(code, "MPI_Iallgather"));
          continue;
        }
      }
      if (s.summary != MPI_REQUEST_NULL) {
        int flag = 0;
        const int code = MPI_Test(&s.summary, &flag, MPI_STATUS_IGNORE);
        if (code != MPI_SUCCESS) {
          Pop(w, MpiStatus(code, "MPI_Test"));
          continue;
        }
        if (!flag) return;
      }
      absl::Status v = MpiAgreementVerdict(w.op, s.all);
      if (v.ok()) v = PostData(comm_, rank_, size_, w);
      Pop(w, std::move(v));
    }
  }

 private:
  void Pop(MpiLaunch& w, absl::Status s) {
    if (!s.ok() && !absl::IsInvalidArgument(s)) {
      s = absl::Status(s.code(), absl::StrCat(w.name, ": ", s.message()));
    }
    w.resolved = true;
    w.agreement = std::move(s);
    waiting_.pop_front();
  }

  std::mutex mu_;
  const MPI_Comm comm_;
  const int rank_;
  const int size_;
  std::deque<std::shared_ptr<MpiLaunch>> waiting_;  // under mu_
};

namespace {

MpiWork::~MpiWork() {
  // Its data not posted yet (the queue posts it in its turn), or MPI may
  // still complete it: kept for the rest of the process.
  bool keep = false;
  if (queue_ != nullptr) {
    std::lock_guard<std::mutex> lock(queue_->mu());
    keep = !launch_->resolved;
  }
  if (keep || launch_->state.Pending()) Abandon(std::move(launch_));
}

std::optional<absl::Status> MpiWork::Poll() {
  // No MPI from a thread that may not call it, nor after MPI_Finalize.
  VEMESH_RETURN_IF_ERROR(MpiUsable(name(), size_));
  if (queue_ != nullptr) {
    std::lock_guard<std::mutex> lock(queue_->mu());
    if (!launch_->resolved) queue_->Drive();
    if (!launch_->resolved) return std::nullopt;
    if (!launch_->agreement.ok()) return launch_->agreement;
  }
  return PollData();
}

}  // namespace

MpiCommunicator::MpiCommunicator(MPI_Comm comm, int rank, int size,
                                 std::vector<int> ranks)
    : comm_(comm),
      rank_(rank),
      size_(size),
      ranks_(std::move(ranks)),
      check_(CollectiveCheckDefault()),
      queue_(std::make_shared<MpiLaunchQueue>(comm, rank, size)) {}

MpiCommunicator::~MpiCommunicator() {
  // After MPI_Finalize the communicator is already gone; calling MPI then
  // is an error, so only free while MPI is alive.
  if (comm_ == MPI_COMM_NULL || !MpiIsUsable()) return;
  // Under MPI_THREAD_FUNNELED / SINGLE a worker thread must not call MPI:
  // leave the communicator to MPI_Finalize rather than break that rule.
  absl::Status thread = CheckMpiThread("freeing an MPI communicator");
  if (!thread.ok()) {
    static std::once_flag warned;
    std::call_once(warned, [&thread] {
      LogWarning(absl::StrCat(
          thread.message(),
          "; it is left to MPI_Finalize. Let go of MPI communicators (and "
          "meshes, and the registry's reset) on the main thread."));
    });
    return;
  }
  // Operations still pending on it (abandoned) finish or not on their own:
  // MPI_Comm_free only marks the communicator for deallocation.
  MPI_Comm_free(&comm_);
}

absl::Status MpiCommunicator::CheckUsable(absl::string_view op) const {
  return MpiUsable(op, size_);
}

size_t MpiCommunicator::MaxCount() const {
  return static_cast<size_t>(INT_MAX);
}

Communicator::WorkOr MpiCommunicator::Start(const Operation& op) {
  const MPI_Datatype type = MpiDataType(op.type);
  if (type == MPI_DATATYPE_NULL) {
    return absl::InternalError(absl::StrCat(
        op.Describe(), ": MPI could not make a datatype for ",
        DataTypeName(op.type), ": ", MpiHalfTypesStatus().message()));
  }
  auto work = std::make_shared<MpiWork>(Self(), op, size_);
  if (!check_ || size_ == 1 || !IsCheckedCollective(op)) {
    VEMESH_RETURN_IF_ERROR(PostData(comm_, rank_, size_, *work->launch()));
    return std::shared_ptr<Work>(std::move(work));
  }
  work->set_queue(queue_);
  {
    std::lock_guard<std::mutex> lock(queue_->mu());
    queue_->Push(work->launch());
    queue_->Drive();  // posts its summary when nothing older waits
  }
  return std::shared_ptr<Work>(std::move(work));
}

absl::Status MpiCommunicator::FlushChecked() {
  // Bounded by the operations' own peers: a split is collective too.
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(queue_->mu());
      queue_->Drive();
      if (queue_->empty()) return absl::OkStatus();
    }
    absl::SleepFor(absl::Microseconds(50));
  }
}

void MpiCommunicator::set_collective_check(bool on) { check_ = on; }

absl::StatusOr<std::shared_ptr<MpiCommunicator>> MpiCommunicator::World() {
  VEMESH_RETURN_IF_ERROR(EnsureMpiInitialized());
  return Dup(MPI_COMM_WORLD);
}

absl::StatusOr<std::shared_ptr<MpiCommunicator>> MpiCommunicator::Dup(
    MPI_Comm comm) {
  return Dup(comm, absl::InfiniteFuture());
}

absl::StatusOr<std::shared_ptr<MpiCommunicator>> MpiCommunicator::Dup(
    MPI_Comm comm, absl::Time deadline) {
  if (MpiWasAbandoned()) return MpiAbandonedError("MpiCommunicator::Dup");
  if (!MpiIsUsable()) {
    return absl::FailedPreconditionError(
        "MpiCommunicator::Dup needs an initialised, not finalised MPI");
  }
  if (comm == MPI_COMM_NULL) {
    return absl::InvalidArgumentError("MpiCommunicator::Dup of MPI_COMM_NULL");
  }
  absl::StatusOr<MPI_Comm> copy = BoundedCommIdup(comm, deadline);
  if (absl::IsDeadlineExceeded(copy.status()))
    AbandonMpi();  // the caller says why
  if (!copy.ok()) return copy.status();
  return Adopt(*copy, MPI_COMM_NULL, nullptr);
}

absl::StatusOr<std::shared_ptr<MpiCommunicator>> MpiCommunicator::Adopt(
    MPI_Comm comm, MPI_Comm parent, const std::vector<int>* parent_ranks) {
  int rank = 0;
  int size = 0;
  absl::Status status =
      MpiStatus(MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN),
                "MPI_Comm_set_errhandler");
  if (status.ok())
    status = MpiStatus(MPI_Comm_rank(comm, &rank), "MPI_Comm_rank");
  if (status.ok())
    status = MpiStatus(MPI_Comm_size(comm, &size), "MPI_Comm_size");
  std::vector<int> ranks(static_cast<size_t>(size));
  std::iota(ranks.begin(), ranks.end(), 0);
  if (status.ok() && parent_ranks != nullptr) {
    // Member i's rank in the parent, then the parent's origin rank of that.
    MPI_Group mine = MPI_GROUP_NULL;
    MPI_Group theirs = MPI_GROUP_NULL;
    std::vector<int> in_parent(ranks.size());
    status = MpiStatus(MPI_Comm_group(comm, &mine), "MPI_Comm_group");
    if (status.ok()) {
      status = MpiStatus(MPI_Comm_group(parent, &theirs), "MPI_Comm_group");
    }
    if (status.ok()) {
      status = MpiStatus(MPI_Group_translate_ranks(mine, size, ranks.data(),
                                                   theirs, in_parent.data()),
                         "MPI_Group_translate_ranks");
    }
    if (mine != MPI_GROUP_NULL) MPI_Group_free(&mine);
    if (theirs != MPI_GROUP_NULL) MPI_Group_free(&theirs);
    for (size_t i = 0; status.ok() && i < ranks.size(); ++i) {
      if (in_parent[i] < 0 ||
          static_cast<size_t>(in_parent[i]) >= parent_ranks->size()) {
        status = absl::InternalError(
            absl::StrCat("MPI_Group_translate_ranks gave rank ", in_parent[i],
                         " outside a parent of ", parent_ranks->size()));
      } else {
        ranks[i] = (*parent_ranks)[in_parent[i]];
      }
    }
  }
  if (!status.ok()) {
    FreeQuietly(&comm);
    return status;
  }
  return std::shared_ptr<MpiCommunicator>(
      new MpiCommunicator(comm, rank, size, std::move(ranks)));
}

absl::StatusOr<std::shared_ptr<MpiCommunicator>> MpiCommunicator::split_mpi(
    int color, int key) {
  absl::Status status = CheckUsable("split");
  if (status.ok()) status = FlushChecked();
  if (!status.ok()) return status;
  MPI_Comm child = MPI_COMM_NULL;
  status = MpiStatus(
      MPI_Comm_split(comm_, color < 0 ? MPI_UNDEFINED : color, key, &child),
      "MPI_Comm_split");
  if (!status.ok()) return status;
  if (child == MPI_COMM_NULL) return std::shared_ptr<MpiCommunicator>();
  return Adopt(child, comm_, &ranks_);
}

absl::StatusOr<std::shared_ptr<Communicator>> MpiCommunicator::split(int color,
                                                                     int key) {
  VEMESH_ASSIGN_OR_RETURN(auto child, split_mpi(color, key));
  return std::shared_ptr<Communicator>(std::move(child));
}

absl::StatusOr<std::shared_ptr<Communicator>> MpiCommunicator::Shrink(
    absl::Span<const int> exclude, const ShrinkOptions& /*options*/) {
  absl::Status status = CheckUsable("shrink");
  if (!status.ok()) return status;
  // The survivors' group ranks in this communicator.
  std::vector<int> stay;
  size_t next = 0;
  for (int r = 0; r < size_; ++r) {
    if (next < exclude.size() && exclude[next] == r) {
      ++next;
    } else {
      stay.push_back(r);
    }
  }
  MPI_Group all = MPI_GROUP_NULL;
  MPI_Group survivors = MPI_GROUP_NULL;
  status = MpiStatus(MPI_Comm_group(comm_, &all), "MPI_Comm_group");
  if (status.ok()) {
    status = MpiStatus(MPI_Group_incl(all, static_cast<int>(stay.size()),
                                      stay.data(), &survivors),
                       "MPI_Group_incl");
  }
  MPI_Comm child = MPI_COMM_NULL;
  if (status.ok()) {
    // Collective over `survivors` only: the excluded ranks do not call.
    constexpr int kShrinkTag = 0x5eed;
    status =
        MpiStatus(MPI_Comm_create_group(comm_, survivors, kShrinkTag, &child),
                  "MPI_Comm_create_group");
  }
  if (survivors != MPI_GROUP_NULL) MPI_Group_free(&survivors);
  if (all != MPI_GROUP_NULL) MPI_Group_free(&all);
  if (!status.ok()) return status;
  VEMESH_ASSIGN_OR_RETURN(auto made, Adopt(child, comm_, &ranks_));
  return std::shared_ptr<Communicator>(std::move(made));
}

absl::StatusOr<std::vector<std::shared_ptr<Communicator>>>
MpiCommunicator::split_many(absl::Span<const SplitRequest> requests,
                            absl::Time deadline) {
  const bool group_local =
      std::any_of(requests.begin(), requests.end(),
                  [](const SplitRequest& r) { return r.group_local; });
  if (!group_local) return Communicator::split_many(requests, deadline);
  absl::Status status = CheckUsable("split_many");
  if (status.ok()) status = FlushChecked();
  if (!status.ok()) return status;
  // Every check below reads only what every member was given alike, so a
  // request refused here is refused on each of its members before any call.
  for (size_t i = 0; i < requests.size(); ++i) {
    const SplitRequest& r = requests[i];
    if (!r.group_local || r.color < 0) continue;
    const auto& m = r.members;
    bool fits = r.key >= 0 && static_cast<size_t>(r.key) < m.size() &&
                m[static_cast<size_t>(r.key)] == rank_;
    for (size_t k = 0; fits && k < m.size(); ++k) {
      fits = m[k] >= 0 && m[k] < size_;
    }
    if (!fits) {
      return absl::InvalidArgumentError(absl::StrCat(
          "split ", SplitRequestName(r, i), ": members [",
          absl::StrJoin(m, ", "), "] of a communicator of ", size_,
          " must hold this rank (", rank_, ") at index key (", r.key, ")"));
    }
  }
  std::vector<std::shared_ptr<Communicator>> groups;
  groups.reserve(requests.size());
  MPI_Group all = MPI_GROUP_NULL;
  for (size_t i = 0; i < requests.size(); ++i) {
    const SplitRequest& r = requests[i];
    if (!r.group_local) {
      auto group = split(r.color, r.key);
      if (!group.ok()) {
        status = group.status();
        break;
      }
      groups.push_back(*std::move(group));
      continue;
    }
    if (r.color < 0) {  // not a member: no call
      groups.push_back(nullptr);
      continue;
    }
    if (all == MPI_GROUP_NULL) {
      status = MpiStatus(MPI_Comm_group(comm_, &all), "MPI_Comm_group");
      if (!status.ok()) break;
    }
    MPI_Group group = MPI_GROUP_NULL;
    MPI_Comm child = MPI_COMM_NULL;
    status = MpiStatus(MPI_Group_incl(all, static_cast<int>(r.members.size()),
                                      r.members.data(), &group),
                       "MPI_Group_incl");
    // The tag keeps this request's context-id agreement apart from the
    // others' (a rank may be in several groups with the same peers).
    if (status.ok()) {
      status = MpiStatus(
          MPI_Comm_create_group(comm_, group, static_cast<int>(i), &child),
          "MPI_Comm_create_group");
    }
    if (group != MPI_GROUP_NULL) MPI_Group_free(&group);
    if (!status.ok()) break;
    // The members are known: their origin ranks without translating groups.
    std::vector<int> origin(r.members.size());
    for (size_t k = 0; k < origin.size(); ++k) {
      origin[k] = ranks_[static_cast<size_t>(r.members[k])];
    }
    auto made = AdoptKnown(child, r.key, std::move(origin));
    if (!made.ok()) {
      status = made.status();
      break;
    }
    groups.push_back(*std::move(made));
  }
  if (all != MPI_GROUP_NULL) MPI_Group_free(&all);
  if (!status.ok()) {
    const size_t failed = groups.size();  // the request that failed
    groups.clear();                       // those made are freed
    return absl::Status(
        status.code(),
        absl::StrCat("split ", SplitRequestName(requests[failed], failed), ": ",
                     status.message()));
  }
  return groups;
}

absl::StatusOr<std::shared_ptr<MpiCommunicator>> MpiCommunicator::AdoptKnown(
    MPI_Comm comm, int rank, std::vector<int> ranks) {
  absl::Status status =
      MpiStatus(MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN),
                "MPI_Comm_set_errhandler");
  if (!status.ok()) {
    FreeQuietly(&comm);
    return status;
  }
  const int size = static_cast<int>(ranks.size());
  return std::shared_ptr<MpiCommunicator>(
      new MpiCommunicator(comm, rank, size, std::move(ranks)));
}

NativeHandle MpiCommunicator::native_handle() const {
  return NativeHandle{BackendName(Backend::kMpi),
                      const_cast<MPI_Comm*>(&comm_)};
}

}  // namespace vemesh
