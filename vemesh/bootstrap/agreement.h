// vemesh/bootstrap/agreement.h
//
// Checks that every rank is about to make the same collective call with the
// same arguments, before that call can hang or build a wrong mesh, and
// carries a small per-rank payload in the same step:
//
//   auto hosts = AgreeAndGather(boot, "init_device_mesh",
//       {{"device type", "cpu"}, {"shape", "(2, 2, 2)"}},
//       /*payload=*/HostIdentity(), deadline);
//   // OK: (*hosts)[r] is rank r's payload.
//
// Every rank gets the same answer, because it is computed from the same
// gathered bytes: OK, InvalidArgument naming the first rank that disagrees
// with rank 0 and both values of each differing field, or the bootstrap's
// own error (DeadlineExceeded naming the ranks that never arrived). It runs
// before any Communicator exists (over the bootstrap: a store or MPI), so it
// cannot use comm/agreement.h's AgreeAcrossRanks; each differing field is
// written by its DisagreementMessage, the one format of a disagreement:
//
//   init_device_mesh shape: rank 2 has (3), rank 0 has (1, 3) (every rank
//   must pass the same arguments)
//
// Cost: one all_gather of a 64-bit fingerprint plus the payload when the
// ranks agree; one more all_gather of the full arguments only when they do
// not. AgreeAndMakeWorld is the same check made with
// Bootstrap::all_gather_and_world: mesh creation's agreement and its private
// world in one step (under MPI, two collectives: the gather and the world's
// MPI_Comm_idup, which closes it).

#ifndef VEMESH_BOOTSTRAP_AGREEMENT_H_
#define VEMESH_BOOTSTRAP_AGREEMENT_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "vemesh/bootstrap/bootstrap.h"

namespace vemesh {

struct AgreementField {
  std::string name;   // "shape"
  std::string value;  // "(2, 2, 2)": compared in full, shown shortened
};

absl::StatusOr<std::vector<std::string>> AgreeAndGather(
    Bootstrap& bootstrap, absl::string_view operation,
    absl::Span<const AgreementField> fields, absl::string_view payload,
    absl::Time deadline);

struct AgreedWorld {
  std::vector<std::string> payloads;    // payloads[r]: rank r's
  std::shared_ptr<Communicator> world;  // the bootstrap's host world
};

// The check and Bootstrap::all_gather_and_world in one step. On a
// disagreement the world is made and let go (every rank alike).
absl::StatusOr<AgreedWorld> AgreeAndMakeWorld(
    Bootstrap& bootstrap, absl::string_view operation,
    absl::Span<const AgreementField> fields, absl::string_view payload,
    absl::Time deadline, absl::Duration op_timeout);

// The same check with no payload.
absl::Status CheckAgreement(Bootstrap& bootstrap, absl::string_view operation,
                            absl::Span<const AgreementField> fields,
                            absl::Time deadline);

}  // namespace vemesh

#endif  // VEMESH_BOOTSTRAP_AGREEMENT_H_
