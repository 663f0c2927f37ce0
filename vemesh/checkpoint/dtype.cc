// vemesh/checkpoint/dtype.cc

#include "vemesh/checkpoint/dtype.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace vemesh::checkpoint {
namespace {

struct Entry {
  DType dtype;
  absl::string_view name;
  size_t size;
};
constexpr Entry kTable[] = {
    {DType::kF64, "F64", 8}, {DType::kF32, "F32", 4}, {DType::kBF16, "BF16", 2},
    {DType::kI64, "I64", 8}, {DType::kI32, "I32", 4}, {DType::kU8, "U8", 1},
    {DType::kF16, "F16", 2},
};

}  // namespace

absl::string_view DTypeName(DType dtype) {
  for (const Entry& e : kTable) {
    if (e.dtype == dtype) return e.name;
  }
  return "unknown";
}

size_t DTypeSize(DType dtype) {
  for (const Entry& e : kTable) {
    if (e.dtype == dtype) return e.size;
  }
  return 0;
}

absl::StatusOr<DType> DTypeFromName(absl::string_view name) {
  for (const Entry& e : kTable) {
    if (e.name == name) return e.dtype;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "dtype '", name, "' is not one of F64, F32, BF16, I64, I32, U8, F16"));
}

}  // namespace vemesh::checkpoint
