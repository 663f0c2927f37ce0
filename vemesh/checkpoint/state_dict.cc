// vemesh/checkpoint/state_dict.cc

#include "vemesh/checkpoint/state_dict.h"

#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "vemesh/base/status_macros.h"

namespace vemesh::checkpoint {
namespace {

bool PrintableAscii(const std::string& s) {
  for (unsigned char c : s) {
    if (c < 0x20 || c > 0x7e) return false;
  }
  return true;
}

}  // namespace

absl::Status StateDict::Add(std::string name, DType dtype,
                            std::vector<int64_t> global_shape, Box box,
                            void* data) {
  if (name.empty() || name.size() > 1024 || !PrintableAscii(name)) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor name '", absl::CEscape(name.substr(0, 200)),
                     "': expected 1 to 1024 bytes of printable ASCII"));
  }
  if (DTypeSize(dtype) == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor '", name, "': dtype ", static_cast<int>(dtype),
                     " is not a checkpoint::DType"));
  }
  if (global_shape.size() > 16) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor '", name, "': ", global_shape.size(),
                     " dimensions, expected at most 16"));
  }
  if (absl::Status s = CheckBox(box, global_shape); !s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor '", name, "': ", s.message()));
  }
  if (data == nullptr && BoxNumel(box) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor '", name, "' box ", BoxToString(box), ": data is null"));
  }
  for (const Piece& p : pieces_) {
    if (p.name != name) continue;
    if (p.dtype != dtype || p.global_shape != global_shape) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor '", name, "' added as ", DTypeName(dtype), " [",
          absl::StrJoin(global_shape, ", "), "] after ", DTypeName(p.dtype),
          " [", absl::StrJoin(p.global_shape, ", "), "]"));
    }
    if (p.box == box) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor '", name, "' box ", BoxToString(box), " added twice"));
    }
  }
  pieces_.push_back(Piece{std::move(name), dtype, std::move(global_shape),
                          std::move(box), data});
  return absl::OkStatus();
}

absl::Status StateDict::AddFull(std::string name, DType dtype,
                                std::vector<int64_t> shape, void* data) {
  Box box{std::vector<int64_t>(shape.size(), 0), shape};
  return Add(std::move(name), dtype, std::move(shape), std::move(box), data);
}

void StateDict::SetMetadata(std::string key, std::string value) {
  metadata_[std::move(key)] = std::move(value);
}

void StateDict::Clear() {
  pieces_.clear();
  metadata_.clear();
}

}  // namespace vemesh::checkpoint
