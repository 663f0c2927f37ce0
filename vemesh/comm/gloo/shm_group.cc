#include "vemesh/comm/gloo/internal/shm_group.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <climits>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace vemesh {
namespace gloo_internal {
namespace {

constexpr size_t kLine = 64;
// A slot: the summary on its own line, then the payload.
constexpr size_t kSlotStride = kLine + ShmGroup::kSlotBytes;
// A wait spins (yielding) this long before it sleeps: a round whose ranks
// arrive within it costs no system call and no wake-up (a sleeper is woken
// late when ranks outnumber cores: train_nd's steps under torchrun took
// 2-3x longer with a 50 us spin), and one that waits for a late rank burns
// no more CPU that the late rank may need (mpirun pins a replica's rank k
// to core k: the members of a DP group can share one core).
constexpr absl::Duration kSpinFor = absl::Milliseconds(2);
constexpr int kSpinsPerClock = 64;
// A sleep's bound: how often a sleeping wait looks at the clock and the
// awaited rank's liveness (a pid probe costs a /proc read: not every
// microsecond). Leave and abort wake the sleepers; one that checked just
// before the wake (they move no counter) sleeps out this bound.
constexpr absl::Duration kLivenessEvery = absl::Milliseconds(5);

// A pair's descriptors: a message's length and whether its payload is in
// the ring, two words each.
constexpr size_t kDescriptorBytes = ShmGroup::kP2PSlots * 2 * sizeof(uint64_t);

size_t PairStride(int size) {
  return 2 * kLine + kDescriptorBytes + ShmGroup::RingBytes(size);
}

size_t RoundsBytes(int size) {
  return static_cast<size_t>(size) * (kLine + 2 * kSlotStride);
}

size_t SegmentBytes(int size) {
  const size_t n = ShmGroup::HasP2P(size) ? static_cast<size_t>(size) : 0;
  return RoundsBytes(size) + n * n * PairStride(size);
}

// A message takes whole lines of the ring: every payload starts aligned.
uint64_t RingSpan(uint64_t bytes) {
  return (bytes + kLine - 1) / kLine * kLine;
}

// Whether `pid` is gone: no such process, or one that exited and waits to
// be reaped (a zombie: kill still succeeds on it; its launcher may reap it
// only seconds later).
bool Gone(int32_t pid) {
  if (pid <= 0) return false;  // not mapped yet: the open's own bound
  if (kill(pid, 0) != 0) return errno == ESRCH;
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/%d/stat", pid);
  FILE* f = std::fopen(path, "r");
  if (f == nullptr) return false;  // no /proc: kill's answer stands
  char buf[256];
  const size_t n = std::fread(buf, 1, sizeof(buf) - 1, f);
  std::fclose(f);
  buf[n] = '\0';
  // "pid (comm) S ...": the state follows the last ')'.
  const char* close = std::strrchr(buf, ')');
  return close != nullptr && close[1] == ' ' &&
         (close[2] == 'Z' || close[2] == 'X');
}

// The futex word of a counter: its low half (the kernel compares 32 bits;
// a counter that moved changes them).
static_assert(std::endian::native == std::endian::little);
uint32_t* FutexWord(uint64_t& counter) {
  return reinterpret_cast<uint32_t*>(&counter);
}

// Not FUTEX_PRIVATE: the word is in memory shared between processes.
void FutexWait(uint32_t* word, uint32_t expected, absl::Duration bound) {
  const timespec ts = absl::ToTimespec(bound);
  syscall(SYS_futex, word, FUTEX_WAIT, expected, &ts, nullptr, 0);
}
void FutexWakeAll(uint32_t* word) {
  syscall(SYS_futex, word, FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

}  // namespace

// One rank's counters, on a cache line of its own. Plain integers that
// the segment's zeroed pages hold from the start, accessed only through
// std::atomic_ref (no constructor runs in shared memory).
struct ShmGroup::Control {
  uint64_t posted;    // the last round this rank posted
  uint64_t released;  // the last round it finished reading
  int32_t pid;
  int32_t gone;       // Leave()
  uint32_t sleepers;  // waits asleep on this rank's counters
};
static_assert(std::atomic<uint64_t>::is_always_lock_free);

// One ordered pair's counters: the sender's line, then the receiver's.
struct ShmGroup::Pair {
  alignas(kLine) uint64_t posted;  // messages posted
  uint64_t opened;                 // 1 + messages sent by TCP before OpenP2P
  uint32_t recv_sleepers;          // receiver waits asleep on these
  alignas(kLine) uint64_t taken;   // messages received
  uint64_t taken_bytes;            // ring bytes freed
  uint32_t send_sleepers;          // sender waits asleep on `taken`
};

template <typename T>
T Load(T& field) {
  return std::atomic_ref<T>(field).load(std::memory_order_acquire);
}
template <typename T>
void Store(T& field, T value) {
  std::atomic_ref<T>(field).store(value, std::memory_order_release);
}

ShmGroup::ShmGroup(std::string name, void* base, size_t bytes, int size)
    : name_(std::move(name)),
      base_(base),
      bytes_(bytes),
      size_(size),
      ring_bytes_(RingBytes(size)),
      written_(static_cast<size_t>(size)),
      read_(static_cast<size_t>(size)),
      closed_(static_cast<size_t>(size)) {}

size_t ShmGroup::RingBytes(int size) {
  const size_t share = (size_t{256} << 10) / std::max(size, 1);
  return std::clamp<size_t>(share / kLine * kLine, size_t{4} << 10,
                            size_t{64} << 10);
}

ShmGroup::~ShmGroup() { munmap(base_, bytes_); }

absl::StatusOr<std::unique_ptr<ShmGroup>> ShmGroup::Create(
    const std::string& name, int size) {
  const size_t bytes = SegmentBytes(size);
  const int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) {
    return absl::UnavailableError(
        absl::StrCat("shm_open(", name, "): ", std::strerror(errno)));
  }
  // Reserved now: a full /dev/shm is an error here, never a SIGBUS later.
  const int err = posix_fallocate(fd, 0, static_cast<off_t>(bytes));
  void* base =
      err == 0 ? mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)
               : MAP_FAILED;
  const int map_errno = errno;
  close(fd);
  if (base == MAP_FAILED) {
    shm_unlink(name.c_str());
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot reserve ", bytes, " bytes of shared memory (",
                     name, "): ", std::strerror(err != 0 ? err : map_errno)));
  }
  auto group = std::unique_ptr<ShmGroup>(new ShmGroup(name, base, bytes, size));
  return group;
}

