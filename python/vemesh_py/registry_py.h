// python/vemesh_py/registry_py.h
//
// vemesh.VESCALE_DEVICE_MESH: the process's one registry
// (vemesh/registry/ve_device_mesh.h) with veScale's Python names, so a
// veScale script runs with `from vemesh import VESCALE_DEVICE_MESH`:
//
//   VESCALE_DEVICE_MESH.init_device_mesh("cpu", (2, 2),
//                                        mesh_dim_names=("DP", "TP"))
//   VESCALE_DEVICE_MESH.get_tensor_parallel_rank()
//   VESCALE_DEVICE_MESH["TP"].mesh.tolist()
//   VESCALE_DEVICE_MESH.get_data_parallel_dim_groups().all_reduce(grad)
//   VESCALE_DEVICE_MESH.shape, VESCALE_DEVICE_MESH.ndim
//
// Every failing query raises (errors.h): before init_device_mesh,
// vemesh.Error with code FAILED_PRECONDITION.

#ifndef VEMESH_PYTHON_REGISTRY_PY_H_
#define VEMESH_PYTHON_REGISTRY_PY_H_

#include <pybind11/pybind11.h>

namespace vemesh::python {

void RegisterRegistry(pybind11::module_& m);

}  // namespace vemesh::python

#endif  // VEMESH_PYTHON_REGISTRY_PY_H_
