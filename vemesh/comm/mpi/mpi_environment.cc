#include "vemesh/comm/mpi/mpi_environment.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#if __has_include(<mpi-ext.h>)
#include <mpi-ext.h>  // Open MPI's extensions: ULFM's MPIX_ERR_* when built in
#endif

#include "absl/base/attributes.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "vemesh/base/log.h"

namespace vemesh {
namespace {

// std::mutex, not absl::Mutex: TSan sees pthread locking, not the locking
// inside Debian's uninstrumented Abseil. constexpr-constructed.
std::mutex env_mu;
// Atomics, so that the queries below never wait for env_mu, which an
// abandoned start may hold for ever (inside MPI_Init_thread).
std::atomic<bool> owns_mpi{false};
bool atexit_registered = false;
std::atomic<int> thread_level{-1};
// Set when a collective was abandoned at a deadline (or MPI's start-up was):
// no MPI call may be made any more, MPI_Finalize included, since it would
// wait for peers that are gone.
std::atomic<bool> abandoned{false};
// When AbandonMpi was first called, and the first non-empty reason given
// (a caller that knows more than the call that abandoned adds it after);
// under reason_mu.
std::mutex reason_mu;
std::string* abandon_time = nullptr;
std::string* abandon_reason = nullptr;

// MPI_Initialized stays true once true (even after MPI_Finalize), so a
// true answer is kept: the usability checks of every call ask it.
std::atomic<bool> seen_initialized{false};

bool Initialized() {
  if (seen_initialized.load(std::memory_order_relaxed)) return true;
  int flag = 0;
  MPI_Initialized(&flag);
  if (flag != 0) seen_initialized.store(true, std::memory_order_relaxed);
  return flag != 0;
}

// MPI_Finalize deletes MPI_COMM_SELF's attributes first (MPI 3.1, 8.7.1):
// a delete callback there tells that finalising has begun, so that until
// then the usability checks of every call need not ask MPI_Finalized (a
// library call, ~0.2 us, several per mesh creation). Installed once, by a
// thread that may call MPI (WatchFinalize); before that, and once
// finalising has begun, MPI_Finalized is asked as always.
std::atomic<bool> finalize_watched{false};
std::atomic<bool> finalize_begun{false};

int FinalizeBegun(MPI_Comm, int, void*, void*) {
  finalize_begun.store(true);
  return MPI_SUCCESS;
}

bool Finalized() {
  if (finalize_watched.load(std::memory_order_acquire) &&
      !finalize_begun.load(std::memory_order_acquire)) {
    return false;
  }
  int flag = 0;
  MPI_Finalized(&flag);
  return flag != 0;
}

// Installs the callback above; only on a thread that may call MPI, while
// MPI is running.
std::mutex watch_mu;
void WatchFinalize() {
  if (finalize_watched.load(std::memory_order_acquire)) return;
  std::lock_guard<std::mutex> lock(watch_mu);
  if (finalize_watched.load() || Finalized()) return;
  int keyval = MPI_KEYVAL_INVALID;
  if (MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, FinalizeBegun, &keyval,
                             nullptr) != MPI_SUCCESS) {
    return;
  }
  if (MPI_Comm_set_attr(MPI_COMM_SELF, keyval, nullptr) != MPI_SUCCESS) return;
  finalize_watched.store(true, std::memory_order_release);
}

// The thread MPI_Is_thread_main last said is the main one: it stays so, so
// the check of every call under MPI_THREAD_SINGLE / _FUNNELED asks MPI once
// per thread, not once per call.
std::atomic<std::thread::id> main_thread{};

// Finalises MPI if vemesh started it and nobody finalised it yet.
void FinalizeIfOwned() {
  if (abandoned.load()) {
    LogNote(
        "MPI_Finalize skipped: a collective was abandoned at a "
        "deadline, so finalising would wait for ranks that are gone");
    return;
  }
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
    if (thread_level < 0) {
      int level = -1;
      MPI_Query_thread(&level);
      thread_level = level;
    }
    return absl::OkStatus();
  }
  int provided = MPI_THREAD_SINGLE;
  int code = MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided);
  if (code != MPI_SUCCESS) return MpiStatus(code, "MPI_Init_thread");
  owns_mpi = true;
  thread_level = provided;
  return absl::OkStatus();
}

