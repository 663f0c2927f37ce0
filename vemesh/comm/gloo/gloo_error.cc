#include "vemesh/comm/gloo/internal/gloo_error.h"

#include <exception>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gloo/common/error.h"
#include "gloo/common/logging.h"

namespace vemesh {
namespace {

// Gloo has no timeout exception type: its timeouts are IoExceptions whose
// text says so ("Timed out waiting 1000ms for recv ...", "Read timeout",
// "Connect timeout", "Application timeout caused pair closure").
bool IsTimeout(absl::string_view message) {
  const std::string lower = absl::AsciiStrToLower(message);
  return absl::StrContains(lower, "timed out") ||
         absl::StrContains(lower, "timeout");
}

}  // namespace

absl::Status RunGloo(absl::string_view what, absl::FunctionRef<void()> fn) {
  try {
    fn();
    return absl::OkStatus();
  } catch (const gloo::IoException& e) {
    const absl::string_view message = e.what();
    if (IsTimeout(message)) {
      return absl::DeadlineExceededError(absl::StrCat(what, ": ", message));
    }
    return absl::UnavailableError(absl::StrCat(what, ": ", message));
  } catch (const gloo::EnforceNotMet& e) {
    return absl::InternalError(absl::StrCat(what, ": ", e.what()));
  } catch (const std::exception& e) {  // gloo::Exception and the std ones
    return absl::InternalError(absl::StrCat(what, ": ", e.what()));
  } catch (...) {
    return absl::InternalError(
        absl::StrCat(what, ": Gloo threw an unknown exception"));
  }
}

}  // namespace vemesh
