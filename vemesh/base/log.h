// vemesh/base/log.h
//
// The one place vemesh's warnings and notes go. By default a line on stderr
// ("vemesh: warning: ..."); a program that has its own logging redirects
// them, and a test captures them:
//
//   vemesh::set_log_sink([](vemesh::LogLevel level, absl::string_view text) {
//     my_logger.log(level == vemesh::LogLevel::kWarning ? WARN : INFO, text);
//   });
//   ...
//   vemesh::set_log_sink(nullptr);   // back to stderr
//
// The sink is called from whichever thread logs, one call per message, never
// two at once (calls are serialised); it must not call set_log_sink itself.
// Messages are whole sentences without the "vemesh:" prefix or a newline.

#ifndef VEMESH_BASE_LOG_H_
#define VEMESH_BASE_LOG_H_

#include <functional>

#include "absl/strings/string_view.h"

namespace vemesh {

enum class LogLevel { kNote, kWarning };

// "note" or "warning".
absl::string_view LogLevelName(LogLevel level);

using LogSink = std::function<void(LogLevel level, absl::string_view text)>;

// Replaces the sink for the whole process; null restores stderr.
void set_log_sink(LogSink sink);

// Sends one message to the current sink.
void Log(LogLevel level, absl::string_view text);
inline void LogWarning(absl::string_view text) {
  Log(LogLevel::kWarning, text);
}
inline void LogNote(absl::string_view text) { Log(LogLevel::kNote, text); }

}  // namespace vemesh

#endif  // VEMESH_BASE_LOG_H_
