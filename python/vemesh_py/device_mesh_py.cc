#include "device_mesh_py.h"

#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "communicator_py.h"
#include "elastic_py.h"
#include "errors.h"
#include "vemesh/layout/device_type.h"
#include "vemesh/mesh/device_mesh.h"
#include "vemesh/registry/ve_device_mesh.h"

namespace py = pybind11;

namespace vemesh::python {
namespace {

py::list ToList(const Coordinate& c) {
  py::list out;
  for (int64_t v : c) out.append(v);
  return out;
}

// The member ranks as an int64 array of the mesh's shape (PyTorch's
// DeviceMesh.mesh, a tensor; .tolist() gives the same nesting).
py::array_t<int64_t> RanksArray(const DeviceMesh& mesh) {
  std::vector<int64_t> ranks = mesh.mesh();
  std::vector<py::ssize_t> shape;
  for (int64_t s : mesh.shape()) shape.push_back(static_cast<py::ssize_t>(s));
  py::array_t<int64_t> out(shape);
  std::copy(ranks.begin(), ranks.end(), out.mutable_data());
  return out;
}

// A dimension given as a str (name) or an int (index); None for a 1-D mesh
// (PyTorch's mesh_dim=None).
template <typename F>
auto ByDim(const DeviceMesh& mesh, const py::object& dim, const char* what,
           F&& f) {
  if (dim.is_none()) {
    if (mesh.ndim() != 1) {
      RaiseStatus(absl::InvalidArgumentError(absl::StrCat(
          what, ": mesh_dim may be left out only on a 1-D mesh; this mesh has ",
          mesh.ndim(), " dimensions (",
          absl::StrJoin(mesh.mesh_dim_names(), ", "), "): name one")));
    }
    return f(int64_t{0});
  }
  if (py::isinstance<py::str>(dim)) return f(dim.cast<std::string>());
  if (py::isinstance<py::int_>(dim)) return f(dim.cast<int64_t>());
  PyErr_SetString(
      PyExc_TypeError,
      absl::StrCat(what, ": mesh_dim must be a str, an int or None").c_str());
  throw py::error_already_set();
}

DeviceMesh Index(const DeviceMesh& mesh, const py::object& key) {
  if (py::isinstance<py::str>(key)) {
    return Unwrap(mesh[key.cast<std::string>()]);
  }
  if (py::isinstance<py::int_>(key)) return Unwrap(mesh[key.cast<int64_t>()]);
  if (py::isinstance<py::tuple>(key) || py::isinstance<py::list>(key)) {
    return Unwrap(mesh.slice(key.cast<std::vector<std::string>>()));
  }
  PyErr_SetString(PyExc_TypeError,
                  "mesh[...]: expected a dimension name, an index, or a tuple "
                  "of names");
  throw py::error_already_set();
}

}  // namespace

std::vector<std::string> NamesFrom(const py::object& names) {
  if (names.is_none()) return {};
  return names.cast<std::vector<std::string>>();
}

MeshOptions MeshOptionsFrom(
    std::optional<double> timeout, std::optional<std::string> backend,
    std::optional<std::map<std::string, std::string>> backend_override) {
  MeshOptions o;
  if (timeout) {
    if (!std::isfinite(*timeout) || *timeout <= 0) {
      RaiseStatus(absl::InvalidArgumentError(absl::StrCat(
          "timeout: ", *timeout, " is not a number of seconds > 0")));
    }
    o.timeout = absl::Seconds(*timeout);
  }
  if (backend) o.backend = *backend;
  if (backend_override) o.backend_override = *backend_override;
  return o;
}

void RegisterDeviceMesh(py::module_& m) {
  py::class_<DeviceMesh>(
      m, "DeviceMesh",
      "A mesh bound to this process: PyTorch's DeviceMesh names. A cheap "
      "handle; children (mesh['tp'], mesh[('dp', 'tp')]) share their "
      "parent's communicators.")
      .def_property_readonly(
          "device_type",
          [](const DeviceMesh& d) {
            return std::string(DeviceTypeName(d.device_type()));
          })
      .def_property_readonly("mesh", &RanksArray)
      .def_property_readonly(
          "shape",
          [](const DeviceMesh& d) { return py::tuple(py::cast(d.shape())); })
      .def_property_readonly("ndim", &DeviceMesh::ndim)
      .def_property_readonly("mesh_dim_names",
                             [](const DeviceMesh& d) {
                               return py::tuple(py::cast(d.mesh_dim_names()));
                             })
      .def(
          "size",
          [](const DeviceMesh& d, const py::object& dim) -> int64_t {
            if (dim.is_none()) return d.size();
            return ByDim(d, dim, "size",
                         [&](auto x) { return Unwrap(d.size(x)); });
          },
          py::arg("mesh_dim") = py::none())
      .def("get_rank", &DeviceMesh::global_rank)
      .def("get_coordinate",
           [](const DeviceMesh& d) -> py::object {
             // PyTorch answers None for a rank outside the mesh.
             if (!d.has_self()) return py::none();
             return ToList(Unwrap(d.get_coordinate()));
           })
      .def(
          "get_local_rank",
          [](const DeviceMesh& d, const py::object& dim) {
            return ByDim(d, dim, "get_local_rank",
                         [&](auto x) { return Unwrap(d.get_local_rank(x)); });
          },
          py::arg("mesh_dim") = py::none())
      .def(
          "get_group",
          [](const DeviceMesh& d, const py::object& dim) {
            return ByDim(d, dim, "get_group",
                         [&](auto x) { return Unwrap(d.get_group(x)); });
          },
          py::arg("mesh_dim") = py::none())
      .def("get_all_groups",
           [](const DeviceMesh& d) { return Unwrap(d.get_all_groups()); })
      .def("__getitem__", &Index)
      .def(
          "flatten",
          [](const DeviceMesh& d, const py::object& dims,
             const std::string& name) {
            std::vector<std::string> names =
                dims.is_none() ? d.mesh_dim_names() : NamesFrom(dims);
            absl::StatusOr<DeviceMesh> out;
            {
              py::gil_scoped_release nogil;
              out = d.flatten_mesh(names, name);
            }
            return Unwrap(std::move(out));
          },
          py::arg("mesh_dims") = py::none(), py::arg("mesh_dim_name") = "",
          "Collective: the 1-D mesh of `mesh_dims` (default: all) flattened "
          "into one dimension named `mesh_dim_name` (default: the names "
          "joined by '_'). PyTorch's DeviceMesh._flatten.")
      .def_static(
          "concatenate",
          [](const std::vector<DeviceMesh>& meshes) {
            return Unwrap(DeviceMesh::concatenate(meshes));
          },
          py::arg("device_mesh_list"),
          "One mesh whose dimensions are those of the given sub-meshes of "
          "one root, in order (PyTorch's DeviceMesh._concatenate): local, no "
          "new communicator. Overlapping meshes or meshes of different roots "
          "raise ValueError.")
      .def_static(
          "_concatenate",
          [](const std::vector<DeviceMesh>& meshes) {
            return Unwrap(DeviceMesh::concatenate(meshes));
          },
          py::arg("device_mesh_list"), "PyTorch's spelling of concatenate.")
      .def(
          "abort", [](const DeviceMesh& d) { ThrowIfError(d.abort()); },
          "Aborts every group of this mesh, its children and flattenings: "
          "their operations raise at once (DeviceMesh::abort).")
      .def(
          "shrink",
          [](const DeviceMesh& d, const std::string& dim,
             std::vector<int64_t> exclude) {
            absl::StatusOr<DeviceMesh> out;
            {
              py::gil_scoped_release nogil;
              out = d.shrink(dim, exclude);
            }
            return Unwrap(std::move(out));
          },
          py::arg("mesh_dim"), py::arg("exclude"),
          "Collective over the survivors: this mesh without the coordinates "
          "`exclude` of `mesh_dim` (DeviceMesh::shrink).")
      .def(
          "_flatten",
          [](const DeviceMesh& d, const std::string& name) {
            absl::StatusOr<DeviceMesh> out;
            {
              py::gil_scoped_release nogil;
              out = d.flatten_mesh(d.mesh_dim_names(), name);
            }
            return Unwrap(std::move(out));
          },
          py::arg("mesh_dim_name") = "")
      .def(
          "unflatten",
          [](const DeviceMesh& d, const py::object& dim,
             std::vector<int64_t> sizes, const py::object& names) {
            std::vector<std::string> n = NamesFrom(names);
            absl::StatusOr<DeviceMesh> out;
            if (py::isinstance<py::int_>(dim)) {
              const int64_t i = dim.cast<int64_t>();
              py::gil_scoped_release nogil;
              out = d.unflatten(i, sizes, n);
            } else {
              const std::string s = dim.cast<std::string>();
              py::gil_scoped_release nogil;
              out = d.unflatten(s, sizes, n);
            }
            return Unwrap(std::move(out));
          },
          py::arg("dim"), py::arg("mesh_sizes"), py::arg("mesh_dim_names"),
          "Collective: dimension `dim` split into `mesh_dim_names` of "
          "`mesh_sizes`. PyTorch's DeviceMesh._unflatten.")
      .def("same_root", &DeviceMesh::same_root)
      .def("host_local_rank", &DeviceMesh::host_local_rank)
      .def(
          "backend",
          [](const DeviceMesh& d, const std::string& dim) {
            return Unwrap(d.backend(dim));
          },
          py::arg("mesh_dim"))
      .def("__eq__",
           [](const DeviceMesh& a, const DeviceMesh& b) { return a == b; })
      .def("__hash__",
           [](const DeviceMesh& d) {
             return static_cast<py::ssize_t>(absl::HashOf(d));
           })
      .def("__repr__", &DeviceMesh::ToString);

  m.def(
      "init_device_mesh",
      [](const std::string& device_type, std::vector<int64_t> mesh_shape,
         const py::object& mesh_dim_names, std::optional<double> timeout,
         std::optional<std::string> backend,
         std::optional<std::map<std::string, std::string>> backend_override,
         const py::object& elastic) {
        const std::vector<std::string> names = NamesFrom(mesh_dim_names);
        const MeshOptions o = MeshOptionsFrom(timeout, std::move(backend),
                                              std::move(backend_override));
        std::optional<ElasticOptions> el = ElasticOptionsFrom(elastic);
        absl::StatusOr<DeviceMesh> mesh;
        {
          py::gil_scoped_release nogil;
          if (el) {
            // The elastic mesh lives in the registry (it replaces the
            // registry's mesh at every membership epoch).
            InitOptions io;
            io.mesh = o;
            io.elastic = el;
            mesh = VeDeviceMesh::Instance().init_device_mesh(
                device_type, mesh_shape, names, std::move(io));
          } else {
            mesh = init_device_mesh(device_type, mesh_shape, names, o);
          }
        }
        if (mesh.ok() && el) NoteElasticInit(*el);
        return Unwrap(std::move(mesh));
      },
      py::arg("device_type"), py::arg("mesh_shape"),
      py::arg("mesh_dim_names") = py::none(), py::kw_only(),
      py::arg("timeout") = py::none(), py::arg("backend") = py::none(),
      py::arg("backend_override") = py::none(), py::arg("elastic") = py::none(),
      "Collective over the job: PyTorch's init_device_mesh. device_type is "
      "'cpu', 'cuda', 'cuda:N' or 'meta'. Beyond PyTorch: timeout (seconds "
      "to wait for every rank), backend ('mpi', 'gloo', 'nccl'), "
      "backend_override ({dim: backend}) and elastic (a vemesh.ElasticOptions: "
      "an elastic job through VESCALE_DEVICE_MESH, whose mesh this returns; "
      "see vemesh.elastic).");
}

}  // namespace vemesh::python
