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
// Counts are elements. MPI counts are `int`: a count above INT_MAX elements
// (or, for all_gather / reduce_scatter, a total above it) is InvalidArgument.
// send/recv use MPI_Send/MPI_Recv: a send to oneself only completes when a
// matching recv is posted concurrently; use `send_recv` for that.

#ifndef VEMESH_COMM_MPI_MPI_COMMUNICATOR_H_
#define VEMESH_COMM_MPI_MPI_COMMUNICATOR_H_

#include <mpi.h>

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "vemesh/comm/communicator.h"

namespace vemesh {

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
  absl::string_view backend() const override { return "mpi"; }

  absl::Status barrier() override;
  absl::Status broadcast(void* data, size_t count, DataType type,
                         int root) override;
  absl::Status all_reduce(const void* send, void* recv, size_t count,
                          DataType type, ReduceOp op) override;
  absl::Status all_gather(const void* send, void* recv, size_t count,
                          DataType type) override;
  absl::Status reduce_scatter(const void* send, void* recv, size_t count,
                              DataType type, ReduceOp op) override;
  absl::Status send(const void* data, size_t count, DataType type,
                    int peer) override;
  absl::Status recv(void* data, size_t count, DataType type,
                    int peer) override;
  absl::Status send_recv(const void* send_data, size_t send_count, int dest,
                         void* recv_data, size_t recv_count, int source,
                         DataType type) override;
  using Communicator::all_gather;
  using Communicator::all_reduce;
  using Communicator::broadcast;
  using Communicator::recv;
  using Communicator::reduce_scatter;
  using Communicator::send;
  using Communicator::send_recv;

  // A negative color gives nullptr (MPI_UNDEFINED).
  absl::StatusOr<std::shared_ptr<Communicator>> split(int color,
                                                      int key) override;
  // The same split, typed (the NCCL backend splits its MPI twin with it).
  absl::StatusOr<std::shared_ptr<MpiCommunicator>> split_mpi(int color,
                                                             int key);

  // An MpiBootstrap over a private copy of this communicator.
  absl::StatusOr<std::shared_ptr<Bootstrap>> make_bootstrap(
      absl::Time deadline) override;

  // `handle` points at the MPI_Comm (valid while this object lives).
  NativeHandle native_handle() const override;
  MPI_Comm comm() const { return comm_; }

 private:
  MpiCommunicator(MPI_Comm comm, int rank, int size, std::vector<int> ranks);
  // Takes ownership of `comm` (freed on failure too); `parent_ranks` maps the
  // parent's ranks to origin ranks, null when `comm` is a new origin.
  static absl::StatusOr<std::shared_ptr<MpiCommunicator>> Adopt(
      MPI_Comm comm, MPI_Comm parent, const std::vector<int>* parent_ranks);

  // FailedPrecondition when MPI was finalised, or when this thread may not
  // call MPI at the level MPI granted (mpi_environment.h).
  absl::Status Usable(absl::string_view op) const;

  MPI_Comm comm_;
  int rank_;
  int size_;
  std::vector<int> ranks_;
};

// The MPI datatype and reduction of vemesh's enums.
MPI_Datatype MpiDataType(DataType type);
MPI_Op MpiReduceOp(ReduceOp op);

}  // namespace vemesh

#endif  // VEMESH_COMM_MPI_MPI_COMMUNICATOR_H_
