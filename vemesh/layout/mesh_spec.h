// vemesh/layout/mesh_spec.h
//
// The text form of a mesh that command lines use: "PP=2,DP=2,TP=2".
//
//   absl::StatusOr<MeshSpec> spec = ParseMeshSpec("PP=2,DP=2,TP=2");
//   spec->shape;   // {2, 2, 2}
//   spec->names;   // {"PP", "DP", "TP"}
//
// A dimension is NAME=SIZE; NAME is letters, digits and '_' (starting with a
// letter), SIZE a positive integer. Dimensions are separated by ','. Spaces
// around tokens are allowed. Validation of the mesh itself (duplicate names,
// overflow) is MeshLayout::Create's; the parser checks the text.

#ifndef VEMESH_LAYOUT_MESH_SPEC_H_
#define VEMESH_LAYOUT_MESH_SPEC_H_

#include <cstdint>
#include <string>
#include <vector>
#include "absl/strings/string_view.h"

#include "absl/status/statusor.h"

namespace vemesh {

struct MeshSpec {
  std::vector<int64_t> shape;
  std::vector<std::string> names;
};

absl::StatusOr<MeshSpec> ParseMeshSpec(absl::string_view text);

// "PP=2,DP=2,TP=2".
std::string FormatMeshSpec(const MeshSpec& spec);

}  // namespace vemesh

#endif  // VEMESH_LAYOUT_MESH_SPEC_H_
