// python/vemesh_py/communicator_py.h
//
// vemesh.Communicator and vemesh.Work: one mesh dimension's group, with
// PyTorch's collective names on numpy arrays and DLPack tensors, in place.
//
//   tp = mesh.get_group("TP")
//   tp.all_reduce(grad, op="sum")            # blocks, GIL released
//   w = tp.all_reduce(grad, async_op=True)   # or tp.iall_reduce(grad)
//   w.wait(timeout=30.0)                     # TimeoutError past it
//
// A blocking call or Work.wait releases the GIL and looks at the Python
// signal flags every 50 ms: Ctrl-C (KeyboardInterrupt) aborts the
// communicator (an unfinished collective cannot be taken back) and raises.
// A Communicator object holds its group: it outlives the mesh that handed
// it out. A Work holds its group and its buffers until it completes, even
// when the Python Work is dropped first.

#ifndef VEMESH_PYTHON_COMMUNICATOR_PY_H_
#define VEMESH_PYTHON_COMMUNICATOR_PY_H_

#include <pybind11/pybind11.h>

#include <memory>

#include "vemesh/comm/communicator.h"

namespace vemesh::python {

// The Python object of a communicator (pybind11 holds the shared_ptr).
pybind11::object WrapCommunicator(std::shared_ptr<Communicator> comm);

void RegisterCommunicator(pybind11::module_& m);

}  // namespace vemesh::python

#endif  // VEMESH_PYTHON_COMMUNICATOR_PY_H_
