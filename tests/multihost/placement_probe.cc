// One rank of a multi-host job, for the emulated-host tests
// (tests/multihost/): builds the registry's mesh and prints, in one line,
// where this rank really runs (gethostname: the emulated host's UTS name)
// next to what vemesh made of it (host-local rank, host size) and the global
// ranks of each of its dimension groups:
//
//   placement_probe --mesh PP=2,DP=2,TP=2 [--timeout SECONDS]
//   PROBE rank=5 hostname=node1 host_local_rank=1 host_size=4 group.PP=1,5
//   group.DP=5,7 group.TP=4,5
//
// Rank 0 also prints vemesh's own account, get_placement() as JSON:
//
//   PLACEMENT {"vemesh_placement": 1, "world_size": 8, ...}
//
// check_probe.py compares those lines with each other: the hostnames are the
// truth. A failure prints "PROBE_ERROR rank=R: <status>" and exits 1.
// Started by mpirun (MPI) or by an env:// launcher (Gloo, no MPI).
#include <unistd.h>

#include <climits>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "vemesh/bootstrap/launch.h"
#include "vemesh/comm/mpi/mpi_environment.h"
#include "vemesh/layout/mesh_spec.h"
#include "vemesh/placement/placement.h"
#include "vemesh/registry/ve_device_mesh.h"

namespace {

struct ProbeFlags {
  std::string mesh = "PP=2,DP=2,TP=2";
  double timeout_s = 30;
};

// --mesh SPEC / --mesh=SPEC, --timeout S / --timeout=S.
absl::StatusOr<ProbeFlags> ParseFlags(int argc, char** argv) {
  ProbeFlags flags;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    std::string value;
    std::string name = arg;
    if (const size_t eq = arg.find('='); eq != std::string::npos) {
      name = arg.substr(0, eq);
      value = arg.substr(eq + 1);
    } else if (i + 1 < argc) {
      value = argv[++i];
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("flag '", arg, "' needs a value"));
    }
    if (name == "--mesh") {
      flags.mesh = value;
    } else if (name == "--timeout") {
      if (!absl::SimpleAtod(value, &flags.timeout_s) || flags.timeout_s <= 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--timeout=", value, ": expected a positive number of seconds"));
      }
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          "unknown flag '", name, "' (expected --mesh or --timeout)"));
    }
  }
  return flags;
}

// The probe's line (two on rank 0), or the first error on the way to it.
absl::StatusOr<std::string> ProbeLine(const ProbeFlags& flags) {
  absl::StatusOr<vemesh::MeshSpec> spec = vemesh::ParseMeshSpec(flags.mesh);
  if (!spec.ok()) return spec.status();
  vemesh::InitOptions options;
  options.mesh.timeout = absl::Seconds(flags.timeout_s);
  absl::StatusOr<vemesh::DeviceMesh> mesh =
      VESCALE_DEVICE_MESH.init_device_mesh("cpu", spec->shape, spec->names,
                                           options);
  if (!mesh.ok()) return mesh.status();

  char host[HOST_NAME_MAX + 1] = {};
  if (gethostname(host, sizeof(host) - 1) != 0) {
    return absl::InternalError("gethostname failed");
  }
  std::string line =
      absl::StrCat("PROBE rank=", mesh->global_rank(), " hostname=", host,
                   " host_local_rank=", mesh->host_local_rank(),
                   " host_size=", mesh->host_size());
  for (const std::string& dim : mesh->mesh_dim_names()) {
    auto group = mesh->get_group(dim);
    if (!group.ok()) return group.status();
    absl::StrAppend(&line, " group.", dim, "=",
                    absl::StrJoin((*group)->ranks(), ","));
  }
  if (mesh->global_rank() == 0) {
    absl::StatusOr<vemesh::Placement> placement =
        VESCALE_DEVICE_MESH.get_placement();
    if (!placement.ok()) return placement.status();
    absl::StrAppend(&line, "\nPLACEMENT ", placement->ToJson());
  }
  return line;
}

}  // namespace

int main(int argc, char** argv) {
  absl::StatusOr<ProbeFlags> flags = ParseFlags(argc, argv);
  if (!flags.ok()) {
    std::fprintf(stderr, "placement_probe: %s\n",
                 std::string(flags.status().message()).c_str());
    return 2;
  }
  // MPI only when an MPI launcher started the job (env:// runs on Gloo).
  auto launch = vemesh::DetectLaunch();
  if (!launch.ok()) {
    std::fprintf(stderr, "placement_probe: %s\n",
                 std::string(launch.status().message()).c_str());
    return 2;
  }
  std::optional<vemesh::MpiSession> mpi;
  if (launch->kind != vemesh::LaunchKind::kEnv) {
    mpi.emplace(&argc, &argv);
    if (!mpi->status().ok()) {
      std::fprintf(stderr, "placement_probe: MPI failed to start: %s\n",
                   std::string(mpi->status().message()).c_str());
      return 1;
    }
  }
  absl::StatusOr<std::string> line = ProbeLine(*flags);
  if (!line.ok()) {
    std::printf("PROBE_ERROR rank=%d: %s\n", vemesh::LauncherRank(),
                line.status().ToString().c_str());
    std::fflush(stdout);
    return 1;
  }
  // One write, so lines of different ranks do not mix.
  std::printf("%s\n", line->c_str());
  std::fflush(stdout);
  VESCALE_DEVICE_MESH.reset();
  return 0;
}
