#include "vemesh/comm/mpi/mpi_environment.h"

#include <mutex>
#include <cstdio>
#include <cstdlib>

#include "absl/base/attributes.h"
#include "absl/strings/str_cat.h"

namespace vemesh {
namespace {

// std::mutex, not absl::Mutex: TSan sees pthread locking, not the locking
// inside Debian's uninstrumented Abseil. constexpr-constructed.
std::mutex env_mu;
bool owns_mpi = false;
bool atexit_registered = false;
int thread_level = -1;

bool Initialized() {
  int flag = 0;
  MPI_Initialized(&flag);
  return flag != 0;
}

bool Finalized() {
  int flag = 0;
  MPI_Finalized(&flag);
  return flag != 0;
}

// Finalises MPI if vemesh started it and nobody finalised it yet.
void FinalizeIfOwned() {
  std::lock_guard<std::mutex> lock(env_mu);
  if (!owns_mpi || Finalized()) return;
  MPI_Finalize();
}

absl::Status InitLocked(int* argc, char*** argv)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(env_mu) {
  if (Finalized()) {
    return absl::FailedPreconditionError(
        "MPI was already finalised; it cannot be initialised again");
  }
  if (Initialized()) {
    if (thread_level < 0) MPI_Query_thread(&thread_level);
    return absl::OkStatus();
  }
  int provided = MPI_THREAD_SINGLE;
  int code = MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided);
  if (code != MPI_SUCCESS) return MpiStatus(code, "MPI_Init_thread");
  owns_mpi = true;
  thread_level = provided;
  return absl::OkStatus();
}

}  // namespace

absl::Status MpiStatus(int code, absl::string_view call) {
  if (code == MPI_SUCCESS) return absl::OkStatus();
  char text[MPI_MAX_ERROR_STRING] = {};
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) length = 0;
  return absl::InternalError(absl::StrCat(
      call, " failed with MPI error ", code, ": ",
      absl::string_view(text, static_cast<size_t>(length))));
}

absl::Status EnsureMpiInitialized() {
  std::lock_guard<std::mutex> lock(env_mu);
  absl::Status status = InitLocked(nullptr, nullptr);
  // A lazy start still ends cleanly: finalise at exit unless a session or
  // the program does it first.
  if (status.ok() && owns_mpi && !atexit_registered) {
    atexit_registered = true;
    std::atexit(FinalizeIfOwned);
  }
  return status;
}

bool MpiIsUsable() { return Initialized() && !Finalized(); }

bool VemeshOwnsMpi() {
  std::lock_guard<std::mutex> lock(env_mu);
  return owns_mpi;
}

int MpiThreadLevel() {
  std::lock_guard<std::mutex> lock(env_mu);
  if (thread_level < 0 && MpiIsUsable()) MPI_Query_thread(&thread_level);
  return thread_level;
}

absl::string_view MpiThreadLevelName(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE:
      return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED:
      return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED:
      return "MPI_THREAD_SERIALIZED";
    case MPI_THREAD_MULTIPLE:
      return "MPI_THREAD_MULTIPLE";
  }
  return "no thread level (MPI not initialised)";
}

absl::Status CheckMpiThread(absl::string_view what) {
  if (!MpiIsUsable()) return absl::OkStatus();
  const int level = MpiThreadLevel();
  if (level >= MPI_THREAD_SERIALIZED) return absl::OkStatus();
  // MPI_Is_thread_main may be called from any thread (MPI 3.1, 12.4.3).
  int is_main = 0;
  MPI_Is_thread_main(&is_main);
  if (is_main) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      what, " would call MPI from a thread other than the main one, but MPI "
      "was initialised with ", MpiThreadLevelName(level),
      ": call it from the thread that initialised MPI, or initialise MPI with "
      "MPI_THREAD_SERIALIZED or MPI_THREAD_MULTIPLE"));
}

MpiSession::MpiSession(int* argc, char*** argv) {
  std::lock_guard<std::mutex> lock(env_mu);
  status_ = InitLocked(argc, argv);
}

MpiSession::~MpiSession() { FinalizeIfOwned(); }

}  // namespace vemesh
