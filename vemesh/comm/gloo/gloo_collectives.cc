// GlooCommunicator's collectives: each Operation as Gloo's calls, on the
// worker (they throw; Execute catches).

#include <climits>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <stdexcept>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gloo/allgather.h"
#include "gloo/allgatherv.h"
#include "gloo/allreduce.h"
#include "gloo/alltoall.h"
#include "gloo/alltoallv.h"
#include "gloo/barrier.h"
#include "gloo/broadcast.h"
#include "gloo/gather.h"
#include "gloo/reduce.h"
#include "gloo/scatter.h"
#include "vemesh/comm/gloo/gloo_communicator.h"
#include "vemesh/comm/gloo/internal/gloo_job.h"
#include "vemesh/comm/internal/buffer_overlap.h"
#include "vemesh/comm/internal/host_reduce.h"

namespace vemesh {
namespace {

using comm_internal::BuffersOverlap;
using gloo_internal::Bytes;

// The host reduction of `op` (comm/internal/host_reduce.h). The base
// class refuses unknown types and ops before a Job runs.
HostCombineFn ReduceFunction(const Operation& op) {
  const HostCombineFn combine = HostCombiner(op.type, op.op);
  if (combine == nullptr)
    throw std::invalid_argument("unknown vemesh ReduceOp");
  return combine;
}

// The end of an avg: divides a sum by the group size.
void FinishAverage(const Operation& op, void* data, size_t count, int size) {
  if (op.op != ReduceOp::kAvg || count == 0) return;
  HostDivide(data, count, op.type, size);
}

// Element counts as byte counts, as Gloo's all_to_all_v takes them.
std::vector<int64_t> ByteCounts(absl::Span<const size_t> counts, size_t width) {
  std::vector<int64_t> bytes;
  bytes.reserve(counts.size());
  for (size_t c : counts) bytes.push_back(static_cast<int64_t>(c * width));
  return bytes;
}

}  // namespace

void GlooCommunicator::RunCollective(const Operation& op) {
  const uint32_t tag = NextTag();  // every rank, every collective
  const size_t width = SizeOf(op.type);
  const size_t bytes = op.count * width;
  switch (op.kind) {
    case OpKind::kBarrier: {
      gloo::BarrierOptions opts(context_);
      opts.setTag(tag);
      gloo::barrier(opts);
      return;
    }
    case OpKind::kBroadcast: {
      if (bytes == 0) return;  // Gloo rejects 0 bytes; every rank skips
      gloo::BroadcastOptions opts(context_);
      opts.setOutput(Bytes(op.recv), bytes);
      opts.setRoot(op.root);
      opts.setTag(tag);
      gloo::broadcast(opts);
      return;
    }
    case OpKind::kAllReduce: {
      if (bytes == 0) return;
      WithHostType(op.type, [&](auto zero) {
        using T = decltype(zero);
        gloo::AllreduceOptions opts(context_);
        // Without an input Gloo reduces the output in place.
        if (op.send != op.recv) {
          opts.setInput(reinterpret_cast<T*>(Bytes(op.send)), op.count);
        }
        opts.setOutput(static_cast<T*>(op.recv), op.count);
        opts.setReduceFunction(ReduceFunction(op));
        opts.setTag(tag);
        if (bytes <= gloo_internal::kLogDepthAllReduceBytes) {
          opts.setAlgorithm(gloo::AllreduceOptions::Algorithm::BCUBE);
        }
        gloo::allreduce(opts);
      });
      FinishAverage(op, op.recv, op.count, size_);
      return;
    }
    case OpKind::kReduce: {
      if (bytes == 0) return;
      // Gloo's ring reduce needs a whole output on every rank.
      std::vector<char> scratch;
      void* out = op.recv;
      if (rank_ != op.root) {
        scratch.resize(bytes);
        out = scratch.data();
      }
      WithHostType(op.type, [&](auto zero) {
        using T = decltype(zero);
        gloo::ReduceOptions opts(context_);
        if (op.send != out) {
          opts.setInput(reinterpret_cast<T*>(Bytes(op.send)), op.count);
        }
        opts.setOutput(static_cast<T*>(out), op.count);
        opts.setRoot(op.root);
        opts.setReduceFunction(ReduceFunction(op));
        opts.setTag(tag);
        gloo::reduce(opts);
      });
      if (rank_ == op.root) FinishAverage(op, op.recv, op.count, size_);
      return;
    }
    case OpKind::kAllGather: {
      if (bytes == 0) return;
      // Gloo copies the input into the output first: an input inside the
      // output (MPI's in-place form) is copied out of the way.
      std::vector<char> copy;
      const char* in = Bytes(op.send);
      if (BuffersOverlap(op.send, bytes, op.recv, bytes * size_)) {
        copy.assign(in, in + bytes);
        in = copy.data();
      }
      gloo::AllgatherOptions opts(context_);
      opts.setInput(const_cast<char*>(in), bytes);
      opts.setOutput(Bytes(op.recv), bytes * size_);
      opts.setTag(tag);
      gloo::allgather(opts);
      return;
    }
    case OpKind::kAllGatherV: {
      // Every rank passes the same counts, so all skip an empty one alike.
      std::vector<size_t> counts;
      size_t total = 0;
      for (size_t c : op.recv_counts) {
        counts.push_back(c * width);
        total += c;
      }
      if (total == 0) return;
      const size_t mine = counts[rank_];
      std::vector<char> copy;
      const char* in = Bytes(op.send);
      if (BuffersOverlap(op.send, mine, op.recv, total * width)) {
        copy.assign(in, in + mine);
        in = copy.data();
      }
      gloo::AllgathervOptions opts(context_);
      opts.setInput(const_cast<char*>(in), mine);
      opts.setOutput(Bytes(op.recv), std::move(counts));
      opts.setTag(tag);
      gloo::allgatherv(opts);
      return;
    }
    case OpKind::kReduceScatter:
    case OpKind::kReduceScatterV: {
      // Gloo (2022) has no general reduce-scatter. Each rank gets the
      // blocks it owns from every rank with one all_to_all(v) and reduces
      // them locally in rank order: every element crosses the network once
      // and in one round (an all_reduce of the whole input moves about
      // twice as much; a reduce per root takes size() rounds), at the cost
      // of size() blocks of scratch.
      std::vector<size_t> counts = op.recv_counts;
      if (op.kind == OpKind::kReduceScatter) {
        counts.assign(static_cast<size_t>(size_), op.count);
      }
      const size_t total =
          std::accumulate(counts.begin(), counts.end(), size_t{0});
      if (total == 0) return;  // same counts everywhere: all skip
      const size_t mine = counts[rank_];
      std::vector<char> blocks(mine * width * size_);
      gloo::AlltoallvOptions opts(context_);
      opts.setInput(Bytes(op.send), ByteCounts(counts, width));
      opts.setOutput(Bytes(static_cast<void*>(blocks.data())),
                     ByteCounts(std::vector<size_t>(size_, mine), width));
      opts.setTag(tag);
      gloo::alltoallv(opts);
      if (mine == 0) return;
      const size_t block = mine * width;
      std::memcpy(op.recv, blocks.data(), block);
      const HostCombineFn combine = ReduceFunction(op);
      for (int r = 1; r < size_; ++r) {
        combine(op.recv, op.recv, blocks.data() + r * block, mine);
      }
      FinishAverage(op, op.recv, mine, size_);
      return;
    }
    case OpKind::kGather: {
      if (bytes == 0) return;
      gloo::GatherOptions opts(context_);
      opts.setInput(Bytes(op.send), bytes);
      if (rank_ == op.root) opts.setOutput(Bytes(op.recv), bytes * size_);
      opts.setRoot(op.root);
      opts.setTag(tag);
      gloo::gather(opts);
      return;
    }
    case OpKind::kScatter: {
      if (bytes == 0) return;
      gloo::ScatterOptions opts(context_);
      if (rank_ == op.root) {
        std::vector<char*> blocks;
        for (int r = 0; r < size_; ++r) {
          blocks.push_back(Bytes(op.send) + r * bytes);
        }
        opts.setInputs(blocks, bytes);
      }
      opts.setOutput(Bytes(op.recv), bytes);
      opts.setRoot(op.root);
      opts.setTag(tag);
      gloo::scatter(opts);
      return;
    }
    case OpKind::kAllToAll: {
      if (bytes == 0) return;
      gloo::AlltoallOptions opts(context_);
      opts.setInput(Bytes(op.send), bytes * size_);
      opts.setOutput(Bytes(op.recv), bytes * size_);
      opts.setTag(tag);
      gloo::alltoall(opts);
      return;
    }
    case OpKind::kAllToAllV: {
      // Never skipped: a rank with nothing to send or receive must still
      // answer the zero-length messages of the others.
      gloo::AlltoallvOptions opts(context_);
      opts.setInput(Bytes(op.send), ByteCounts(op.send_counts, width));
      opts.setOutput(Bytes(op.recv), ByteCounts(op.recv_counts, width));
      opts.setTag(tag);
      gloo::alltoallv(opts);
      return;
    }
    case OpKind::kBatch:
      break;
  }
  throw std::invalid_argument(
      absl::StrCat("the Gloo backend cannot run ", op.Describe()));
}

}  // namespace vemesh
