#include "vemesh/bootstrap/launch_session.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "vemesh/bootstrap/init_timeout.h"
#ifndef VEMESH_NO_MPI
#include "vemesh/comm/mpi/mpi_environment.h"
#else
namespace vemesh {
class MpiSession {};  // never made: the unique_ptr needs a complete type
}  // namespace vemesh
#endif

namespace vemesh {

LaunchSession::LaunchSession(int* argc, char*** argv)
    : init_timeout_(kBuiltinInitTimeout) {
  auto launch = DetectLaunch();
  if (!launch.ok()) {
    status_ = launch.status();
    return;
  }
  launch_ = *std::move(launch);
  auto timeout = DefaultInitTimeout();
  if (!timeout.ok()) {
    status_ = timeout.status();
    return;
  }
  init_timeout_ = *timeout;
  if (launch_.kind == LaunchKind::kEnv) return;  // Gloo and a store: no MPI
#ifndef VEMESH_NO_MPI
  mpi_ = std::make_unique<MpiSession>(argc, argv);
  if (!mpi_->status().ok()) {
    status_ = absl::Status(mpi_->status().code(),
                           absl::StrCat("MPI failed to start (", launch_.reason,
                                        "): ", mpi_->status().message()));
  }
#else
  (void)argc;
  (void)argv;
  // One process with no launcher: nothing to start (a mesh over the
  // launcher's world says Unimplemented itself; one over a given bootstrap
  // works).
  if (launch_.kind == LaunchKind::kNone) return;
  status_ = absl::UnimplementedError(absl::StrCat(
      "an MPI launch (", launch_.reason,
      "): vemesh was built with VEMESH_WITH_MPI=OFF (rebuild with it ON, or "
      "launch the env:// way: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT)"));
#endif
}

LaunchSession::~LaunchSession() = default;

}  // namespace vemesh
