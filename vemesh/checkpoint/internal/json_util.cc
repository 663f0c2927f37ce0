// vemesh/checkpoint/internal/json_util.cc

#include "vemesh/checkpoint/internal/json_util.h"

#include <set>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "vemesh/base/json_depth.h"

namespace vemesh::checkpoint::internal {

absl::StatusOr<Json> ParseJson(absl::string_view text, absl::string_view what,
                               int max_depth) {
  // Depth first: nlohmann's DOM would recurse as deep as the text nests.
  if (const int depth = JsonNestingDepth(text); depth > max_depth) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": JSON nests ", depth,
                                                   " levels deep; at most ",
                                                   max_depth, " expected"));
  }
  // Duplicate keys: nlohmann keeps the last one silently, so that a file
  // could say two things and be read as one of them. The keys of each open
  // object are tracked as the parser reports them.
  std::vector<std::set<std::string>> open;
  std::string duplicate;
  auto callback = [&](int /*depth*/, Json::parse_event_t event, Json& parsed) {
    switch (event) {
      case Json::parse_event_t::object_start:
        open.emplace_back();
        break;
      case Json::parse_event_t::object_end:
        if (!open.empty()) open.pop_back();
        break;
      case Json::parse_event_t::key:
        if (!open.empty() && parsed.is_string() &&
            !open.back().insert(parsed.get<std::string>()).second &&
            duplicate.empty()) {
          duplicate = parsed.get<std::string>();
        }
        break;
      default:
        break;
    }
    return true;
  };
  Json j = Json::parse(text.begin(), text.end(), callback,
                       /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": not valid JSON (", text.size(), " bytes)"));
  }
  if (!duplicate.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": the key \"", absl::CHexEscape(duplicate),
                     "\" appears twice in one object (which one is meant?)"));
  }
  return j;
}

absl::StatusOr<int64_t> AsInt(const Json& j, int64_t lo, int64_t hi,
                              absl::string_view where) {
  int64_t v = 0;
  if (j.is_number_unsigned()) {
    uint64_t u = j.get<uint64_t>();
    if (u > static_cast<uint64_t>(INT64_MAX)) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": ", u, " is out of range [", lo, ", ", hi, "]"));
    }
    v = static_cast<int64_t>(u);
  } else if (j.is_number_integer()) {
    v = j.get<int64_t>();
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": expected an integer, got ", j.type_name()));
  }
  if (v < lo || v > hi) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": ", v, " is out of range [", lo, ", ", hi, "]"));
  }
  return v;
}

absl::StatusOr<int64_t> GetInt(const Json& object, const char* key, int64_t lo,
                               int64_t hi, absl::string_view where) {
  auto it = object.find(key);
  if (it == object.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": no \"", key, "\""));
  }
  return AsInt(*it, lo, hi, absl::StrCat(where, " \"", key, "\""));
}

absl::StatusOr<std::string> GetString(const Json& object, const char* key,
                                      absl::string_view where) {
  auto it = object.find(key);
  if (it == object.end() || !it->is_string()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": \"", key, "\" is missing or not a string"));
  }
  return it->get<std::string>();
}

absl::StatusOr<std::vector<int64_t>> GetIntArray(const Json& object,
                                                 const char* key,
                                                 size_t max_size, int64_t lo,
                                                 int64_t hi,
                                                 absl::string_view where) {
  auto it = object.find(key);
  if (it == object.end() || !it->is_array()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": \"", key, "\" is missing or not an array"));
  }
  if (it->size() > max_size) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": \"", key, "\" has ", it->size(),
                     " entries, expected at most ", max_size));
  }
  std::vector<int64_t> out;
  out.reserve(it->size());
  for (const Json& e : *it) {
    absl::StatusOr<int64_t> v =
        AsInt(e, lo, hi, absl::StrCat(where, " \"", key, "\""));
    if (!v.ok()) return v.status();
    out.push_back(*v);
  }
  return out;
}

std::string DumpJson(const Json& j, int indent) {
  return j.dump(indent, ' ', /*ensure_ascii=*/false,
                Json::error_handler_t::replace);
}

}  // namespace vemesh::checkpoint::internal
