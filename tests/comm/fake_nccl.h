// A fake NCCL and CUDA runtime behind the NCCL seam
// (vemesh/comm/nccl/internal/nccl_api.h), for tests without a GPU. While a
// FakeNccl lives, the NCCL backend talks to it instead of the libraries:
//
//   FakeNccl fake;                      // installed until it goes
//   fake.record_calls = false;          // a long test: keep no call log
//   void* x = fake.DeviceAlloc(64);     // "device" memory (host memory)
//   ... NcclCommunicator::Create(twin, 0) on each thread-rank ...
//   EXPECT_EQ(fake.LiveComms(), 0);     // every communicator released
//
// It does two jobs:
//   * It records every call (which thread, inside a group or not, which
//     communicator), and each communicator's creation: its split's color,
//     key, name and config. Splits can be made to fail, fail late or never
//     finish (fail_on_issue, fail_async, never_ready, by commName).
//   * ncclCommShrink: the survivors' i-th shrink of a communicator forms its
//     child once every rank not excluded issued it; NCCL_SHRINK_ABORT
//     withdraws the parent's unfinished parts first, as ncclCommAbort does.
//   * It moves data. "Device memory" is host memory the fake hands out (and
//     reports as device memory to cudaPointerGetAttributes); the ranks of a
//     communicator are threads of this process. Each collective and each
//     send/receive waits until every rank it needs has issued its part; the
//     last to arrive performs it for all, in double precision (16-bit floats
//     through float), and marks it done. A CUDA event recorded on a stream
//     completes once everything issued on that stream before it is done, so
//     a rank whose peer never comes waits (until its deadline or abort()),
//     as with NCCL. Aborting or destroying a communicator withdraws its
//     unfinished parts: no peer touches its buffers afterwards.
// Cliques: ranks that passed the same unique id to ncclCommInitRankConfig
// form one communicator; the i-th ncclCommSplit on every rank of a
// communicator forms its children (by color, ordered by key then rank) once
// every rank issued it.
//
// One FakeNccl at a time. Only in builds with NCCL (VEMESH_HAVE_NCCL).

#ifndef TESTS_COMM_FAKE_NCCL_H_
#define TESTS_COMM_FAKE_NCCL_H_

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"
#include "vemesh/comm/half.h"
#include "vemesh/comm/nccl/internal/nccl_api.h"

namespace vemesh::testing {

// One NCCL communicator the fake made.
struct FakeComm {
  int id = 0;
  int parent = -1;  // -1: made by ncclCommInitRankConfig
  int color = 0;
  int key = 0;
  std::string name;      // config->commName, "" when unset
  int split_share = -1;  // config->splitShare as passed
  int blocking = -1;
  int polls_left = 0;  // ncclInProgress answers before `outcome`
  ncclResult_t outcome = ncclSuccess;
  int aborted = 0;
  int destroyed = 0;
  int device = -1;        // the CUDA device current when it was made
  int shrink_flags = -1;  // ncclCommShrink's flags; -1: not a shrink
};

// One recorded NCCL call.
struct Call {
  std::thread::id thread;
  std::string fn;
  bool in_group = false;
  int comm = -1;  // the FakeComm it made or used
};

class FakeNccl {
 public:
  // What the next communicators do; splits are picked by commName.
  int version = NCCL_VERSION(2, 28, 3);
  int polls_until_ready = 3;
  std::string fail_on_issue;  // ncclCommSplit answers ncclInvalidArgument
  std::string fail_async;     // the child ends in ncclRemoteError
  std::string never_ready;    // the child stays ncclInProgress
  int visible_devices = 8;    // what cudaGetDeviceCount answers
  // Whether calls are logged (CallsOf, Count, SplitsOf). A test that runs
  // many operations turns it off: every poll is a call.
  std::atomic<bool> record_calls{true};

  FakeNccl() : table_(MakeTable()) {
    current_ = this;
    installed_ = std::make_unique<ScopedNcclApi>(table_);
  }
  ~FakeNccl() {
    installed_.reset();
    current_ = nullptr;
  }
  FakeNccl(const FakeNccl&) = delete;
  FakeNccl& operator=(const FakeNccl&) = delete;

  // Communicators whose split work is still under way (a caller returned
  // before polling them idle).
  int ParentsStillSplitting() {
    std::lock_guard<std::mutex> lock(mu_);
    int n = 0;
    for (const State& st : states_) n += st.split_polls_left > 0 ? 1 : 0;
    return n;
  }

