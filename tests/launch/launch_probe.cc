// One rank of an env:// job, for the launch fault tests (expect_probe.sh):
// initialises a 1-D mesh over the whole job with a short timeout, checks an
// all_reduce, and prints one line:
//
//   probe rank R: OK (after S s)
//   probe rank R: DEADLINE_EXCEEDED: <message> (after S s)
//
// VEMESH_PROBE_DIE=1 makes the rank join the job's store and then die
// before init (a rank lost during rendezvous). VEMESH_PROBE_VALUE=k makes
// each rank contribute k * (rank + 1), so that a mesh mixing two jobs with
// different k sums wrong (job_race.py).
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/time/clock.h"
#include "vemesh/bootstrap/launch.h"
#include "vemesh/mesh/device_mesh.h"

namespace {

void Report(int rank, const absl::Status& status, absl::Time start) {
  const double took = absl::ToDoubleSeconds(absl::Now() - start);
  if (status.ok()) {
    std::printf("probe rank %d: OK (after %.2f s)\n", rank, took);
  } else {
    std::printf("probe rank %d: %s: %s (after %.2f s)\n", rank,
                absl::StatusCodeToString(status.code()).c_str(),
                std::string(status.message()).c_str(), took);
  }
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  double seconds = 3;
  if (argc > 1 && !absl::SimpleAtod(argv[1], &seconds)) return 2;
  const absl::Time start = absl::Now();
  const absl::Duration timeout = absl::Seconds(seconds);
  const int rank = vemesh::LauncherRank();
  if (const char* die = std::getenv("VEMESH_PROBE_DIE"); die && *die == '1') {
    auto boot = vemesh::LaunchBootstrap(start + timeout);
    std::printf("probe rank %d: dying after joining the store (%s)\n", rank,
                boot.ok() ? "joined" : "did not join");
    std::fflush(stdout);
    _exit(1);
  }
  vemesh::MeshOptions options;
  options.timeout = timeout;
  auto size = vemesh::DetectLaunch();
  if (!size.ok()) {
    Report(rank, size.status(), start);
    return 0;
  }
  const int64_t n = size->world_size > 0 ? size->world_size : 1;
  auto mesh = vemesh::init_device_mesh("cpu", {n}, {"DP"}, options);
  if (!mesh.ok()) {
    Report(rank, mesh.status(), start);
    // A failed job ends promptly, without waiting on anybody.
    std::_Exit(0);
  }
  auto group = mesh->get_group("DP");
  int64_t scale = 1;
  if (const char* v = std::getenv("VEMESH_PROBE_VALUE"); v != nullptr) {
    if (!absl::SimpleAtoi(v, &scale)) return 2;
  }
  int64_t value = scale * (rank + 1);
  absl::Status status = group.ok()
                            ? (*group)->all_reduce(absl::MakeSpan(&value, 1),
                                                   vemesh::ReduceOp::kSum)
                            : group.status();
  if (status.ok() && value != scale * n * (n + 1) / 2) {
    status = absl::InternalError("all_reduce gave a wrong sum");
  }
  Report(rank, status, start);
  // VEMESH_PROBE_HOLD_MS: keep the job (and rank 0's store) up a while, so
  // that a second job started meanwhile meets it.
  if (const char* hold = std::getenv("VEMESH_PROBE_HOLD_MS"); hold != nullptr) {
    int ms = 0;
    if (absl::SimpleAtoi(hold, &ms) && ms > 0) usleep(ms * 1000);
  }
  return status.ok() ? 0 : 1;
}
