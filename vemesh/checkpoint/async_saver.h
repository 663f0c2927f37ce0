// vemesh/checkpoint/async_saver.h
//
// Saves in the background: Start plans the save with the other ranks and
// copies this rank's pieces to host memory (the only stall), a background
// thread writes and fsyncs the shard file while training goes on, and Wait
// (or the next Start) commits it: the collective part (every rank durable,
// rank 0's manifest, `latest`) runs on the calling thread, over a
// communicator of the saver's own (split from `world` in Create), so the
// training thread's communicators are never used from another thread.
//
//   VEMESH_ASSIGN_OR_RETURN(auto saver, AsyncSaver::Create(*world));
//   for (int64_t step = 1; step <= 300; ++step) {
//     Train(step);
//     if (step % 100 == 0) {
//       VEMESH_RETURN_IF_ERROR(saver->Start(state, step, "/ckpt"));
//     }
//   }
//   VEMESH_RETURN_IF_ERROR(saver->Wait());  // the last save is committed
//
// At most one save is in flight: Start first waits for (and commits) the
// previous one, returning its error if it failed. Start, Wait and the
// destructor are collective like Save (every rank calls them in the same
// order). The destructor joins the writer thread (bounded by the disk) but
// does not commit: a save not waited for is not a checkpoint.

#ifndef VEMESH_CHECKPOINT_ASYNC_SAVER_H_
#define VEMESH_CHECKPOINT_ASYNC_SAVER_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "vemesh/checkpoint/checkpoint.h"
#include "vemesh/checkpoint/state_dict.h"
#include "vemesh/comm/communicator.h"

namespace vemesh::checkpoint {

class AsyncSaver {
 public:
  // Collective over `world`: splits a communicator of its own from it.
  static absl::StatusOr<std::unique_ptr<AsyncSaver>> Create(
      Communicator& world);
  // Commits over `world` itself instead of a split of it: for a group that
  // cannot be split (an elastic mesh's reconfigurable groups) when the
  // caller runs Start and Wait on the thread that runs every other
  // operation on `world`, none in flight meanwhile (the writer thread never
  // communicates). Not collective.
  static absl::StatusOr<std::unique_ptr<AsyncSaver>> CreateOn(
      std::shared_ptr<Communicator> world);
  ~AsyncSaver();
  AsyncSaver(const AsyncSaver&) = delete;
  AsyncSaver& operator=(const AsyncSaver&) = delete;

  // Waits for the save in flight (its error is returned, and this one is
  // not started), then plans this save, copies this rank's share of the
  // pieces and returns; `state`'s buffers may change as soon as it returns.
  absl::Status Start(const StateDict& state, int64_t step,
                     const std::string& dir, const SaveOptions& options = {});
  // Finishes the save in flight (writer thread, then the collective commit)
  // and returns its status; OK when none is in flight.
  absl::Status Wait();
  // Whether a save was started and not yet waited for.
  bool in_flight() const;

  struct Impl;

 private:
  explicit AsyncSaver(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace vemesh::checkpoint

#endif  // VEMESH_CHECKPOINT_ASYNC_SAVER_H_
