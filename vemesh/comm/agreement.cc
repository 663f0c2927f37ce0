// vemesh/comm/agreement.cc

#include "vemesh/comm/agreement.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "vemesh/base/fnv1a.h"
#include "vemesh/base/status_macros.h"

namespace vemesh {
namespace {

// One rank's summary on the wire: the same size on every rank, so that the
// exchange itself can never mismatch.
struct WireSummary {
  uint64_t hash = 0;
  uint64_t length = 0;  // of the whole text; at most kAgreementTextBytes sent
  char text[kAgreementTextBytes] = {};
};
static_assert(sizeof(WireSummary) == kAgreementTextBytes + 16);

std::string Shown(absl::string_view text) {
  if (text.size() <= kAgreementTextBytes) return std::string(text);
  return absl::StrCat(text.substr(0, kAgreementTextBytes), "...");
}

bool SameSummary(const AgreementSummary& a, const AgreementSummary& b) {
  return a.hash == b.hash && Shown(a.text) == Shown(b.text);
}

int MemberId(const AgreementOptions& o, size_t index) {
  return index < o.ids.size() ? o.ids[index] : static_cast<int>(index);
}

}  // namespace

AgreementSummary AgreementSummary::Of(absl::string_view text) {
  return AgreementSummary{Fnv1a(text), std::string(text)};
}

std::string DisagreementMessage(absl::string_view what, int rank,
                                absl::string_view value, int reference,
                                absl::string_view reference_value,
                                absl::string_view member) {
  return absl::StrCat(what, ": ", member, " ", rank, " has ", value, ", ",
                      member, " ", reference, " has ", reference_value);
}

absl::Status AgreementVerdict(absl::string_view what,
                              absl::Span<const AgreementSummary> all,
                              const AgreementOptions& options) {
  for (size_t r = 1; r < all.size(); ++r) {
    if (SameSummary(all[r], all[0])) continue;
    std::string value = Shown(all[r].text);
    std::string reference = Shown(all[0].text);
    if (value == reference) {
      // The same text, another hash: the hash is all that tells them apart.
      absl::StrAppendFormat(&value, " (hash %016x)", all[r].hash);
      absl::StrAppendFormat(&reference, " (hash %016x)", all[0].hash);
    }
    return absl::Status(
        options.code,
        DisagreementMessage(what, MemberId(options, r), value,
                            MemberId(options, 0), reference, options.member));
  }
  return absl::OkStatus();
}

absl::Status AgreeAcrossRanks(Communicator& comm, absl::string_view what,
                              const AgreementSummary& mine,
                              const AgreementOptions& options) {
  WireSummary send;
  send.hash = mine.hash;
  send.length = mine.text.size();
  std::memcpy(send.text, mine.text.data(),
              std::min(mine.text.size(), kAgreementTextBytes));
  const size_t n = static_cast<size_t>(comm.size());
  std::vector<WireSummary> gathered(n);
  VEMESH_RETURN_IF_ERROR(comm.all_gather(
      &send, gathered.data(), sizeof(WireSummary), DataType::kUInt8));
  std::vector<AgreementSummary> all(n);
  for (size_t r = 0; r < n; ++r) {
    const WireSummary& w = gathered[r];
    all[r].hash = w.hash;
    const size_t sent = std::min<uint64_t>(w.length, kAgreementTextBytes);
    all[r].text.assign(w.text, sent);
    // A cut text keeps its "..." once shown: pad it past the limit.
    if (w.length > kAgreementTextBytes) all[r].text.push_back('.');
  }
  return AgreementVerdict(what, all, options);
}

}  // namespace vemesh
