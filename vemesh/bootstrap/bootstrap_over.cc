#include "vemesh/bootstrap/bootstrap_over.h"

#include "absl/strings/str_cat.h"
#include "vemesh/base/status_macros.h"
#ifndef VEMESH_NO_MPI
#include <mpi.h>

#include "vemesh/bootstrap/mpi/mpi_bootstrap.h"
#include "vemesh/comm/mpi/mpi_environment.h"
#endif

namespace vemesh {

absl::StatusOr<std::shared_ptr<Bootstrap>> MakeBootstrapOver(
    const Communicator& world, absl::Time deadline) {
  const NativeHandle native = world.native_handle();
  if (native.backend != BackendName(Backend::kMpi)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "MeshOptions.world must be an MPI communicator (one that can bootstrap "
        "a mesh); got backend '",
        world.backend(), "'"));
  }
#ifndef VEMESH_NO_MPI
  VEMESH_RETURN_IF_ERROR(MpiUsable("MakeBootstrapOver", world.size()));
  VEMESH_ASSIGN_OR_RETURN(
      auto boot, MpiBootstrap::Create(*static_cast<MPI_Comm*>(native.handle),
                                      "MeshOptions.world (an MPI communicator)",
                                      deadline));
  return std::shared_ptr<Bootstrap>(std::move(boot));
#else
  (void)deadline;
  return absl::UnimplementedError(
      "MakeBootstrapOver: vemesh was built with VEMESH_WITH_MPI=OFF (rebuild "
      "with it ON and an MPI installed)");
#endif
}

}  // namespace vemesh