// A lazy start still ends cleanly: finalise at exit unless a session or the
// program does it first.
absl::Status LazyInitLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(env_mu) {
  absl::Status status = InitLocked(nullptr, nullptr);
  if (status.ok() && owns_mpi && !atexit_registered) {
    atexit_registered = true;
    std::atexit(FinalizeIfOwned);
  }
  return status;
}

}  // namespace

namespace {

// Error classes that mean a peer process is gone. Only MPIs with the
// fault-tolerance extension (ULFM: Open MPI 5, MPICH) define them.
bool IsPeerLoss(int error_class) {
#if defined(MPI_ERR_PROC_FAILED)
  if (error_class == MPI_ERR_PROC_FAILED) return true;
#endif
#if defined(MPI_ERR_PROC_FAILED_PENDING)
  if (error_class == MPI_ERR_PROC_FAILED_PENDING) return true;
#endif
#if defined(MPI_ERR_REVOKED)
  if (error_class == MPI_ERR_REVOKED) return true;
#endif
#if defined(MPIX_ERR_PROC_FAILED)
  if (error_class == MPIX_ERR_PROC_FAILED) return true;
#endif
#if defined(MPIX_ERR_PROC_FAILED_PENDING)
  if (error_class == MPIX_ERR_PROC_FAILED_PENDING) return true;
#endif
#if defined(MPIX_ERR_REVOKED)
  if (error_class == MPIX_ERR_REVOKED) return true;
#endif
  (void)error_class;
  return false;
}

}  // namespace

absl::Status MpiStatus(int code, absl::string_view call) {
  if (code == MPI_SUCCESS) return absl::OkStatus();
  char text[MPI_MAX_ERROR_STRING] = {};
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) length = 0;
  int error_class = code;
  if (MPI_Error_class(code, &error_class) != MPI_SUCCESS) error_class = code;
  const std::string message =
      absl::StrCat(call, " failed with MPI error ", code, ": ",
                   absl::string_view(text, static_cast<size_t>(length)));
  if (IsPeerLoss(error_class)) {
    return absl::UnavailableError(
        absl::StrCat(message, " (a peer process was lost)"));
  }
  if (error_class == MPI_ERR_TRUNCATE) {
    return absl::InvalidArgumentError(absl::StrCat(
        message,
        " (a message was longer than its receive buffer: the ranks "
        "disagree on a count)"));
  }
  return absl::InternalError(message);
}

absl::Status EnsureMpiInitialized(absl::Time deadline) {
  if (abandoned.load()) {
    return MpiAbandonedError("");
  }
  if (Initialized()) {
    std::lock_guard<std::mutex> lock(env_mu);
    return InitLocked(nullptr, nullptr);
  }
  if (deadline == absl::InfiniteFuture()) {
    // No deadline: start MPI on this thread, which becomes MPI's main
    // thread, as the program's own MPI_Init would.
    std::lock_guard<std::mutex> lock(env_mu);
    return LazyInitLocked();
  }
  if (deadline <= absl::Now()) {
    return absl::DeadlineExceededError(
        "MPI is not started and the deadline has passed: nothing was tried");
  }
  // MPI_Init_thread waits for every rank of the job (the launcher's start-up
  // exchange) and has no timeout of its own: run it on a thread and stop
  // waiting at the deadline, so that a rank that never starts MPI leaves
  // the others a Status.
  struct Start {
    std::mutex mu;
    std::condition_variable done_cv;
    bool done = false;
    absl::Status status;
  };
  auto start = std::make_shared<Start>();
  std::thread([start] {
    absl::Status status;
    {
      std::lock_guard<std::mutex> lock(env_mu);
      status = LazyInitLocked();
    }
    std::lock_guard<std::mutex> lock(start->mu);
    start->status = status;
    start->done = true;
    start->done_cv.notify_all();
  }).detach();
  std::unique_lock<std::mutex> lock(start->mu);
  while (!start->done) {
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) {
      AbandonMpi("MPI_Init_thread did not return: some rank never started MPI");
      return absl::DeadlineExceededError(
          "MPI_Init_thread did not return before the deadline: it waits for "
          "every rank of the job to start MPI, and some rank did not. MPI "
          "cannot be used in this process: end the job");
    }
    // At most a second at a time: no overflow for far deadlines.
    start->done_cv.wait_for(
        lock, absl::ToChronoMilliseconds(std::min(left, absl::Seconds(1))) +
                  std::chrono::milliseconds(1));
  }
  if (start->status.ok() && MpiThreadLevel() < MPI_THREAD_SERIALIZED) {
    // MPI was started on a helper thread (to bound it), which then ended:
    // under FUNNELED or SINGLE no living thread could call MPI.
    return absl::FailedPreconditionError(absl::StrCat(
        "MPI granted ", MpiThreadLevelName(MpiThreadLevel()),
        " to vemesh's bounded start; vemesh needs MPI_THREAD_SERIALIZED or "
        "more there: start MPI yourself (MpiSession or MPI_Init_thread) before "
        "init_device_mesh"));
  }
  return start->status;
}

