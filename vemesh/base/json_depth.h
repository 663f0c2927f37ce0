// vemesh/base/json_depth.h
//
// The nesting depth of a JSON text, found by one linear scan that skips
// strings, before any parser builds a document: a DOM parser recurses as
// deep as the text nests, so a file or a store value (anyone's input) is
// checked against a small bound first.
//
//   if (JsonNestingDepth(text) > 16) return InvalidArgumentError(...);
//
// The text need not be valid JSON: brackets inside strings do not count,
// and unbalanced closers only lower the running depth.
#ifndef VEMESH_BASE_JSON_DEPTH_H_
#define VEMESH_BASE_JSON_DEPTH_H_

#include <algorithm>
#include <cstddef>

#include "absl/strings/string_view.h"

namespace vemesh {

inline int JsonNestingDepth(absl::string_view text) {
  int depth = 0, max_depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;  // an escaped character, a quote included
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      max_depth = std::max(max_depth, ++depth);
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return max_depth;
}

}  // namespace vemesh

#endif  // VEMESH_BASE_JSON_DEPTH_H_
