// vemesh/comm/agreement.h
//
// "Do the ranks agree on this?", asked one way everywhere: every rank
// gives a fixed-size summary of what it holds (a 64-bit hash, compared
// exactly, and a short text, shown), one all_gather exchanges them, and on
// a disagreement every rank returns the same status, whose one message
// names what was agreed on, the first rank that differs from rank 0 and
// both values:
//
//   absl::Status s = AgreeAcrossRanks(*dp, "checkpoint step",
//                                     AgreementSummary::Of(step_text));
//   if (!s.ok()) return s;  // the same status on every rank of dp:
//   // "checkpoint step: rank 3 has step 8, rank 0 has step 7"
//
// Agreements made where no Communicator exists yet (a bootstrap's, a
// backend's own) or from bytes already gathered (a checkpoint's plan) use
// AgreementVerdict or DisagreementMessage, so that every disagreement in
// vemesh reads alike.

#ifndef VEMESH_COMM_AGREEMENT_H_
#define VEMESH_COMM_AGREEMENT_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "vemesh/comm/communicator.h"

namespace vemesh {

// What one rank holds of the thing agreed on.
struct AgreementSummary {
  // The summary of a value shown in full: its FNV-1a hash and the text.
  static AgreementSummary Of(absl::string_view text);

  uint64_t hash = 0;  // compared exactly
  std::string text;   // compared and shown, up to kAgreementTextBytes
};

// Longer texts are cut there (and shown with "..."); the hash still
// covers whatever the caller hashed.
inline constexpr size_t kAgreementTextBytes = 112;

// How a disagreement is reported.
struct AgreementOptions {
  absl::StatusCode code = absl::StatusCode::kInvalidArgument;
  // The word before each index ("rank", "DP rank", "replica") and, when
  // not empty, what index r is called (ids[r] instead of r).
  absl::string_view member = "rank";
  absl::Span<const int> ids = {};
};

// "<what>: rank 3 has X, rank 0 has Y": the one format of a disagreement.
std::string DisagreementMessage(absl::string_view what, int rank,
                                absl::string_view value, int reference,
                                absl::string_view reference_value,
                                absl::string_view member = "rank");

// Pure: OK when every summary equals all[0]; otherwise the status naming
// the first index that differs from 0 (its text and index 0's; both hashes
// too when the texts alone look the same).
absl::Status AgreementVerdict(absl::string_view what,
                              absl::Span<const AgreementSummary> all,
                              const AgreementOptions& options = {});

// Collective over `comm` (one all_gather of kAgreementTextBytes + 16 bytes
// per rank): AgreementVerdict of every rank's `mine`, the same on every
// rank. A failure of the all_gather itself is returned as is.
absl::Status AgreeAcrossRanks(Communicator& comm, absl::string_view what,
                              const AgreementSummary& mine,
                              const AgreementOptions& options = {});

}  // namespace vemesh

#endif  // VEMESH_COMM_AGREEMENT_H_
