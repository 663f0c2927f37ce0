// python/vemesh_py/bench_py.cc
//
// vemesh._cpp_all_reduce_loop(comm, array, iterations, op="sum") -> seconds:
// the same blocking all_reduce that Communicator.all_reduce makes, called
// `iterations` times from C++ with the GIL released, so that a Python job
// (bench/python_overhead.py) measures the binding's per-call cost against
// the C++ call on the same group, buffers and launcher. Not part of the
// documented API.

#include <pybind11/pybind11.h>

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "bench_py.h"
#include "errors.h"
#include "tensor_buffer.h"
#include "vemesh/comm/communicator.h"

namespace py = pybind11;

namespace vemesh::python {

void RegisterBench(py::module_& m) {
  m.def(
      "_cpp_all_reduce_loop",
      [](const std::shared_ptr<Communicator>& comm, py::handle array,
         int64_t iterations) {
        TensorBuffer b = TensorBuffer::From(array, "array", true);
        absl::Status s;
        absl::Duration took;
        {
          py::gil_scoped_release nogil;
          const absl::Time start = absl::Now();
          for (int64_t i = 0; i < iterations && s.ok(); ++i) {
            s = comm->all_reduce(b.data(), b.data(), b.count(), b.type(),
                                 ReduceOp::kSum);
          }
          took = absl::Now() - start;
        }
        ThrowIfError(s);
        return absl::ToDoubleSeconds(took);
      },
      py::arg("comm"), py::arg("array"), py::arg("iterations"));
}

}  // namespace vemesh::python
