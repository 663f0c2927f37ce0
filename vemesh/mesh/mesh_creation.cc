// Making a DeviceMesh: a meta mesh (no communication), one over groups the
// caller made (FromGroups), or a new one (Create: bootstrap, agreement,
// backends' worlds, one split_many per world), and init_device_mesh,
// PyTorch's entry point.

#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "vemesh/base/log.h"
#include "vemesh/base/status_macros.h"
#include "vemesh/bootstrap/agreement.h"
#include "vemesh/bootstrap/bootstrap_over.h"
#include "vemesh/bootstrap/init_timeout.h"
#include "vemesh/bootstrap/launch.h"
#include "vemesh/mesh/device_mesh.h"
#include "vemesh/mesh/internal/mesh_backends.h"
#include "vemesh/mesh/internal/mesh_shared.h"

namespace vemesh {
namespace {

std::string ShapeText(absl::Span<const int64_t> shape) {
  return absl::StrCat("(", absl::StrJoin(shape, ", "), ")");
}

std::string RankListText(const MeshLayout& layout) {
  if (!layout.has_rank_table()) return "arange";
  return absl::StrCat("[", absl::StrJoin(layout.ranks(), ", "), "]");
}

}  // namespace

DeviceMesh DeviceMesh::Meta(MeshLayout layout, int64_t global_rank) {
  auto shared =
      std::make_shared<Shared>(DeviceType::kMeta, layout, global_rank);
  return DeviceMesh(std::move(shared), std::move(layout));
}

absl::StatusOr<DeviceMesh> DeviceMesh::FromGroups(
    DeviceType device_type, MeshLayout layout, int64_t global_rank,
    std::vector<std::shared_ptr<Communicator>> groups, int host_local_rank,
    int host_size) {
  if (device_type == DeviceType::kMeta) {
    return absl::InvalidArgumentError(
        "DeviceMesh::FromGroups: a meta mesh has no communicators to adopt");
  }
  if (static_cast<int64_t>(groups.size()) != layout.ndim()) {
    return absl::InvalidArgumentError(
        absl::StrCat("DeviceMesh::FromGroups: ", groups.size(), " groups for ",
                     layout.ToString(), ": expected one per dimension (",
                     layout.ndim(), ")"));
  }
  if (host_size < 1 || host_local_rank < 0 || host_local_rank >= host_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "DeviceMesh::FromGroups: host-local rank ", host_local_rank,
        " of a host of ", host_size, ": expected 0 <= rank < size"));
  }
  VEMESH_ASSIGN_OR_RETURN(auto coord, layout.coordinate_of(global_rank));
  for (int64_t d = 0; d < layout.ndim(); ++d) {
    const std::string& name = layout.dim_name(d);
    const Communicator* g = groups[d].get();
    if (g == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "DeviceMesh::FromGroups: no group for dimension '", name, "'"));
    }
    const int64_t size = layout.dim_size(d).value_or(-1);
    if (g->size() != size || g->rank() != coord[d]) {
      return absl::InvalidArgumentError(
          absl::StrCat("DeviceMesh::FromGroups: the group of '", name,
                       "' has rank ", g->rank(), " of ", g->size(),
                       ": expected rank ", coord[d], " of ", size));
    }
    Coordinate at = coord;
    for (int64_t i = 0; i < size; ++i) {
      at[d] = i;
      VEMESH_ASSIGN_OR_RETURN(auto expected, layout.rank_at(at));
      if (g->ranks()[i] != expected) {
        return absl::InvalidArgumentError(absl::StrCat(
            "DeviceMesh::FromGroups: the group of '", name, "' holds rank ",
            g->ranks()[i], " at index ", i, ": expected ", expected));
      }
    }
  }
  auto shared = std::make_shared<Shared>(device_type, layout, global_rank);
  shared->host_local_rank = host_local_rank;
  shared->host_size = host_size;
  shared->dims = std::move(groups);
  return DeviceMesh(std::move(shared), std::move(layout));
}

