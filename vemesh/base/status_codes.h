// vemesh/base/status_codes.h
//
// The one table of the absl::StatusCode values vemesh returns: what each
// means here, which calls return it, and whether the caller may try again.
// Every other header and document refers to this table instead of
// restating it. The message of every error names the bad value or the peer,
// key or rank involved, and what was expected; callers branch on the code,
// people read the message.
//
//   absl::Status s = comm->all_reduce(absl::MakeSpan(grad), ReduceOp::kSum);
//   if (absl::IsUnavailable(s)) {
//     // A peer is gone: this communicator is finished; make a new group.
//   }
//
// After each code, "retry" says what the caller may do: "same call" means
// the identical call may succeed later with nothing else changed; "rebuild"
// means the object that failed (the communicator, the bootstrap, the mesh)
// is finished and a new one must be made; "fix" means the call is wrong and
// will fail the same way until the caller changes it.
//
// InvalidArgument (retry: fix)
//   A bad value from the caller, named with what was expected: a mesh shape,
//   dimension name or mesh spec ("PP=2,DP=2,TP=2"); communicator arguments
//   (a null buffer with a non-zero count, a count past the backend's limit,
//   a root or peer outside the group, overlapping buffers, avg of integers);
//   launch variables (RANK, WORLD_SIZE, MASTER_PORT, LOCAL_RANK,
//   VEMESH_BOOTSTRAP); store keys or values over the bounds; a malformed
//   store frame or membership record. Also the agreement check: ranks that
//   called a collective with different arguments all get InvalidArgument
//   naming the first rank that differs and both values.
//
// NotFound (retry: fix)
//   A name or member that does not exist: an unknown mesh dimension or role
//   name, a global rank that is not a member of the group
//   (Communicator::group_rank, MeshLayout), a store key that is not set
//   (Store::get; wait for it instead).
//
// OutOfRange (retry: fix)
//   An index past its bound: a dimension index, a coordinate, a sub-mesh
//   index of DeviceMesh or MeshLayout.
//
// AlreadyExists (retry: fix, or the same call later)
//   init_device_mesh with InitOptions::check_uniqueness while a mesh is
//   initialised (call reset() first); a TcpStoreServer whose port is taken
//   (another job holds it: choose another port, or 0 for any free one).
//
// FailedPrecondition (retry: rebuild, or fix the order of calls)
//   The call is valid but the state forbids it: a registry query before
//   init_device_mesh or after reset; a stale mesh (an older init, an older
//   elastic epoch); a communicator on a meta mesh; MPI finalised, or a
//   thread that MPI's thread level does not allow; a bootstrap or MPI that
//   was abandoned at an earlier deadline (MPI is then unusable in this
//   process: end it); a backend the job cannot use (MPI without an MPI
//   launcher, NCCL on a cpu mesh, a launcher whose agent hosts the store);
//   more ranks on a host than visible GPUs; a strategy whose registry sizes
//   changed since it was built.
//
// DeadlineExceeded (retry: rebuild; a Store wait: the same call)
//   Something did not finish by its deadline. A communicator operation past
//   its deadline also aborts the communicator (an unfinished collective
//   cannot be taken back): make a new one. A bootstrap all-gather or mesh
//   creation names the ranks that never arrived, on every rank that came,
//   and leaves the bootstrap unusable (under MPI, MPI itself). A Store
//   wait/wait_get names the missing keys and changes nothing: waiting again
//   is safe.
//
// Unavailable (retry: the same call for a Store; rebuild for a communicator)
//   A peer or service is gone or cannot be reached: a lost Gloo or NCCL peer
//   (connection reset, closed), a store or Redis that refuses, stops or
//   resets the connection (named host:port; the store's next call tries one
//   fresh connection), an elastic control plane that is lost; NCCL or the
//   CUDA runtime that cannot be loaded (every cuda entry point, naming the
//   file: install it or set VEMESH_NCCL_LIBRARY / VEMESH_CUDART_LIBRARY). A
//   communicator that saw a lost peer stays broken with this code; an
//   elastic job recovers by recover() into a new epoch.
//
// Aborted (retry: rebuild; RedisStore::add: the same call)
//   Communicator::abort() was called (from any thread), or an earlier
//   deadline aborted the communicator: every later operation is Aborted
//   naming the first reason. RedisStore::add also answers Aborted when other
//   writers won every compare-and-set round for op_timeout.
//
// ResourceExhausted (retry: fix, or the same call later)
//   A limit was reached: a registry call that would build more than 2^16
//   meshes (ask for this rank's own instead); a store reply over the frame
//   bound; no memory for a Redis connection, no thread for the Gloo worker.
//
// Unimplemented (retry: fix)
//   A feature this build or this object does not have: NCCL in a build
//   without NCCL's and CUDA's headers; an elastic mesh on a device other than
//   cpu; split of an elastic epoch's group; set_lease on a store without
//   expiring keys (use RedisStore or MemoryStore).
//
// Internal (retry: rebuild; report it)
//   A library error that is none of the above (an MPI, NCCL, CUDA, Gloo or
//   Redis error with the library's own text), or a broken invariant in
//   vemesh. The message carries the library's text.
//
// vemesh does not return Cancelled, Unknown, PermissionDenied, DataLoss or
// Unauthenticated.

#ifndef VEMESH_BASE_STATUS_CODES_H_
#define VEMESH_BASE_STATUS_CODES_H_

#include "absl/status/status.h"

#endif  // VEMESH_BASE_STATUS_CODES_H_
