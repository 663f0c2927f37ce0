// bench/torchrun_init.cc
//
// vemesh's cpu mesh creation under torchrun (env://: the store rank 0 hosts,
// Gloo), timed the way bench/torch_mesh_creation.py times torch 1.13's
// new_group per sub-group, so that bench/torchrun_creation.sh can put the
// two side by side under the same torchrun:
//
//   torchrun --no_python --standalone --nproc_per_node=16 --redirects 1
//       --tee 1 build/release/bench/torchrun_init 2,2,4 9     (one line)
//
// Each repetition makes the mesh anew (init_device_mesh; the first, untimed,
// also joins the launcher's store) after a barrier over the previous mesh's
// groups, and a sample is the slowest rank's time (a max all_reduce along
// every dimension of the new mesh). Rank 0 prints one line:
//
//   vemesh world 16 mesh (2,2,4): median 41.2 ms of 9 [..samples..];
//   sockets per rank max 8 (rank 0 9 without its store's); CPU of all
//   ranks per creation 158.0 ms
//
// The CPU is the process's (every thread's, getrusage) over the timed
// init_device_mesh calls only, summed over the ranks: unlike the wall time,
// it does not depend on what else the machine runs.

#include <sys/resource.h>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "open_sockets.h"
#include "vemesh/bootstrap/launch_session.h"
#include "vemesh/mesh/device_mesh.h"

namespace {

int Sockets() { return static_cast<int>(vemesh::OpenSocketInodes().size()); }

// Reduces `v` (max) along every dimension: the whole mesh's max. Also a
// barrier over the mesh.
absl::Status MeshMax(const vemesh::DeviceMesh& mesh,
                     const std::vector<std::string>& names, double* v) {
  for (const std::string& name : names) {
    auto group = mesh.get_group(name);
    if (!group.ok()) return group.status();
    absl::Status s =
        (*group)->all_reduce(absl::MakeSpan(v, 1), vemesh::ReduceOp::kMax);
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

// CPU time of this process so far (all threads), in ms.
double CpuMs() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  auto ms = [](const timeval& t) { return t.tv_sec * 1e3 + t.tv_usec / 1e3; };
  return ms(u.ru_utime) + ms(u.ru_stime);
}

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "torchrun_init: %s\n", s.ToString().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  vemesh::LaunchSession launch(&argc, &argv);
  if (!launch.status().ok()) return Fail(launch.status());
  if (argc < 2) {
    std::fprintf(stderr, "usage: torchrun_init SHAPE [REPS]\n");
    return 2;
  }
  std::vector<int64_t> shape;
  for (absl::string_view s : absl::StrSplit(argv[1], ',')) {
    int64_t v = 0;
    if (!absl::SimpleAtoi(s, &v)) return 2;
    shape.push_back(v);
  }
  int reps = 9;
  if (argc > 2 && !absl::SimpleAtoi(argv[2], &reps)) return 2;
  std::vector<std::string> names;
  for (size_t d = 0; d < shape.size(); ++d) {
    names.push_back(absl::StrCat("d", d));
  }
  vemesh::MeshOptions options;
  options.timeout = absl::Seconds(120);
  std::vector<double> samples;
  double cpu_ms = 0;  // over the timed creations
  absl::StatusOr<vemesh::DeviceMesh> mesh = absl::UnknownError("no mesh yet");
  for (int i = 0; i <= reps; ++i) {
    if (mesh.ok()) {
      double zero = 0;
      if (absl::Status s = MeshMax(*mesh, names, &zero); !s.ok()) {
        return Fail(s);
      }
    }
    const absl::Time start = absl::Now();
    const double cpu_start = CpuMs();
    auto next = vemesh::init_device_mesh("cpu", shape, names, options);
    double ms = absl::ToDoubleMilliseconds(absl::Now() - start);
    if (i > 0) cpu_ms += CpuMs() - cpu_start;
    if (!next.ok()) return Fail(next.status());
    mesh = *std::move(next);  // the previous mesh goes, outside the timing
    if (absl::Status s = MeshMax(*mesh, names, &ms); !s.ok()) return Fail(s);
    if (i > 0) samples.push_back(ms);  // the first also joins the store
  }
  // Sockets after the last creation (the earlier meshes are gone): the
  // largest count over ranks other than 0 (rank 0 also hosts the store).
  const int rank = static_cast<int>(mesh->global_rank());
  double sockets = rank == 0 ? 0 : Sockets();
  const double rank0 = rank == 0 ? Sockets() : 0;
  if (absl::Status s = MeshMax(*mesh, names, &sockets); !s.ok()) {
    return Fail(s);
  }
  for (const std::string& name : names) {  // the sum over every rank
    auto group = mesh->get_group(name);
    if (!group.ok()) return Fail(group.status());
    absl::Status s = (*group)->all_reduce(absl::MakeSpan(&cpu_ms, 1),
                                          vemesh::ReduceOp::kSum);
    if (!s.ok()) return Fail(s);
  }
  if (rank == 0) {
    std::vector<double> sorted = samples;
    std::sort(sorted.begin(), sorted.end());
    const double median = sorted[sorted.size() / 2];
    std::printf(
        "vemesh world %lld mesh (%s): median %.1f ms of %d [%s]; sockets per "
        "rank %d (rank 0: %d, store included); CPU of all ranks per "
        "creation %.1f ms\n",
        static_cast<long long>(mesh->size()), absl::StrJoin(shape, ",").c_str(),
        median, reps,
        absl::StrJoin(samples, " ",
                      [](std::string* out, double v) {
                        absl::StrAppend(out, absl::StrFormat("%.1f", v));
                      })
            .c_str(),
        static_cast<int>(sockets), static_cast<int>(rank0),
        cpu_ms / std::max(reps, 1));
    std::fflush(stdout);
  }
  return 0;
}
