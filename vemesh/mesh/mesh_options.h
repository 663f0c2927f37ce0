// vemesh/mesh/mesh_options.h
//
// How DeviceMesh::Create builds a mesh: the rank list, the deadline, the
// world and bootstrap it is built over, each dimension's backend, NCCL's
// settings and the roles whose groups should stay inside one host.
//
//   MeshOptions options;
//   options.timeout = absl::Seconds(10);
//   options.backend_override = {{"DP", "gloo"}};
//   auto mesh = DeviceMesh::Create(DeviceType::kCpu, *layout, options);

#ifndef VEMESH_MESH_MESH_OPTIONS_H_
#define VEMESH_MESH_MESH_OPTIONS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "vemesh/bootstrap/bootstrap.h"
#include "vemesh/comm/communicator.h"
#include "vemesh/comm/nccl_options.h"

namespace vemesh {

struct MeshOptions {
  // Explicit row-major rank list (PyTorch's `mesh` tensor); empty = arange.
  std::vector<int64_t> ranks;
  // How long creation waits for every rank to arrive before it fails with
  // DeadlineExceeded instead of hanging; also the bound of each operation on
  // the mesh's Gloo communicators (MPI and NCCL operations have none).
  // Unset: VEMESH_INIT_TIMEOUT when the launch sets it, else 60 s
  // (vemesh/bootstrap/init_timeout.h). Positive and at most a day: an
  // infinite one is InvalidArgument.
  std::optional<absl::Duration> timeout;
  // The group the mesh is built over; must be a communicator that can
  // bootstrap a mesh (MPI). Null means the launcher's world.
  std::shared_ptr<Communicator> world;
  // How the ranks find each other; null means from `world`, else the
  // launcher's (LaunchBootstrap).
  std::shared_ptr<Bootstrap> bootstrap;
  // "mpi", "gloo" or "nccl" for every dimension; empty picks by device type
  // and launcher (cpu: mpi under an MPI launcher, gloo under env://; cuda:
  // nccl).
  std::string backend;
  // Per-dimension backends, by dimension name (PyTorch's backend_override).
  std::map<std::string, std::string> backend_override;
  // How a "cuda" mesh makes its NCCL communicators: resource sharing between
  // the world and the dimensions' splits (`split_share`, off by default),
  // and whether the dimensions' ncclCommSplit calls go in one group
  // (`group_splits`, off). See vemesh/comm/nccl_options.h.
  NcclOptions nccl;
  // Roles (matched to dimension names ignoring case, as the registry's
  // roles are) whose groups should stay inside one host. Global rank 0 logs
  // one warning (vemesh/base/log.h) for each whose groups cross hosts although
  // a block placement with it innermost would keep them inside.
  std::vector<std::string> latency_sensitive_dims = {"TP"};
  // The CUDA device of a "cuda" mesh on this rank: N of "cuda:N" (which
  // init_device_mesh sets), or -1 for the host-local rank's device (device
  // 0 when CUDA_VISIBLE_DEVICES leaves one device per task). See
  // vemesh/comm/nccl/cuda_device.h.
  int cuda_device = -1;
};

}  // namespace vemesh

#endif  // VEMESH_MESH_MESH_OPTIONS_H_
