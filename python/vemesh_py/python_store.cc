#include "python_store.h"

#include <pybind11/chrono.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <chrono>
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

std::chrono::milliseconds Until(absl::Time deadline) {
  const absl::Duration left =
      std::max(deadline - absl::Now(), absl::Milliseconds(1));
  // An infinite deadline: a day, torch's timedelta has a bound.
  return std::chrono::milliseconds(
      absl::ToInt64Milliseconds(std::min(left, absl::Hours(24))));
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
  py::gil_scoped_acquire gil;
  try {
    store_.attr("wait")(std::vector<std::string>(keys.begin(), keys.end()),
                        Until(deadline));
  } catch (py::error_already_set& e) {
    const bool late = absl::Now() >= deadline;
    return FromPython(e,
                      late ? absl::StatusCode::kDeadlineExceeded
                           : absl::StatusCode::kUnavailable,
                      absl::StrCat("wait for ", keys.size(), " keys (",
                                   keys.empty() ? "" : keys[0], "...)"));
  }
  return absl::OkStatus();
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
    const std::string k(key);
    std::string now =
        store_.attr("compare_set")(k, Bytes(expected), Bytes(desired))
            .cast<std::string>();
    // torch 1.13's TCPStore wakes no waiter on a compare_set: the same
    // value set again does (no other writer can change it in between, as
    // compare_set only replaces `expected`).
    if (now == desired && expected != desired) {
      store_.attr("set")(k, Bytes(desired));
    }
    return now;
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
