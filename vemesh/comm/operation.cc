#include "vemesh/comm/operation.h"

#include "absl/strings/str_cat.h"

namespace vemesh {

absl::string_view Operation::Name() const {
  return name.empty() ? OpKindName(kind) : name;
}

std::string Operation::Describe() const {
  switch (kind) {
    case OpKind::kBarrier:
      return std::string(Name());
    case OpKind::kBatch: {
      if (p2p.size() == 1) {
        return absl::StrCat(Name(), " of ", p2p[0].count, " ",
                            DataTypeName(p2p[0].type), " ",
                            p2p[0].kind == P2POp::Kind::kSend ? "to" : "from",
                            " rank ", p2p[0].peer);
      }
      return absl::StrCat(Name(), " of ", p2p.size(), " transfers");
    }
    case OpKind::kAllGatherV:
    case OpKind::kReduceScatterV:
    case OpKind::kAllToAllV: {
      size_t total = 0;
      for (size_t c : recv_counts) total += c;
      return absl::StrCat(Name(), " receiving ", total, " ",
                          DataTypeName(type));
    }
    default:
      return absl::StrCat(Name(), " of ", count, " ", DataTypeName(type));
  }
}

absl::string_view OpKindName(OpKind kind) {
  switch (kind) {
    case OpKind::kBarrier:
      return "barrier";
    case OpKind::kBroadcast:
      return "broadcast";
    case OpKind::kAllReduce:
      return "all_reduce";
    case OpKind::kReduce:
      return "reduce";
    case OpKind::kAllGather:
      return "all_gather";
    case OpKind::kAllGatherV:
      return "all_gather_v";
    case OpKind::kReduceScatter:
      return "reduce_scatter";
    case OpKind::kReduceScatterV:
      return "reduce_scatter_v";
    case OpKind::kGather:
      return "gather";
    case OpKind::kScatter:
      return "scatter";
    case OpKind::kAllToAll:
      return "all_to_all";
    case OpKind::kAllToAllV:
      return "all_to_all_v";
    case OpKind::kBatch:
      return "batch_send_recv";
  }
  return "unknown";
}

}  // namespace vemesh
