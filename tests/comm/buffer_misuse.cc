// Must NOT compile unless VEMESH_BUFFER_OK is defined: the typed
// communicator operations refuse a const buffer where they write
// (VEMESH_CONST_RECV) and a send/recv pair of different element types
// (VEMESH_MIXED_TYPES). Compiled by the communicator.buffer.* tests, never
// built into a target.
#include <span>
#include <vector>

#include "absl/types/span.h"
#include "vemesh/comm/communicator.h"

void Use(vemesh::Communicator& comm) {
  std::vector<float> a(1);
  std::vector<float> b(2);
#if defined(VEMESH_CONST_RECV)
  const std::vector<float> frozen(2);
  (void)comm.all_gather(a, frozen);
#elif defined(VEMESH_MIXED_TYPES)
  std::vector<double> wide(2);
  (void)comm.all_gather(a, wide);
#else
  // The control: every spelling the issue asked for compiles.
  (void)comm.all_gather(absl::MakeSpan(a), absl::MakeSpan(b));
  (void)comm.all_gather(std::span<const float>(a), b);
  (void)comm.all_reduce(b, vemesh::ReduceOp::kSum);
  (void)comm.iall_reduce(std::span<float>(b), vemesh::ReduceOp::kSum);
  (void)comm.iall_gather(a, b);
#endif
}
