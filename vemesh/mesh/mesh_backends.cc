#include "vemesh/mesh/internal/mesh_backends.h"

#include <algorithm>
#include <cstdlib>
#include <set>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "vemesh/bootstrap/launch.h"
#include "vemesh/bootstrap/store_bootstrap.h"
#include "vemesh/comm/nccl/nccl_communicator.h"
#include "vemesh/rendezvous/tcp/tcp_store.h"
#include "vemesh/rendezvous/tcp/tcp_store_server.h"
#include "vemesh/base/status_macros.h"

namespace vemesh {
namespace {

absl::Status CheckBackend(absl::string_view what, const std::string& backend,
                          DeviceType device_type, const Bootstrap& bootstrap) {
  if (backend != "mpi" && backend != "gloo" && backend != "nccl") {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " '", backend, "': expected 'mpi', 'gloo' or 'nccl'"));
  }
  if (backend == "mpi" && bootstrap.kind() != "mpi") {
    return absl::FailedPreconditionError(absl::StrCat(
        what, " 'mpi' needs an MPI launcher (mpirun, srun --mpi=pmix), but "
        "this job was started without one (", bootstrap.reason(),
        "): use 'gloo'"));
  }
  if (backend == "nccl" && device_type != DeviceType::kCuda) {
    return absl::FailedPreconditionError(absl::StrCat(
        what, " 'nccl' needs device type 'cuda', not '",
        DeviceTypeName(device_type), "'"));
  }
  return absl::OkStatus();
}

// The host world that goes with the bootstrap: no store needed for either.
std::string NaturalHostBackend(const Bootstrap& bootstrap) {
  return bootstrap.kind() == "mpi" ? "mpi" : "gloo";
}

// Gloo under an MPI launcher: rank 0 hosts a store on an ephemeral port and
// tells the others where, over the MPI bootstrap.
absl::StatusOr<std::shared_ptr<Bootstrap>> GlooBootstrapOverMpi(
    Bootstrap& bootstrap, bool one_host, absl::Time deadline,
    std::unique_ptr<TcpStoreServer>* server) {
  std::string address;
  if (bootstrap.rank() == 0) {
    // One host: loopback; several: an address the others can reach.
    const std::string host = one_host ? "127.0.0.1" : AdvertisedAddress();
    VEMESH_ASSIGN_OR_RETURN(auto started, TcpStoreServer::Start(host, 0));
    *server = std::move(started);
    address = absl::StrCat(host, " ", (*server)->port());
  }
  VEMESH_ASSIGN_OR_RETURN(auto all, bootstrap.all_gather(address, deadline));
  const std::string& zero = all[0];
  const size_t space = zero.find(' ');
  int port = 0;
  if (space == std::string::npos ||
      !absl::SimpleAtoi(zero.substr(space + 1), &port)) {
    return absl::InternalError(
        absl::StrCat("rank 0 sent a malformed store address '", zero, "'"));
  }
  const std::string host = zero.substr(0, space);
  TcpStoreOptions store_options;
  store_options.timeout = std::max(deadline - absl::Now(), absl::Seconds(1));
  VEMESH_ASSIGN_OR_RETURN(
      auto store, TcpStore::Connect(host, port, deadline, store_options));
  std::string local_host;
  if (const char* forced = std::getenv("VEMESH_GLOO_HOST"); forced && *forced) {
    local_host = forced;
  } else {
    VEMESH_ASSIGN_OR_RETURN(auto local, LocalAddressTowards(host));
    local_host = local;
  }
  return std::shared_ptr<Bootstrap>(std::make_shared<StoreBootstrap>(
      std::shared_ptr<Store>(std::move(store)), bootstrap.rank(),
      bootstrap.size(), "vemesh/gloo-over-mpi",
      "a store hosted by rank 0 over the MPI bootstrap", local_host));
}

}  // namespace

