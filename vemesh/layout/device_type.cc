#include "vemesh/layout/device_type.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace vemesh {

absl::StatusOr<ParsedDeviceType> ParseDeviceType(absl::string_view text) {
  if (text == "cpu") return ParsedDeviceType{DeviceType::kCpu, ""};
  if (text == "cuda") return ParsedDeviceType{DeviceType::kCuda, ""};
  if (text == "meta") return ParsedDeviceType{DeviceType::kMeta, ""};
  if (text.substr(0, 5) == "cuda:") {
    int index = 0;
    if (absl::SimpleAtoi(text.substr(5), &index) && index >= 0) {
      return ParsedDeviceType{DeviceType::kCuda, "", index};
    }
  }
  return absl::InvalidArgumentError(
      absl::StrCat("device type '", text,
                   "' is not supported: expected 'cpu', 'cuda', 'cuda:N' or "
                   "'meta'"));
}

absl::string_view DeviceTypeName(DeviceType type) {
  switch (type) {
    case DeviceType::kCpu:
      return "cpu";
    case DeviceType::kCuda:
      return "cuda";
    case DeviceType::kMeta:
      return "meta";
  }
  return "unknown";
}

}  // namespace vemesh
