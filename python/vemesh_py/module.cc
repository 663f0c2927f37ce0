// python/vemesh_py/module.cc
//
// The `vemesh._C` extension module (python/vemesh/__init__.py re-exports
// it): the registry (VESCALE_DEVICE_MESH), the DeviceMesh and
// init_device_mesh, Communicator and Work, the errors and checkpoints
// (_checkpoint, vemesh.checkpoint's C++ part), the elastic mesh
// (ElasticOptions, Recovery, _ElasticMesh: vemesh.elastic's C++ part). At
// import, a process started by an MPI launcher (mpirun, srun) starts MPI here,
// as the C++ programs do at the top of main (examples/train_nd), and vemesh
// finalises it at exit; under torchrun (env://) MPI is never touched. A launch
// that cannot work (a bad RANK, an agent-hosted store) never fails the import:
// the first init_device_mesh reports it.
//
// Beside torch.distributed in one process (env://): the launch meets through
// torch's store when torch.distributed is initialised first (vemesh/_meeting.py
// says which store), and gives MASTER_PORT back once it met there when vemesh
// is first, so that torch binds it after (EnvLaunchPolicy, launch.h).

#include <pybind11/pybind11.h>

#ifndef VEMESH_NO_MPI
#include <dlfcn.h>
#endif

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "bench_py.h"
#include "checkpoint_py.h"
#include "communicator_py.h"
#include "device_mesh_py.h"
#include "elastic_py.h"
#include "errors.h"
#include "python_store.h"
#include "registry_py.h"
#include "vemesh/bootstrap/launch.h"
#ifndef VEMESH_NO_MPI
#include "vemesh/comm/mpi/mpi_environment.h"
#endif

namespace py = pybind11;

namespace vemesh::python {
namespace {

// Under an MPI launcher: MPI_Init_thread (MPI_THREAD_MULTIPLE) now. Open
// MPI's plugins resolve libmpi's symbols globally, and Python loads this
// module with RTLD_LOCAL, so libmpi is promoted to RTLD_GLOBAL first (what
// mpi4py does).
void StartMpiIfLaunched() {
  absl::StatusOr<LaunchInfo> launch = DetectLaunch();
  // LaunchBootstrap (init_device_mesh) reads the variables again and raises.
  if (!launch.ok() || launch->kind != LaunchKind::kMpi) return;
#ifndef VEMESH_NO_MPI
  for (const char* lib : {"libmpi.so.40", "libmpi.so"}) {
    if (dlopen(lib, RTLD_NOW | RTLD_GLOBAL | RTLD_NOLOAD) != nullptr) break;
  }
  // A failure is not raised here: init_device_mesh starts MPI again and
  // reports it.
  py::gil_scoped_release nogil;
  (void)EnsureMpiInitialized(absl::Now() + absl::Seconds(120));
#endif
}

// vemesh._meeting.meeting_store(rank, world_size): None, or (store,
// description) of a torch store every rank of the job reaches.
absl::StatusOr<ExternalStore> MeetingStore(const LaunchInfo& info) {
  if (!Py_IsInitialized()) return ExternalStore{};
  py::gil_scoped_acquire gil;
  try {
    py::object found = py::module_::import("vemesh._meeting")
                           .attr("meeting_store")(info.rank, info.world_size);
    if (found.is_none()) return ExternalStore{};
    auto pair = found.cast<py::tuple>();
    ExternalStore out;
    out.store = std::make_shared<PythonStore>(pair[0]);
    out.description = pair[1].cast<std::string>();
    return out;
  } catch (py::error_already_set& e) {
    return absl::FailedPreconditionError(absl::StrCat(
        "env:// launch: looking for torch.distributed's store: ", e.what()));
  }
}

void SetLaunchPolicy() {
  EnvLaunchPolicy policy;
  policy.release_master_port = true;
  policy.meeting_store = &MeetingStore;
  SetEnvLaunchPolicy(std::move(policy));
}

}  // namespace
}  // namespace vemesh::python

PYBIND11_MODULE(_C, m) {
  using namespace vemesh::python;
  m.doc() =
      "vemesh: one named N-D device mesh per process (veScale's "
      "VESCALE_DEVICE_MESH, PyTorch's DeviceMesh) with MPI, Gloo and NCCL "
      "communicators on numpy arrays and DLPack tensors. See the README's "
      "Python section.";
  RegisterErrors(m);
  RegisterCommunicator(m);
  RegisterDeviceMesh(m);
  RegisterRegistry(m);
  RegisterBench(m);
  RegisterCheckpoint(m);
  RegisterElastic(m);
  SetLaunchPolicy();
  StartMpiIfLaunched();
}
