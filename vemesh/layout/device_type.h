// vemesh/layout/device_type.h
//
// Where a mesh's tensors live, and so which backend talks for it:
//   cpu  -> MPI communicators
//   cuda -> NCCL communicators (bootstrapped over MPI)
//   meta -> no communicators at all: layout and queries only (planning)
//
//   ParseDeviceType("cuda");    // DeviceType::kCuda
//   ParseDeviceType("cuda:1");  // kCuda, index 1: this rank binds device 1
//                               // (plain "cuda": the host-local rank's)
//   ParseDeviceType("tpu");     // InvalidArgument naming "tpu"

#ifndef VEMESH_LAYOUT_DEVICE_TYPE_H_
#define VEMESH_LAYOUT_DEVICE_TYPE_H_

#include <string>
#include "absl/strings/string_view.h"

#include "absl/status/statusor.h"

namespace vemesh {

enum class DeviceType { kCpu, kCuda, kMeta };

struct ParsedDeviceType {
  DeviceType type = DeviceType::kCpu;
  // Non-empty when the text was accepted with a caveat.
  std::string warning;
  // N of "cuda:N"; -1 otherwise.
  int index = -1;
};

absl::StatusOr<ParsedDeviceType> ParseDeviceType(absl::string_view text);
absl::string_view DeviceTypeName(DeviceType type);

}  // namespace vemesh

#endif  // VEMESH_LAYOUT_DEVICE_TYPE_H_
