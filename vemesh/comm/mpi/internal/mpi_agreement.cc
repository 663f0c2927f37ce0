#include "vemesh/comm/mpi/internal/mpi_agreement.h"

#include <cstdlib>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "vemesh/base/log.h"

namespace vemesh {

bool IsCheckedCollective(const Operation& op) {
  return op.kind != OpKind::kBatch;
}

absl::Status MpiAgreementVerdict(const Operation& op,
                                 absl::Span<const MpiOpSummary> all) {
  return OpSummaryVerdict(
      op, static_cast<int>(all.size()),
      [&](int r) -> const OpSummary& { return all[static_cast<size_t>(r)]; });
}

bool CollectiveCheckDefault() {
  static const bool on = [] {
    const char* v = std::getenv("VEMESH_COLLECTIVE_CHECK");
    if (v == nullptr || *v == '\0') return true;
    const std::string s = absl::AsciiStrToLower(v);
    if (s == "0" || s == "off") return false;
    if (s != "1" && s != "on") {
      LogWarning(absl::StrCat("VEMESH_COLLECTIVE_CHECK='", v,
                              "' is not 1, on, 0 or off: the check stays on"));
    }
    return true;
  }();
  return on;
}

}  // namespace vemesh
