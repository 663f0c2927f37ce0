// GlooCommunicator on one host: the group's shared-memory rounds
// (internal/shm_group.h). Every collective's agreement check is one round
// there instead of messages through Gloo's TCP pairs; an all_reduce or
// broadcast of at most ShmGroup::kSlotBytes rides in the same round whole
// (the summary is the payload's header), and so does an all_gather or
// reduce_scatter whose input fits. A larger all_reduce, broadcast,
// all_gather or reduce_scatter runs through the segment in slot-sized rounds,
// the first one also the check (ChunkedRounds); the other large operations keep
// Gloo's TCP algorithms after the round. Set up once, at the group's first
// collective, by three small Gloo collectives; VEMESH_GLOO_SHM=0 on any
// rank keeps the group on TCP.

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "gloo/allgather.h"
#include "gloo/broadcast.h"
#include "vemesh/base/fnv1a.h"
#include "vemesh/comm/gloo/gloo_communicator.h"
#include "vemesh/comm/gloo/internal/shm_group.h"
#include "vemesh/comm/internal/host_reduce.h"

namespace vemesh {
namespace {

using gloo_internal::ShmGroup;

// What makes two ranks one host for shared memory: the kernel they run on
// (its boot id), its hostname and the network namespace (the emulated
// hosts of tests/multihost are namespaces: they keep TCP between them).
uint64_t HostIdentity() {
  std::string id;
  std::ifstream boot("/proc/sys/kernel/random/boot_id");
  std::getline(boot, id);
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  struct stat ns;
  const uint64_t netns = stat("/proc/self/ns/net", &ns) == 0 ? ns.st_ino : 0;
  uint64_t h = kFnv1aOffset;
  for (char c : absl::StrCat(id, "/", host)) h = Fnv1aWord(uint8_t(c), h);
  return Fnv1aWord(netns, h);
}

bool ShmWanted() {
  const char* v = std::getenv("VEMESH_GLOO_SHM");
  if (v == nullptr || *v == '\0') return true;
  const std::string s(v);
  return !(s == "0" || s == "off" || s == "false" || s == "no");
}

// An all_reduce, broadcast, all_gather or reduce_scatter larger than a
// slot, through the segment in slot-sized rounds; the first round is also
// the agreement check (`check` reads its summaries: a mismatch ends the
// operation on every rank after that round, nothing written).
//
// all_reduce: round k carries every rank's chunk k of the input and, at
// `tail_at`, its reduced part of chunk k-1. After round k each rank r
// combines its part of chunk k (elements [r*len/n, (r+1)*len/n)) across
// the n slots in rank order, into its output (chunk k's input is in the
// slots by then: in place is safe), and copies the others' reduced parts
// of chunk k-1 out of their slots: each element is reduced once, by one
// rank, so every rank holds the same bits; per rank O(N) work, one round
// per chunk, plus one for the last chunk's parts. reduce_scatter: round k
// carries chunk k of each of a rank's n blocks; each rank combines its
// block's across the slots in rank order.
absl::Status ChunkedRounds(ShmGroup& shm, const Operation& op, int rank,
                           int size, const char* summary,
                           absl::Duration timeout,
                           const ShmGroup::Aborted& aborted,
                           const std::function<absl::Status()>& check,
                           absl::Status* verdict) {
  const size_t width = SizeOf(op.type);
  const size_t n = static_cast<size_t>(size);
  char* out = static_cast<char*>(op.recv);
  const char* in = static_cast<const char*>(
      op.kind == OpKind::kBroadcast || op.send == nullptr ? op.recv : op.send);
  // An all_reduce in place is safe (below); an all_gather's input and
  // output never overlap (Communicator refuses it).
  const size_t block = op.count * width;
  // Elements per chunk; all_reduce leaves room for the parts.
  size_t chunk = ShmGroup::kSlotBytes / width;
  if (op.kind == OpKind::kAllReduce) {
    chunk = chunk * n / (n + 1);
    while (chunk + (chunk + n - 1) / n > ShmGroup::kSlotBytes / width) --chunk;
  } else if (op.kind == OpKind::kReduceScatter) {
    chunk /= n;  // a piece of each of the n blocks
  }
  const size_t tail_at = chunk * width;
  const size_t chunks = (op.count + chunk - 1) / chunk;
  const size_t rounds = op.kind == OpKind::kAllReduce ? chunks + 1 : chunks;
  auto first = [&](size_t k) { return k * chunk; };
  auto length = [&](size_t k) { return std::min(chunk, op.count - k * chunk); };
  // Rank r's part of chunk k: its first element (absolute) and count.
  auto part_at = [&](size_t k, size_t r) {
    return first(k) + r * length(k) / n;
  };
  auto part_length = [&](size_t k, size_t r) {
    return (r + 1) * length(k) / n - r * length(k) / n;
  };
  const HostCombineFn combine = HostCombiner(op.type, op.op);
  // reduce_scatter: chunk k of each block, side by side (a staged copy).
  std::vector<char> staged(op.kind == OpKind::kReduceScatter ? n * chunk * width
                                                             : 0);
  const size_t me = static_cast<size_t>(rank);
  for (size_t k = 0; k < rounds; ++k) {
    // An abort ends the operation at its next round: nothing here crosses
    // the TCP pairs that abort closes, and a wait whose rank is on time
    // never reaches its own look at `aborted`. (Leave, which the abort
    // ran, has told the peers: their waits on this rank end Unavailable.)
    if (k > 0 && aborted && aborted()) return absl::AbortedError("aborted");
    const void* data = nullptr;
    size_t bytes = 0;
    const void* tail = nullptr;
    size_t tail_bytes = 0;
    if (k < chunks && op.kind == OpKind::kReduceScatter) {
      bytes = length(k) * width;
      for (size_t b = 0; b < n; ++b) {
        std::memcpy(staged.data() + b * bytes,
                    in + (b * op.count + first(k)) * width, bytes);
      }
      data = staged.data();
      bytes *= n;
    } else if (k < chunks &&
               (op.kind != OpKind::kBroadcast || rank == op.root)) {
      data = in + first(k) * width;
      bytes = length(k) * width;
    }
    if (op.kind == OpKind::kAllReduce && k > 0) {
      tail = out + part_at(k - 1, me) * width;
      tail_bytes = part_length(k - 1, me) * width;
    }
    absl::Status posted =
        shm.Post(summary, data, bytes, tail_bytes > 0 ? tail_at : bytes, tail,
                 tail_bytes, timeout, aborted);
    if (!posted.ok()) return posted;
    if (k == 0) {
      *verdict = check();
      if (!verdict->ok()) {
        shm.Release();
        return absl::OkStatus();
      }
    }
    auto slot = [&](size_t r) {
      return static_cast<const char*>(shm.payload(static_cast<int>(r)));
    };
    if (op.kind == OpKind::kBroadcast) {
      if (rank != op.root) {
        std::memcpy(out + first(k) * width, slot(op.root), length(k) * width);
      }
    } else if (op.kind == OpKind::kAllGather) {
      for (size_t r = 0; r < n; ++r) {
        std::memcpy(out + r * block + first(k) * width, slot(r),
                    length(k) * width);
      }
    } else if (op.kind == OpKind::kReduceScatter) {
      // This rank's piece of every rank's chunk, combined in rank order
      // (as the one-round and the TCP paths do: the same bits).
      const size_t offset = me * length(k) * width;
      char* dst = out + first(k) * width;
      std::memcpy(dst, slot(0) + offset, length(k) * width);
      for (size_t r = 1; r < n; ++r) {
        combine(dst, dst, slot(r) + offset, length(k));
      }
      if (op.op == ReduceOp::kAvg) HostDivide(dst, length(k), op.type, size);
    } else {
      if (k < chunks && part_length(k, me) > 0) {
        const size_t at = part_at(k, me);
        const size_t count = part_length(k, me);
        const size_t offset = (at - first(k)) * width;
        char* dst = out + at * width;
        std::memcpy(dst, slot(0) + offset, count * width);
        for (size_t r = 1; r < n; ++r) {
          combine(dst, dst, slot(r) + offset, count);
        }
        if (op.op == ReduceOp::kAvg) HostDivide(dst, count, op.type, size);
      }
      if (k > 0) {
        for (size_t r = 0; r < n; ++r) {
          if (r == me) continue;
          std::memcpy(out + part_at(k - 1, r) * width, slot(r) + tail_at,
                      part_length(k - 1, r) * width);
        }
      }
    }
    shm.Release();
  }
  return absl::OkStatus();
}

struct Probe {
  uint64_t host;
  int32_t wanted;
  int32_t pid;
};

}  // namespace

void GlooCommunicator::SetUpShm() {
  shm_tried_ = true;
  if (size_ == 1) return;
  Probe mine{HostIdentity(), ShmWanted() ? 1 : 0,
             static_cast<int32_t>(getpid())};
  std::vector<Probe> all(static_cast<size_t>(size_));
  {
    gloo::AllgatherOptions opts(context_);
    opts.setInput(&mine, 1);
    opts.setOutput(all.data(), all.size());
    opts.setTag(NextTag());
    gloo::allgather(opts);
  }
  for (const Probe& p : all) {
    if (p.host != all[0].host || p.wanted == 0) return;  // TCP, everyone
  }
  // Rank 0 makes the segment under a name no other group or job has (its
  // pid, a random word) and tells the others; an empty name: it could not.
  char name[64] = {};
  std::unique_ptr<ShmGroup> group;
  if (rank_ == 0) {
    std::random_device random;
    const std::string n =
        absl::StrFormat("/vemesh-%d-%08x%08x", all[0].pid, random(), random());
    auto made = ShmGroup::Create(n, size_);
    if (made.ok()) {
      group = *std::move(made);
      std::memcpy(name, n.data(), n.size());
    }
  }
  // From here rank 0 removes the name on every way out.
  struct UnlinkOnExit {
    ShmGroup* group;
    ~UnlinkOnExit() {
      if (group != nullptr) group->Unlink();
    }
  } unlink{group.get()};
  {
    gloo::BroadcastOptions opts(context_);
    opts.setOutput(name, sizeof(name));
    opts.setRoot(0);
    opts.setTag(NextTag());
    gloo::broadcast(opts);
  }
  name[sizeof(name) - 1] = '\0';
  if (name[0] == '\0') return;
  if (rank_ != 0) {
    auto opened = ShmGroup::Open(name, rank_, size_);
    if (opened.ok()) group = *std::move(opened);
  }
  if (group != nullptr) group->SetRank(rank_);
  // Everyone mapped it (then rank 0 unlinks: the guard), or all keep TCP.
  int32_t mapped = group != nullptr ? 1 : 0;
  std::vector<int32_t> every(static_cast<size_t>(size_));
  {
    gloo::AllgatherOptions opts(context_);
    opts.setInput(&mapped, 1);
    opts.setOutput(every.data(), every.size());
    opts.setTag(NextTag());
    gloo::allgather(opts);
  }
  for (int32_t m : every) {
    if (m == 0) return;
  }
  shm_ = std::move(group);
  shm_shared_.store(shm_.get());
  // This rank's sends go through the segment from here; the receivers
  // learn how many went by TCP before.
  if (!ShmGroup::HasP2P(size_)) return;
  std::lock_guard<std::mutex> lock(p2p_mu_);
  shm_->OpenP2P(sent_.data());
  p2p_shm_ = shm_.get();
}

absl::Status GlooCommunicator::ShmRound(const Operation& op,
                                        absl::Status* verdict, bool* finished) {
  const size_t bytes = op.count * SizeOf(op.type);
  // What rides in the round: a small all_reduce's input, a small
  // broadcast's data on its root.
  // reduce_scatter's input is a block per rank.
  const size_t posted_bytes =
      op.kind == OpKind::kReduceScatter ? bytes * size_ : bytes;
  const bool small =
      posted_bytes <= ShmGroup::kSlotBytes &&
      (op.kind == OpKind::kAllReduce || op.kind == OpKind::kBroadcast ||
       op.kind == OpKind::kAllGather || op.kind == OpKind::kReduceScatter ||
       op.kind == OpKind::kBarrier);
  const void* payload = nullptr;
  size_t payload_bytes = 0;
  if (small &&
      (op.kind == OpKind::kAllReduce || op.kind == OpKind::kAllGather ||
       op.kind == OpKind::kReduceScatter)) {
    payload = op.send != nullptr ? op.send : op.recv;
    payload_bytes = posted_bytes;
  } else if (small && op.kind == OpKind::kBroadcast && rank_ == op.root) {
    payload = op.recv;
    payload_bytes = bytes;
  }
  char summary[ShmGroup::kSummaryBytes];
  SummarizeInto(op, summary);
  // Larger than a slot: in chunks, the first round the check.
  const bool chunked =
      !small &&
      (op.kind == OpKind::kAllReduce || op.kind == OpKind::kBroadcast ||
       op.kind == OpKind::kAllGather ||
       (op.kind == OpKind::kReduceScatter &&
        size_ * SizeOf(op.type) <= ShmGroup::kSlotBytes));
  if (chunked) {
    const absl::Status ran = ChunkedRounds(
        *shm_, op, rank_, size_, summary, gloo_timeout_,
        [this] { return aborted(); },
        [&] {
          return CompareSummaries(
              op, [&](int r) -> const void* { return shm_->summary(r); });
        },
        verdict);
    *finished = ran.ok() && verdict->ok();
    return ran;
  }
  const absl::Status posted =
      shm_->Post(summary, payload, payload_bytes, gloo_timeout_,
                 [this] { return aborted(); });
  if (!posted.ok()) return posted;
  *verdict = CompareSummaries(
      op, [&](int r) -> const void* { return shm_->summary(r); });
  if (verdict->ok() && small && bytes > 0) {
    // The input was copied into this rank's slot before: an output that
    // overlaps it (the in-place forms) is safe to write.
    if (op.kind == OpKind::kBroadcast) {
      if (rank_ != op.root) std::memcpy(op.recv, shm_->payload(op.root), bytes);
    } else if (op.kind == OpKind::kAllGather) {
      for (int r = 0; r < size_; ++r) {
        std::memcpy(static_cast<char*>(op.recv) + r * bytes, shm_->payload(r),
                    bytes);
      }
    } else if (op.kind == OpKind::kReduceScatter) {
      // This rank's block of every rank's input, combined in rank order.
      const HostCombineFn combine = HostCombiner(op.type, op.op);
      const size_t offset = static_cast<size_t>(rank_) * bytes;
      auto block = [&](int r) {
        return static_cast<const char*>(shm_->payload(r)) + offset;
      };
      std::memcpy(op.recv, block(0), bytes);
      for (int r = 1; r < size_; ++r) {
        combine(op.recv, op.recv, block(r), op.count);
      }
      if (op.op == ReduceOp::kAvg) {
        HostDivide(op.recv, op.count, op.type, size_);
      }
    } else {
      // Every rank combines the inputs in rank order: the same bits on
      // every rank.
      const HostCombineFn combine = HostCombiner(op.type, op.op);
      std::memcpy(op.recv, shm_->payload(0), bytes);
      for (int r = 1; r < size_; ++r) {
        combine(op.recv, op.recv, shm_->payload(r), op.count);
      }
      if (op.op == ReduceOp::kAvg)
        HostDivide(op.recv, op.count, op.type, size_);
    }
  }
  shm_->Release();
  *finished = verdict->ok() && small;
  if (verdict->ok() && !small && op.kind == OpKind::kAllToAllV) {
    *verdict = CheckAllToAllCounts(op);
  }
  return absl::OkStatus();
}

}  // namespace vemesh