  // The calls made on `thread`, from the `from`-th call recorded on: a
  // thread that starts after another was joined may get its id, so a test
  // that starts threads in turn notes CallCount() as each begins.
  std::vector<Call> CallsOf(std::thread::id thread, size_t from = 0) {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<Call> out;
    for (size_t i = from; i < calls_.size(); ++i) {
      if (calls_[i].thread == thread) out.push_back(calls_[i]);
    }
    return out;
  }
  size_t CallCount() {
    std::lock_guard<std::mutex> lock(mu_);
    return calls_.size();
  }
  int Count(std::thread::id thread, absl::string_view fn) {
    int n = 0;
    for (const Call& c : CallsOf(thread)) n += c.fn == fn ? 1 : 0;
    return n;
  }
  // The children split on `thread`, in the order of their ncclCommSplit.
  std::vector<FakeComm> SplitsOf(std::thread::id thread) {
    std::vector<FakeComm> out;
    for (const Call& c : CallsOf(thread)) {
      if (c.fn == "ncclCommSplit" && c.comm >= 0) out.push_back(Comm(c.comm));
    }
    return out;
  }
  FakeComm Comm(int id) {
    std::lock_guard<std::mutex> lock(mu_);
    return comms_[id];
  }
  // Communicators neither destroyed nor aborted.
  int LiveComms() {
    std::lock_guard<std::mutex> lock(mu_);
    int n = 0;
    for (const FakeComm& c : comms_) n += c.aborted + c.destroyed == 0;
    return n;
  }
  int ReleasedTwice() {
    std::lock_guard<std::mutex> lock(mu_);
    int n = 0;
    for (const FakeComm& c : comms_) n += c.aborted + c.destroyed > 1;
    return n;
  }
  // Streams, events and device buffers not freed.
  int LiveAllocations() { return allocations_.load(); }

  // Device memory for a test's buffers (what cudaMalloc hands the backend).
  void* DeviceAlloc(size_t bytes) {
    void* p = std::malloc(std::max<size_t>(bytes, 1));
    std::lock_guard<std::mutex> lock(mu_);
    ++allocations_;
    device_memory_[reinterpret_cast<uintptr_t>(p)] = bytes;
    return p;
  }
  void DeviceFree(void* p) {
    if (p == nullptr) return;
    {
      std::lock_guard<std::mutex> lock(mu_);
      --allocations_;
      device_memory_.erase(reinterpret_cast<uintptr_t>(p));
    }
    std::free(p);
  }

 private:
  // Whether an operation finished; shared by its stream's events.
  struct Item {
    bool done = false;
  };
  struct Stream {
    std::vector<std::shared_ptr<Item>> issued;
  };
  struct Event {
    std::vector<std::shared_ptr<Item>> waits_for;
  };
  enum class Coll {
    kAllReduce,
    kBroadcast,
    kReduce,
    kAllGather,
    kReduceScatter
  };
  // One rank's part of a collective.
  struct Part {
    int comm = -1;
    const void* send = nullptr;
    void* recv = nullptr;
    size_t count = 0;
    ncclDataType_t type = ncclFloat32;
    ncclRedOp_t op = ncclSum;
    int root = 0;
    std::shared_ptr<Item> item;
  };
  struct Slot {
    Coll kind = Coll::kAllReduce;
    std::vector<std::optional<Part>> parts;
    int arrived = 0;
    bool withdrawn = false;  // a member was aborted: it never runs
  };
  // One side of a send/receive pair.
  struct Transfer {
    int comm = -1;
    void* data = nullptr;
    size_t bytes = 0;
    std::shared_ptr<Item> item;
  };
  struct Member {
    int color = -1;
    int key = 0;
    int child = -1;
  };
  struct SplitRound {
    std::vector<std::optional<Member>> members;
    int arrived = 0;
  };
  struct Clique {
    int nranks = 0;
    int joined = 0;
    std::map<int64_t, Slot> slots;  // by collective sequence number
    // By (source, destination) rank: sends and receives not yet paired.
    std::map<std::pair<int, int>, std::deque<Transfer>> sends, recvs;
    std::map<int64_t, SplitRound> splits;   // by split sequence number
    std::map<int64_t, SplitRound> shrinks;  // by shrink sequence number
  };
  // What the fake keeps per communicator beside its public record.
  struct State {
    std::shared_ptr<Clique> clique;  // null until a split's round is full
    int rank = -1;
    int64_t collectives = 0;
    int64_t splits = 0;
    int64_t shrinks = 0;
    ncclResult_t error = ncclSuccess;  // a mismatch the fake noticed
    // As NCCL's background job of a split: the parent answers
    // ncclInProgress for this many more polls, and a negative color's
    // `newcomm` is written (null) only when that work ends. A caller that
    // stops polling the parent early and frees `newcomm` shows in
    // ParentsStillSplitting() (and as a use after free under ASan).
    int split_polls_left = 0;
    std::vector<ncclComm_t*> deferred_null_writes;
  };