absl::StatusOr<BackendPlan> PlanBackends(DeviceType device_type,
                                         const MeshLayout& layout,
                                         const Bootstrap& bootstrap,
                                         const MeshOptions& options) {
  BackendPlan plan;
  if (!options.backend.empty()) {
    plan.default_backend = options.backend;
    plan.reason = "MeshOptions.backend";
  } else if (device_type == DeviceType::kCuda) {
    plan.default_backend = "nccl";
    plan.reason = absl::StrCat("device type cuda; unique id over the ",
                               bootstrap.kind(), " bootstrap: ",
                               bootstrap.reason());
  } else {
    plan.default_backend = NaturalHostBackend(bootstrap);
    plan.reason = bootstrap.reason();
  }
  absl::Status status = CheckBackend("MeshOptions.backend",
                                     plan.default_backend, device_type,
                                     bootstrap);
  if (!status.ok()) return status;
  plan.dims.assign(static_cast<size_t>(layout.ndim()), plan.default_backend);
  for (const auto& [dim, backend] : options.backend_override) {
    auto index = layout.dim_index(dim);
    if (!index.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "MeshOptions.backend_override names dimension '", dim,
          "', which the mesh does not have: ", index.status().message()));
    }
    status = CheckBackend(absl::StrCat("MeshOptions.backend_override['", dim,
                                       "']"),
                          backend, device_type, bootstrap);
    if (!status.ok()) return status;
    plan.dims[*index] = backend;
  }
  return plan;
}

absl::StatusOr<std::unique_ptr<MeshBackends>> MeshBackends::Create(
    Bootstrap& bootstrap, BackendPlan plan,
    std::shared_ptr<Communicator> host_world,
    const CudaDeviceRequest& cuda_device, bool one_host,
    absl::Time deadline, absl::Duration op_timeout,
    const NcclOptions& nccl_options) {
  std::unique_ptr<MeshBackends> out(new MeshBackends());
  std::set<std::string> used(plan.dims.begin(), plan.dims.end());
  used.insert(plan.default_backend);
  const std::string host = NaturalHostBackend(bootstrap);
  // Always there: NCCL's twin, and the cheapest world to have (made with
  // the agreement step, Bootstrap::all_gather_and_world).
  if (host_world == nullptr) {
    return absl::InternalError("MeshBackends::Create: no host world");
  }
  out->worlds_[host] = std::move(host_world);
  if (used.count("gloo") > 0 && host != "gloo") {
    VEMESH_ASSIGN_OR_RETURN(
        auto gloo_boot,
        GlooBootstrapOverMpi(bootstrap, one_host, deadline, &out->server_));
    out->gloo_bootstrap_ = std::move(gloo_boot);
    VEMESH_ASSIGN_OR_RETURN(auto gloo,
                            out->gloo_bootstrap_->world(deadline, op_timeout));
    out->worlds_["gloo"] = std::move(gloo);
  }
  if (used.count("nccl") > 0) {
    VEMESH_ASSIGN_OR_RETURN(
        auto nccl, CreateNcclCommunicator(out->worlds_[host], cuda_device,
                                          nccl_options));
    out->worlds_["nccl"] = std::move(nccl);
  }
  out->plan_ = std::move(plan);
  return out;
}

MeshBackends::~MeshBackends() {
  // Communicators go before the store that their peers may still read.
  worlds_.clear();
  gloo_bootstrap_.reset();
}

const std::shared_ptr<Communicator>& MeshBackends::default_world() const {
  return worlds_.at(plan_.default_backend);
}

const std::shared_ptr<Communicator>& MeshBackends::world_of_dim(
    int64_t dim) const {
  return worlds_.at(plan_.dims[dim]);
}

std::string MeshBackends::ToString() const {
  std::string out = absl::StrCat("backend=", plan_.default_backend);
  std::vector<std::string> others;
  for (size_t d = 0; d < plan_.dims.size(); ++d) {
    if (plan_.dims[d] != plan_.default_backend) {
      others.push_back(absl::StrCat("dim ", d, ":", plan_.dims[d]));
    }
  }
  if (!others.empty()) absl::StrAppend(&out, " [", absl::StrJoin(others, ", "), "]");
  absl::StrAppend(&out, " (", plan_.reason, ")");
  return out;
}

}  // namespace vemesh
