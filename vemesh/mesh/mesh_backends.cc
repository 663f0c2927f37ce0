#include "vemesh/mesh/internal/mesh_backends.h"

#include <algorithm>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "vemesh/base/status_macros.h"
#include "vemesh/bootstrap/launch.h"
#include "vemesh/bootstrap/rank0_store.h"
#include "vemesh/comm/gloo/gloo_communicator.h"
#include "vemesh/comm/nccl/nccl_communicator.h"
#include "vemesh/rendezvous/tcp/tcp_store_server.h"

namespace vemesh {
namespace {

// The backend `name` names, if this job can use it for a `device_type`
// mesh; `what` names the option in errors.
absl::StatusOr<Backend> CheckBackend(absl::string_view what,
                                     const std::string& name,
                                     DeviceType device_type,
                                     const Bootstrap& bootstrap) {
  VEMESH_ASSIGN_OR_RETURN(const Backend backend, ParseBackend(name, what));
  if (backend == Backend::kMpi && bootstrap.kind() != "mpi") {
    return absl::FailedPreconditionError(absl::StrCat(
        what,
        " 'mpi' needs an MPI launcher (mpirun, srun --mpi=pmix), but "
        "this job was started without one (",
        bootstrap.reason(), "): use 'gloo'"));
  }
  if (backend == Backend::kNccl && device_type != DeviceType::kCuda) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, " 'nccl' needs device type 'cuda', not '",
                     DeviceTypeName(device_type), "'"));
  }
  return backend;
}

// The host world that goes with the bootstrap: no store needed for either.
Backend NaturalHostBackend(const Bootstrap& bootstrap) {
  return bootstrap.kind() == "mpi" ? Backend::kMpi : Backend::kGloo;
}

// Gloo under an MPI launcher: rank 0 hosts a store on an ephemeral port and
// tells the others where, over the MPI bootstrap.
absl::StatusOr<std::shared_ptr<Bootstrap>> GlooBootstrapOverMpi(
    Bootstrap& bootstrap, bool one_host, absl::Time deadline,
    std::unique_ptr<TcpStoreServer>* server) {
  Rank0StoreSpec spec;
  spec.rank = bootstrap.rank();
  spec.size = bootstrap.size();
  if (bootstrap.rank() == 0) {
    // One host: loopback; several: an address the others can reach.
    spec.host = one_host ? "127.0.0.1" : AdvertisedAddress();
    spec.bind = spec.host;
  }
  spec.port = 0;
  spec.announce = &bootstrap;
  spec.prefix = "vemesh/gloo-over-mpi";
  spec.reason = "a store hosted by rank 0 over the MPI bootstrap";
  spec.context = "Gloo over the MPI bootstrap";
  VEMESH_ASSIGN_OR_RETURN(Rank0Store store, StartRank0Store(spec, deadline));
  *server = std::move(store.server);
  return std::shared_ptr<Bootstrap>(std::move(store.bootstrap));
}

}  // namespace

absl::StatusOr<BackendPlan> PlanBackends(DeviceType device_type,
                                         const MeshLayout& layout,
                                         const Bootstrap& bootstrap,
                                         const MeshOptions& options) {
  BackendPlan plan;
  if (!options.backend.empty()) {
    VEMESH_ASSIGN_OR_RETURN(plan.default_backend,
                            CheckBackend("MeshOptions.backend", options.backend,
                                         device_type, bootstrap));
    plan.reason = "MeshOptions.backend";
  } else if (device_type == DeviceType::kCuda) {
    plan.default_backend = Backend::kNccl;
    plan.reason =
        absl::StrCat("device type cuda; unique id over the ", bootstrap.kind(),
                     " bootstrap: ", bootstrap.reason());
  } else {
    plan.default_backend = NaturalHostBackend(bootstrap);
    plan.reason = bootstrap.reason();
  }
  plan.dims.assign(static_cast<size_t>(layout.ndim()), plan.default_backend);
  for (const auto& [dim, backend] : options.backend_override) {
    auto index = layout.dim_index(dim);
    if (!index.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "MeshOptions.backend_override names dimension '", dim,
          "', which the mesh does not have: ", index.status().message()));
    }
    VEMESH_ASSIGN_OR_RETURN(
        plan.dims[*index],
        CheckBackend(absl::StrCat("MeshOptions.backend_override['", dim, "']"),
                     backend, device_type, bootstrap));
  }
  return plan;
}

std::string DimBackendsText(const BackendPlan& plan) {
  return absl::StrJoin(plan.dims, ", ", [](std::string* out, Backend b) {
    absl::StrAppend(out, BackendName(b));
  });
}