  static FakeNccl& Self() { return *current_; }
  static ncclComm_t Handle(int id) {
    // Never dereferenced: an id dressed as a handle (0 stays null).
    return reinterpret_cast<ncclComm_t>(static_cast<intptr_t>(id + 1));
  }
  static int Id(ncclComm_t comm) {
    return static_cast<int>(reinterpret_cast<intptr_t>(comm)) - 1;
  }
  void Record(absl::string_view fn, int comm) {
    if (!record_calls.load(std::memory_order_relaxed)) return;
    calls_.push_back(
        {std::this_thread::get_id(), std::string(fn), group_depth_ > 0, comm});
  }
  int NewComm(FakeComm comm) {
    comm.id = static_cast<int>(comms_.size());
    comms_.push_back(std::move(comm));
    states_.emplace_back();
    return comms_.back().id;
  }

  // -- Element values ---------------------------------------------------------
  static size_t Bytes(ncclDataType_t t) {
    switch (t) {
      case ncclInt8:
      case ncclUint8:
        return 1;
      case ncclFloat16:
      case ncclBfloat16:
        return 2;
      case ncclInt32:
      case ncclUint32:
      case ncclFloat32:
        return 4;
      default:
        return 8;
    }
  }
  template <typename T>
  static T Read(const void* base, size_t i) {
    T v;
    std::memcpy(&v, static_cast<const char*>(base) + i * sizeof(T), sizeof(T));
    return v;
  }
  template <typename T>
  static void Write(void* base, size_t i, T v) {
    std::memcpy(static_cast<char*>(base) + i * sizeof(T), &v, sizeof(T));
  }
  static double Load(ncclDataType_t t, const void* base, size_t i) {
    switch (t) {
      case ncclInt8:
        return Read<int8_t>(base, i);
      case ncclUint8:
        return Read<uint8_t>(base, i);
      case ncclInt32:
        return Read<int32_t>(base, i);
      case ncclUint32:
        return Read<uint32_t>(base, i);
      case ncclInt64:
        return static_cast<double>(Read<int64_t>(base, i));
      case ncclUint64:
        return static_cast<double>(Read<uint64_t>(base, i));
      case ncclFloat16:
        return Float16BitsToFloat(Read<uint16_t>(base, i));
      case ncclBfloat16:
        return BFloat16BitsToFloat(Read<uint16_t>(base, i));
      case ncclFloat32:
        return Read<float>(base, i);
      default:
        return Read<double>(base, i);
    }
  }
  static void Store(ncclDataType_t t, void* base, size_t i, double v) {
    switch (t) {
      case ncclInt8:
        return Write(base, i, static_cast<int8_t>(v));
      case ncclUint8:
        return Write(base, i, static_cast<uint8_t>(v));
      case ncclInt32:
        return Write(base, i, static_cast<int32_t>(v));
      case ncclUint32:
        return Write(base, i, static_cast<uint32_t>(v));
      case ncclInt64:
        return Write(base, i, static_cast<int64_t>(v));
      case ncclUint64:
        return Write(base, i, static_cast<uint64_t>(v));
      case ncclFloat16:
        return Write(base, i, FloatToFloat16Bits(static_cast<float>(v)));
      case ncclBfloat16:
        return Write(base, i, FloatToBFloat16Bits(static_cast<float>(v)));
      case ncclFloat32:
        return Write(base, i, static_cast<float>(v));
      default:
        return Write(base, i, v);
    }
  }

