// vemesh/bootstrap/bootstrap.h
//
// How the processes of a job find each other before any communicator
// exists: rank, size, which host each one is on, an all-gather of bytes and
// a barrier, each bounded by a deadline. Mesh creation (the agreement check,
// host placement, NCCL unique ids) goes only through this seam and through
// Communicator, so the same code runs under every launcher:
//
//   MpiBootstrap     mpirun / srun --mpi=pmix (vemesh/bootstrap/mpi/)
//   StoreBootstrap   torchrun, env://, Kubernetes, hand-written Slurm
//                    scripts: a Store hosted by rank 0 at
//                    MASTER_ADDR:MASTER_PORT (vemesh/bootstrap/)
//
//   absl::StatusOr<std::shared_ptr<Bootstrap>> boot =
//       LaunchBootstrap(absl::Now() + absl::Seconds(60));  // launch.h
//   auto all = (*boot)->all_gather("hello", absl::Now() + absl::Seconds(30));
//   // (*all)[r] is what rank r passed.
//
// Every call is collective over the job and must be made in the same order
// on every rank. Outcome agreement: an all_gather either gives every rank
// the same list, or fails; a failure names what went wrong (the ranks that
// never arrived, for DeadlineExceeded) and leaves the bootstrap unusable
// (FailedPrecondition afterwards), because a collective abandoned by some
// ranks cannot be resumed consistently.

#ifndef VEMESH_BOOTSTRAP_BOOTSTRAP_H_
#define VEMESH_BOOTSTRAP_BOOTSTRAP_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace vemesh {

class Communicator;
class Store;

class Bootstrap {
 public:
  virtual ~Bootstrap() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // "mpi" or "store": what carries this bootstrap.
  virtual absl::string_view kind() const = 0;
  // Why this bootstrap was chosen ("OMPI_COMM_WORLD_SIZE is set"), for
  // DeviceMesh::ToString() and error texts.
  virtual std::string reason() const = 0;

  // Collective: every rank's `data`, indexed by rank. Values may differ in
  // length between ranks.
  virtual absl::StatusOr<std::vector<std::string>> all_gather(
      absl::string_view data, absl::Time deadline) = 0;
  // Collective: returns once every rank called it.
  virtual absl::Status barrier(absl::Time deadline);

  // The store that carries this bootstrap, when there is one (null under
  // MPI): Gloo rendezvous and NCCL ids use it directly.
  virtual std::shared_ptr<Store> store() const { return nullptr; }
  // Collective: a new host-memory world communicator of this bootstrap's own
  // backend (MPI's private duplicate for MpiBootstrap, a Gloo world for
  // StoreBootstrap), made by the deadline. `op_timeout` bounds each later
  // operation on it and its splits where the backend can (Gloo).
  virtual absl::StatusOr<std::shared_ptr<Communicator>> world(
      absl::Time deadline, absl::Duration op_timeout) = 0;

  // Collective: all_gather(data), then world(), as one step where the
  // backend can make the world the gather's own closing step (MPI: every
  // all_gather is closed by an MPI_Comm_idup that only ranks whose gather
  // completed in time post; here its copy is kept as the world).
  // Mesh creation needs both; this saves it one collective. The outcome is
  // the same on every rank, as for all_gather. The default makes the two
  // calls.
  struct GatheredWorld {
    std::vector<std::string> gathered;
    std::shared_ptr<Communicator> world;
  };
  virtual absl::StatusOr<GatheredWorld> all_gather_and_world(
      absl::string_view data, absl::Time deadline, absl::Duration op_timeout);
};

// This machine's identity for host placement: the hostname (each emulated
// host has its own UTS namespace), or VEMESH_HOST_ID when set.
std::string HostIdentity();

}  // namespace vemesh

#endif  // VEMESH_BOOTSTRAP_BOOTSTRAP_H_
