// vemesh/registry/internal/snapshot_guard.h
//
// Lock-free reading of an object that a writer replaces, with the old object
// freed by the writer on the writer's thread (hazard pointers, a few per
// thread). The registry (ve_device_mesh_init.cc) publishes its state this way.
//
//   std::atomic<const void*> published;         // the current object
//
//   // Reader, any thread: one snapshot for the guard's whole scope.
//   {
//     SnapshotGuard guard(published);
//     const State* s = static_cast<const State*>(guard.get());  // may be null
//     ... read *s ...
//   }
//
//   // Writer (one at a time): publish the new object, then wait out the
//   // readers of the old one and free it here.
//   const void* old = published.exchange(next.get());
//   WaitForReaders(old);
//   delete old_object;
//
// Why not a shared_ptr per thread: a thread-local copy owns the object, so
// the last owner may be an idle worker, which then frees it (and whatever
// it holds, MPI communicators included) on its own thread, at its next call.
// Here readers never own: the writer alone frees.
//
// A reader's cost is a plain store and two loads, inlined into the query:
// the store-load ordering that hazard pointers need (the announcement must
// be visible before the re-check) is paid by the writer instead, with one
// membarrier(2) per WaitForReaders that makes every running thread of the
// process execute a full barrier. Where membarrier is unavailable (or under
// TSan, which cannot see it) readers fall back to a seq_cst store. A
// writer's wait lasts as long as the readers' queries in flight
// (microseconds). Guards may nest up to kMaxNesting deep on one thread;
// deeper is a bug in vemesh (abort).

#ifndef VEMESH_REGISTRY_INTERNAL_SNAPSHOT_GUARD_H_
#define VEMESH_REGISTRY_INTERNAL_SNAPSHOT_GUARD_H_

#include <atomic>

namespace vemesh {

namespace snapshot_internal {

// One thread's announcements: one per nesting level of its guards.
inline constexpr int kMaxNesting = 4;
struct ReaderSlots {
  std::atomic<const void*> hazards[kMaxNesting] = {};
  int depth = 0;  // touched by the owning thread only
};

// This thread's slots, null until its first guard. initial-exec: one
// %fs-relative load, no __tls_get_addr; constinit: no TLS wrapper call.
extern constinit thread_local ReaderSlots* t_slots
    __attribute__((tls_model("initial-exec")));
// True when WaitForReaders orders the readers' announcements itself
// (membarrier registered at load time); never changes afterwards.
extern bool light_readers;

ReaderSlots* RegisterThisThread();  // the slow path of a thread's first guard
[[noreturn]] void NestedTooDeep();

}  // namespace snapshot_internal

class SnapshotGuard {
 public:
  static constexpr int kMaxNesting = snapshot_internal::kMaxNesting;

  // Loads `published` and announces the object read, so that no writer frees
  // it while this guard lives.
  explicit SnapshotGuard(const std::atomic<const void*>& published) {
    using namespace snapshot_internal;
    ReaderSlots* slots = t_slots;
    if (slots == nullptr) [[unlikely]]
      slots = RegisterThisThread();
    if (slots->depth == kMaxNesting) [[unlikely]]
      NestedTooDeep();
    slot_ = &slots->hazards[slots->depth++];
    // Announce, then check the object is still the published one: a writer
    // that unpublished it before seeing the announcement may already be
    // freeing it.
    const void* object = published.load(std::memory_order_acquire);
    for (;;) {
      if (light_readers) [[likely]] {
        slot_->store(object, std::memory_order_relaxed);
        // Keeps the compiler from moving the load above the store; the CPU
        // is kept from it by the writer's membarrier.
        std::atomic_signal_fence(std::memory_order_seq_cst);
      } else {
        slot_->store(object);  // seq_cst: the store must not pass the load
      }
      const void* again = published.load();
      if (again == object) break;
      object = again;
    }
    object_ = object;
  }
  ~SnapshotGuard() {
    slot_->store(nullptr, std::memory_order_release);
    --snapshot_internal::t_slots->depth;
  }
  SnapshotGuard(const SnapshotGuard&) = delete;
  SnapshotGuard& operator=(const SnapshotGuard&) = delete;

  // The object read; null when nothing was published.
  const void* get() const { return object_; }

 private:
  std::atomic<const void*>* slot_;
  const void* object_;
};

// Blocks until no guard on any thread announces `object`. Call it after
// `object` stopped being published; then the caller may free it. Must not
// be called while this thread holds a guard on `object`.
void WaitForReaders(const void* object);

}  // namespace vemesh

#endif  // VEMESH_REGISTRY_INTERNAL_SNAPSHOT_GUARD_H_