  // -- Data movement (mu_ held) -----------------------------------------------
  // Runs a collective whose parts have all arrived.
  void Perform(Slot& slot) {
    const int n = static_cast<int>(slot.parts.size());
    const Part& first = *slot.parts[0];
    bool agree = true;
    for (const auto& p : slot.parts) {
      agree = agree && p->count == first.count && p->type == first.type &&
              p->op == first.op && p->root == first.root;
    }
    if (!agree) {
      // Ranks that disagree: NCCL's result is undefined; the fake says so.
      for (const auto& p : slot.parts)
        states_[p->comm].error = ncclInvalidUsage;
    } else {
      const size_t count = first.count;
      const ncclDataType_t type = first.type;
      auto reduce = [&](size_t total) {
        std::vector<double> acc(total);
        for (size_t i = 0; i < total; ++i) {
          double a = Load(type, slot.parts[0]->send, i);
          for (int r = 1; r < n; ++r) {
            const double v = Load(type, slot.parts[r]->send, i);
            switch (first.op) {
              case ncclProd:
                a *= v;
                break;
              case ncclMin:
                a = std::min(a, v);
                break;
              case ncclMax:
                a = std::max(a, v);
                break;
              default:  // sum, avg
                a += v;
            }
          }
          if (first.op == ncclAvg) {
            a = type == ncclFloat64
                    ? a / n
                    : static_cast<double>(static_cast<float>(a) /
                                          static_cast<float>(n));
          }
          acc[i] = a;
        }
        return acc;
      };
      auto store = [&](void* to, const std::vector<double>& values) {
        if (to == nullptr) return;
        for (size_t i = 0; i < values.size(); ++i)
          Store(type, to, i, values[i]);
      };
      std::vector<double> values;
      switch (slot.kind) {
        case Coll::kAllReduce:
          values = reduce(count);
          for (const auto& p : slot.parts) store(p->recv, values);
          break;
        case Coll::kReduce:
          values = reduce(count);
          store(slot.parts[first.root]->recv, values);
          break;
        case Coll::kBroadcast:
          for (size_t i = 0; i < count; ++i) {
            values.push_back(Load(type, slot.parts[first.root]->send, i));
          }
          for (const auto& p : slot.parts) store(p->recv, values);
          break;
        case Coll::kAllGather:
          for (int r = 0; r < n; ++r) {
            for (size_t i = 0; i < count; ++i) {
              values.push_back(Load(type, slot.parts[r]->send, i));
            }
          }
          for (const auto& p : slot.parts) store(p->recv, values);
          break;
        case Coll::kReduceScatter: {
          values = reduce(count * n);
          for (int r = 0; r < n; ++r) {
            const std::vector<double> block(values.begin() + r * count,
                                            values.begin() + (r + 1) * count);
            store(slot.parts[r]->recv, block);
          }
          break;
        }
      }
    }
    for (const auto& p : slot.parts) p->item->done = true;
  }

  // Enqueues one rank's part of a collective on `stream`.
  ncclResult_t Collective(Coll kind, const char* fn, ncclComm_t comm,
                          cudaStream_t stream, Part part) {
    std::lock_guard<std::mutex> lock(mu_);
    const int id = Id(comm);
    Record(fn, id);
    State& st = states_[id];
    if (st.clique == nullptr) return ncclInvalidUsage;
    part.comm = id;
    part.item = std::make_shared<Item>();
    StreamOf(stream).issued.push_back(part.item);
    Clique& c = *st.clique;
    const int64_t seq = st.collectives++;
    Slot& slot = c.slots[seq];
    if (slot.parts.empty()) {
      slot.kind = kind;
      slot.parts.resize(c.nranks);
    }
    if (slot.kind != kind) st.error = ncclInvalidUsage;
    slot.parts[st.rank] = std::move(part);
    if (++slot.arrived == c.nranks) {
      if (!slot.withdrawn) Perform(slot);
      c.slots.erase(seq);
    }
    return ncclSuccess;
  }