absl::StatusOr<std::unique_ptr<MeshBackends>> MeshBackends::Create(
    Bootstrap& bootstrap, BackendPlan plan,
    std::shared_ptr<Communicator> host_world,
    const CudaDeviceRequest& cuda_device, bool one_host, absl::Time deadline,
    absl::Duration op_timeout, const NcclOptions& nccl_options) {
  std::unique_ptr<MeshBackends> out(new MeshBackends());
  std::set<Backend> used(plan.dims.begin(), plan.dims.end());
  used.insert(plan.default_backend);
  const Backend host = NaturalHostBackend(bootstrap);
  // Always there: NCCL's twin, and the cheapest world to have (made with
  // the agreement step, Bootstrap::all_gather_and_world).
  if (host_world == nullptr) {
    return absl::InternalError("MeshBackends::Create: no host world");
  }
  out->worlds_[host] = std::move(host_world);
  if (used.count(Backend::kGloo) > 0 && host != Backend::kGloo) {
    VEMESH_ASSIGN_OR_RETURN(
        auto gloo_boot,
        GlooBootstrapOverMpi(bootstrap, one_host, deadline, &out->server_));
    out->gloo_bootstrap_ = std::move(gloo_boot);
    VEMESH_ASSIGN_OR_RETURN(auto gloo,
                            out->gloo_bootstrap_->world(deadline, op_timeout));
    out->worlds_[Backend::kGloo] = std::move(gloo);
  }
  out->host_ = host;
  out->cuda_device_ = cuda_device;
  out->nccl_options_ = nccl_options;
  out->op_timeout_ = op_timeout;
  if (used.count(Backend::kNccl) > 0) {
    if (GlooCommunicator::UnconnectedWorld(out->worlds_[host].get()) !=
        nullptr) {
      // torchrun / env://: the dimensions' NCCL groups take their ids from
      // the store (DeviceMesh::Create), and the world's NCCL communicator
      // waits for a use that needs it (world()).
      out->nccl_deferred_ = true;
    } else {
      VEMESH_ASSIGN_OR_RETURN(
          auto nccl, CreateNcclCommunicator(out->worlds_[host], cuda_device,
                                            nccl_options));
      out->worlds_[Backend::kNccl] = std::move(nccl);
    }
  }
  out->plan_ = std::move(plan);
  return out;
}

absl::StatusOr<std::shared_ptr<Communicator>> MeshBackends::world(
    Backend backend) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = worlds_.find(backend);
  if (it != worlds_.end()) return it->second;
  if (backend != Backend::kNccl || !nccl_deferred_) {
    return absl::InternalError(
        absl::StrCat("MeshBackends: no ", BackendName(backend), " world"));
  }
  // Collective: the first use of the NCCL world is the same call on every
  // rank (a flatten or an unflatten); it connects the host world too.
  VEMESH_ASSIGN_OR_RETURN(
      auto nccl,
      CreateNcclCommunicator(worlds_[host_], cuda_device_, nccl_options_));
  nccl_deferred_ = false;
  worlds_[Backend::kNccl] = nccl;
  return nccl;
}

absl::StatusOr<std::vector<std::shared_ptr<Communicator>>>
MeshBackends::split_dims(Backend backend, absl::string_view batch,
                         absl::Span<const SplitRequest> requests,
                         absl::Time deadline) {
  if (backend == Backend::kNccl && nccl_deferred()) {
    // NCCL over a Gloo world not connected yet (env://): the groups' host
    // twins in one store round, then their NCCL communicators with ids
    // through the store. Ranks outside the mesh take part in the ready
    // agreement only.
    return CreateNcclGroupsOverWorld(host_world(), batch, requests,
                                     cuda_device_, op_timeout_, nccl_options_);
  }
  VEMESH_ASSIGN_OR_RETURN(std::shared_ptr<Communicator> comm, world(backend));
  return comm->split_many(requests, deadline);
}

bool MeshBackends::nccl_deferred() const {
  std::lock_guard<std::mutex> lock(mu_);
  return nccl_deferred_;
}

std::shared_ptr<Communicator> MeshBackends::host_world() const {
  std::lock_guard<std::mutex> lock(mu_);
  return worlds_.at(host_);
}

MeshBackends::~MeshBackends() {
  // Communicators go before the store that their peers may still read.
  std::lock_guard<std::mutex> lock(mu_);
  worlds_.clear();
  gloo_bootstrap_.reset();
}

absl::StatusOr<std::shared_ptr<Communicator>> MeshBackends::default_world() {
  return world(plan_.default_backend);
}

absl::StatusOr<std::shared_ptr<Communicator>> MeshBackends::world_of_dim(
    int64_t dim) {
  return world(plan_.dims[dim]);
}

std::string MeshBackends::ToString() const {
  std::string out =
      absl::StrCat("backend=", BackendName(plan_.default_backend));
  std::vector<std::string> others;
  for (size_t d = 0; d < plan_.dims.size(); ++d) {
    if (plan_.dims[d] != plan_.default_backend) {
      others.push_back(
          absl::StrCat("dim ", d, ":", BackendName(plan_.dims[d])));
    }
  }
  if (!others.empty())
    absl::StrAppend(&out, " [", absl::StrJoin(others, ", "), "]");
  absl::StrAppend(&out, " (", plan_.reason, ")");
  return out;
}

}  // namespace vemesh
