// libFuzzer target: ParseMeshSpec on arbitrary text.
//
// Invariants checked on every input (a violation aborts, which libFuzzer
// reports as a crash with the input saved):
//   - a rejected spec is InvalidArgument with a non-empty message;
//   - an accepted spec has as many names as sizes, every name matches
//     [A-Za-z][A-Za-z0-9_]* and every size is >= 1;
//   - FormatMeshSpec then ParseMeshSpec gives the same spec back;
//   - MeshLayout::Create on it either succeeds with the same shape and names
//     or fails with InvalidArgument (duplicates, overflow, too many dims).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/string_view.h"
#include "fuzz_check.h"
#include "vemesh/layout/mesh_layout.h"
#include "vemesh/layout/mesh_spec.h"

namespace {

// The parser's rule for names, restated independently as the oracle:
// a letter, then letters, digits or '_'.
bool IsName(absl::string_view s) {
  static constexpr absl::string_view kLetters =
      "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
  static constexpr absl::string_view kRest =
      "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_";
  return !s.empty() && kLetters.find(s[0]) != absl::string_view::npos &&
         s.find_first_not_of(kRest) == absl::string_view::npos;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view text(reinterpret_cast<const char*>(data), size);
  auto spec = vemesh::ParseMeshSpec(text);
  if (!spec.ok()) {
    FUZZ_CHECK(spec.status().code() == absl::StatusCode::kInvalidArgument);
    FUZZ_CHECK(!spec.status().message().empty());
    return 0;
  }
  FUZZ_CHECK(!spec->shape.empty());
  FUZZ_CHECK(spec->shape.size() == spec->names.size());
  for (size_t i = 0; i < spec->shape.size(); ++i) {
    FUZZ_CHECK(spec->shape[i] >= 1);
    FUZZ_CHECK(IsName(spec->names[i]));
  }

  const std::string formatted = vemesh::FormatMeshSpec(*spec);
  auto again = vemesh::ParseMeshSpec(formatted);
  FUZZ_CHECK(again.ok());
  FUZZ_CHECK(again->shape == spec->shape);
  FUZZ_CHECK(again->names == spec->names);

  auto layout = vemesh::MeshLayout::Create(spec->shape, spec->names);
  if (!layout.ok()) {
    FUZZ_CHECK(layout.status().code() == absl::StatusCode::kInvalidArgument);
    FUZZ_CHECK(!layout.status().message().empty());
    return 0;
  }
  FUZZ_CHECK(layout->shape() == spec->shape);
  FUZZ_CHECK(layout->dim_names() == spec->names);
  return 0;
}
