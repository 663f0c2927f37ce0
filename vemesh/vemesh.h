// vemesh/vemesh.h
//
// Every public header of the library, floor by floor (base, layout,
// placement, rendezvous, comm, bootstrap, mesh, elastic, registry): what
// vemesh::vemesh links. For a program that needs one floor, include that
// floor's headers and link its target (vemesh::layout for MeshLayout alone).
//
//   #include "vemesh/vemesh.h"
//
//   auto mesh = VESCALE_DEVICE_MESH.init_device_mesh("cpu", {2, 2, 2},
//                                                    {"PP", "DP", "TP"});
//   if (!mesh.ok()) return mesh.status();
//
// The strategies (vemesh/strategies/, target vemesh::strategies) are not
// included: their headers bring Eigen, which vemesh::vemesh does not need.
// Neither are the private <floor>/internal/ headers, which are not installed.
// The comm/mpi headers include <mpi.h>: vemesh::vemesh links MPI.

#ifndef VEMESH_VEMESH_H_
#define VEMESH_VEMESH_H_

#include "vemesh/base/log.h"
#include "vemesh/base/status_macros.h"

#include "vemesh/layout/device_type.h"
#include "vemesh/layout/fast_divider.h"
#include "vemesh/layout/mesh_layout.h"
#include "vemesh/layout/mesh_spec.h"

#include "vemesh/placement/placement.h"

#include "vemesh/rendezvous/memory_store.h"
#include "vemesh/rendezvous/prefix_store.h"
#include "vemesh/rendezvous/redis/redis_store.h"
#include "vemesh/rendezvous/store.h"
#include "vemesh/rendezvous/tcp/socket.h"
#include "vemesh/rendezvous/tcp/tcp_store.h"
#include "vemesh/rendezvous/tcp/tcp_store_server.h"
#include "vemesh/rendezvous/tcp/wire.h"

#include "vemesh/comm/communicator.h"
#include "vemesh/comm/gloo/gloo_communicator.h"
#include "vemesh/comm/half.h"
#ifndef VEMESH_NO_MPI  // not installed with VEMESH_WITH_MPI=OFF
#include "vemesh/comm/mpi/mpi_communicator.h"
#include "vemesh/comm/mpi/mpi_environment.h"
#include "vemesh/comm/mpi/mpi_request.h"
#endif
#include "vemesh/comm/nccl/cuda_device.h"
#include "vemesh/comm/nccl/nccl_communicator.h"
#include "vemesh/comm/nccl_options.h"
#include "vemesh/comm/work.h"

#include "vemesh/checkpoint/async_saver.h"
#include "vemesh/checkpoint/box.h"
#include "vemesh/checkpoint/checkpoint.h"
#include "vemesh/checkpoint/dtype.h"
#include "vemesh/checkpoint/state_dict.h"

#include "vemesh/bootstrap/agreement.h"
#include "vemesh/bootstrap/bootstrap.h"
#include "vemesh/bootstrap/bootstrap_over.h"
#include "vemesh/bootstrap/init_timeout.h"
#include "vemesh/bootstrap/launch.h"
#include "vemesh/bootstrap/launch_session.h"
#ifndef VEMESH_NO_MPI
#include "vemesh/bootstrap/mpi/mpi_bootstrap.h"
#endif
#include "vemesh/bootstrap/store_bootstrap.h"

#include "vemesh/mesh/device_mesh.h"
#include "vemesh/mesh/mesh_options.h"

#include "vemesh/elastic/elastic_mesh.h"
#include "vemesh/elastic/epoch_communicator.h"

#include "vemesh/registry/ve_device_mesh.h"

#endif  // VEMESH_VEMESH_H_
