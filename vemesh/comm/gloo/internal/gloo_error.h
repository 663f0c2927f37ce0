// vemesh/comm/gloo/internal/gloo_error.h
//
// Gloo reports failure by throwing; vemesh by absl::Status. RunGloo is the
// boundary between the two: every call into Gloo goes through it, so no
// Gloo exception ever reaches a vemesh caller.
//
//   absl::Status s = RunGloo("all_reduce", [&] { gloo::allreduce(opts); });
//
// Mapping:
//   gloo::IoException naming a timeout        -> DeadlineExceeded
//   any other gloo::IoException (peer closed,  -> Unavailable
//     connection reset, socket errors)
//   gloo::EnforceNotMet, gloo::Exception,      -> Internal
//     any other exception
// Each message is `what` followed by Gloo's own text.

#ifndef VEMESH_COMM_GLOO_INTERNAL_GLOO_ERROR_H_
#define VEMESH_COMM_GLOO_INTERNAL_GLOO_ERROR_H_

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace vemesh {

absl::Status RunGloo(absl::string_view what, absl::FunctionRef<void()> fn);

}  // namespace vemesh

#endif  // VEMESH_COMM_GLOO_INTERNAL_GLOO_ERROR_H_
