#include "python_store.h"

#include <pybind11/stl.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace py = pybind11;

namespace vemesh::python {
namespace {

// The Python error now set, as a status of `code` (the error is cleared).
absl::Status FromPython(py::error_already_set& e, absl::StatusCode code,
                        absl::string_view what) {
  return absl::Status(code, absl::StrCat("torch store ", what, ": ", e.what()));
}

py::bytes Bytes(absl::string_view s) { return py::bytes(s.data(), s.size()); }

// What no vemesh key holds: the answer of compare_set for an absent key.
constexpr absl::string_view kAbsent("\0vemesh: no such key\0", 21);

}  // namespace

PythonStore::PythonStore(py::object store) : store_(std::move(store)) {}

PythonStore::~PythonStore() {
  if (!Py_IsInitialized()) {
    store_.release();  // the interpreter is gone: nothing to release it to
    return;
  }
  py::gil_scoped_acquire gil;
  store_ = py::object();
}

absl::Status PythonStore::set(absl::string_view key, absl::string_view value) {
  if (absl::Status s = CheckStoreValue(key, value); !s.ok()) return s;
  py::gil_scoped_acquire gil;
  try {
    store_.attr("set")(std::string(key), Bytes(value));
  } catch (py::error_already_set& e) {
    return FromPython(e, absl::StatusCode::kUnavailable, "set");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> PythonStore::get(absl::string_view key) {
  if (absl::Status s = CheckStoreKey(key); !s.ok()) return s;
  py::gil_scoped_acquire gil;
  try {
    // One non-blocking look: torch's compare_set of an absent key with a
    // non-empty `expected` stores nothing and answers `expected`. (A wait
    // with a short timeout would leave torch's TCPStore client a reply it
    // no longer expects once the key is set.)
    const py::bytes absent = Bytes(kAbsent);
    std::string value =
        store_.attr("compare_set")(std::string(key), absent, absent)
            .cast<std::string>();
    if (value == kAbsent) {
      return absl::NotFoundError(absl::StrCat("key '", key, "' is not set"));
    }
    return value;
  } catch (py::error_already_set& e) {
    return FromPython(e, absl::StatusCode::kUnavailable, "get");
  }
}

absl::Status PythonStore::wait(absl::Span<const std::string> keys,
                               absl::Time deadline) {
  if (absl::Status s = CheckStoreKeys(keys); !s.ok()) return s;
  // Polled with get, never torch's wait: a torch wait that times out leaves
  // its TCPStore client a reply it no longer expects (the server answers
  // once the key is set), which the next request of that client - torch's
  // own, on its default store - would read as its answer.
  absl::Duration pause = absl::Milliseconds(1);
  size_t present = 0;  // keys are never removed while waited for
  for (;;) {
    while (present < keys.size()) {
      absl::StatusOr<std::string> value = get(keys[present]);
      if (absl::IsNotFound(value.status())) break;
      if (!value.ok()) return value.status();
      ++present;
    }
    if (present == keys.size()) return absl::OkStatus();
    const absl::Time now = absl::Now();
    if (now >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "torch store: ", keys.size() - present, " of ", keys.size(),
          " keys not set by the deadline (first missing: ", keys[present],
          ")"));
    }
    absl::SleepFor(std::min(pause, deadline - now));
    pause = std::min(pause * 2, absl::Milliseconds(20));
  }
}

absl::StatusOr<int64_t> PythonStore::add(absl::string_view key, int64_t delta) {
  if (absl::Status s = CheckStoreKey(key); !s.ok()) return s;
  py::gil_scoped_acquire gil;
  try {
    return store_.attr("add")(std::string(key), delta).cast<int64_t>();
  } catch (py::error_already_set& e) {
    return FromPython(e, absl::StatusCode::kUnavailable, "add");
  }
}

absl::StatusOr<std::string> PythonStore::compare_set(
    absl::string_view key, absl::string_view expected,
    absl::string_view desired) {
  if (absl::Status s = CheckStoreValue(key, desired); !s.ok()) return s;
  py::gil_scoped_acquire gil;
  try {
    return store_
        .attr("compare_set")(std::string(key), Bytes(expected), Bytes(desired))
        .cast<std::string>();
  } catch (py::error_already_set& e) {
    return FromPython(e, absl::StatusCode::kUnavailable, "compare_set");
  }
}

absl::StatusOr<bool> PythonStore::remove(absl::string_view key) {
  if (absl::Status s = CheckStoreKey(key); !s.ok()) return s;
  py::gil_scoped_acquire gil;
  try {
    return store_.attr("delete_key")(std::string(key)).cast<bool>();
  } catch (py::error_already_set& e) {
    return FromPython(e, absl::StatusCode::kUnavailable, "remove");
  }
}

}  // namespace vemesh::python
