// vemesh/mesh/internal/mesh_backends.h
//
// Which communication backend each mesh dimension uses, and the worlds those
// backends split from. Backend is not device type:
//
//   device  launcher             default   also allowed per dimension
//   cpu     mpirun / srun        mpi       gloo (rank 0 hosts a store)
//   cpu     torchrun / env://    gloo      -
//   cuda    any                  nccl      mpi or gloo (host memory)
//
//   auto plan = PlanBackends(DeviceType::kCpu, layout, *bootstrap, options);
//   auto agreed = AgreeAndMakeWorld(*bootstrap, ...);   // the host world
//   auto backends = MeshBackends::Create(*bootstrap, *plan, agreed->world,
//                                        {-1, host_local_rank, host_size},
//                                        one_host, deadline, timeout);
//   (*(*backends)->world_of_dim(2))->split(color, key);
//   auto dims = (*backends)->split_dims(Backend::kGloo, "dims0", requests,
//                                       deadline);
//
// The plan is local (the agreement check compares it across ranks); Create
// is collective (`one_host`: every rank is on this host, so a store that
// rank 0 starts for Gloo listens on loopback only) and makes each world in
// the same order on every rank after the bootstrap's own host world, which
// the agreement step made (NCCL's unique id travels over it): a Gloo world
// over MPI when asked for, then NCCL. Over an unconnected Gloo world
// (env://) the NCCL world is deferred: the mesh's NCCL groups then take
// their ids from the store, and world() makes it on first use. Only this
// plan names backend types: mesh creation asks it for each backend's
// groups (split_dims) and never casts to a backend.

#ifndef VEMESH_MESH_INTERNAL_MESH_BACKENDS_H_
#define VEMESH_MESH_INTERNAL_MESH_BACKENDS_H_

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "vemesh/bootstrap/bootstrap.h"
#include "vemesh/comm/backend.h"
#include "vemesh/comm/communicator.h"
#include "vemesh/comm/nccl/cuda_device.h"
#include "vemesh/comm/nccl_options.h"
#include "vemesh/layout/device_type.h"
#include "vemesh/layout/mesh_layout.h"
#include "vemesh/mesh/mesh_options.h"

namespace vemesh {

class TcpStoreServer;

struct BackendPlan {
  Backend default_backend = Backend::kMpi;  // the mesh's (flatten uses it)
  std::vector<Backend> dims;                // each root dimension's backend
  std::string reason;                       // why the default was chosen
};

// The dimensions' backends as the agreement step compares them: "mpi, gloo".
std::string DimBackendsText(const BackendPlan& plan);

// Parses MeshOptions' backend names (once, here). InvalidArgument for an
// unknown backend or an override naming no
// dimension; FailedPrecondition for a backend this job cannot use ("mpi"
// without an MPI launcher, "nccl" for a cpu mesh).
absl::StatusOr<BackendPlan> PlanBackends(DeviceType device_type,
                                         const MeshLayout& layout,
                                         const Bootstrap& bootstrap,
                                         const MeshOptions& options);

class MeshBackends {
 public:
  // `host_world`: the bootstrap's own world, made beforehand with the
  // agreement (AgreeAndMakeWorld); the other worlds are made here, the NCCL
  // world on the device `cuda_device` chooses, with `nccl_options` (its
  // splits inherit them).
  static absl::StatusOr<std::unique_ptr<MeshBackends>> Create(
      Bootstrap& bootstrap, BackendPlan plan,
      std::shared_ptr<Communicator> host_world,
      const CudaDeviceRequest& cuda_device, bool one_host, absl::Time deadline,
      absl::Duration op_timeout, const NcclOptions& nccl_options = {});
  ~MeshBackends();

  // A backend's world. Over an unconnected Gloo world (torchrun), the NCCL
  // world is made on the first call that asks for it (collective: the same
  // call on every rank), with its unique id over the host world.
  absl::StatusOr<std::shared_ptr<Communicator>> world(Backend backend);
  absl::StatusOr<std::shared_ptr<Communicator>> default_world();
  absl::StatusOr<std::shared_ptr<Communicator>> world_of_dim(int64_t dim);
  // Whether the NCCL world waits for its first use (the host world is an
  // unconnected Gloo world): the dimensions' NCCL groups are then made over
  // the store (split_dims) beside Gloo subgroups.
  bool nccl_deferred() const;
  // Collective over every rank (the same calls in the same order): the
  // groups of `requests` (SplitRequest, members included, null for a
  // negative color) on `backend`, each backend making its own. One
  // split_many of the backend's world (over an unconnected Gloo world: one
  // store round among the groups' members, the world's pairs never made);
  // NCCL deferred: the communicators over the host world's store
  // (CreateNcclGroupsOverWorld, batch `batch`, fresh per call: "dims0"),
  // with neither the world's Gloo pairs nor a world NCCL communicator.
  absl::StatusOr<std::vector<std::shared_ptr<Communicator>>> split_dims(
      Backend backend, absl::string_view batch,
      absl::Span<const SplitRequest> requests, absl::Time deadline);
  // The bootstrap's own host world (NCCL's twin).
  std::shared_ptr<Communicator> host_world() const;
  const CudaDeviceRequest& cuda_device() const { return cuda_device_; }
  const NcclOptions& nccl_options() const { return nccl_options_; }
  Backend default_backend() const { return plan_.default_backend; }
  Backend dim_backend(int64_t dim) const { return plan_.dims[dim]; }
  // "backend=gloo (RANK/WORLD_SIZE are set ...)"; per-dimension backends
  // are listed when they differ.
  std::string ToString() const;

 private:
  MeshBackends() = default;

  BackendPlan plan_;
  Backend host_ = Backend::kGloo;
  CudaDeviceRequest cuda_device_;
  NcclOptions nccl_options_;
  absl::Duration op_timeout_;
  // Guards worlds_ and nccl_deferred_ (the NCCL world may be made late).
  mutable std::mutex mu_;
  bool nccl_deferred_ = false;
  std::map<Backend, std::shared_ptr<Communicator>> worlds_;
  // Gloo under an MPI launcher: rank 0's store and the bootstrap over it.
  std::unique_ptr<TcpStoreServer> server_;
  std::shared_ptr<Bootstrap> gloo_bootstrap_;
};

}  // namespace vemesh

#endif  // VEMESH_MESH_INTERNAL_MESH_BACKENDS_H_
