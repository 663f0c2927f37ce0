// vemesh/bootstrap/mpi/mpi_bootstrap.h
//
// The Bootstrap of jobs started by an MPI launcher (mpirun, srun --mpi=pmix):
// rank and size of an MPI communicator (MPI_COMM_WORLD unless the program
// gives its own), an all-gather made of non-blocking MPI collectives polled
// against the deadline, and host-memory worlds that are private copies of
// that communicator.
//
//   auto boot = MpiBootstrap::Create(MPI_COMM_WORLD, "mpirun",
//                                    absl::Now() + absl::Seconds(60));
//   auto all = (*boot)->all_gather("x", absl::Now() + absl::Seconds(5));
//
// MPI collectives cannot be abandoned: after a DeadlineExceeded a request is
// left pending (its buffers are deliberately kept alive so a late rank cannot
// write into freed memory), every later call of this bootstrap answers
// FailedPrecondition, and MPI is marked abandoned for the process
// (AbandonMpi: no later MPI call, no exit-time MPI_Finalize): end the job.
//
// Outcome agreement: each all_gather is closed by an MPI_Comm_idup of the
// bootstrap's communicator that only ranks whose all_gather completed in
// time post. A rank that arrives after the others gave up completes their
// abandoned all_gather, but not that second step, so it fails at its own
// deadline too (DeadlineExceeded everywhere, never OK on some ranks and an
// error on others). all_gather_and_world keeps the copy as the mesh's world
// (two collectives for the agreement and the world); all_gather frees it.
//
// Who was missing: a pending collective cannot say, so only at a deadline
// of the first step (the private MPI_Comm_idup of Create, or an
// all_gather's MPI_Iallgather) the ranks that came report to ranks 0 and 1
// (vemesh/bootstrap/mpi/internal/arrival_report.h), and every one of them says
//   "rank 2 of 8: ranks 3, 7 never arrived (the ranks that did: node0: 0-2;
//    node1: 4-6); waited past the deadline ..."
// A rank whose gather completed but whose closing step did not says that
// everyone came but the others gave up first. Nothing of this runs on the
// success path. Later refusals (FailedPrecondition, here and in every MPI
// call of vemesh: MpiAbandonedError) name that deadline and its verdict.

#ifndef VEMESH_BOOTSTRAP_MPI_MPI_BOOTSTRAP_H_
#define VEMESH_BOOTSTRAP_MPI_MPI_BOOTSTRAP_H_

#include <mpi.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <string>

#include "vemesh/bootstrap/bootstrap.h"

namespace vemesh {

class MpiBootstrap final : public Bootstrap {
 public:
  // Collective over `base`: makes a private copy of it (MPI_Comm_idup, polled
  // against `deadline`), so that bootstrap traffic never matches the
  // program's. Initialises MPI when `base` is MPI_COMM_WORLD and nobody did.
  static absl::StatusOr<std::shared_ptr<MpiBootstrap>> Create(
      MPI_Comm base, std::string reason, absl::Time deadline);
  ~MpiBootstrap() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  absl::string_view kind() const override { return "mpi"; }
  std::string reason() const override { return reason_; }

  absl::StatusOr<std::vector<std::string>> all_gather(
      absl::string_view data, absl::Time deadline) override;
  absl::StatusOr<std::shared_ptr<Communicator>> world(
      absl::Time deadline, absl::Duration op_timeout) override;
  // One step fewer than the two calls: the closing MPI_Comm_idup's copy is
  // the world.
  absl::StatusOr<GatheredWorld> all_gather_and_world(
      absl::string_view data, absl::Time deadline,
      absl::Duration op_timeout) override;

 private:
  // The all-gather, under `mu_`, closed by an MPI_Comm_idup whose copy
  // becomes `*world` when `world` is given.
  absl::StatusOr<std::vector<std::string>> Gather(
      absl::string_view data, absl::Time deadline,
      std::shared_ptr<Communicator>* world);
  MpiBootstrap(MPI_Comm base, MPI_Comm comm, int rank, int size,
               std::string reason);
  absl::Status CheckUsable() const;

  MPI_Comm base_;
  MPI_Comm comm_;
  int rank_;
  int size_;
  std::string reason_;
  std::atomic<bool> broken_{false};
  // One collective at a time: calls from two threads would pair up
  // differently on different ranks.
  std::mutex mu_;
};

}  // namespace vemesh

#endif  // VEMESH_BOOTSTRAP_MPI_MPI_BOOTSTRAP_H_