absl::StatusOr<DeviceMesh> DeviceMesh::Create(DeviceType device_type,
                                              MeshLayout layout,
                                              const MeshOptions& options) {
  if (device_type == DeviceType::kMeta) {
    return Meta(std::move(layout), LauncherRank());
  }
  absl::Duration timeout;
  if (options.timeout.has_value()) {
    timeout = *options.timeout;
  } else {
    VEMESH_ASSIGN_OR_RETURN(timeout, DefaultInitTimeout());
  }
  // A finite bound: Gloo and the stores take it in milliseconds, and an
  // infinite one would read as "Timed out waiting 9223372036854775807ms".
  if (timeout <= absl::ZeroDuration() || timeout > absl::Hours(24)) {
    return absl::InvalidArgumentError(
        absl::StrCat("MeshOptions.timeout is ", absl::FormatDuration(timeout),
                     ": expected a positive duration of at most a day (24h)"));
  }
  const absl::Time deadline = absl::Now() + timeout;

  // (1) The bootstrap.
  std::shared_ptr<Bootstrap> bootstrap = options.bootstrap;
  if (bootstrap == nullptr && options.world != nullptr) {
    VEMESH_ASSIGN_OR_RETURN(auto made,
                            MakeBootstrapOver(*options.world, deadline));
    bootstrap = std::move(made);
  }
  if (bootstrap == nullptr) {
    VEMESH_ASSIGN_OR_RETURN(auto launched, LaunchBootstrap(deadline));
    bootstrap = std::move(launched);
  }
  const int world_rank = bootstrap->rank();
  const int world_size = bootstrap->size();

  // Each dimension's backend, decided locally and checked in the agreement.
  VEMESH_ASSIGN_OR_RETURN(
      auto plan, PlanBackends(device_type, layout, *bootstrap, options));

  // (2) Agreement, host identities and the bootstrap's host world in one
  // step (under MPI: one all-gather, closed by the world's MPI_Comm_idup).
  const std::vector<AgreementField> fields = {
      {"device type", std::string(DeviceTypeName(device_type))},
      {"shape", ShapeText(layout.shape())},
      {"dim names",
       absl::StrCat("[", absl::StrJoin(layout.dim_names(), ", "), "]")},
      {"ranks", RankListText(layout)},
      {"backends", DimBackendsText(plan)},
  };
  VEMESH_ASSIGN_OR_RETURN(
      AgreedWorld agreed,
      AgreeAndMakeWorld(*bootstrap, "DeviceMesh::Create", fields,
                        HostIdentity(), deadline, timeout));
  const std::vector<std::string>& hosts = agreed.payloads;

  // (3) The mesh fits the world (the same answer on every rank now).
  if (layout.size() > world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("mesh ", layout.ToString(), " has ", layout.size(),
                     " ranks but the world has only ", world_size));
  }
  if (layout.has_rank_table()) {
    for (int64_t r : layout.ranks()) {
      if (r >= world_size) {
        return absl::InvalidArgumentError(
            absl::StrCat("mesh ", layout.ToString(), " holds rank ", r,
                         " but the world has ranks 0..", world_size - 1));
      }
    }
  }

  // A mesh smaller than the world is allowed (PyTorch allows it) but is
  // often a typo ({2, 2} for {2, 4}): say so once, from world rank 0.
  if (layout.size() < world_size && world_rank == 0) {
    LogWarning(absl::StrCat("mesh ", layout.ToString(), " covers ",
                            layout.size(), " of the world's ", world_size,
                            " ranks; the other ", world_size - layout.size(),
                            " are outside it (was the shape meant to multiply "
                            "to ",
                            world_size, "?)"));
  }

  auto shared = std::make_shared<Shared>(device_type, layout, world_rank);
  shared->timeout = timeout;
  shared->bootstrap = bootstrap;

  // (4) Where this rank sits on its host (the GPU it binds for cuda).
  const std::string& mine = hosts[world_rank];
  for (int r = 0; r < world_size; ++r) {
    if (hosts[r] != mine) continue;
    if (r < world_rank) ++shared->host_local_rank;
  }
  shared->host_size =
      static_cast<int>(std::count(hosts.begin(), hosts.end(), mine));
  // Moved, not copied: one string per world rank (issue 32: O(world)
  // allocations per rank were part of creation's CPU).
  shared->world_hosts = std::make_shared<const std::vector<std::string>>(
      std::move(agreed.payloads));
  const LauncherLocal launcher = LauncherLocalRank();
  if (options.world == nullptr && launcher.rank >= 0 &&
      launcher.rank != shared->host_local_rank) {
    LogWarning(absl::StrCat(
        "rank ", world_rank, ": ", launcher.variable, "=", launcher.rank,
        " says local rank ", launcher.rank, " but the host identities say ",
        shared->host_local_rank, "; using ", shared->host_local_rank));
  }

  // (5) The backends' worlds.
  auto backends = MeshBackends::Create(
      *bootstrap, std::move(plan), std::move(agreed.world),
      CudaDeviceRequest{options.cuda_device, shared->host_local_rank,
                        shared->host_size},
      shared->host_size == world_size, deadline, timeout, options.nccl);
  if (!backends.ok()) return backends.status();
  shared->backends = *std::move(backends);
  // Null while the NCCL world waits for its first use (torchrun): then
  // DeviceWorld() makes it.
  if (!(shared->backends->default_backend() == Backend::kNccl &&
        shared->backends->nccl_deferred())) {
    VEMESH_ASSIGN_OR_RETURN(shared->device_world,
                            shared->backends->default_world());
  }
  for (int64_t d = 0; d < layout.ndim(); ++d) shared->backend_dim.push_back(d);

  // (6) The dimensions' groups: one split_many per backend world, worlds in
  // the order of their first dimension (the same calls in the same order on
  // every rank). NCCL builds all its dimensions' communicators in one group.
  const bool member = layout.contains(world_rank);
  const int64_t ndim = layout.ndim();
  std::vector<SplitRequest> requests(static_cast<size_t>(ndim));
  for (int64_t d = 0; d < ndim; ++d) {
    VEMESH_ASSIGN_OR_RETURN(
        requests[d],
        DimSplitRequest(layout, layout.dim_name(d), world_rank, member));
  }
  shared->dims.resize(static_cast<size_t>(ndim));
  std::vector<bool> made(static_cast<size_t>(ndim), false);
  for (int64_t d = 0; d < ndim; ++d) {
    if (made[d]) continue;
    const Backend backend = shared->backends->dim_backend(d);
    std::vector<int64_t> dims;
    std::vector<SplitRequest> batch;
    dims.reserve(static_cast<size_t>(ndim - d));
    batch.reserve(static_cast<size_t>(ndim - d));
    for (int64_t e = d; e < ndim; ++e) {
      if (shared->backends->dim_backend(e) != backend) continue;
      dims.push_back(e);
      batch.push_back(std::move(requests[e]));  // each is used once
      made[e] = true;
    }
    // Each backend makes its own groups (mesh_backends.h: split_dims): one
    // split_many of its world, or, NCCL over a Gloo world not connected
    // yet (env://), NCCL communicators with ids through the store. Over
    // such a world the groups connect among their members in one store
    // round, and neither the world's pairs nor a world NCCL communicator
    // is made.
    VEMESH_ASSIGN_OR_RETURN(
        auto groups, shared->backends->split_dims(
                         backend, absl::StrCat("dims", d), batch, deadline));
    for (size_t i = 0; i < dims.size(); ++i) {
      shared->dims[dims[i]] = std::move(groups[i]);
    }
  }
  // (7) Placement warnings, once per job: from global rank 0, after every
  // rank made its groups (so the mesh works whatever is said).
  // A world on one host has no group that crosses hosts, so nothing to
  // warn about: the O(world) placement is skipped (issue 32).
  if (world_rank == 0 && !options.latency_sensitive_dims.empty() &&
      shared->host_size < world_size) {
    auto placement = ComputePlacement(layout, *shared->world_hosts);
    if (placement.ok()) {
      for (const std::string& warning : PlacementWarnings(
               *placement, layout, options.latency_sensitive_dims)) {
        LogWarning(warning);
      }
    }
  }
  return DeviceMesh(std::move(shared), std::move(layout));
}

absl::StatusOr<DeviceMesh> init_device_mesh(
    absl::string_view device_type, absl::Span<const int64_t> mesh_shape,
    absl::Span<const std::string> mesh_dim_names, const MeshOptions& options) {
  VEMESH_ASSIGN_OR_RETURN(auto parsed, ParseDeviceType(device_type));
  if (!parsed.warning.empty()) {
    LogWarning(parsed.warning);
  }
  VEMESH_ASSIGN_OR_RETURN(
      auto layout,
      MeshLayout::Create(mesh_shape, mesh_dim_names, options.ranks));
  if (parsed.index < 0) {
    return DeviceMesh::Create(parsed.type, std::move(layout), options);
  }
  MeshOptions with_device = options;  // "cuda:N": device N on this rank
  with_device.cuda_device = parsed.index;
  return DeviceMesh::Create(parsed.type, std::move(layout), with_device);
}

}  // namespace vemesh
