// vemesh/checkpoint/dtype.h
//
// The element types a checkpoint stores, named as safetensors names them.
//
//   DType t = DType::kF32;
//   DTypeName(t);                 // "F32"
//   DTypeSize(t);                 // 4
//   auto back = DTypeFromName("BF16");  // DType::kBF16

#ifndef VEMESH_CHECKPOINT_DTYPE_H_
#define VEMESH_CHECKPOINT_DTYPE_H_

#include <cstddef>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace vemesh::checkpoint {

// safetensors dtype names: "F64", "F32", "BF16", "I64", "I32", "U8", "F16".
enum class DType { kF64, kF32, kBF16, kI64, kI32, kU8, kF16 };

// "F32", ...; "unknown" outside the enum.
absl::string_view DTypeName(DType dtype);
// Bytes per element; 0 outside the enum.
size_t DTypeSize(DType dtype);
// The dtype a safetensors name stands for; InvalidArgument naming it when
// it is not one of the names above.
absl::StatusOr<DType> DTypeFromName(absl::string_view name);

}  // namespace vemesh::checkpoint

#endif  // VEMESH_CHECKPOINT_DTYPE_H_
