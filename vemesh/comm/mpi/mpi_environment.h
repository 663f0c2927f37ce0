// vemesh/comm/mpi/mpi_environment.h
//
// Who starts and stops MPI. vemesh works both ways:
//
//   * The program owns MPI (it called MPI_Init or MPI_Init_thread itself):
//     vemesh adopts it and never finalises it.
//   * Nobody initialised MPI: vemesh does, on first use, asking for
//     MPI_THREAD_MULTIPLE, and finalises it when the program ends.
//
// The clean way to say "vemesh owns MPI for this program" is a session in
// main, which finalises at the end of its scope, after the program's meshes
// and communicators are gone:
//
//   int main(int argc, char** argv) {
//     vemesh::MpiSession mpi(&argc, &argv);
//     if (!mpi.status().ok()) return 1;
//     ... init_device_mesh("cpu", {2, 2, 2}) ...
//   }   // MPI_Finalize here, because vemesh initialised it
//
// Without a session, vemesh registers an atexit handler when it initialises
// MPI lazily. Communicators that outlive MPI_Finalize (a global registry, for
// instance) see that MPI is finalised and free nothing.
//
// Threads: vemesh asks for MPI_THREAD_MULTIPLE when it starts MPI; a program
// that started MPI itself chose the level. Under MPI_THREAD_FUNNELED or
// MPI_THREAD_SINGLE only the main thread may call MPI, and vemesh enforces
// it (CheckMpiThread): MPI communicator operations and the registry's
// init_device_mesh from another thread are FailedPrecondition, and an MPI
// communicator let go of on another thread is not freed (MPI_Finalize
// reclaims it; a warning says so).
//
// Thread safety: every function here may be called from any thread.

#ifndef VEMESH_COMM_MPI_MPI_ENVIRONMENT_H_
#define VEMESH_COMM_MPI_MPI_ENVIRONMENT_H_

#include <mpi.h>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace vemesh {

// Initialises MPI when nobody did (MPI_Init_thread, MPI_THREAD_MULTIPLE
// asked); adopts an initialised MPI. FailedPrecondition once MPI was
// finalised (it cannot be restarted) or abandoned, Internal if
// initialisation fails. MPI's start-up waits for every rank of the job:
// when it has not returned by `deadline` this is DeadlineExceeded, and MPI
// is abandoned (it may still be starting on a background thread).
absl::Status EnsureMpiInitialized(absl::Time deadline = absl::InfiniteFuture());

// Marks MPI unusable for the rest of the process: a collective was left
// pending at a deadline. Every later MpiIsUsable() is false, and the
// exit-time / MpiSession MPI_Finalize is skipped (it would wait for the
// ranks that are gone), so the program can end promptly by returning from
// main. Later refusals name the time of the first call and the first
// non-empty `reason` ("rank 2 of 4, MPI_Iallgather: rank 3 never arrived");
// a caller that knows more than the call that gave up calls it again.
void AbandonMpi(absl::string_view reason = "");

// FailedPrecondition for `what` once MPI was abandoned, naming the earlier
// deadline: "<what>: MPI was abandoned at an earlier deadline in this
// process (at 13:45:02 UTC: <reason>): no MPI call can be made any more;
// end the job".
absl::Status MpiAbandonedError(absl::string_view what);

// MPI is initialised, not yet finalised, and not abandoned: MPI calls are
// allowed.
bool MpiIsUsable();
// AbandonMpi was called.
bool MpiWasAbandoned();

// Whether vemesh itself initialised MPI (and so will finalise it).
bool VemeshOwnsMpi();

// The thread level MPI granted (MPI_THREAD_SINGLE .. MPI_THREAD_MULTIPLE);
// -1 before MPI is initialised.
int MpiThreadLevel();
// "MPI_THREAD_FUNNELED" for MPI_THREAD_FUNNELED, and so on.
absl::string_view MpiThreadLevelName(int level);

// Whether this thread may call MPI now, by the level MPI granted: OK under
// MPI_THREAD_SERIALIZED or MPI_THREAD_MULTIPLE, or on the main thread (the
// one that initialised MPI), or while MPI is not running (nothing to
// forbid). Otherwise FailedPrecondition naming `what`, the level and the
// way out: under MPI_THREAD_FUNNELED or MPI_THREAD_SINGLE only the main
// thread may call MPI.
absl::Status CheckMpiThread(absl::string_view what);
// CheckMpiThread's answer without a message: true when it would be OK.
bool MpiThreadAllowed();

// Turns an MPI return code into a Status naming the call and MPI's own
// message, by the code's error class: OK for MPI_SUCCESS; Unavailable for a
// lost peer (MPI_ERR_PROC_FAILED, _PENDING and MPI_ERR_REVOKED, or their
// MPIX_ names, where this MPI defines them); InvalidArgument for
// MPI_ERR_TRUNCATE (the ranks disagree on a count); Internal otherwise.
absl::Status MpiStatus(int code, absl::string_view call);

// OK when `op` on a communicator of `size` ranks may call MPI from this
// thread now; FailedPrecondition naming `op` when MPI was finalised or
// abandoned, or this thread may not call it.
absl::Status MpiUsable(absl::string_view op, int size);

// Scope guard for main(): initialises MPI (or adopts it) on construction;
// on destruction finalises MPI if and only if vemesh initialised it.
class MpiSession {
 public:
  MpiSession() : MpiSession(nullptr, nullptr) {}
  MpiSession(int* argc, char*** argv);
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;
  ~MpiSession();

  // Whether MPI could be initialised.
  const absl::Status& status() const { return status_; }

 private:
  absl::Status status_;
};

}  // namespace vemesh

#endif  // VEMESH_COMM_MPI_MPI_ENVIRONMENT_H_
