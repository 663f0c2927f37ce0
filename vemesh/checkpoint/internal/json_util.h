// vemesh/checkpoint/internal/json_util.h
//
// Bounded JSON reading for the files a checkpoint reads back (manifest,
// safetensors headers): nesting depth is checked before nlohmann's parser
// sees the text, and every number is range-checked before use.
//
//   VEMESH_ASSIGN_OR_RETURN(Json j, ParseJson(text, "manifest 'm.json'"));
//   VEMESH_ASSIGN_OR_RETURN(int64_t step, GetInt(j, "step", 0, kMax, where));

#ifndef VEMESH_CHECKPOINT_INTERNAL_JSON_UTIL_H_
#define VEMESH_CHECKPOINT_INTERNAL_JSON_UTIL_H_

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace vemesh::checkpoint::internal {

// Bounds on a tensor shape read from a file (manifest or safetensors header):
// at most kMaxDims dimensions, each at most kMaxDim elements.
inline constexpr size_t kMaxDims = 16;
inline constexpr int64_t kMaxDim = int64_t{1} << 50;

using Json = nlohmann::json;

// Parses `text`; InvalidArgument naming `what` when it is not JSON, nests
// deeper than `max_depth`, or repeats a key within one object (nlohmann
// alone would keep the last: a file that says two things is refused).
absl::StatusOr<Json> ParseJson(absl::string_view text, absl::string_view what,
                               int max_depth = 16);
// An integer in [lo, hi]; `where` names the value in errors.
absl::StatusOr<int64_t> AsInt(const Json& j, int64_t lo, int64_t hi,
                              absl::string_view where);
absl::StatusOr<int64_t> GetInt(const Json& object, const char* key, int64_t lo,
                               int64_t hi, absl::string_view where);
absl::StatusOr<std::string> GetString(const Json& object, const char* key,
                                      absl::string_view where);
// An array of at most `max_size` integers, each in [lo, hi].
absl::StatusOr<std::vector<int64_t>> GetIntArray(const Json& object,
                                                 const char* key,
                                                 size_t max_size, int64_t lo,
                                                 int64_t hi,
                                                 absl::string_view where);
// Serialises; bytes that are not UTF-8 are replaced (names are checked to be
// printable ASCII before they get here).
std::string DumpJson(const Json& j, int indent = -1);

}  // namespace vemesh::checkpoint::internal

#endif  // VEMESH_CHECKPOINT_INTERNAL_JSON_UTIL_H_
