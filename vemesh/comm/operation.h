// vemesh/comm/operation.h
//
// One communication operation as data: what every backend receives from
// Communicator (communicator.h), after the base class checked it once for
// all backends (operation_checks.cc).
//
//   Operation op;
//   op.kind = OpKind::kAllReduce;
//   op.send = op.recv = grad.data();  // the same pointer: in place
//   op.count = grad.size();
//   op.type = DataTypeOf<float>();
//   op.op = ReduceOp::kSum;
//   op.Describe();                    // "all_reduce of 1024 float32"
//   absl::Status s = comm->run(op);   // checked, started, waited for
//
//   // Point to point: one send or receive of a batch (PyTorch's P2POp).
//   std::vector<P2POp> ring = {P2POp::Send(absl::MakeConstSpan(out), next),
//                              P2POp::Recv(absl::MakeSpan(in), prev)};

#ifndef VEMESH_COMM_OPERATION_H_
#define VEMESH_COMM_OPERATION_H_

#include <cstddef>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "vemesh/comm/buffer.h"
#include "vemesh/comm/data_type.h"

namespace vemesh {

// One send or receive of a batch (`batch_isend_irecv`, PyTorch's P2POp).
// `peer` is a group rank.
struct P2POp {
  enum class Kind { kSend, kRecv };
  Kind kind = Kind::kSend;
  void* data = nullptr;  // read for a send, written for a receive
  size_t count = 0;
  DataType type = DataType::kFloat32;
  int peer = 0;

  static P2POp Send(const void* data, size_t count, DataType type, int peer) {
    return {Kind::kSend, const_cast<void*>(data), count, type, peer};
  }
  static P2POp Recv(void* data, size_t count, DataType type, int peer) {
    return {Kind::kRecv, data, count, type, peer};
  }
  // Any contiguous range (buffer.h); the receive buffer must be mutable.
  template <ReadBuffer R>
  static P2POp Send(R&& data, int peer) {
    return Send(ReadData(data), BufferSize(data), DataTypeOf<BufferValue<R>>(),
                peer);
  }
  template <WriteBuffer W>
  static P2POp Recv(W&& data, int peer) {
    return Recv(WriteData(data), BufferSize(data), DataTypeOf<BufferValue<W>>(),
                peer);
  }
};

// Every operation a backend implements, as one checked description.
enum class OpKind {
  kBarrier,
  kBroadcast,       // recv: the data (in at root, out elsewhere); count
  kAllReduce,       // send, recv (same pointer: in place); count
  kReduce,          // send; recv at root only; count; root
  kAllGather,       // send: count; recv: size() * count
  kAllGatherV,      // send: recv_counts[rank()]; recv: sum(recv_counts)
  kReduceScatter,   // send: size() * count; recv: count
  kReduceScatterV,  // send: sum(recv_counts); recv: recv_counts[rank()]
  kGather,          // send: count; recv at root: size() * count
  kScatter,         // send at root: size() * count; recv: count
  kAllToAll,        // send and recv: size() * count, block i for/from rank i
  kAllToAllV,       // send: send_counts per peer; recv: recv_counts per peer
  kBatch,           // p2p: sends and receives completed together
};
// "all_reduce", "batch_send_recv", ...; "unknown" outside the enum.
absl::string_view OpKindName(OpKind kind);

// What a backend hook receives. Blocks of the `V` forms are contiguous, in
// rank order. The description owns its count lists, so an asynchronous
// backend may keep it until the operation ends.
struct Operation {
  OpKind kind = OpKind::kBarrier;
  const void* send = nullptr;
  void* recv = nullptr;
  size_t count = 0;
  DataType type = DataType::kFloat32;
  ReduceOp op = ReduceOp::kSum;
  int root = 0;
  std::vector<size_t> send_counts;
  std::vector<size_t> recv_counts;
  std::vector<P2POp> p2p;
  // NCCL: the cudaStream_t to enqueue on (null: the communicator's own).
  void* stream = nullptr;
  // The public operation's name when it is not the kind's ("send_recv" is
  // a kBatch); a string literal. Empty: OpKindName(kind).
  absl::string_view name;

  absl::string_view Name() const;

  // "all_reduce of 1024 bfloat16", for messages.
  std::string Describe() const;
};

}  // namespace vemesh

#endif  // VEMESH_COMM_OPERATION_H_
