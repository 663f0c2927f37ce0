// vemesh/comm/gloo/internal/shm_group.h
//
// The shared-memory rounds of a Gloo group whose ranks share one host
// (issue 46): one POSIX shared-memory segment per group, made by its rank 0
// at the group's first collective and unlinked as soon as every rank has
// mapped it (so that no name outlives the job, however it ends: the memory
// goes with the last mapping). Private: not installed.
//
// A round: every rank posts its operation's 32-byte summary and, for a
// small operation, its payload into its own slot, then waits until every
// rank has posted the same round; every rank then reads all the slots (the
// summaries: the agreement check, the payloads: the result), and releases
// the round. Slots alternate between two buffers by round parity; a rank
// writes round k's only once every rank has released round k-2.
//
// A wait spins for about 2 milliseconds, then sleeps on a futex in the
// segment that the rank it waits for wakes when it moves its counter: a
// rank that waits for a late one burns no CPU the late one may need (ranks
// outnumber cores, or mpirun pinned a DP group's members to one core: the
// elastic demo's joiner missed its epoch's rounds while they spun).
//
// Every wait is bounded: by the group's timeout, by the liveness of the
// ranks it waits for (each rank's pid, probed with kill(pid, 0) and its
// /proc state every 5 ms once the spin is over: a rank that died is an
// error within a few milliseconds, as a reset TCP connection is), by a
// rank's leaving and by abort (Leave, which OnAbort calls too, wakes every
// sleeping wait of the group; a wait that had just looked sleeps out its
// 5 ms).

#ifndef VEMESH_COMM_GLOO_INTERNAL_SHM_GROUP_H_
#define VEMESH_COMM_GLOO_INTERNAL_SHM_GROUP_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace vemesh {
namespace gloo_internal {

class ShmGroup {
 public:
  // The largest payload a round carries: all_reduce and broadcast of at
  // most this many bytes run on shared memory alone.
  static constexpr size_t kSlotBytes = 65536;
  static constexpr size_t kSummaryBytes = 32;

  // Rank 0 makes the segment `name` (a POSIX shm name, "/vemesh-..."),
  // sized for `size` ranks, its memory reserved (no SIGBUS later on a full
  // /dev/shm); the others map it once it exists.
  static absl::StatusOr<std::unique_ptr<ShmGroup>> Create(
      const std::string& name, int size);
  static absl::StatusOr<std::unique_ptr<ShmGroup>> Open(const std::string& name,
                                                        int rank, int size);
  ~ShmGroup();
  ShmGroup(const ShmGroup&) = delete;
  ShmGroup& operator=(const ShmGroup&) = delete;

  // Every rank's pid, written once each has mapped the segment; Unlink
  // removes the name (rank 0, once all mapped).
  void SetRank(int rank);
  void Unlink();

  // What a wait checks besides the clock: true when abort() was called.
  using Aborted = std::function<bool()>;

  // Posts this rank's next round (summary and `bytes` <= kSlotBytes of
  // payload) and waits until every rank posted it. Unavailable naming the
  // rank when one died, DeadlineExceeded after `timeout`, Aborted.
  absl::Status Post(const void* summary, const void* data, size_t bytes,
                    absl::Duration timeout, const Aborted& aborted);
  // Rank r's summary and payload of the round just posted.
  const void* summary(int r) const;
  const void* payload(int r) const;
  // This rank is done reading the round's slots.
  void Release();
  // This rank leaves the group (its communicator was destroyed, aborted or
  // broke): the others' waits end at their next look, Unavailable, as
  // a closed TCP connection ends theirs. Any thread.
  void Leave();

 private:
  ShmGroup(std::string name, void* base, size_t bytes, int size);
  struct Control;
  Control* control(int r) const;
  char* slot(int r, uint64_t round) const;
  // Spins, then sleeps, until every rank's counter `which` reaches
  // `target`; bounded as Post says.
  absl::Status WaitAll(int which, uint64_t target, absl::Duration timeout,
                       const Aborted& aborted);
  // Stores this rank's counter and wakes the waits asleep on it.
  void Advance(uint64_t& counter, uint64_t value);

  std::string name_;
  void* base_;
  size_t bytes_;
  int rank_ = 0;
  int size_;
  uint64_t round_ = 0;  // rounds this rank posted
};

}  // namespace gloo_internal
}  // namespace vemesh

#endif  // VEMESH_COMM_GLOO_INTERNAL_SHM_GROUP_H_
