#include "vemesh/bootstrap/init_timeout.h"

#include <cmath>
#include <cstdlib>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace vemesh {

absl::StatusOr<absl::Duration> ParseInitTimeout(absl::string_view text) {
  const absl::string_view value = absl::StripAsciiWhitespace(text);
  absl::Duration parsed = absl::ZeroDuration();
  double seconds = 0;
  bool ok = false;
  if (absl::SimpleAtod(value, &seconds)) {
    // Up to a day: more is a typo, not a deadline anyone waits for.
    ok = std::isfinite(seconds) && seconds > 0 && seconds <= 86400;
    if (ok) parsed = absl::Seconds(seconds);
  } else if (absl::ParseDuration(value, &parsed)) {
    ok = parsed > absl::ZeroDuration() && parsed <= absl::Hours(24);
  }
  if (!ok) {
    return absl::InvalidArgumentError(absl::StrCat(
        kInitTimeoutVariable, "='", text,
        "': expected a positive number of seconds (e.g. 30 or 2.5) or a "
        "duration (e.g. 90s, 2m), at most a day"));
  }
  return parsed;
}

absl::StatusOr<absl::Duration> DefaultInitTimeout() {
  const std::string name(kInitTimeoutVariable);
  const char* value = std::getenv(name.c_str());
  // Empty counts as unset, as for the launcher's variables (launch.h).
  if (value == nullptr || *value == '\0') return kBuiltinInitTimeout;
  return ParseInitTimeout(value);
}

}  // namespace vemesh
