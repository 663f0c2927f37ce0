#include "vemesh/base/log.h"

#include <cstdio>
#include <mutex>
#include <utility>

namespace vemesh {
namespace {

// One lock for the sink and its calls: a sink swapped while another thread
// logs is never destroyed under it, and messages never interleave.
std::mutex& SinkMutex() {
  static auto* mu = new std::mutex;
  return *mu;
}

LogSink& Sink() {
  static auto* sink = new LogSink;
  return *sink;
}

}  // namespace

absl::string_view LogLevelName(LogLevel level) {
  return level == LogLevel::kWarning ? "warning" : "note";
}

void set_log_sink(LogSink sink) {
  std::lock_guard<std::mutex> lock(SinkMutex());
  Sink() = std::move(sink);
}

void Log(LogLevel level, absl::string_view text) {
  std::lock_guard<std::mutex> lock(SinkMutex());
  if (Sink()) {
    Sink()(level, text);
    return;
  }
  const absl::string_view name = LogLevelName(level);
  std::fprintf(stderr, "vemesh: %.*s: %.*s\n", static_cast<int>(name.size()),
               name.data(), static_cast<int>(text.size()), text.data());
}

}  // namespace vemesh
