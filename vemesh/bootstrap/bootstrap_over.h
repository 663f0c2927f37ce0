// vemesh/bootstrap/bootstrap_over.h
//
// A Bootstrap over a group the caller already has, so that a mesh can be
// built on it instead of on the launcher's world (MeshOptions::world):
//
//   std::shared_ptr<Communicator> half = ...;   // e.g. a split of the world
//   auto boot = MakeBootstrapOver(*half, absl::Now() + absl::Seconds(30));
//
// Collective over the group's members. Only backends whose collectives
// honour a deadline can carry a bootstrap: MPI today (the bootstrap works on
// a private copy of the communicator). Another backend is InvalidArgument
// naming it; a finalised MPI is FailedPrecondition.

#ifndef VEMESH_BOOTSTRAP_BOOTSTRAP_OVER_H_
#define VEMESH_BOOTSTRAP_BOOTSTRAP_OVER_H_

#include <memory>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "vemesh/bootstrap/bootstrap.h"
#include "vemesh/comm/communicator.h"

namespace vemesh {

absl::StatusOr<std::shared_ptr<Bootstrap>> MakeBootstrapOver(
    const Communicator& world, absl::Time deadline);

}  // namespace vemesh

#endif  // VEMESH_BOOTSTRAP_BOOTSTRAP_OVER_H_
