#include "registry_py.h"

#include <pybind11/stl.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "device_mesh_py.h"
#include "elastic_py.h"
#include "errors.h"
#include "vemesh/registry/ve_device_mesh.h"

namespace py = pybind11;

namespace vemesh::python {
namespace {

using Reg = VeDeviceMesh;

py::list ToList(const Coordinate& c) {
  py::list out;
  for (int64_t v : c) out.append(v);
  return out;
}

DeviceMesh Init(Reg& r, const std::string& device_type,
                std::vector<int64_t> mesh_shape,
                const py::object& mesh_dim_names, bool check_uniqueness,
                std::optional<double> timeout,
                std::optional<std::string> backend,
                std::optional<std::map<std::string, std::string>> override,
                const py::object& elastic) {
  InitOptions o;
  o.mesh = MeshOptionsFrom(timeout, std::move(backend), std::move(override));
  o.check_uniqueness = check_uniqueness;
  o.elastic = ElasticOptionsFrom(elastic);
  const std::optional<ElasticOptions> el = o.elastic;
  std::vector<std::string> names = NamesFrom(mesh_dim_names);
  absl::StatusOr<DeviceMesh> mesh;
  {
    py::gil_scoped_release nogil;
    mesh = r.init_device_mesh(device_type, std::move(mesh_shape),
                              std::move(names), std::move(o));
  }
  if (mesh.ok() && el) NoteElasticInit(*el);
  return Unwrap(std::move(mesh));
}

// A stage neighbour as (stage, peer, mesh), or None.
py::object Neighbor(absl::StatusOr<std::optional<StageNeighbor>> n) {
  std::optional<StageNeighbor> v = Unwrap(std::move(n));
  if (!v) return py::none();
  return py::make_tuple(v->stage, v->peer, v->mesh);
}

template <typename F>
auto ByDim(const py::object& dim, F&& f) {
  if (py::isinstance<py::int_>(dim)) return f(dim.cast<int64_t>());
  return f(dim.cast<std::string>());
}

}  // namespace

void RegisterRegistry(py::module_& m) {
  py::class_<Reg, std::unique_ptr<Reg, py::nodelete>> cls(
      m, "VeDeviceMesh",
      "The process's one device mesh, veScale's VESCALE_DEVICE_MESH. Use the "
      "module's VESCALE_DEVICE_MESH instance.");
  cls.def("init_device_mesh", &Init, py::arg("device_type"),
          py::arg("mesh_shape"), py::kw_only(),
          py::arg("mesh_dim_names") = py::none(),
          py::arg("check_uniqueness") = false, py::arg("timeout") = py::none(),
          py::arg("backend") = py::none(),
          py::arg("backend_override") = py::none(),
          py::arg("elastic") = py::none(),
          "Collective: builds the global mesh and makes it current. "
          "check_uniqueness: a second init raises (ALREADY_EXISTS) instead "
          "of replacing the mesh. elastic: a vemesh.ElasticOptions (or a "
          "dict of its fields): the dimension elastic.replica_dim spans one "
          "launch per replica and follows the membership "
          "(vemesh.elastic, docs/TORCH.md).")
      .def(
          "_elastic", [](const Reg&) { return CurrentElastic(); },
          "The elastic mesh of the current init (a _C._ElasticMesh), or "
          "None; vemesh.elastic wraps it as VESCALE_DEVICE_MESH.elastic().")
      .def("get",
           [](Reg& r, const py::kwargs& kwargs) {
             // veScale: get(**init_device_mesh kwargs) initialises first.
             if (kwargs.size() > 0) {
               py::object init = py::cast(&r).attr("init_device_mesh");
               return init(**kwargs).cast<DeviceMesh>();
             }
             return Unwrap(r.get());
           })
      .def("reset",
           [](Reg& r) {
             py::gil_scoped_release nogil;
             r.reset();
           })
      .def("is_initialized", &Reg::is_initialized)
      .def("is_current", &Reg::is_current, py::arg("mesh"))
      .def("__getitem__",
           [](const Reg& r, const py::object& key) {
             if (py::isinstance<py::int_>(key)) {
               return Unwrap(r[key.cast<int64_t>()]);
             }
             if (py::isinstance<py::str>(key)) {
               return Unwrap(r[key.cast<std::string>()]);
             }
             return Unwrap(r.get_submesh(key.cast<std::vector<std::string>>()));
           })
      .def(
          "get_submesh",
          [](const Reg& r, std::vector<std::string> dims) {
            return Unwrap(r.get_submesh(dims));
          },
          py::arg("mesh_dims"))
      .def(
          "get_strategy_size",
          [](const Reg& r, const py::object& dim) {
            return ByDim(
                dim, [&](auto d) { return Unwrap(r.get_strategy_size(d)); });
          },
          py::arg("dim"))
      .def(
          "get_strategy_coordinate",
          [](const Reg& r, std::optional<int64_t> local_rank) {
            if (!local_rank) return ToList(Unwrap(r.get_strategy_coordinate()));
            return ToList(Unwrap(r.get_strategy_coordinate(*local_rank)));
          },
          py::arg("local_rank") = py::none(),
          "This rank's coordinate, or global rank `local_rank`'s (veScale's "
          "keyword name).")
      .def(
          "lookup_rank",
          [](const Reg& r, const py::object& dim) {
            return ByDim(dim, [&](auto d) { return Unwrap(r.lookup_rank(d)); });
          },
          py::arg("dim"))
      .def(
          "get_global_rank",
          [](const Reg& r, std::vector<int64_t> coordinate) {
            return Unwrap(r.get_global_rank(coordinate));
          },
          py::arg("coordinate"))
      .def("get_rank", [](const Reg& r) { return Unwrap(r.get_rank()); })
      .def("get_local_rank",
           [](const Reg& r) { return Unwrap(r.get_local_rank()); })
      .def("get_coordinate",
           [](const Reg& r) { return ToList(Unwrap(r.get_coordinate())); })
      .def(
          "size",
          [](const Reg& r, const py::object& dim) -> int64_t {
            if (dim.is_none()) return Unwrap(r.size());
            return ByDim(dim, [&](auto d) { return Unwrap(r.size(d)); });
          },
          py::arg("dim") = py::none())
      .def_property_readonly("ndim",
                             [](const Reg& r) { return Unwrap(r.ndim()); })
      .def_property_readonly("shape",
                             [](const Reg& r) { return Unwrap(r.shape()); })
      .def_property_readonly(
          "mesh_dim_names",
          [](const Reg& r) {
            return py::tuple(py::cast(Unwrap(r.mesh_dim_names())));
          })
      // Roles by name.
      .def("get_role_size",
           [](const Reg& r, const std::string& role) {
             return Unwrap(r.get_role_size(role));
           })
      .def("get_role_rank",
           [](const Reg& r, const std::string& role) {
             return Unwrap(r.get_role_rank(role));
           })
      .def("get_role_mesh",
           [](const Reg& r, const std::string& role) {
             return Unwrap(r.get_role_mesh(role));
           })
      .def("get_role_dim_groups",
           [](const Reg& r, const std::string& role) {
             return Unwrap(r.get_role_dim_groups(role));
           })
      .def("get_global_role_meshes",
           [](const Reg& r, const std::string& role) {
             return Unwrap(r.get_global_role_meshes(role));
           })
      // veScale's role getters.
      .def("get_pipeline_parallel_rank",
           [](const Reg& r) { return Unwrap(r.get_pipeline_parallel_rank()); })
      .def("get_data_parallel_rank",
           [](const Reg& r) { return Unwrap(r.get_data_parallel_rank()); })
      .def("get_tensor_parallel_rank",
           [](const Reg& r) { return Unwrap(r.get_tensor_parallel_rank()); })
      .def("get_pipeline_parallel_mesh",
           [](const Reg& r) { return Unwrap(r.get_pipeline_parallel_mesh()); })
      .def("get_data_parallel_mesh",
           [](const Reg& r) { return Unwrap(r.get_data_parallel_mesh()); })
      .def("get_tensor_parallel_mesh",
           [](const Reg& r) { return Unwrap(r.get_tensor_parallel_mesh()); })
      .def("get_pipeline_parallel_dim_groups",
           [](const Reg& r) {
             return Unwrap(r.get_pipeline_parallel_dim_groups());
           })
      .def(
          "get_data_parallel_dim_groups",
          [](const Reg& r) { return Unwrap(r.get_data_parallel_dim_groups()); })
      .def("get_tensor_parallel_dim_groups",
           [](const Reg& r) {
             return Unwrap(r.get_tensor_parallel_dim_groups());
           })
      .def("get_global_tensor_parallel_meshes",
           [](const Reg& r) {
             return Unwrap(r.get_global_tensor_parallel_meshes());
           })
      .def("get_global_pipeline_parallel_meshes",
           [](const Reg& r) {
             return Unwrap(r.get_global_pipeline_parallel_meshes());
           })
      .def("is_first_stage",
           [](const Reg& r) { return Unwrap(r.is_first_stage()); })
      .def("is_last_stage",
           [](const Reg& r) { return Unwrap(r.is_last_stage()); })
      // Pipeline neighbours: (stage, peer global rank, stage mesh) or None.
      .def(
          "get_prev_stage",
          [](const Reg& r, bool wrap) {
            return Neighbor(r.get_prev_stage(wrap));
          },
          py::arg("wrap") = false)
      .def(
          "get_next_stage",
          [](const Reg& r, bool wrap) {
            return Neighbor(r.get_next_stage(wrap));
          },
          py::arg("wrap") = false)
      .def(
          "get_prev_stage_peer",
          [](const Reg& r, bool wrap) {
            return Unwrap(r.get_prev_stage_peer(wrap));
          },
          py::arg("wrap") = false)
      .def(
          "get_next_stage_peer",
          [](const Reg& r, bool wrap) {
            return Unwrap(r.get_next_stage_peer(wrap));
          },
          py::arg("wrap") = false)
      .def("__repr__", [](const Reg& r) -> std::string {
        absl::StatusOr<DeviceMesh> mesh = r.get();
        if (!mesh.ok()) return "VESCALE_DEVICE_MESH(not initialised)";
        return "VESCALE_DEVICE_MESH(" + mesh->ToString() + ")";
      });
  m.attr("VESCALE_DEVICE_MESH") =
      py::cast(&VeDeviceMesh::Instance(), py::return_value_policy::reference);
}

}  // namespace vemesh::python
