// vemesh/comm/forwarded_work.h
//
// How a communicator that wraps another (an elastic epoch's group, a
// reconfigurable one) starts an operation on it, from its Start(op):
//
//   Communicator::WorkOr work = StartForwarded(wrapper, *inner, op);
//
// On most backends the inner Work is returned as it is: the inner group
// bounds and aborts its own operations. On NCCL, whose operations are
// bounded only by the deadline of the wait on them, the Work is owned by
// the wrapper: a deadline passed to wait() (the wrapper's timeout included)
// aborts through the wrapper's OnAbort, which releases the NCCL
// communicator inside an NCCL group (AbortCommunicators), NCCL's rule; a
// `wrapper` that is null (not held by a shared_ptr) is FailedPrecondition
// there.

#ifndef VEMESH_COMM_FORWARDED_WORK_H_
#define VEMESH_COMM_FORWARDED_WORK_H_

#include <memory>

#include "vemesh/comm/communicator.h"

namespace vemesh {

// Starts `op` on `inner` on behalf of `wrapper` (see above).
Communicator::WorkOr StartForwarded(std::shared_ptr<Communicator> wrapper,
                                    Communicator& inner, const Operation& op);

}  // namespace vemesh

#endif  // VEMESH_COMM_FORWARDED_WORK_H_