  // Enqueues one side of a send/receive pair; pairs in issue order.
  ncclResult_t PointToPoint(bool is_send, void* data, size_t count,
                            ncclDataType_t type, int peer, ncclComm_t comm,
                            cudaStream_t stream) {
    std::lock_guard<std::mutex> lock(mu_);
    const int id = Id(comm);
    Record(is_send ? "ncclSend" : "ncclRecv", id);
    State& st = states_[id];
    if (st.clique == nullptr || peer < 0 || peer >= st.clique->nranks) {
      return ncclInvalidArgument;
    }
    Transfer mine{id, data, count * Bytes(type), std::make_shared<Item>()};
    StreamOf(stream).issued.push_back(mine.item);
    const auto key =
        is_send ? std::make_pair(st.rank, peer) : std::make_pair(peer, st.rank);
    auto& waiting = is_send ? st.clique->recvs[key] : st.clique->sends[key];
    if (waiting.empty()) {
      (is_send ? st.clique->sends[key] : st.clique->recvs[key])
          .push_back(std::move(mine));
      return ncclSuccess;
    }
    Transfer other = std::move(waiting.front());
    waiting.pop_front();
    const Transfer& send = is_send ? mine : other;
    const Transfer& recv = is_send ? other : mine;
    if (send.bytes != recv.bytes) {
      states_[send.comm].error = ncclInvalidUsage;
      states_[recv.comm].error = ncclInvalidUsage;
    }
    std::memmove(recv.data, send.data, std::min(send.bytes, recv.bytes));
    mine.item->done = true;
    other.item->done = true;
    return ncclSuccess;
  }

  // A communicator that is aborted or destroyed takes back its unfinished
  // parts: the collectives it was in never run, its transfers never pair.
  void Withdraw(int id) {
    State& st = states_[id];
    if (st.clique == nullptr) return;
    Clique& c = *st.clique;
    for (auto& [seq, slot] : c.slots) {
      if (slot.parts[st.rank].has_value()) slot.withdrawn = true;
    }
    for (auto* queues : {&c.sends, &c.recvs}) {
      for (auto& [key, queue] : *queues) {
        queue.erase(
            std::remove_if(queue.begin(), queue.end(),
                           [id](const Transfer& t) { return t.comm == id; }),
            queue.end());
      }
    }
  }

  Stream& StreamOf(cudaStream_t stream) {
    return *reinterpret_cast<Stream*>(stream);
  }

  // The children of a split round every rank has issued: one clique per
  // color, ranked by key, then by rank in the parent.
  void FormChildren(SplitRound& round) {
    std::map<int, std::vector<std::pair<std::pair<int, int>, int>>> by_color;
    for (size_t r = 0; r < round.members.size(); ++r) {
      if (!round.members[r].has_value()) continue;  // excluded by a shrink
      const Member& m = *round.members[r];
      if (m.child < 0) continue;
      by_color[m.color].push_back({{m.key, static_cast<int>(r)}, m.child});
    }
    for (auto& [color, members] : by_color) {
      std::sort(members.begin(), members.end());
      auto clique = std::make_shared<Clique>();
      clique->nranks = static_cast<int>(members.size());
      clique->joined = clique->nranks;
      for (size_t i = 0; i < members.size(); ++i) {
        State& child = states_[members[i].second];
        child.clique = clique;
        child.rank = static_cast<int>(i);
      }
    }
  }

