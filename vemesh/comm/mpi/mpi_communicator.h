// vemesh/comm/mpi/mpi_communicator.h
//
// The MPI backend of Communicator: host buffers, any MPI communicator.
//
//   absl::StatusOr<std::shared_ptr<MpiCommunicator>> world =
//       MpiCommunicator::World();             // collective: a dup of WORLD
//   auto row = (*world)->split(rank / 4, rank % 4);  // collective
//   std::vector<double> x(16, 1.0);
//   absl::Status s = (*row)->all_reduce(absl::MakeSpan(x), ReduceOp::kSum);
//
// Each MpiCommunicator owns a private MPI communicator (a dup or a split), so
// vemesh traffic never matches the program's own messages, and sets
// MPI_ERRORS_RETURN on it, so that MPI errors come back as Status instead of
// aborting the job. It frees that communicator when the last holder lets go,
// unless MPI was finalised first (then there is nothing left to free), or
// the last holder is a thread that may not call MPI (MPI_THREAD_FUNNELED or
// SINGLE: it is then left to MPI_Finalize, with a warning).
//
// Every operation and `split` first check that MPI is still usable: after
// MPI_Finalize they answer FailedPrecondition saying MPI was finalised
// (Open MPI would abort the process), and under MPI_THREAD_FUNNELED or
// SINGLE, from a thread other than the main one, FailedPrecondition naming
// the thread level.
//
// `ranks()` are ranks in the *origin* of the communicator: the communicator
// that `World()` or `Dup()` copied (MPI_COMM_WORLD for `World()`). Splits
// inherit their parent's origin. They are computed once at creation with
// MPI_Group_translate_ranks, a local call.
//
// Operations. Every operation (communicator.h) is one of MPI's
// non-blocking calls, started by `Start` and finished by polling its
// requests (MPI_Test): MPI_Ibarrier, MPI_Ibcast, MPI_Iallreduce (MPI_IN_PLACE
// when send and recv are the same buffer), MPI_Ireduce, MPI_Iallgather(v),
// MPI_Ireduce_scatter_block, MPI_Ireduce_scatter (the v form), MPI_Igather,
// MPI_Iscatter, MPI_Ialltoall(v), and for point to point (send, recv,
// send_recv, batches) one MPI_Isend / MPI_Irecv per transfer, all with one
// tag, so that messages between two ranks arrive in the order they were
// posted. The blocking forms are the same requests waited for, so a
// blocking operation honours `set_timeout` and `abort()` like an
// asynchronous one.
//
// Counts are elements; MPI counts and displacements are `int`, so a count
// above INT_MAX elements (per buffer or in total) is InvalidArgument.
//
// Data types: MPI_FLOAT, MPI_DOUBLE, MPI_INT32_T, MPI_INT64_T, MPI_INT8_T
// and MPI_UINT8_T; bfloat16 and float16 are two derived datatypes of two
// bytes each, with their own commutative reduction operators that widen
// each pair of elements to float, combine them and round back once
// (internal/mpi_datatypes.h, over comm/internal/host_reduce.h). avg is
// a sum divided by size() when the operation completes (in float for the
// 16-bit types); prod is MPI_PROD on the native types.
//
// Agreement: every collective (not point to point) of a group of two or
// more first all-gathers each rank's 32-byte summary (operation, count,
// type, reduce op, root, a hash of the V forms' count lists), and posts
// its data only when they agree; a difference is InvalidArgument on every
// rank, naming the first rank that differs from rank 0 and what each
// passed, and the group goes on. Open MPI reports a mismatch inside its
// non-blocking collectives (MPI_ERR_TRUNCATE from MPI_Test) on
// MPI_COMM_WORLD, whose handler ends the whole job: the check keeps MPI
// from seeing one. The summaries and the data are posted strictly in issue
// order (an operation's data waits for its summaries, the next summaries
// for that data), driven by whichever of the group's Works is polled, and
// a split first waits for them all. Not checked: all_to_all_v's per-pair
// counts (each rank knows only its own row: kind and type are compared),
// and point to point (a receive of the wrong length is InvalidArgument, see
// Errors). The cost is one small all-gather per collective (bench/RESULTS.md,
// "the collective check"). VEMESH_COLLECTIVE_CHECK=0 (or off) turns it off
// for new communicators, set_collective_check per group: then a mismatch is
// MPI's undefined behaviour (Open MPI ends the job).
//
// Errors: MPI's error class decides the code. A lost peer (the
// fault-tolerance classes MPI_ERR_PROC_FAILED(_PENDING) / MPI_ERR_REVOKED,
// where this MPI has them) is Unavailable; a message longer than its
// receive buffer (MPI_ERR_TRUNCATE: the ranks disagree on a count) is
// InvalidArgument, and a receive that got fewer elements than asked is
// InvalidArgument naming both counts; anything else is Internal with MPI's
// own message.
//
// Abort and deadlines: MPI cannot cancel a collective, and vemesh does not
// call MPI from `abort()` (it may come from any thread; under
// MPI_THREAD_FUNNELED that would be forbidden). A wait notices the abort
// and returns Aborted; the operation's requests are then abandoned: MPI may
// still read or write its buffers when the other ranks get to it, so those
// buffers must outlive it (keep them, or end the job). The same holds for an
// operation that passed its deadline. vemesh keeps its own temporaries of
// an abandoned operation alive for the rest of the process.
//
// Waiting from a thread that may not call MPI (MPI_THREAD_FUNNELED or
// SINGLE, not the main thread) calls no MPI: the wait answers
// FailedPrecondition naming the thread level, and the operation is
// abandoned as above. After MPI_Finalize it answers FailedPrecondition.
// MPI has no abort of one communicator (MPI_Abort ends the job): an aborted
// MpiCommunicator is only marked, and its MPI_Comm is freed when the last
// holder lets go, by MPI_Comm_free, which Open MPI and MPICH do locally
// (it marks the communicator for deallocation; no message).
//
// shrink: MPI_Comm_create_group over the survivors (collective over them
// only, MPI-3), so the excluded ranks need not call; it needs them alive
// (MPI without ULFM cannot survive a killed process).

