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
                const py::object& elastic,
                const std::optional<std::string>& mesh_name) {
  InitOptions o;
  if (mesh_name) o.mesh_name = *mesh_name;
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

// The mesh a getter answers from: mesh_name=None is the default one.
MeshName N(const std::optional<std::string>& mesh_name) {
  return mesh_name ? MeshName(*mesh_name) : MeshName();
}
#define MESH_ARG py::kw_only(), py::arg("mesh_name") = py::none()

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
          py::arg("elastic") = py::none(), py::arg("mesh_name") = py::none(),
          "Collective: builds the global mesh and makes it current. "
          "mesh_name: make (or replace) a named mesh instead, beside the "
          "default one (issue 45: an expert mesh over the same ranks); "
          "every getter takes mesh_name= to answer from it. "
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
             // get(mesh_name="experts"): that mesh.
             if (kwargs.size() == 1 && kwargs.contains("mesh_name")) {
               return Unwrap(r.get(
                   N(kwargs["mesh_name"].is_none()
                         ? std::nullopt
                         : std::optional<std::string>(
                               kwargs["mesh_name"].cast<std::string>()))));
             }
             // veScale: get(**init_device_mesh kwargs) initialises first.
             if (kwargs.size() > 0) {
               py::object init = py::cast(&r).attr("init_device_mesh");
               return init(**kwargs).cast<DeviceMesh>();
             }
             return Unwrap(r.get());
           })
      .def(
          "reset",
          [](Reg& r, const std::optional<std::string>& mesh_name) {
            py::gil_scoped_release nogil;
            r.reset(N(mesh_name));
          },
          MESH_ARG,
          "Forgets the default mesh, or the named one: the others keep "
          "working.")
      .def("reset_all",
           [](Reg& r) {
             py::gil_scoped_release nogil;
             r.reset_all();
           })
      .def("mesh_names", &Reg::mesh_names,
           "The named meshes initialised now (the default one is not among "
           "them).")
      .def(
          "is_initialized",
          [](const Reg& r, const std::optional<std::string>& mesh_name) {
            return r.is_initialized(N(mesh_name));
          },
          MESH_ARG)
      .def(
          "is_current",
          [](const Reg& r, const DeviceMesh& mesh,
             const std::optional<std::string>& mesh_name) {
            return r.is_current(mesh, N(mesh_name));
          },
          py::arg("mesh"), MESH_ARG)
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
          [](const Reg& r, std::vector<std::string> dims,
             const std::optional<std::string>& mesh_name) {
            return Unwrap(r.get_submesh(dims, N(mesh_name)));
          },
          py::arg("mesh_dims"), MESH_ARG)
      .def(
          "get_strategy_size",
          [](const Reg& r, const py::object& dim,
             const std::optional<std::string>& mesh_name) {
            return ByDim(dim, [&](auto d) {
              return Unwrap(r.get_strategy_size(d, N(mesh_name)));
            });
          },
          py::arg("dim"), MESH_ARG)
      .def(
          "get_strategy_coordinate",
          [](const Reg& r, std::optional<int64_t> local_rank,
             const std::optional<std::string>& mesh_name) {
            if (!local_rank) {
              return ToList(Unwrap(r.get_strategy_coordinate(N(mesh_name))));
            }
            return ToList(
                Unwrap(r.get_strategy_coordinate(*local_rank, N(mesh_name))));
          },
          py::arg("local_rank") = py::none(), MESH_ARG,
          "This rank's coordinate, or global rank `local_rank`'s (veScale's "
          "keyword name).")
      .def(
          "lookup_rank",
          [](const Reg& r, const py::object& dim,
             const std::optional<std::string>& mesh_name) {
            return ByDim(dim, [&](auto d) {
              return Unwrap(r.lookup_rank(d, N(mesh_name)));
            });
          },
          py::arg("dim"), MESH_ARG)
      .def(
          "get_global_rank",
          [](const Reg& r, std::vector<int64_t> coordinate,
             const std::optional<std::string>& mesh_name) {
            return Unwrap(r.get_global_rank(coordinate, N(mesh_name)));
          },
          py::arg("coordinate"), MESH_ARG)
      .def(
          "get_rank",
          [](const Reg& r, const std::optional<std::string>& mesh_name) {
            return Unwrap(r.get_rank(N(mesh_name)));
          },
          MESH_ARG)
      .def(
          "get_local_rank",
          [](const Reg& r, const std::optional<std::string>& mesh_name) {
            return Unwrap(r.get_local_rank(N(mesh_name)));
          },
          MESH_ARG)
      .def(
          "get_coordinate",
          [](const Reg& r, const std::optional<std::string>& mesh_name) {
            return ToList(Unwrap(r.get_coordinate(N(mesh_name))));
          },
          MESH_ARG)
      .def(
          "size",
          [](const Reg& r, const py::object& dim,
             const std::optional<std::string>& mesh_name) -> int64_t {
            if (dim.is_none()) return Unwrap(r.size(N(mesh_name)));
            return ByDim(
                dim, [&](auto d) { return Unwrap(r.size(d, N(mesh_name))); });
          },
          py::arg("dim") = py::none(), MESH_ARG)
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
      .def(
          "get_role_size",
          [](const Reg& r, const std::string& role,
             const std::optional<std::string>& mesh_name) {
            return Unwrap(r.get_role_size(role, N(mesh_name)));
          },
          py::arg("role"), MESH_ARG)
      .def(
          "get_role_rank",
          [](const Reg& r, const std::string& role,
             const std::optional<std::string>& mesh_name) {
            return Unwrap(r.get_role_rank(role, N(mesh_name)));
          },
          py::arg("role"), MESH_ARG)
      .def(
          "get_role_mesh",
          [](const Reg& r, const std::string& role,
             const std::optional<std::string>& mesh_name) {
            return Unwrap(r.get_role_mesh(role, N(mesh_name)));
          },
          py::arg("role"), MESH_ARG)
      .def(
          "get_role_dim_groups",
          [](const Reg& r, const std::string& role,
             const std::optional<std::string>& mesh_name) {
            return Unwrap(r.get_role_dim_groups(role, N(mesh_name)));
          },
          py::arg("role"), MESH_ARG)
      .def(
          "get_global_role_meshes",
          [](const Reg& r, const std::string& role,
             const std::optional<std::string>& mesh_name) {
            return Unwrap(r.get_global_role_meshes(role, N(mesh_name)));
          },
          py::arg("role"), MESH_ARG)
      // veScale's role getters.
      .def(
          "get_pipeline_parallel_rank",
          [](const Reg& r, const std::optional<std::string>& mesh_name) {
            return Unwrap(r.get_pipeline_parallel_rank(N(mesh_name)));
          },
          MESH_ARG)
      .def(
          "get_data_parallel_rank",
          [](const Reg& r, const std::optional<std::string>& mesh_name) {
            return Unwrap(r.get_data_parallel_rank(N(mesh_name)));
          },
          MESH_ARG)
      .def(
          "get_tensor_parallel_rank",
          [](const Reg& r, const std::optional<std::string>& mesh_name) {
            return Unwrap(r.get_tensor_parallel_rank(N(mesh_name)));
          },
          MESH_ARG)
      .def(
          "get_pipeline_parallel_mesh",
          [](const Reg& r, const std::optional<std::string>& mesh_name) {
            return Unwrap(r.get_pipeline_parallel_mesh(N(mesh_name)));
          },
          MESH_ARG)
      .def(
          "get_data_parallel_mesh",
          [](const Reg& r, const std::optional<std::string>& mesh_name) {
            return Unwrap(r.get_data_parallel_mesh(N(mesh_name)));
          },
          MESH_ARG)
      .def(
          "get_tensor_parallel_mesh",
          [](const Reg& r, const std::optional<std::string>& mesh_name) {
            return Unwrap(r.get_tensor_parallel_mesh(N(mesh_name)));
          },
          MESH_ARG)
      .def(
          "get_pipeline_parallel_dim_groups",
          [](const Reg& r, const std::optional<std::string>& mesh_name) {
            return Unwrap(r.get_pipeline_parallel_dim_groups(N(mesh_name)));
          },
          MESH_ARG)
      .def(
          "get_data_parallel_dim_groups",
          [](const Reg& r, const std::optional<std::string>& mesh_name) {
            return Unwrap(r.get_data_parallel_dim_groups(N(mesh_name)));
          },
          MESH_ARG)
      .def(
          "get_tensor_parallel_dim_groups",
          [](const Reg& r, const std::optional<std::string>& mesh_name) {
            return Unwrap(r.get_tensor_parallel_dim_groups(N(mesh_name)));
          },
          MESH_ARG)
      .def(
          "get_global_tensor_parallel_meshes",
          [](const Reg& r, const std::optional<std::string>& mesh_name) {
            return Unwrap(r.get_global_tensor_parallel_meshes(N(mesh_name)));
          },
          MESH_ARG)
      .def(
          "get_global_pipeline_parallel_meshes",
          [](const Reg& r, const std::optional<std::string>& mesh_name) {
            return Unwrap(r.get_global_pipeline_parallel_meshes(N(mesh_name)));
          },
          MESH_ARG)
      .def(
          "is_first_stage",
          [](const Reg& r, const std::optional<std::string>& mesh_name) {
            return Unwrap(r.is_first_stage(N(mesh_name)));
          },
          MESH_ARG)
      .def(
          "is_last_stage",
          [](const Reg& r, const std::optional<std::string>& mesh_name) {
            return Unwrap(r.is_last_stage(N(mesh_name)));
          },
          MESH_ARG)
      // Pipeline neighbours: (stage, peer global rank, stage mesh) or None.
      .def(
          "get_prev_stage",
          [](const Reg& r, bool wrap,
             const std::optional<std::string>& mesh_name) {
            return Neighbor(r.get_prev_stage(wrap, N(mesh_name)));
          },
          py::arg("wrap") = false, MESH_ARG)
      .def(
          "get_next_stage",
          [](const Reg& r, bool wrap,
             const std::optional<std::string>& mesh_name) {
            return Neighbor(r.get_next_stage(wrap, N(mesh_name)));
          },
          py::arg("wrap") = false, MESH_ARG)
      .def(
          "get_prev_stage_peer",
          [](const Reg& r, bool wrap,
             const std::optional<std::string>& mesh_name) {
            return Unwrap(r.get_prev_stage_peer(wrap, N(mesh_name)));
          },
          py::arg("wrap") = false, MESH_ARG)
      .def(
          "get_next_stage_peer",
          [](const Reg& r, bool wrap,
             const std::optional<std::string>& mesh_name) {
            return Unwrap(r.get_next_stage_peer(wrap, N(mesh_name)));
          },
          py::arg("wrap") = false, MESH_ARG)
      .def("__repr__", [](const Reg& r) -> std::string {
        absl::StatusOr<DeviceMesh> mesh = r.get();
        if (!mesh.ok()) return "VESCALE_DEVICE_MESH(not initialised)";
        return "VESCALE_DEVICE_MESH(" + mesh->ToString() + ")";
      });
  m.attr("VESCALE_DEVICE_MESH") =
      py::cast(&VeDeviceMesh::Instance(), py::return_value_policy::reference);
}

}  // namespace vemesh::python