void AbandonMpi(absl::string_view reason) {
  {
    std::lock_guard<std::mutex> lock(reason_mu);
    if (abandon_time == nullptr) {
      abandon_time = new std::string(
          absl::FormatTime("%H:%M:%E3S UTC", absl::Now(), absl::UTCTimeZone()));
    }
    if (abandon_reason == nullptr && !reason.empty()) {
      abandon_reason = new std::string(reason);
    }
  }
  abandoned.store(true);
}

absl::Status MpiAbandonedError(absl::string_view what) {
  std::string when;
  {
    std::lock_guard<std::mutex> lock(reason_mu);
    if (abandon_time != nullptr) {
      when = absl::StrCat(
          " (at ", *abandon_time, abandon_reason != nullptr ? ": " : "",
          abandon_reason != nullptr ? *abandon_reason : "", ")");
    }
  }
  return absl::FailedPreconditionError(
      absl::StrCat(what, what.empty() ? "" : ": ",
                   "MPI was abandoned at an earlier deadline in this process",
                   when, ": no MPI call can be made any more; end the job"));
}

bool MpiWasAbandoned() { return abandoned.load(); }

bool MpiIsUsable() {
  return !abandoned.load() && Initialized() && !Finalized();
}

bool VemeshOwnsMpi() { return owns_mpi.load(); }

int MpiThreadLevel() {
  if (thread_level < 0 && !abandoned.load() && Initialized() && !Finalized()) {
    int level = -1;
    MPI_Query_thread(&level);
    thread_level = level;
  }
  return thread_level.load();
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

bool MpiThreadAllowed() {
  if (!MpiIsUsable()) return true;
  const int level = MpiThreadLevel();
  bool allowed = level >= MPI_THREAD_SERIALIZED;
  if (!allowed) {
    const std::thread::id self = std::this_thread::get_id();
    allowed = main_thread.load(std::memory_order_relaxed) == self;
    if (!allowed) {
      // MPI_Is_thread_main may be called from any thread (MPI 3.1, 12.4.3).
      int is_main = 0;
      MPI_Is_thread_main(&is_main);
      allowed = is_main != 0;
      if (allowed) main_thread.store(self, std::memory_order_relaxed);
    }
  }
  if (allowed) WatchFinalize();
  return allowed;
}

absl::Status CheckMpiThread(absl::string_view what) {
  if (MpiThreadAllowed()) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      what,
      " would call MPI from a thread other than the main one, but MPI "
      "was initialised with ",
      MpiThreadLevelName(MpiThreadLevel()),
      ": call it from the thread that initialised MPI, or initialise MPI with "
      "MPI_THREAD_SERIALIZED or MPI_THREAD_MULTIPLE"));
}

MpiSession::MpiSession(int* argc, char*** argv) {
  // An abandoned start may still hold the lock inside MPI_Init_thread.
  if (abandoned.load()) {
    status_ = MpiAbandonedError("MpiSession");
    return;
  }
  std::lock_guard<std::mutex> lock(env_mu);
  status_ = InitLocked(argc, argv);
}

MpiSession::~MpiSession() { FinalizeIfOwned(); }

// FailedPrecondition when MPI was finalised or this thread may not call it.
absl::Status MpiUsable(absl::string_view op, int size) {
  if (!MpiIsUsable()) {
    // Open MPI aborts the process on any call after MPI_Finalize.
    if (MpiWasAbandoned()) {
      return MpiAbandonedError(
          absl::StrCat(op, " on an MPI communicator of ", size, " ranks"));
    }
    return absl::FailedPreconditionError(absl::StrCat(
        op, " on an MPI communicator of ", size,
        " ranks after MPI was finalised (MPI_Finalize was called): MPI cannot "
        "be used again; finish communicating before MPI_Finalize"));
  }
  // The common case first, without building a message.
  if (MpiThreadAllowed()) return absl::OkStatus();
  return CheckMpiThread(absl::StrCat(op, " on an MPI communicator"));
}

}  // namespace vemesh
