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
#include <utility>

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

size_t SegmentBytes(int size) {
  return static_cast<size_t>(size) * (kLine + 2 * kSlotStride);
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

template <typename T>
T Load(T& field) {
  return std::atomic_ref<T>(field).load(std::memory_order_acquire);
}
template <typename T>
void Store(T& field, T value) {
  std::atomic_ref<T>(field).store(value, std::memory_order_release);
}

ShmGroup::ShmGroup(std::string name, void* base, size_t bytes, int size)
    : name_(std::move(name)), base_(base), bytes_(bytes), size_(size) {}

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

char* ShmGroup::slot(int r, uint64_t round) const {
  char* slots = static_cast<char*>(base_) + size_ * kLine;
  return slots + (static_cast<size_t>(r) * 2 + round % 2) * kSlotStride;
}

absl::Status ShmGroup::WaitAll(int which, uint64_t target,
                               absl::Duration timeout, const Aborted& aborted) {
  const absl::Time start = absl::Now();
  const absl::Time spin_until = start + kSpinFor;
  for (int r = 0; r < size_; ++r) {
    Control* c = control(r);
    uint64_t& counter = which == 0 ? c->posted : c->released;
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
      // A rank that did its part of this round and then left (or exited)
      // owes nothing more: look at the counter again after its state.
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
            absl::StrCat("rank ", r, " did not reach round ", target,
                         " within ", absl::FormatDuration(timeout)));
      }
      // Asleep until rank r moves the counter (Advance wakes the sleepers),
      // a rank leaves (Leave wakes all) or kLivenessEvery passes. The sleeper
      // is counted before the counter is read again (both sequentially
      // consistent), so that a poster either sees it or the futex sees the new
      // value.
      std::atomic_ref<uint32_t> sleepers(c->sleepers);
      sleepers.fetch_add(1, std::memory_order_seq_cst);
      const uint64_t again =
          std::atomic_ref<uint64_t>(counter).load(std::memory_order_seq_cst);
      if (again < target) {
        FutexWait(FutexWord(counter), static_cast<uint32_t>(again),
                  std::min(kLivenessEvery, timeout - (now - start)));
      }
      sleepers.fetch_sub(1, std::memory_order_seq_cst);
    }
  }
  return absl::OkStatus();
}

void ShmGroup::Advance(uint64_t& counter, uint64_t value) {
  std::atomic_ref<uint64_t>(counter).store(value, std::memory_order_seq_cst);
  Control* me = control(rank_);
  if (std::atomic_ref<uint32_t>(me->sleepers).load(std::memory_order_seq_cst) !=
      0) {
    FutexWakeAll(FutexWord(counter));
  }
}

absl::Status ShmGroup::Post(const void* summary, const void* data, size_t bytes,
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
  }
}

}  // namespace gloo_internal
}  // namespace vemesh
