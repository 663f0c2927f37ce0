// python/vemesh_py/elastic_py.h
//
// The elastic mesh (vemesh/elastic/elastic_mesh.h) from Python: the
// options, the per-step verdict, the recovery record and the mesh's calls.
// The pure-Python layer (python/vemesh/elastic.py) builds the user's API on
// these (state dicts serialised, exceptions turned into step statuses):
//
//   o = vemesh.ElasticOptions(store="redis://127.0.0.1:6379", replica=k,
//                             replica_dim="DP_REPLICATE")
//   VESCALE_DEVICE_MESH.init_device_mesh("cpu", (3, 2),
//       mesh_dim_names=("DP_REPLICATE", "DP_SHARD"), elastic=o)
//   el = VESCALE_DEVICE_MESH._elastic()          # _C._ElasticMesh
//   el.register_state_dict_fn("step", get_bytes, load_from_memoryview)
//   v = el.end_step(None)                        # or ("UNAVAILABLE", text)
//   r = el.recover(step)                         # _C.Recovery
//
// The GIL. end_step, recover and sync_state release it while they
// communicate; the state callbacks run on the thread that called them
// (inside recover, sync_state, or end_step's periodic fingerprint) and take
// the GIL back for the call. No other thread calls into Python.
//
// Lifetime. A handle names the registry's elastic mesh of one init: after
// VESCALE_DEVICE_MESH.reset() or another init_device_mesh every call on it
// raises FAILED_PRECONDITION. The registered Python callables are released
// with the elastic mesh (under the GIL; leaked, not touched, once the
// interpreter is finalising).

#ifndef VEMESH_PYTHON_ELASTIC_PY_H_
#define VEMESH_PYTHON_ELASTIC_PY_H_

#include <pybind11/pybind11.h>

#include <optional>

#include "vemesh/elastic/elastic_mesh.h"

namespace vemesh::python {

// None -> nullopt; an ElasticOptions -> a copy; a dict -> ElasticOptions(**d).
// Anything else is TypeError naming `elastic`.
std::optional<ElasticOptions> ElasticOptionsFrom(
    const pybind11::handle& elastic);

// Called by the init bindings after an elastic init succeeded.
void NoteElasticInit(const ElasticOptions& options);

// The registry's elastic mesh as a _C._ElasticMesh, or None.
pybind11::object CurrentElastic();

void RegisterElastic(pybind11::module_& m);

}  // namespace vemesh::python

#endif  // VEMESH_PYTHON_ELASTIC_PY_H_
