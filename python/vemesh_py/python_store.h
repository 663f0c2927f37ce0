// python/vemesh_py/python_store.h
//
// A vemesh::Store over a Python object with torch.distributed's Store
// methods (set, get, wait, add, compare_set, delete_key): torch's TCPStore,
// PrefixStore or HashStore. vemesh meets through one when torch.distributed
// already holds the job's store (EnvLaunchPolicy, vemesh/bootstrap/launch.h):
//
//   std::shared_ptr<Store> s = std::make_shared<PythonStore>(torch_store);
//   s->set("vemesh/meet/0", "10.0.0.1 41234");
//
// Every call takes the GIL (callers hold it or not). get never blocks, as a
// vemesh Store's must: torch 1.13's Store has no non-blocking lookup, so it
// is a compare_set that stores nothing. wait polls get (1 ms, doubling to
// 20 ms) rather than calling torch's wait, whose timeout leaves its TCPStore
// client a late reply that the next request would read. A torch error is
// Unavailable with its text; a wait past its deadline, DeadlineExceeded.

#ifndef VEMESH_PYTHON_PYTHON_STORE_H_
#define VEMESH_PYTHON_PYTHON_STORE_H_

#include <pybind11/pybind11.h>

#include <string>
#include <vector>

#include "vemesh/rendezvous/store.h"

namespace vemesh::python {

class PythonStore final : public Store {
 public:
  explicit PythonStore(pybind11::object store);
  ~PythonStore() override;

  absl::Status set(absl::string_view key, absl::string_view value) override;
  absl::StatusOr<std::string> get(absl::string_view key) override;
  absl::Status wait(absl::Span<const std::string> keys,
                    absl::Time deadline) override;
  absl::StatusOr<int64_t> add(absl::string_view key, int64_t delta) override;
  absl::StatusOr<std::string> compare_set(absl::string_view key,
                                          absl::string_view expected,
                                          absl::string_view desired) override;
  absl::StatusOr<bool> remove(absl::string_view key) override;

 private:
  pybind11::object store_;
};

}  // namespace vemesh::python

#endif  // VEMESH_PYTHON_PYTHON_STORE_H_
