// vemesh/api/snapshot_guard.h
//
// Lock-free reading of an object that a writer replaces, with the old object
// freed by the writer on the writer's thread (hazard pointers, a few per
// thread). The registry (ve_device_mesh.cc) publishes its state this way.
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
// A reader's cost is one seq_cst store and two loads; a writer's wait lasts
// as long as the readers' queries in flight (microseconds). Guards may nest
// up to kMaxNesting deep on one thread; deeper is a bug in vemesh (abort).

#ifndef VEMESH_API_SNAPSHOT_GUARD_H_
#define VEMESH_API_SNAPSHOT_GUARD_H_

#include <atomic>

namespace vemesh {

class SnapshotGuard {
 public:
  static constexpr int kMaxNesting = 4;

  // Loads `published` and announces the object read, so that no writer frees
  // it while this guard lives.
  explicit SnapshotGuard(const std::atomic<const void*>& published);
  ~SnapshotGuard();
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

#endif  // VEMESH_API_SNAPSHOT_GUARD_H_
