#include "vemesh/layout/mesh_spec.h"

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace vemesh {
namespace {

bool IsName(absl::string_view s) {
  if (s.empty() || !absl::ascii_isalpha(static_cast<unsigned char>(s[0]))) {
    return false;
  }
  for (char c : s) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '_') {
      return false;
    }
  }
  return true;
}

}  // namespace

absl::StatusOr<MeshSpec> ParseMeshSpec(absl::string_view text) {
  const absl::string_view trimmed = absl::StripAsciiWhitespace(text);
  if (trimmed.empty()) {
    return absl::InvalidArgumentError(
        "mesh spec is empty: expected NAME=SIZE[,NAME=SIZE...], e.g. "
        "PP=2,DP=2,TP=2");
  }
  MeshSpec spec;
  for (absl::string_view part : absl::StrSplit(trimmed, ',')) {
    part = absl::StripAsciiWhitespace(part);
    const size_t eq = part.find('=');
    if (eq == absl::string_view::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("mesh spec '", text, "' has the part '", part,
                       "' without '=': expected NAME=SIZE, e.g. TP=2"));
    }
    const absl::string_view name =
        absl::StripAsciiWhitespace(part.substr(0, eq));
    const absl::string_view size =
        absl::StripAsciiWhitespace(part.substr(eq + 1));
    if (!IsName(name)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "mesh spec '", text, "' has the dimension name '", name,
          "': expected letters, digits or '_', starting with a letter"));
    }
    int64_t value = 0;
    if (!absl::SimpleAtoi(size, &value) || value < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("mesh spec '", text, "' gives dimension '", name,
                       "' the size '", size, "': expected an integer >= 1"));
    }
    spec.names.emplace_back(name);
    spec.shape.push_back(value);
  }
  return spec;
}

std::string FormatMeshSpec(const MeshSpec& spec) {
  std::vector<std::string> parts;
  for (size_t i = 0; i < spec.shape.size() && i < spec.names.size(); ++i) {
    parts.push_back(absl::StrCat(spec.names[i], "=", spec.shape[i]));
  }
  return absl::StrJoin(parts, ",");
}

}  // namespace vemesh
