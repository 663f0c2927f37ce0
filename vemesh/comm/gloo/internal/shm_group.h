// vemesh/comm/gloo/internal/shm_group.h
//
// The shared-memory rounds of a Gloo group whose ranks share one host
// (issue 46): one POSIX shared-memory segment per group, made by its rank 0
// at the group's first collective and unlinked as soon as every rank has
// mapped it (so that no name outlives the job, however it ends: the memory
// goes with the last mapping). Private: not installed.
//
// A round: every rank posts its operation's 32-byte summary and its
// payload (a small operation's whole, or a large one's chunk: gloo_shm.cc
// runs those in many rounds) into its own slot, then waits until every
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
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace vemesh {
namespace gloo_internal {

class ShmGroup {
 public:
  // The largest payload a round carries: a collective of at most this
  // many bytes takes one round; a larger all_reduce, broadcast,
  // all_gather or reduce_scatter takes one per chunk of about this size (the
  // segment's size does not grow with the payload).
  static constexpr size_t kSlotBytes = 65536;
  static constexpr size_t kSummaryBytes = 32;

  static constexpr uint64_t kP2PSlots = 128;
  // Pairs grow as size^2: a larger group keeps its messages on TCP (32
  // ranks: 1,024 pairs, 10 MiB).
  static constexpr int kMaxP2PRanks = 32;
  static bool HasP2P(int size) { return size <= kMaxP2PRanks; }
  // Each ordered pair's ring: 256 KiB shared among a rank's peers, from
  // 4 KiB to 64 KiB each.
  static size_t RingBytes(int size);

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
  // The same with a second piece of payload, `tail_bytes` of `tail` at
  // byte `tail_at` of the slot (bytes <= tail_at, tail_at + tail_bytes <=
  // kSlotBytes): a chunked operation's next input and last result.
  absl::Status Post(const void* summary, const void* data, size_t bytes,
                    size_t tail_at, const void* tail, size_t tail_bytes,
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

  // Point to point. This rank's sends go through the segment from now on:
  // it publishes, for each rank r, how many messages it sent r before
  // (`sent[r]`, through TCP). The caller orders this with its sends.
  void OpenP2P(const uint64_t* sent);
  // How many messages `peer` sent this rank through TCP before it opened
  // its sends here: waits for it to publish (it does right after the
  // set-up's last collective).
  absl::StatusOr<uint64_t> P2PTcpBefore(int peer, absl::Duration timeout,
                                        const Aborted& aborted);
  // Posts a message of `bytes` to `peer`: true when its payload went into
  // the ring, false when it goes by TCP (its descriptor, if any, says so).
  // Never waits; Unavailable once this rank left. Never concurrent.
  absl::StatusOr<bool> P2PSend(int peer, const void* data, size_t bytes);
  // The next message from `peer`, once posted: its length and whether its
  // payload is in the ring. P2PTake then copies an inline payload into
  // `data` (nullptr: drops it) and frees the message's descriptor.
  struct P2PMessage {
    uint64_t bytes;
    bool in_ring;
    bool closes;  // every later message from `peer` goes by TCP
  };
  absl::StatusOr<P2PMessage> P2PNext(int peer, absl::Duration timeout,
                                     const Aborted& aborted);
  void P2PTake(int peer, const P2PMessage& message, void* data);

 private:
  ShmGroup(std::string name, void* base, size_t bytes, int size);
  struct Control;
  struct Pair;
  Control* control(int r) const;
  // The pair from rank `from` to rank `to`, its descriptors and its ring.
  Pair* pair(int from, int to) const;
  uint64_t* descriptors(int from, int to) const;
  char* ring(int from, int to) const;
  char* slot(int r, uint64_t round) const;
  // Spins, then sleeps, until every rank's counter `which` reaches
  // `target`; bounded as Post says.
  absl::Status WaitAll(int which, uint64_t target, absl::Duration timeout,
                       const Aborted& aborted);
  // Spins, then sleeps, until `counter` (moved by rank `r`, which wakes the
  // `sleepers`) reaches `target`; `what` names the wait in a timeout.
  absl::Status WaitFor(uint64_t& counter, uint64_t target, int r,
                       uint32_t& sleepers, absl::Duration timeout,
                       const Aborted& aborted,
                       const std::function<std::string()>& what);
  // Stores this rank's counter and wakes the waits asleep on it.
  void Advance(uint64_t& counter, uint64_t value);
  void Advance(uint64_t& counter, uint64_t value, uint32_t& sleepers);

  std::string name_;
  void* base_;
  size_t bytes_;
  int rank_ = 0;
  int size_;
  uint64_t round_ = 0;  // rounds this rank posted
  size_t ring_bytes_;
  // This rank's ends of its pairs, per peer: bytes written into its
  // outgoing ring (the sender's), bytes read from its incoming one.
  std::vector<uint64_t> written_;
  std::vector<uint64_t> read_;
  std::vector<char> closed_;  // the sender's: pairs now on TCP for good
};

}  // namespace gloo_internal
}  // namespace vemesh

#endif  // VEMESH_COMM_GLOO_INTERNAL_SHM_GROUP_H_
