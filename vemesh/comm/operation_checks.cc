// The argument checks of every operation, once for all backends
// (Communicator::start calls Check before a backend sees the operation):
// each failure is InvalidArgument with one text whatever the backend.

#include <cstdint>
#include <limits>
#include <string>

#include "absl/strings/str_cat.h"
#include "vemesh/base/status_macros.h"
#include "vemesh/comm/communicator.h"
#include "vemesh/comm/internal/buffer_overlap.h"

namespace vemesh {
namespace {

using comm_internal::BuffersOverlap;

bool IsReduction(OpKind kind) {
  return kind == OpKind::kAllReduce || kind == OpKind::kReduce ||
         kind == OpKind::kReduceScatter || kind == OpKind::kReduceScatterV;
}

}  // namespace

size_t Communicator::MaxCount() const {
  return std::numeric_limits<size_t>::max();
}

absl::Status Communicator::CheckUsable(absl::string_view) const {
  return absl::OkStatus();
}

absl::Status Communicator::LengthError(absl::string_view op,
                                       absl::string_view what, size_t got,
                                       size_t expected) {
  return absl::InvalidArgumentError(
      absl::StrCat(op, ": the ", what, " buffer has ", got,
                   " elements: expected ", expected));
}

absl::Status Communicator::TotalError(absl::string_view op,
                                      absl::string_view what, size_t length,
                                      absl::Span<const size_t> counts) {
  size_t total = 0;
  for (size_t c : counts) {
    if (c > std::numeric_limits<size_t>::max() - total) {
      return absl::InvalidArgumentError(
          absl::StrCat(op, ": the ", what, " counts overflow when summed"));
    }
    total += c;
  }
  if (total == length) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(op, ": the ", what, " buffer has ", length,
                   " elements: expected the sum of its counts, ", total));
}

absl::Status Communicator::Multiple(absl::string_view op,
                                    absl::string_view what, size_t length,
                                    size_t block) const {
  const size_t expected = block * static_cast<size_t>(size());
  if (length == expected) return absl::OkStatus();
  return LengthError(op, what, length, expected);
}

absl::Status Communicator::RootLength(absl::string_view op,
                                      absl::string_view what, size_t length,
                                      size_t expected, int root) const {
  if (root != rank() || length == expected) return absl::OkStatus();
  return LengthError(op, what, length, expected);
}

absl::Status Communicator::VLengths(absl::string_view op,
                                    absl::string_view mine_what, size_t mine,
                                    absl::string_view total_what, size_t total,
                                    absl::Span<const size_t> counts) const {
  if (counts.size() != static_cast<size_t>(size())) return absl::OkStatus();
  if (mine != counts[rank()]) {
    return LengthError(op, mine_what, mine, counts[rank()]);
  }
  return TotalError(op, total_what, total, counts);
}

absl::Status Communicator::AllToAllLengths(size_t send, size_t recv) const {
  if (send == recv && send % size() == 0) return absl::OkStatus();
  return absl::InvalidArgumentError(AllToAllLengthText(send, recv));
}

std::string Communicator::AllToAllLengthText(size_t send, size_t recv) const {
  return absl::StrCat("all_to_all: send has ", send, " and recv ", recv,
                      " elements: expected the same length, a multiple of "
                      "the group size ",
                      size());
}

absl::Status Communicator::CheckBuffer(const Operation& op,
                                       absl::string_view what, const void* data,
                                       size_t count) const {
  if (count > MaxCount()) {
    return absl::InvalidArgumentError(
        absl::StrCat(op.Name(), ": the ", what, " buffer of ", count,
                     " elements is above "
                     "the ",
                     backend(), " backend's limit of ", MaxCount()));
  }
  if (data == nullptr && count > 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        op.Name(), ": the ", what, " buffer is null for ", count, " elements"));
  }
  return absl::OkStatus();
}

absl::Status Communicator::CheckRank(const Operation& op,
                                     absl::string_view what,
                                     int64_t rank) const {
  if (rank < 0 || rank >= size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        op.Name(), ": ", what, " ", rank, " is outside the group of ", size(),
        " ranks (0..", size() - 1, ")"));
  }
  return absl::OkStatus();
}

