// python/vemesh_py/device_mesh_py.h
//
// vemesh.DeviceMesh and vemesh.init_device_mesh with PyTorch's names:
//
//   mesh = vemesh.init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
//   mesh["tp"].get_group()          # the TP Communicator of this rank
//   mesh[("dp", "tp")]              # 2-D slice
//   mesh.get_local_rank("dp"), mesh.get_coordinate(), mesh.mesh.tolist()
//   mesh.flatten(("dp", "tp"), "dp_tp")   # collective; PyTorch's _flatten
//   mesh.unflatten("dp", (1, 2), ("a", "b"))
//
// Collective calls (init_device_mesh, flatten, unflatten, view) release the
// GIL while they communicate.

#ifndef VEMESH_PYTHON_DEVICE_MESH_PY_H_
#define VEMESH_PYTHON_DEVICE_MESH_PY_H_

#include <pybind11/pybind11.h>

#include <optional>
#include <string>
#include <vector>

#include "vemesh/mesh/mesh_options.h"

namespace vemesh::python {

// MeshOptions from the keyword arguments both init_device_mesh functions
// take beyond PyTorch's: timeout (seconds), backend, backend_override.
MeshOptions MeshOptionsFrom(
    std::optional<double> timeout, std::optional<std::string> backend,
    std::optional<std::map<std::string, std::string>> backend_override);

// Dimension names from None or a sequence of str.
std::vector<std::string> NamesFrom(const pybind11::object& names);

void RegisterDeviceMesh(pybind11::module_& m);

}  // namespace vemesh::python

#endif  // VEMESH_PYTHON_DEVICE_MESH_PY_H_
