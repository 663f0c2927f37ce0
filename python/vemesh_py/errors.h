// python/vemesh_py/errors.h
//
// absl::Status -> Python exception, with the status's message unchanged:
//
//   InvalidArgument   -> ValueError
//   NotFound          -> KeyError
//   DeadlineExceeded  -> TimeoutError
//   anything else     -> vemesh.Error, whose .code is the absl code's name
//                        ("FAILED_PRECONDITION", "ABORTED", ...)
//
//   DeviceMesh mesh = Unwrap(init_device_mesh("cpu", {2, 2}));  // or raises
//   ThrowIfError(comm->barrier());

#ifndef VEMESH_PYTHON_ERRORS_H_
#define VEMESH_PYTHON_ERRORS_H_

#include <pybind11/pybind11.h>

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace vemesh::python {

// Sets the Python error for `status` (not OK) and throws
// pybind11::error_already_set.
[[noreturn]] void RaiseStatus(const absl::Status& status);

inline void ThrowIfError(const absl::Status& status) {
  if (!status.ok()) RaiseStatus(status);
}

template <typename T>
T Unwrap(absl::StatusOr<T> value) {
  if (!value.ok()) RaiseStatus(value.status());
  return *std::move(value);
}

// Defines vemesh.Error in `m`.
void RegisterErrors(pybind11::module_& m);

}  // namespace vemesh::python

#endif  // VEMESH_PYTHON_ERRORS_H_
