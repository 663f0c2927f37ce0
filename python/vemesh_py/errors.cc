#include "errors.h"

#include <string>

#include "absl/status/status.h"

namespace py = pybind11;

namespace vemesh::python {
namespace {

// vemesh.Error, made once by RegisterErrors (the module lives as long as
// the interpreter, and so does this reference).
PyObject* g_error = nullptr;

}  // namespace

void RaiseStatus(const absl::Status& status) {
  py::gil_scoped_acquire gil;
  const std::string message(status.message());
  PyObject* type = g_error;
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
      type = PyExc_ValueError;
      break;
    case absl::StatusCode::kNotFound:
      type = PyExc_KeyError;
      break;
    case absl::StatusCode::kDeadlineExceeded:
      type = PyExc_TimeoutError;
      break;
    default:
      break;
  }
  if (type != g_error || g_error == nullptr) {
    PyErr_SetString(type != nullptr ? type : PyExc_RuntimeError,
                    message.c_str());
    throw py::error_already_set();
  }
  // vemesh.Error(message) with .code and .message attributes.
  py::object error = py::reinterpret_borrow<py::object>(g_error)(message);
  error.attr("code") = absl::StatusCodeToString(status.code());
  error.attr("message") = message;
  PyErr_SetObject(g_error, error.ptr());
  throw py::error_already_set();
}

void RegisterErrors(py::module_& m) {
  static py::exception<std::exception> error(m, "Error", PyExc_RuntimeError);
  g_error = error.ptr();
  error.doc() =
      "A vemesh failure that has no closer Python exception. `code` is the "
      "absl status code's name (FAILED_PRECONDITION, ABORTED, UNAVAILABLE, "
      "...), `message` the text. InvalidArgument raises ValueError, NotFound "
      "KeyError and DeadlineExceeded TimeoutError instead.";
  error.attr("code") = "UNKNOWN";
}

}  // namespace vemesh::python
