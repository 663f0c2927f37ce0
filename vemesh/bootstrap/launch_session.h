// vemesh/bootstrap/launch_session.h
//
// What main() does first, whatever started the job: a scope guard that reads
// the launcher's environment (DetectLaunch, launch.h) and starts MPI only
// when MPI is what the launch needs.
//
//   mpirun / srun --mpi=pmix    MPI starts here (as MpiSession would) and
//                               ends at the end of the scope
//   torchrun / env://           nothing MPI: no MPI_Init, no Open MPI
//                               singleton, no forked orted
//   no launcher (one process)   MPI starts (the one-process bootstrap is an
//                               MPI singleton)
//
// It also checks VEMESH_INIT_TIMEOUT (init_timeout.h) up front, so that a
// bad value stops the job at start-up with the variable named.
//
//   int main(int argc, char** argv) {
//     vemesh::LaunchSession launch(&argc, &argv);
//     if (!launch.status().ok()) {
//       std::fprintf(stderr, "%s\n", launch.status().ToString().c_str());
//       return 1;
//     }
//     ... VESCALE_DEVICE_MESH.init_device_mesh("cpu", {2, 2, 2}) ...
//     VESCALE_DEVICE_MESH.reset();   // before the session ends MPI
//   }
//
// A program that called MPI_Init itself keeps owning MPI: the session
// adopts it and never finalises it. With VEMESH_WITH_MPI=OFF an MPI launch
// is Unimplemented naming the option, and a lone process starts nothing.

#ifndef VEMESH_BOOTSTRAP_LAUNCH_SESSION_H_
#define VEMESH_BOOTSTRAP_LAUNCH_SESSION_H_

#include <memory>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "vemesh/bootstrap/launch.h"

namespace vemesh {

class MpiSession;

class LaunchSession {
 public:
  LaunchSession() : LaunchSession(nullptr, nullptr) {}
  // argc/argv go to MPI_Init_thread when MPI starts (may be null).
  LaunchSession(int* argc, char*** argv);
  LaunchSession(const LaunchSession&) = delete;
  LaunchSession& operator=(const LaunchSession&) = delete;
  // Finalises MPI if and only if this session (or vemesh) started it.
  ~LaunchSession();

  // OK, or why the job cannot start: a bad launcher variable, a bad
  // VEMESH_INIT_TIMEOUT, or MPI failing to start (each names the cause).
  const absl::Status& status() const { return status_; }
  // What DetectLaunch found (kind kNone with the reason when it failed).
  const LaunchInfo& launch() const { return launch_; }
  // Whether this session initialised (or adopted) MPI.
  bool uses_mpi() const { return mpi_ != nullptr; }
  // The creation deadline a mesh gets when MeshOptions::timeout is unset.
  absl::Duration init_timeout() const { return init_timeout_; }

 private:
  absl::Status status_;
  LaunchInfo launch_;
  absl::Duration init_timeout_;
  std::unique_ptr<MpiSession> mpi_;
};

}  // namespace vemesh

#endif  // VEMESH_BOOTSTRAP_LAUNCH_SESSION_H_
