#include "vemesh/api/snapshot_guard.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <vector>

namespace vemesh {
namespace {

// One thread's announcements: one per nesting level of its guards.
struct ReaderSlots {
  std::atomic<const void*> hazards[SnapshotGuard::kMaxNesting] = {};
  int depth = 0;  // touched by the owning thread only
};

// Every live thread's slots. std::mutex (constexpr-constructed), not
// absl::Mutex: TSan must see this locking.
std::mutex slots_mu;
std::vector<ReaderSlots*>& AllSlots() {
  // Never destroyed: threads may exit after static destruction began.
  static auto* const all = new std::vector<ReaderSlots*>();
  return *all;
}

// The hot path reads this: initial-exec is one %fs-relative load, not a
// __tls_get_addr call.
__attribute__((tls_model("initial-exec"))) thread_local ReaderSlots* t_slots =
    nullptr;

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

ReaderSlots* ThisThreadSlots() {
  if (t_slots != nullptr) return t_slots;
  auto* slots = new ReaderSlots();
  {
    std::lock_guard<std::mutex> lock(slots_mu);
    AllSlots().push_back(slots);
  }
  (void)&t_owner;  // odr-use: registers the thread-exit destructor
  t_slots = slots;
  return slots;
}

}  // namespace

SnapshotGuard::SnapshotGuard(const std::atomic<const void*>& published) {
  ReaderSlots* slots = ThisThreadSlots();
  if (slots->depth == kMaxNesting) {
    std::fprintf(stderr,
                 "vemesh: SnapshotGuard nested %d deep on one thread: at most "
                 "%d (a bug in vemesh)\n",
                 slots->depth + 1, kMaxNesting);
    std::abort();
  }
  slot_ = &slots->hazards[slots->depth++];
  // Announce, then check the object is still the published one: a writer
  // that unpublished it before seeing the announcement may already be
  // freeing it. Both seq_cst: the store must not pass the second load.
  const void* object = published.load();
  for (;;) {
    slot_->store(object);
    const void* again = published.load();
    if (again == object) break;
    object = again;
  }
  object_ = object;
}

SnapshotGuard::~SnapshotGuard() {
  slot_->store(nullptr, std::memory_order_release);
  --t_slots->depth;
}

void WaitForReaders(const void* object) {
  if (object == nullptr) return;
  std::lock_guard<std::mutex> lock(slots_mu);
  for (ReaderSlots* slots : AllSlots()) {
    for (const auto& hazard : slots->hazards) {
      // A reader holds it for one query: O(ndim) work, microseconds.
      while (hazard.load() == object) std::this_thread::yield();
    }
  }
}

}  // namespace vemesh
