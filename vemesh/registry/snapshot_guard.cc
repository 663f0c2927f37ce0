#include "vemesh/registry/internal/snapshot_guard.h"

#include <linux/membarrier.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <vector>

namespace vemesh {
namespace snapshot_internal {

constinit thread_local ReaderSlots* t_slots
    __attribute__((tls_model("initial-exec"))) = nullptr;

namespace {

#if defined(__SANITIZE_THREAD__)
constexpr bool kSanitizingThreads = true;
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
constexpr bool kSanitizingThreads = true;
#else
constexpr bool kSanitizingThreads = false;
#endif
#else
constexpr bool kSanitizingThreads = false;
#endif

long Membarrier(int command) { return syscall(__NR_membarrier, command, 0, 0); }

// Registers the process for expedited private membarriers, once, before
// main (and so before any reader): success lets readers skip their fence.
bool RegisterMembarrier() {
  if (kSanitizingThreads) return false;
  const long supported = Membarrier(MEMBARRIER_CMD_QUERY);
  if (supported < 0 || !(supported & MEMBARRIER_CMD_PRIVATE_EXPEDITED)) {
    return false;
  }
  return Membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED) == 0;
}

}  // namespace

bool light_readers = RegisterMembarrier();

}  // namespace snapshot_internal

namespace {

using snapshot_internal::ReaderSlots;
using snapshot_internal::t_slots;

// Every live thread's slots. std::mutex (constexpr-constructed), not
// absl::Mutex: TSan must see this locking.
std::mutex slots_mu;
std::vector<ReaderSlots*>& AllSlots() {
  // Never destroyed: threads may exit after static destruction began.
  static auto* const all = new std::vector<ReaderSlots*>();
  return *all;
}

// Unregisters the thread's slots when it exits. Touched only on the slow
// path, so its TLS wrapper costs nothing per query.
struct SlotsOwner {
  ~SlotsOwner() {
    if (t_slots == nullptr) return;
    std::lock_guard<std::mutex> lock(slots_mu);
    auto& all = AllSlots();
    all.erase(std::remove(all.begin(), all.end(), t_slots), all.end());
    delete t_slots;
    t_slots = nullptr;
  }
};
thread_local SlotsOwner t_owner;

}  // namespace

namespace snapshot_internal {

ReaderSlots* RegisterThisThread() {
  auto* slots = new ReaderSlots();
  {
    std::lock_guard<std::mutex> lock(slots_mu);
    AllSlots().push_back(slots);
  }
  (void)&t_owner;  // odr-use: registers the thread-exit destructor
  t_slots = slots;
  return slots;
}

void NestedTooDeep() {
  std::fprintf(stderr,
               "vemesh: SnapshotGuard nested %d deep on one thread: at most "
               "%d (a bug in vemesh)\n",
               kMaxNesting + 1, kMaxNesting);
  std::abort();
}

}  // namespace snapshot_internal

void WaitForReaders(const void* object) {
  if (object == nullptr) return;
  // Light readers announce with a plain store: this barrier on every
  // running thread makes each announcement made before it visible here, and
  // a reader that announces after it sees the new pointer on its re-check
  // (the caller published it before calling).
  if (snapshot_internal::light_readers &&
      snapshot_internal::Membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) != 0) {
    std::fprintf(stderr, "vemesh: membarrier failed after registration\n");
    std::abort();
  }
  std::lock_guard<std::mutex> lock(slots_mu);
  for (ReaderSlots* slots : AllSlots()) {
    for (const auto& hazard : slots->hazards) {
      // A reader holds it for one query: O(ndim) work, microseconds.
      while (hazard.load() == object) std::this_thread::yield();
    }
  }
}

}  // namespace vemesh