absl::StatusOr<std::unique_ptr<ShmGroup>> ShmGroup::Open(
    const std::string& name, int rank, int size) {
  const size_t bytes = SegmentBytes(size);
  const int fd = shm_open(name.c_str(), O_RDWR, 0600);
  if (fd < 0) {
    return absl::UnavailableError(
        absl::StrCat("shm_open(", name, "): ", std::strerror(errno)));
  }
  struct stat st;
  const bool sized = fstat(fd, &st) == 0 && st.st_size == off_t(bytes);
  void* base =
      sized ? mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)
            : MAP_FAILED;
  close(fd);
  if (base == MAP_FAILED) {
    return absl::UnavailableError(
        absl::StrCat("cannot map ", name, " (", bytes, " bytes expected)"));
  }
  auto group = std::unique_ptr<ShmGroup>(new ShmGroup(name, base, bytes, size));
  group->rank_ = rank;
  return group;
}

void ShmGroup::SetRank(int rank) {
  rank_ = rank;
  Store(control(rank)->pid, static_cast<int32_t>(getpid()));
}

void ShmGroup::Unlink() { shm_unlink(name_.c_str()); }

ShmGroup::Control* ShmGroup::control(int r) const {
  static_assert(sizeof(Control) <= kLine);
  return reinterpret_cast<Control*>(static_cast<char*>(base_) + r * kLine);
}