#ifndef VEMESH_COMM_MPI_MPI_COMMUNICATOR_H_
#define VEMESH_COMM_MPI_MPI_COMMUNICATOR_H_

#include <mpi.h>

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "vemesh/comm/communicator.h"

namespace vemesh {

class MpiLaunchQueue;  // mpi_communicator.cc

class MpiCommunicator final : public Communicator {
 public:
  // Collective over MPI_COMM_WORLD: initialises MPI if needed (see
  // mpi_environment.h) and returns a private copy of the world.
  static absl::StatusOr<std::shared_ptr<MpiCommunicator>> World();
  // Collective over `comm`: a private copy of it, which becomes the origin
  // of its ranks(). `comm` itself is left untouched.
  static absl::StatusOr<std::shared_ptr<MpiCommunicator>> Dup(MPI_Comm comm);
  // The same copy made with MPI_Comm_idup, polled until `deadline`:
  // DeadlineExceeded (and MPI abandoned, see AbandonMpi) when some rank
  // never joins it.
  static absl::StatusOr<std::shared_ptr<MpiCommunicator>> Dup(
      MPI_Comm comm, absl::Time deadline);

  ~MpiCommunicator() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  absl::Span<const int> ranks() const override { return ranks_; }
  absl::string_view backend() const override {
    return BackendName(Backend::kMpi);
  }

  // A negative color gives nullptr (MPI_UNDEFINED).
  absl::StatusOr<std::shared_ptr<Communicator>> split(int color,
                                                      int key) override;
  // Requests marked group_local (with their members) are made by
  // MPI_Comm_create_group, collective over each group only; the others by
  // MPI_Comm_split, as split_many always does.
  absl::StatusOr<std::vector<std::shared_ptr<Communicator>>> split_many(
      absl::Span<const SplitRequest> requests,
      absl::Time deadline = absl::InfiniteFuture()) override;
  // The same split, typed (the NCCL backend splits its MPI twin with it).
  absl::StatusOr<std::shared_ptr<MpiCommunicator>> split_mpi(int color,
                                                             int key);

  // `handle` points at the MPI_Comm (valid while this object lives).
  NativeHandle native_handle() const override;
  MPI_Comm comm() const { return comm_; }

  // The agreement check of every collective (see "Agreement" above): on
  // unless VEMESH_COLLECTIVE_CHECK=0 (or off) was set. Part of the
  // protocol: every rank of the group sets the same, between operations
  // (all of them waited for).
  void set_collective_check(bool on);
  bool collective_check() const { return check_; }

 protected:
  WorkOr Start(const Operation& op) override;
  // INT_MAX: MPI counts are int.
  size_t MaxCount() const override;
  // FailedPrecondition when MPI was finalised, or when this thread may not
  // call MPI at the level MPI granted (mpi_environment.h).
  absl::Status CheckUsable(absl::string_view op) const override;
  // Nothing: see "Abort and deadlines" above.
  void OnAbort() override {}
  absl::StatusOr<std::shared_ptr<Communicator>> Shrink(
      absl::Span<const int> exclude, const ShrinkOptions& options) override;

 private:
  MpiCommunicator(MPI_Comm comm, int rank, int size, std::vector<int> ranks);
  // A communicator whose members are known (origin ranks, this one at
  // `rank`): no group translation. Takes ownership of `comm`.
  static absl::StatusOr<std::shared_ptr<MpiCommunicator>> AdoptKnown(
      MPI_Comm comm, int rank, std::vector<int> ranks);
  // Takes ownership of `comm` (freed on failure too); `parent_ranks` maps the
  // parent's ranks to origin ranks, null when `comm` is a new origin.
  static absl::StatusOr<std::shared_ptr<MpiCommunicator>> Adopt(
      MPI_Comm comm, MPI_Comm parent, const std::vector<int>* parent_ranks);

  // Waits until every checked collective posted its data: before a split,
  // which is a collective on the same MPI communicator.
  absl::Status FlushChecked();

  MPI_Comm comm_;
  int rank_;
  int size_;
  std::vector<int> ranks_;
  bool check_;
  std::shared_ptr<MpiLaunchQueue> queue_;
};

}  // namespace vemesh

#endif  // VEMESH_COMM_MPI_MPI_COMMUNICATOR_H_