absl::Status Communicator::CheckCounts(const Operation& op,
                                       absl::string_view what,
                                       absl::Span<const size_t> counts,
                                       size_t* total) const {
  if (counts.size() != static_cast<size_t>(size())) {
    return absl::InvalidArgumentError(absl::StrCat(
        op.Name(), ": ", what, " has ", counts.size(),
        " entries: expected one per rank of the group (", size(), ")"));
  }
  *total = 0;
  for (size_t c : counts) {
    if (c > MaxCount() - *total) {
      return absl::InvalidArgumentError(absl::StrCat(
          op.Name(), ": the ", what, " add up to more than the ", backend(),
          " backend's limit of ", MaxCount(), " elements"));
    }
    *total += c;
  }
  return absl::OkStatus();
}

absl::Status Communicator::Check(const Operation& op) const {
  const absl::string_view name = op.Name();
  if (SizeOf(op.type) == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": unknown data type ", static_cast<int>(op.type)));
  }
  if (IsReduction(op.kind)) {
    if (ReduceOpName(op.op) == "unknown") {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": unknown reduce op ", static_cast<int>(op.op)));
    }
    if (op.op == ReduceOp::kAvg && !IsFloatingPoint(op.type)) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": ReduceOp avg needs a floating-point type; got ",
                       DataTypeName(op.type), " (use sum and divide)"));
    }
  }
  const size_t n = static_cast<size_t>(size());
  const size_t width = SizeOf(op.type);
  // Blocks of size() * count elements: refuse a product past the limit
  // before anything multiplies it.
  auto blocks = [&](absl::string_view what) -> absl::StatusOr<size_t> {
    if (op.count > MaxCount() / n) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": the ", what, " buffer of ", n, " x ", op.count,
                       " elements is above the ", backend(),
                       " backend's limit of ", MaxCount()));
    }
    return op.count * n;
  };
  auto disjoint = [&](size_t send_count, size_t recv_count) -> absl::Status {
    if (op.send != op.recv && BuffersOverlap(op.send, send_count * width,
                                             op.recv, recv_count * width)) {
      return absl::InvalidArgumentError(absl::StrCat(
          name,
          ": the send and recv buffers overlap without being the same "
          "buffer"));
    }
    return absl::OkStatus();
  };
  auto apart = [&](size_t send_count, size_t recv_count) -> absl::Status {
    if (BuffersOverlap(op.send, send_count * width, op.recv,
                       recv_count * width)) {
      return absl::InvalidArgumentError(absl::StrCat(
          name,
          ": the send and recv buffers overlap (this operation cannot "
          "work in place)"));
    }
    return absl::OkStatus();
  };
  const bool root_here = op.root == rank();
  switch (op.kind) {
    case OpKind::kBarrier:
      return absl::OkStatus();
    case OpKind::kBroadcast:
      VEMESH_RETURN_IF_ERROR(CheckRank(op, "root", op.root));
      return CheckBuffer(op, "data", op.recv, op.count);
    case OpKind::kAllReduce:
      VEMESH_RETURN_IF_ERROR(CheckBuffer(op, "send", op.send, op.count));
      VEMESH_RETURN_IF_ERROR(CheckBuffer(op, "recv", op.recv, op.count));
      return disjoint(op.count, op.count);
    case OpKind::kReduce:
      VEMESH_RETURN_IF_ERROR(CheckRank(op, "root", op.root));
      VEMESH_RETURN_IF_ERROR(CheckBuffer(op, "send", op.send, op.count));
      if (!root_here) return absl::OkStatus();
      VEMESH_RETURN_IF_ERROR(CheckBuffer(op, "recv", op.recv, op.count));
      return disjoint(op.count, op.count);
    case OpKind::kAllGather: {
      VEMESH_ASSIGN_OR_RETURN(size_t total, blocks("recv"));
      VEMESH_RETURN_IF_ERROR(CheckBuffer(op, "send", op.send, op.count));
      VEMESH_RETURN_IF_ERROR(CheckBuffer(op, "recv", op.recv, total));
      return apart(op.count, total);
    }
    case OpKind::kAllGatherV: {
      size_t total = 0;
      VEMESH_RETURN_IF_ERROR(
          CheckCounts(op, "recv_counts", op.recv_counts, &total));
      if (op.count != op.recv_counts[rank()]) {
        return absl::InvalidArgumentError(absl::StrCat(
            name, ": this rank sends ", op.count, " elements but recv_counts[",
            rank(), "] is ", op.recv_counts[rank()]));
      }
      VEMESH_RETURN_IF_ERROR(CheckBuffer(op, "send", op.send, op.count));
      VEMESH_RETURN_IF_ERROR(CheckBuffer(op, "recv", op.recv, total));
      return apart(op.count, total);
    }
    case OpKind::kReduceScatter: {
      VEMESH_ASSIGN_OR_RETURN(size_t total, blocks("send"));
      VEMESH_RETURN_IF_ERROR(CheckBuffer(op, "send", op.send, total));
      VEMESH_RETURN_IF_ERROR(CheckBuffer(op, "recv", op.recv, op.count));
      return apart(total, op.count);
    }
    case OpKind::kReduceScatterV: {
      size_t total = 0;
      VEMESH_RETURN_IF_ERROR(
          CheckCounts(op, "recv_counts", op.recv_counts, &total));
      const size_t mine = op.recv_counts[rank()];
      VEMESH_RETURN_IF_ERROR(CheckBuffer(op, "send", op.send, total));
      VEMESH_RETURN_IF_ERROR(CheckBuffer(op, "recv", op.recv, mine));
      return apart(total, mine);
    }
    case OpKind::kGather: {
      VEMESH_RETURN_IF_ERROR(CheckRank(op, "root", op.root));
      VEMESH_ASSIGN_OR_RETURN(size_t total, blocks("recv"));
      VEMESH_RETURN_IF_ERROR(CheckBuffer(op, "send", op.send, op.count));
      if (!root_here) return absl::OkStatus();
      VEMESH_RETURN_IF_ERROR(CheckBuffer(op, "recv", op.recv, total));
      return apart(op.count, total);
    }
    case OpKind::kScatter: {
      VEMESH_RETURN_IF_ERROR(CheckRank(op, "root", op.root));
      VEMESH_ASSIGN_OR_RETURN(size_t total, blocks("send"));
      VEMESH_RETURN_IF_ERROR(CheckBuffer(op, "recv", op.recv, op.count));
      if (!root_here) return absl::OkStatus();
      VEMESH_RETURN_IF_ERROR(CheckBuffer(op, "send", op.send, total));
      return apart(total, op.count);
    }
    case OpKind::kAllToAll: {
      VEMESH_ASSIGN_OR_RETURN(size_t total, blocks("send"));
      VEMESH_RETURN_IF_ERROR(CheckBuffer(op, "send", op.send, total));
      VEMESH_RETURN_IF_ERROR(CheckBuffer(op, "recv", op.recv, total));
      return apart(total, total);
    }
    case OpKind::kAllToAllV: {
      size_t sent = 0;
      size_t received = 0;
      VEMESH_RETURN_IF_ERROR(
          CheckCounts(op, "send_counts", op.send_counts, &sent));
      VEMESH_RETURN_IF_ERROR(
          CheckCounts(op, "recv_counts", op.recv_counts, &received));
      VEMESH_RETURN_IF_ERROR(CheckBuffer(op, "send", op.send, sent));
      VEMESH_RETURN_IF_ERROR(CheckBuffer(op, "recv", op.recv, received));
      return apart(sent, received);
    }
    case OpKind::kBatch: {
      for (size_t i = 0; i < op.p2p.size(); ++i) {
        const P2POp& p = op.p2p[i];
        const bool sends = p.kind == P2POp::Kind::kSend;
        if (SizeOf(p.type) == 0) {
          return absl::InvalidArgumentError(
              absl::StrCat(name, ": transfer ", i, " has unknown data type ",
                           static_cast<int>(p.type)));
        }
        VEMESH_RETURN_IF_ERROR(
            CheckRank(op, sends ? "dest" : "source", p.peer));
        VEMESH_RETURN_IF_ERROR(
            CheckBuffer(op, sends ? "send" : "recv", p.data, p.count));
        if (sends) continue;
        // A receive must not write over another transfer's buffer.
        for (size_t j = 0; j < op.p2p.size(); ++j) {
          const P2POp& q = op.p2p[j];
          if (j != i && BuffersOverlap(p.data, p.count * SizeOf(p.type), q.data,
                                       q.count * SizeOf(q.type))) {
            return absl::InvalidArgumentError(
                absl::StrCat(name, ": the recv buffer of transfer ", i,
                             " overlaps the buffer of transfer ", j));
          }
        }
      }
      return absl::OkStatus();
    }
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown operation kind ", static_cast<int>(op.kind)));
}

}  // namespace vemesh
