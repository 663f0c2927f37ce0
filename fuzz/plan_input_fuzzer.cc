// libFuzzer target: the two files `vemesh plan` reads from users and jobs —
// an Open MPI hostfile (--placement hostfile:FILE) and a job's placement
// JSON (--check FILE, read by vemesh::Placement::FromJson). The first byte
// picks the parser; the rest is the text.
//
// Invariants checked on every input (a violation aborts, which libFuzzer
// reports as a crash with the input saved):
//   - a rejected file is InvalidArgument with a non-empty message;
//   - an accepted hostfile has as many names as slot counts, every count in
//     [1, kMaxSlotsPerHost], at most kMaxHostfileHosts hosts, and placing a
//     small world on it either fits its slots or says it does not;
//   - an accepted placement has one host index per rank of its world, each
//     naming a listed host, as many dimensions as names and sizes; checking
//     it against a plan of its own mesh (small worlds) is a verdict, never
//     an error, and "matches" exactly when no difference is listed.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "fuzz_check.h"
#include "tools/plan/hostfile.h"
#include "tools/plan/placement_check.h"
#include "tools/plan/plan.h"
#include "vemesh/placement/placement.h"

namespace {

using vemesh::plan::CheckPlacement;
using vemesh::plan::HostMapFromHostfile;
using vemesh::plan::ParseHostfile;

// Past any interesting file: longer inputs only cost time.
constexpr size_t kMaxInput = 64 * 1024;

void FuzzHostfile(absl::string_view text) {
  auto h = ParseHostfile(text, "fuzz.hosts");
  if (!h.ok()) {
    FUZZ_CHECK(h.status().code() == absl::StatusCode::kInvalidArgument);
    FUZZ_CHECK(!h.status().message().empty());
    return;
  }
  FUZZ_CHECK(h->names.size() == h->slots.size());
  FUZZ_CHECK(static_cast<int64_t>(h->names.size()) <=
             vemesh::plan::kMaxHostfileHosts);
  for (size_t i = 0; i < h->slots.size(); ++i) {
    FUZZ_CHECK(h->slots[i] >= 1 &&
               h->slots[i] <= vemesh::plan::kMaxSlotsPerHost);
    FUZZ_CHECK(!h->names[i].empty());
  }
  const int64_t total = h->total_slots();
  for (int64_t world : {int64_t{1}, int64_t{7}, total, total + 1}) {
    if (world < 1 || world > 4096) continue;
    auto map = HostMapFromHostfile(*h, world);
    FUZZ_CHECK(map.ok() == (world <= total));
    if (!map.ok()) {
      FUZZ_CHECK(map.status().code() == absl::StatusCode::kInvalidArgument);
    }
  }
}

void FuzzPlacement(absl::string_view text) {
  auto job = vemesh::Placement::FromJson(text, "fuzz.json");
  if (!job.ok()) {
    FUZZ_CHECK(job.status().code() == absl::StatusCode::kInvalidArgument);
    FUZZ_CHECK(!job.status().message().empty());
    return;
  }
  FUZZ_CHECK(static_cast<int64_t>(job->rank_hosts.size()) == job->world_size);
  for (const int64_t h : job->rank_hosts) {
    FUZZ_CHECK(h >= 0 && h < static_cast<int64_t>(job->hosts.size()));
  }
  FUZZ_CHECK(job->dim_names.size() == job->shape.size());
  // Compare with a plan of the job's own mesh, two ranks per host, when it
  // is small: a verdict (match or not), never an error, whatever the job.
  if (job->world_size > 4096 || job->shape.empty()) return;
  int64_t size = 1;
  for (int64_t n : job->shape) {
    if (n < 1 || n > 4096) return;
    size *= n;
    if (size > job->world_size) return;
  }
  auto layout = vemesh::MeshLayout::Create(job->shape, job->dim_names);
  if (!layout.ok()) return;
  vemesh::plan::PlanSettings settings;
  settings.ranks_per_host = 2;
  auto plan = vemesh::plan::BuildPlan(*layout, settings);
  if (!plan.ok()) return;
  auto check = CheckPlacement(*plan, *job);
  FUZZ_CHECK(check.ok());
  FUZZ_CHECK(check->matches == check->differences.empty());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1 || size > kMaxInput) return 0;
  const absl::string_view text(reinterpret_cast<const char*>(data) + 1,
                               size - 1);
  if (data[0] % 2 == 0) {
    FuzzHostfile(text);
  } else {
    FuzzPlacement(text);
  }
  return 0;
}
