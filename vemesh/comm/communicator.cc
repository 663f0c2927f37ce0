#include "vemesh/comm/communicator.h"

#include <atomic>
#include <climits>

namespace vemesh {
namespace {

// Every backend's objects, so a test can see a leak whatever made it.
std::atomic<int64_t> live_communicators{0};

}  // namespace

Communicator::Communicator() {
  live_communicators.fetch_add(1, std::memory_order_relaxed);
}

Communicator::~Communicator() {
  live_communicators.fetch_sub(1, std::memory_order_relaxed);
}

int64_t LiveCommunicatorCount() {
  return live_communicators.load(std::memory_order_relaxed);
}

absl::Status Communicator::send_recv(const void*, size_t, int, void*, size_t,
                                     int, DataType) {
  return absl::UnimplementedError(
      absl::StrCat("send_recv is not implemented by the '", backend(),
                   "' communicator"));
}

absl::Status Communicator::CheckBuffer(absl::string_view backend_name,
                                       absl::string_view op, const void* data,
                                       size_t count) const {
  if (count > static_cast<size_t>(INT_MAX)) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, " of ", count, " elements: the ", backend_name,
        " backend takes at most ", INT_MAX));
  }
  if (data == nullptr && count > 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, " got a null buffer for ", count, " elements"));
  }
  return absl::OkStatus();
}

absl::Status Communicator::CheckPeer(absl::string_view op,
                                     absl::string_view what, int peer) const {
  if (peer < 0 || peer >= size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": ", what, " ", peer, " is outside the group of ",
                     size(), " ranks (0..", size() - 1, ")"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<Bootstrap>> Communicator::make_bootstrap(
    absl::Time) {
  return absl::InvalidArgumentError(absl::StrCat(
      "MeshOptions.world must be an MPI communicator (one that can bootstrap "
      "a mesh); got backend '", backend(), "'"));
}

size_t SizeOf(DataType type) {
  switch (type) {
    case DataType::kFloat32:
      return sizeof(float);
    case DataType::kFloat64:
      return sizeof(double);
    case DataType::kInt32:
      return sizeof(int32_t);
    case DataType::kInt64:
      return sizeof(int64_t);
  }
  return 0;
}

absl::string_view DataTypeName(DataType type) {
  switch (type) {
    case DataType::kFloat32:
      return "float32";
    case DataType::kFloat64:
      return "float64";
    case DataType::kInt32:
      return "int32";
    case DataType::kInt64:
      return "int64";
  }
  return "unknown";
}

absl::string_view ReduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kMax:
      return "max";
    case ReduceOp::kMin:
      return "min";
  }
  return "unknown";
}

}  // namespace vemesh