  static NcclApi MakeTable() {
    NcclApi t{};
    t.ncclGetVersion = [](int* v) {
      *v = Self().version;
      return ncclSuccess;
    };
    t.ncclGetUniqueId = [](ncclUniqueId* id) {
      FakeNccl& f = Self();
      std::memset(id, 7, sizeof(*id));
      const int64_t serial = ++f.unique_ids_;
      std::memcpy(id->internal, &serial, sizeof(serial));
      std::lock_guard<std::mutex> lock(f.mu_);
      f.Record("ncclGetUniqueId", -1);
      return ncclSuccess;
    };
    t.ncclCommInitRankConfig = [](ncclComm_t* comm, int nranks,
                                  ncclUniqueId unique, int rank,
                                  ncclConfig_t* config) {
      FakeNccl& f = Self();
      std::lock_guard<std::mutex> lock(f.mu_);
      FakeComm c;
      c.blocking = config->blocking;
      c.polls_left = f.polls_until_ready;
      c.device = device_;
      const int id = f.NewComm(c);
      int64_t serial = 0;
      std::memcpy(&serial, unique.internal, sizeof(serial));
      std::shared_ptr<Clique>& clique = f.by_unique_id_[serial];
      if (clique == nullptr) {
        clique = std::make_shared<Clique>();
        clique->nranks = nranks;
      }
      ++clique->joined;
      f.states_[id].clique = clique;
      f.states_[id].rank = rank;
      f.Record("ncclCommInitRankConfig", id);
      *comm = Handle(id);
      return config->blocking == 0 ? ncclInProgress : ncclSuccess;
    };
    t.ncclCommSplit = [](ncclComm_t parent, int color, int key,
                         ncclComm_t* child, ncclConfig_t* config) {
      FakeNccl& f = Self();
      std::lock_guard<std::mutex> lock(f.mu_);
      const std::string name = config != nullptr && config->commName != nullptr
                                   ? config->commName
                                   : "";
      ++f.splits_in_group_;
      if (name == f.fail_on_issue && !name.empty()) {
        f.Record("ncclCommSplit", -1);
        return ncclInvalidArgument;
      }
      State& p = f.states_[Id(parent)];
      int id = -1;
      p.split_polls_left = std::max(p.split_polls_left, f.polls_until_ready);
      if (color == NCCL_SPLIT_NOCOLOR) {
        *child = reinterpret_cast<ncclComm_t>(intptr_t{-1});  // not yet
        p.deferred_null_writes.push_back(child);
      } else {
        *child = nullptr;
      }
      if (color != NCCL_SPLIT_NOCOLOR) {
        FakeComm c;
        c.parent = Id(parent);
        c.color = color;
        c.key = key;
        c.name = name;
        c.split_share = config != nullptr ? config->splitShare : -1;
        c.blocking = config != nullptr ? config->blocking : -1;
        c.polls_left = name == f.never_ready && !name.empty()
                           ? INT_MAX
                           : f.polls_until_ready;
        c.outcome = name == f.fail_async && !name.empty() ? ncclRemoteError
                                                          : ncclSuccess;
        id = f.NewComm(c);
        *child = Handle(id);
      }
      f.Record("ncclCommSplit", id);
      if (p.clique != nullptr) {
        SplitRound& round = p.clique->splits[p.splits++];
        if (round.members.empty()) round.members.resize(p.clique->nranks);
        round.members[p.rank] = Member{color, key, id};
        if (++round.arrived == p.clique->nranks) f.FormChildren(round);
      }
      // In a group the call only records the split; outside one a
      // non-blocking split is under way when it returns.
      return f.group_depth_ > 0 ? ncclSuccess : ncclInProgress;
    };
    t.ncclCommShrink = [](ncclComm_t parent, int* /*exclude*/, int count,
                          ncclComm_t* child, ncclConfig_t* config, int flags) {
      FakeNccl& f = Self();
      std::lock_guard<std::mutex> lock(f.mu_);
      const int pid = Id(parent);
      if (f.comms_[pid].aborted + f.comms_[pid].destroyed > 0 ||
          f.states_[pid].clique == nullptr) {
        f.Record("ncclCommShrink", -1);
        return ncclInvalidUsage;
      }
      if ((flags & NCCL_SHRINK_ABORT) != 0) f.Withdraw(pid);
      FakeComm c;
      c.parent = pid;
      c.key = f.states_[pid].rank;
      c.shrink_flags = flags;
      c.blocking = config != nullptr ? config->blocking : -1;
      c.polls_left = f.polls_until_ready;
      c.device = device_;
      const int id = f.NewComm(c);
      *child = Handle(id);
      f.Record("ncclCommShrink", id);
      State& p = f.states_[pid];
      SplitRound& round = p.clique->shrinks[p.shrinks++];
      if (round.members.empty()) round.members.resize(p.clique->nranks);
      round.members[p.rank] = Member{0, p.rank, id};
      if (++round.arrived == p.clique->nranks - count) f.FormChildren(round);
      return c.blocking == 0 ? ncclInProgress : ncclSuccess;
    };
    t.ncclCommGetAsyncError = [](ncclComm_t comm, ncclResult_t* state) {
      FakeNccl& f = Self();
      std::lock_guard<std::mutex> lock(f.mu_);
      FakeComm& c = f.comms_[Id(comm)];
      const State& st = f.states_[Id(comm)];
      f.Record("ncclCommGetAsyncError", c.id);
      if (c.aborted + c.destroyed > 0)
        return ncclInvalidUsage;  // use after free
      State& busy = f.states_[Id(comm)];
      if (busy.split_polls_left > 0 && --busy.split_polls_left == 0) {
        for (ncclComm_t* out : busy.deferred_null_writes) *out = nullptr;
        busy.deferred_null_writes.clear();
      }
      if (st.error != ncclSuccess) {
        *state = st.error;
      } else if (busy.split_polls_left > 0) {
        *state = ncclInProgress;  // its splits' background work goes on
      } else if (st.clique == nullptr ||
                 st.clique->joined < st.clique->nranks) {
        *state = ncclInProgress;  // the other ranks have not all come
      } else if (c.polls_left > 0) {
        if (c.polls_left != INT_MAX) --c.polls_left;
        *state = ncclInProgress;
      } else {
        *state = c.outcome;
      }
      return ncclSuccess;
    };
    t.ncclCommAbort = [](ncclComm_t comm) {
      FakeNccl& f = Self();
      std::lock_guard<std::mutex> lock(f.mu_);
      ++f.comms_[Id(comm)].aborted;
      f.Withdraw(Id(comm));
      f.Record("ncclCommAbort", Id(comm));
      return ncclSuccess;
    };
    t.ncclCommDestroy = [](ncclComm_t comm) {
      FakeNccl& f = Self();
      std::lock_guard<std::mutex> lock(f.mu_);
      ++f.comms_[Id(comm)].destroyed;
      f.Withdraw(Id(comm));
      f.Record("ncclCommDestroy", Id(comm));
      return ncclSuccess;
    };
    t.ncclGetErrorString = [](ncclResult_t) { return "fake NCCL error"; };
    t.ncclGetLastError = [](ncclComm_t) { return ""; };
    t.ncclGroupStart = [] {
      FakeNccl& f = Self();
      std::lock_guard<std::mutex> lock(f.mu_);
      f.Record("ncclGroupStart", -1);  // recorded as outside the group
      if (f.group_depth_++ == 0) f.splits_in_group_ = 0;
      return ncclSuccess;
    };
    t.ncclGroupEnd = [] {
      FakeNccl& f = Self();
      std::lock_guard<std::mutex> lock(f.mu_);
      --f.group_depth_;
      f.Record("ncclGroupEnd", -1);
      // Non-blocking communicators: the group's splits go on in the
      // background.
      return f.group_depth_ == 0 && f.splits_in_group_ > 0 ? ncclInProgress
                                                           : ncclSuccess;
    };
    // -- Operations
    // -------------------------------------------------------------
    t.ncclAllReduce = [](const void* send, void* recv, size_t count,
                         ncclDataType_t type, ncclRedOp_t op, ncclComm_t comm,
                         cudaStream_t stream) {
      return Self().Collective(Coll::kAllReduce, "ncclAllReduce", comm, stream,
                               {-1, send, recv, count, type, op, 0, nullptr});
    };
    t.ncclBroadcast = [](const void* send, void* recv, size_t count,
                         ncclDataType_t type, int root, ncclComm_t comm,
                         cudaStream_t stream) {
      return Self().Collective(
          Coll::kBroadcast, "ncclBroadcast", comm, stream,
          {-1, send, recv, count, type, ncclSum, root, nullptr});
    };
    t.ncclReduce = [](const void* send, void* recv, size_t count,
                      ncclDataType_t type, ncclRedOp_t op, int root,
                      ncclComm_t comm, cudaStream_t stream) {
      return Self().Collective(
          Coll::kReduce, "ncclReduce", comm, stream,
          {-1, send, recv, count, type, op, root, nullptr});
    };
    t.ncclAllGather = [](const void* send, void* recv, size_t count,
                         ncclDataType_t type, ncclComm_t comm,
                         cudaStream_t stream) {
      return Self().Collective(
          Coll::kAllGather, "ncclAllGather", comm, stream,
          {-1, send, recv, count, type, ncclSum, 0, nullptr});
    };
    t.ncclReduceScatter = [](const void* send, void* recv, size_t count,
                             ncclDataType_t type, ncclRedOp_t op,
                             ncclComm_t comm, cudaStream_t stream) {
      return Self().Collective(Coll::kReduceScatter, "ncclReduceScatter", comm,
                               stream,
                               {-1, send, recv, count, type, op, 0, nullptr});
    };
    t.ncclSend = [](const void* send, size_t count, ncclDataType_t type,
                    int peer, ncclComm_t comm, cudaStream_t stream) {
      return Self().PointToPoint(true, const_cast<void*>(send), count, type,
                                 peer, comm, stream);
    };
    t.ncclRecv = [](void* recv, size_t count, ncclDataType_t type, int peer,
                    ncclComm_t comm, cudaStream_t stream) {
      return Self().PointToPoint(false, recv, count, type, peer, comm, stream);
    };
    // -- CUDA: eight devices; streams, events and buffers from the heap
    // ---------
    t.cudaGetDeviceCount = [](int* n) {
      *n = Self().visible_devices;
      return cudaSuccess;
    };
    t.cudaGetDevice = [](int* d) {
      *d = device_;
      return cudaSuccess;
    };
    t.cudaSetDevice = [](int d) {
      device_ = d;
      return cudaSuccess;
    };
    t.cudaGetLastError = [] { return cudaSuccess; };
    t.cudaGetErrorName = [](cudaError_t) { return "cudaFakeError"; };
    t.cudaGetErrorString = [](cudaError_t) { return "fake CUDA error"; };
    t.cudaStreamCreateWithFlags = [](cudaStream_t* s, unsigned int) {
      ++Self().allocations_;
      *s = reinterpret_cast<cudaStream_t>(new Stream);
      return cudaSuccess;
    };
    t.cudaStreamDestroy = [](cudaStream_t s) {
      --Self().allocations_;
      delete reinterpret_cast<Stream*>(s);
      return cudaSuccess;
    };
    t.cudaMalloc = [](void** p, size_t n) {
      *p = Self().DeviceAlloc(n);
      return cudaSuccess;
    };
    t.cudaMemset = [](void* p, int v, size_t n) {
      std::memset(p, v, n);
      return cudaSuccess;
    };
    t.cudaFree = [](void* p) {
      Self().DeviceFree(p);
      return cudaSuccess;
    };
    t.cudaPointerGetAttributes = [](cudaPointerAttributes* a, const void* p) {
      FakeNccl& f = Self();
      std::lock_guard<std::mutex> lock(f.mu_);
      std::memset(a, 0, sizeof(*a));
      a->type = cudaMemoryTypeUnregistered;
      const uintptr_t at = reinterpret_cast<uintptr_t>(p);
      auto it = f.device_memory_.upper_bound(at);
      if (it != f.device_memory_.begin()) {
        --it;
        if (at < it->first + std::max<size_t>(it->second, 1)) {
          a->type = cudaMemoryTypeDevice;
          a->device = device_;
        }
      }
      return cudaSuccess;
    };
    t.cudaEventCreateWithFlags = [](cudaEvent_t* e, unsigned int) {
      ++Self().allocations_;
      *e = reinterpret_cast<cudaEvent_t>(new Event);
      return cudaSuccess;
    };
    t.cudaEventRecord = [](cudaEvent_t e, cudaStream_t s) {
      FakeNccl& f = Self();
      std::lock_guard<std::mutex> lock(f.mu_);
      Stream& stream = f.StreamOf(s);
      // What is done stays done: only the unfinished work is kept.
      std::erase_if(stream.issued, [](const std::shared_ptr<Item>& item) {
        return item->done;
      });
      reinterpret_cast<Event*>(e)->waits_for = stream.issued;
      return cudaSuccess;
    };
    t.cudaEventQuery = [](cudaEvent_t e) {
      FakeNccl& f = Self();
      std::lock_guard<std::mutex> lock(f.mu_);
      for (const auto& item : reinterpret_cast<Event*>(e)->waits_for) {
        if (!item->done) return cudaErrorNotReady;
      }
      return cudaSuccess;
    };
    t.cudaEventDestroy = [](cudaEvent_t e) {
      --Self().allocations_;
      delete reinterpret_cast<Event*>(e);
      return cudaSuccess;
    };
    return t;
  }

  static inline FakeNccl* current_ = nullptr;
  static inline thread_local int device_ = 0;
  // NCCL's groups are per thread, and so is this state.
  static inline thread_local int group_depth_ = 0;
  static inline thread_local int splits_in_group_ = 0;

  std::mutex mu_;
  std::deque<FakeComm> comms_;
  std::deque<State> states_;  // beside comms_, same index
  std::vector<Call> calls_;
  std::map<int64_t, std::shared_ptr<Clique>> by_unique_id_;
  std::map<uintptr_t, size_t> device_memory_;  // start -> bytes
  std::atomic<int64_t> unique_ids_{0};
  std::atomic<int> allocations_{0};
  NcclApi table_;
  std::unique_ptr<ScopedNcclApi> installed_;
};

}  // namespace vemesh::testing

#endif  // TESTS_COMM_FAKE_NCCL_H_