ShmGroup::Pair* ShmGroup::pair(int from, int to) const {
  static_assert(sizeof(Pair) == 2 * kLine);
  char* pairs = static_cast<char*>(base_) + RoundsBytes(size_);
  const size_t index = static_cast<size_t>(from) * size_ + to;
  return reinterpret_cast<Pair*>(pairs + index * PairStride(size_));
}

uint64_t* ShmGroup::descriptors(int from, int to) const {
  return reinterpret_cast<uint64_t*>(reinterpret_cast<char*>(pair(from, to)) +
                                     sizeof(Pair));
}

char* ShmGroup::ring(int from, int to) const {
  return reinterpret_cast<char*>(pair(from, to)) + sizeof(Pair) +
         kDescriptorBytes;
}

char* ShmGroup::slot(int r, uint64_t round) const {
  char* slots = static_cast<char*>(base_) + size_ * kLine;
  return slots + (static_cast<size_t>(r) * 2 + round % 2) * kSlotStride;
}

absl::Status ShmGroup::WaitAll(int which, uint64_t target,
                               absl::Duration timeout, const Aborted& aborted) {
  for (int r = 0; r < size_; ++r) {
    Control* c = control(r);
    uint64_t& counter = which == 0 ? c->posted : c->released;
    absl::Status s =
        WaitFor(counter, target, r, c->sleepers, timeout, aborted, [&] {
          return absl::StrCat("rank ", r, " did not reach round ", target);
        });
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status ShmGroup::WaitFor(uint64_t& counter, uint64_t target, int r,
                               uint32_t& sleepers_word, absl::Duration timeout,
                               const Aborted& aborted,
                               const std::function<std::string()>& what) {
  if (Load(counter) >= target) return absl::OkStatus();
  const absl::Time start = absl::Now();
  const absl::Time spin_until = start + kSpinFor;
  Control* c = control(r);
  bool spun = false;  // past kSpinFor: sleeps between looks
  for (int spins = 1; Load(counter) < target; ++spins) {
    if (!spun) {
      if (spins % 16 == 0) sched_yield();  // 8 ranks on 2 cores
      if (spins % kSpinsPerClock != 0) continue;
    }
    const absl::Time now = absl::Now();
    if (now < spin_until) continue;
    spun = true;
    if (aborted()) return absl::AbortedError("aborted");
    // A rank that did its part and then left (or exited) owes nothing
    // more: look at the counter again after its state.
    const bool gone = Load(c->gone) != 0;
    const bool dead = !gone && Gone(Load(c->pid));
    if (Load(counter) >= target) break;
    if (gone) {
      return absl::UnavailableError(
          absl::StrCat("rank ", r,
                       " left the group (its communicator was destroyed, "
                       "aborted or broke)"));
    }
    if (dead) {
      return absl::UnavailableError(absl::StrCat(
          "rank ", r, " (pid ", Load(c->pid), ") of the group exited"));
    }
    if (now - start > timeout) {
      return absl::DeadlineExceededError(
          absl::StrCat(what(), " within ", absl::FormatDuration(timeout)));
    }
    // Asleep until rank r moves the counter (it wakes the sleepers), a
    // rank leaves (Leave wakes all) or kLivenessEvery passes. The sleeper
    // is counted before the counter is read again (both sequentially
    // consistent), so that the mover either sees it or the futex sees the
    // new value.
    std::atomic_ref<uint32_t> sleepers(sleepers_word);
    sleepers.fetch_add(1, std::memory_order_seq_cst);
    const uint64_t again =
        std::atomic_ref<uint64_t>(counter).load(std::memory_order_seq_cst);
    if (again < target) {
      FutexWait(FutexWord(counter), static_cast<uint32_t>(again),
                std::min(kLivenessEvery, timeout - (now - start)));
    }
    sleepers.fetch_sub(1, std::memory_order_seq_cst);
  }
  return absl::OkStatus();
}

void ShmGroup::Advance(uint64_t& counter, uint64_t value) {
  Advance(counter, value, control(rank_)->sleepers);
}

void ShmGroup::Advance(uint64_t& counter, uint64_t value, uint32_t& sleepers) {
  std::atomic_ref<uint64_t>(counter).store(value, std::memory_order_seq_cst);
  if (std::atomic_ref<uint32_t>(sleepers).load(std::memory_order_seq_cst) !=
      0) {
    FutexWakeAll(FutexWord(counter));
  }
}

absl::Status ShmGroup::Post(const void* summary, const void* data, size_t bytes,
                            absl::Duration timeout, const Aborted& aborted) {
  return Post(summary, data, bytes, bytes, nullptr, 0, timeout, aborted);
}

absl::Status ShmGroup::Post(const void* summary, const void* data, size_t bytes,
                            size_t tail_at, const void* tail, size_t tail_bytes,
                            absl::Duration timeout, const Aborted& aborted) {
  const uint64_t round = round_ + 1;
  // The slot of this parity was read in round - 2: by everyone?
  if (round > 2) {
    absl::Status free = WaitAll(1, round - 2, timeout, aborted);
    if (!free.ok()) return free;
  }
  char* mine = slot(rank_, round);
  std::memcpy(mine, summary, kSummaryBytes);
  if (bytes > 0) std::memcpy(mine + kLine, data, bytes);
  if (tail_bytes > 0) std::memcpy(mine + kLine + tail_at, tail, tail_bytes);
  round_ = round;
  Advance(control(rank_)->posted, round);
  return WaitAll(0, round, timeout, aborted);
}

const void* ShmGroup::summary(int r) const { return slot(r, round_); }

const void* ShmGroup::payload(int r) const { return slot(r, round_) + kLine; }

void ShmGroup::Release() { Advance(control(rank_)->released, round_); }

// Wakes every sleeping wait of the group: the others' on this rank's
// counters (they see `gone` at once) and this rank's own (an abort).
void ShmGroup::Leave() {
  Store(control(rank_)->gone, 1);
  for (int r = 0; r < size_; ++r) {
    FutexWakeAll(FutexWord(control(r)->posted));
    FutexWakeAll(FutexWord(control(r)->released));
    if (!HasP2P(size_)) continue;  // no pairs in the segment
    for (Pair* p : {pair(rank_, r), pair(r, rank_)}) {
      FutexWakeAll(FutexWord(p->posted));
      FutexWakeAll(FutexWord(p->opened));
      FutexWakeAll(FutexWord(p->taken));
    }
  }
}

void ShmGroup::OpenP2P(const uint64_t* sent) {
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    Pair* p = pair(rank_, r);
    Advance(p->opened, sent[r] + 1, p->recv_sleepers);
  }
}

absl::StatusOr<uint64_t> ShmGroup::P2PTcpBefore(int peer,
                                                absl::Duration timeout,
                                                const Aborted& aborted) {
  Pair* p = pair(peer, rank_);
  absl::Status s =
      WaitFor(p->opened, 1, peer, p->recv_sleepers, timeout, aborted, [&] {
        return absl::StrCat("rank ", peer,
                            " did not open its sends to shared memory");
      });
  if (!s.ok()) return s;
  return Load(p->opened) - 1;
}

// The ring is a byte stream: a payload may wrap around its end. A
// descriptor's second word: 1 the payload is in the ring, 0 it goes by
// TCP, 2 it and every later message of the pair go by TCP.
absl::StatusOr<bool> ShmGroup::P2PSend(int peer, const void* data,
                                       size_t bytes) {
  if (Load(control(rank_)->gone) != 0) {
    return absl::UnavailableError("this rank left the group");
  }
  // A peer that left takes nothing more (over TCP the send would fail on
  // its closed connection).
  if (Load(control(peer)->gone) != 0) {
    return absl::UnavailableError(
        absl::StrCat("rank ", peer,
                     " left the group (its communicator was destroyed, "
                     "aborted or broke)"));
  }
  if (closed_[peer]) return false;
  Pair* p = pair(rank_, peer);
  const uint64_t n = Load(p->posted);  // only this rank moves it
  uint64_t& written = written_[peer];
  // The receiver's counters, written by another process: bounded before
  // they size a copy.
  const uint64_t taken = Load(p->taken);
  const uint64_t taken_bytes = Load(p->taken_bytes);
  if (taken > n || taken_bytes > written ||
      written - taken_bytes > ring_bytes_) {
    return absl::DataLossError(
        absl::StrCat("rank ", peer, " took ", taken, " messages (", taken_bytes,
                     " bytes) of the ", n, " (", written,
                     " bytes) this rank sent it: the segment is corrupt"));
  }
  // The last free descriptor closes the pair: a send never waits for its
  // receiver (both ranks of a pair may send many before receiving).
  if (n - taken + 1 >= kP2PSlots) closed_[peer] = 1;
  const uint64_t span = RingSpan(bytes);
  const bool in_ring = !closed_[peer] && bytes <= ring_bytes_ &&
                       span <= ring_bytes_ - (written - taken_bytes);
  if (in_ring && bytes > 0) {
    const size_t at = written % ring_bytes_;
    const size_t first = std::min<size_t>(bytes, ring_bytes_ - at);
    std::memcpy(ring(rank_, peer) + at, data, first);
    std::memcpy(ring(rank_, peer), static_cast<const char*>(data) + first,
                bytes - first);
  }
  if (in_ring) written += span;
  uint64_t* d = descriptors(rank_, peer) + 2 * (n % kP2PSlots);
  Store(d[0], uint64_t{bytes});
  Store(d[1], uint64_t{in_ring ? 1u : closed_[peer] ? 2u : 0u});
  Advance(p->posted, n + 1, p->recv_sleepers);
  return in_ring;
}

absl::StatusOr<ShmGroup::P2PMessage> ShmGroup::P2PNext(int peer,
                                                       absl::Duration timeout,
                                                       const Aborted& aborted) {
  Pair* p = pair(peer, rank_);
  const uint64_t n = Load(p->taken);  // only this rank moves it
  absl::Status s =
      WaitFor(p->posted, n + 1, peer, p->recv_sleepers, timeout, aborted, [&] {
        return absl::StrCat("rank ", peer, " did not send message ", n + 1);
      });
  if (!s.ok()) return s;
  const uint64_t* d = descriptors(peer, rank_) + 2 * (n % kP2PSlots);
  const uint64_t how = Load(d[1]);
  const P2PMessage message{Load(d[0]), how == 1, how == 2};
  if (message.in_ring && message.bytes > ring_bytes_) {
    return absl::DataLossError(absl::StrCat(
        "rank ", peer, " posted a message of ", message.bytes,
        " bytes in a ring of ", ring_bytes_, ": the segment is corrupt"));
  }
  return message;
}

void ShmGroup::P2PTake(int peer, const P2PMessage& message, void* data) {
  Pair* p = pair(peer, rank_);
  if (message.in_ring) {
    uint64_t& read = read_[peer];
    if (data != nullptr && message.bytes > 0) {
      const size_t at = read % ring_bytes_;
      const size_t first = std::min<size_t>(message.bytes, ring_bytes_ - at);
      std::memcpy(data, ring(peer, rank_) + at, first);
      std::memcpy(static_cast<char*>(data) + first, ring(peer, rank_),
                  message.bytes - first);
    }
    read += RingSpan(message.bytes);
    Store(p->taken_bytes, read);
  }
  Advance(p->taken, Load(p->taken) + 1, p->send_sleepers);
}

}  // namespace gloo_internal
}  // namespace vemesh
