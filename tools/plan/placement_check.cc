#include "tools/plan/placement_check.h"

#include <algorithm>
#include <fstream>
#include <map>
#include <optional>
#include <utility>

#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "vemesh/layout/mesh_spec.h"

namespace vemesh::plan {
namespace {

std::string ListRanks(const std::vector<int64_t>& ranks, int64_t total) {
  std::string out = absl::StrJoin(ranks, ",");
  if (total > static_cast<int64_t>(ranks.size())) {
    absl::StrAppend(&out, ",... (", total, " ranks)");
  }
  return out;
}

constexpr int64_t kListedHostRanks = 8;

// What a job's rank-to-host map looks like, as a placement the planner has.
struct JobShape {
  std::string description;  // "cyclic over 2 hosts"
  std::string plan_flags;   // "--placement cyclic --hosts 2"; empty: none
  std::optional<PlacementPolicy> policy;
};

JobShape ClassifyJob(const std::vector<int64_t>& host_by_first) {
  const int64_t world = static_cast<int64_t>(host_by_first.size());
  int64_t hosts = 0;
  for (int64_t h : host_by_first) hosts = std::max(hosts, h + 1);
  std::vector<int64_t> sizes(static_cast<size_t>(hosts), 0);
  for (int64_t h : host_by_first) ++sizes[static_cast<size_t>(h)];
  bool block = true;
  for (int64_t r = 1; r < world && block; ++r) {
    block = host_by_first[r] == host_by_first[r - 1] ||
            host_by_first[r] == host_by_first[r - 1] + 1;
  }
  JobShape out;
  if (block) {
    bool uniform = true;
    for (int64_t h = 0; h + 1 < hosts; ++h) uniform &= sizes[h] == sizes[0];
    uniform &= sizes[hosts - 1] <= sizes[0];
    if (uniform) {
      out.description = absl::StrCat("block, ", sizes[0], " ranks per host");
      out.plan_flags =
          absl::StrCat("--placement block --ranks-per-host ", sizes[0]);
    } else {
      std::vector<int64_t> shown(sizes.begin(),
                                 sizes.begin() + std::min<int64_t>(hosts, 8));
      out.description = absl::StrCat(
          "block over hosts of uneven sizes (", absl::StrJoin(shown, ","),
          hosts > 8 ? ",..." : "", "): a hostfile's slots");
      out.plan_flags = "--placement hostfile:FILE with those slots";
    }
    out.policy = PlacementPolicy::kBlock;
    return out;
  }
  bool cyclic = true;
  for (int64_t r = 0; r < world && cyclic; ++r) {
    cyclic = host_by_first[r] == r % hosts;
  }
  if (cyclic) {
    out.description = absl::StrCat("cyclic over ", hosts, " hosts");
    out.plan_flags = absl::StrCat("--placement cyclic --hosts ", hosts);
    out.policy = PlacementPolicy::kCyclic;
    return out;
  }
  out.description = "neither block nor cyclic";
  return out;
}

}  // namespace

absl::StatusOr<Placement> LoadJobPlacement(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::InvalidArgumentError(
        absl::StrCat("--check: cannot open placement file '", path, "'"));
  }
  // One byte past the bound tells a file that is too big, without reading
  // (or holding) the rest of it.
  std::string text(static_cast<size_t>(kMaxPlacementJsonBytes + 1), '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<size_t>(in.gcount()));
  return Placement::FromJson(text, path);
}

absl::StatusOr<PlacementCheck> CheckPlacement(const Plan& plan,
                                              const Placement& job) {
  const MeshLayout& layout = plan.layout;
  const int64_t world = layout.size();
  if (world > kMaxPlacementJsonRanks) {
    return absl::InvalidArgumentError(
        absl::StrCat("--check compares every rank: expected a mesh of at most ",
                     kMaxPlacementJsonRanks, " ranks, got ", plan.mesh_spec,
                     " (", world, " ranks)"));
  }
  PlacementCheck out;
  const HostMap& hosts = plan.hosts;
  const bool same_mesh =
      job.dim_names == layout.dim_names() && job.shape == layout.shape();
  if (!same_mesh) {
    out.differences.push_back(
        absl::StrCat("mesh: plan ", plan.mesh_spec, ", job ",
                     FormatMeshSpec(MeshSpec{job.shape, job.dim_names})));
  }
  if (job.world_size != world) {
    int64_t job_mesh = 1;
    for (int64_t n : job.shape) job_mesh *= n;  // <= world_size (parsed)
    out.differences.push_back(absl::StrCat(
        "world size: plan ", world, " ranks, job ", job.world_size,
        job_mesh < job.world_size
            ? absl::StrCat(" (its mesh covers ", job_mesh, " of them)")
            : ""));
    out.matches = false;
    return out;
  }

  // Job hosts renumbered by their lowest rank, as the plan numbers its own.
  std::vector<int64_t> job_host(static_cast<size_t>(world));
  std::vector<int64_t> renumber(job.hosts.size(), -1);
  std::vector<int64_t> job_host_name;  // renumbered -> index into job.hosts
  for (int64_t r = 0; r < world; ++r) {
    int64_t& id = renumber[static_cast<size_t>(job.rank_hosts[r])];
    if (id < 0) {
      id = static_cast<int64_t>(job_host_name.size());
      job_host_name.push_back(job.rank_hosts[r]);
    }
    job_host[r] = id;
  }
  const int64_t job_hosts = static_cast<int64_t>(job_host_name.size());
  std::vector<int64_t> job_size(static_cast<size_t>(job_hosts), 0);
  for (int64_t h : job_host) ++job_size[h];
  if (job_hosts != hosts.host_count()) {
    out.differences.push_back(
        absl::StrCat("hosts: plan ", hosts.host_count(), ", job ", job_hosts));
  }

  // Crossing groups, dimension by dimension (only comparable on one mesh).
  if (same_mesh) {
    for (size_t d = 0; d < plan.dims.size(); ++d) {
      const DimLocality& p = plan.dims[d].locality;
      const DimPlacement& jd = job.dims[d];
      if (p.group_count != jd.group_count || p.group_size != jd.group_size) {
        out.differences.push_back(absl::StrCat(
            jd.name, ": plan ", p.group_count, " groups of ", p.group_size,
            ", job ", jd.group_count, " of ", jd.group_size));
      }
      if (p.crossing_groups != jd.crossing_groups) {
        out.differences.push_back(
            absl::StrCat(jd.name, ": plan ", p.crossing_groups,
                         " crossing groups, job ", jd.crossing_groups));
      }
    }
  }

  // Rank r sits as planned iff its plan host and its job host hold exactly
  // the same ranks: every rank of the plan host is on that one job host, and
  // every rank of the job host on that one plan host. One pass marks the
  // hosts whose ranks are split (O(world), arrays, no hashing).
  constexpr int64_t kSplit = -2;
  std::vector<int64_t> plan_to_job(static_cast<size_t>(hosts.host_count()), -1);
  std::vector<int64_t> job_to_plan(static_cast<size_t>(job_hosts), -1);
  for (int64_t r = 0; r < world; ++r) {
    const int64_t p = hosts.host_of(r);
    const int64_t j = job_host[r];
    int64_t& pj = plan_to_job[p];
    pj = pj == -1 ? j : (pj == j ? pj : kSplit);
    int64_t& jp = job_to_plan[j];
    jp = jp == -1 ? p : (jp == p ? jp : kSplit);
  }
  std::vector<int64_t> moved;
  int64_t moved_count = 0;
  for (int64_t r = 0; r < world; ++r) {
    const int64_t p = hosts.host_of(r);
    const int64_t j = job_host[r];
    if (plan_to_job[p] == j && job_to_plan[j] == p) continue;
    if (++moved_count <= kMaxNamedRanks) moved.push_back(r);
  }
  for (int64_t r : moved) {
    const int64_t ph = hosts.host_of(r);
    std::vector<int64_t> plan_ranks;
    for (int64_t i = 0; i < std::min(hosts.host_size(ph), kListedHostRanks);
         ++i) {
      plan_ranks.push_back(hosts.rank_on(ph, i));
    }
    std::vector<int64_t> job_ranks;
    for (int64_t q = 0;
         q < world && static_cast<int64_t>(job_ranks.size()) < kListedHostRanks;
         ++q) {
      if (job_host[q] == job_host[r]) job_ranks.push_back(q);
    }
    const std::string plan_host =
        hosts.names().empty()
            ? absl::StrCat("host ", ph)
            : absl::StrCat("'", hosts.names()[ph], "' (host ", ph, ")");
    out.differences.push_back(absl::StrCat(
        "rank ", r, ": the plan puts it on ", plan_host, " with ranks ",
        ListRanks(plan_ranks, hosts.host_size(ph)), "; the job ran it on '",
        job.hosts[job_host_name[job_host[r]]], "' with ranks ",
        ListRanks(job_ranks, job_size[job_host[r]])));
  }
  if (moved_count > kMaxNamedRanks) {
    out.differences.push_back(
        absl::StrCat("... and ", moved_count - kMaxNamedRanks,
                     " more ranks whose host holds other ranks than planned (",
                     moved_count, " of ", world, " in all)"));
  }

  out.matches = out.differences.empty();

  if (!out.matches && moved_count > 0) {
    const JobShape shape = ClassifyJob(job_host);
    std::vector<std::string> launch;
    for (const LaunchLine& l : plan.launch) {
      if (!l.command.empty() && launch.size() < 2) {
        launch.push_back(absl::StrCat("`", l.command, "`"));
      }
    }
    out.hint = absl::StrCat(
        "the job's placement is ", shape.description, "; the plan assumes ",
        PlacementPolicyName(hosts.policy()), ", ", hosts.Describe(),
        ". Launch as planned with ", absl::StrJoin(launch, " or "));
    if (!shape.plan_flags.empty()) {
      absl::StrAppend(&out.hint, "; or plan what the job did with ",
                      shape.plan_flags);
    }
  }
  return out;
}

std::string RenderCheck(const Plan& plan, const Placement& job,
                        const PlacementCheck& check) {
  if (check.matches) {
    std::vector<std::string> crossing;
    for (const DimPlan& d : plan.dims) {
      crossing.push_back(absl::StrCat(d.name, " ", d.locality.crossing_groups));
    }
    return absl::StrCat("plan matches the job's placement: ", job.world_size,
                        " ranks on ", plan.hosts.host_count(), " hosts, mesh ",
                        plan.mesh_spec, ", crossing groups ",
                        absl::StrJoin(crossing, ", "), "\n");
  }
  std::string out =
      absl::StrCat("plan and job placement differ (plan: ", plan.mesh_spec,
                   ", ", PlacementPolicyName(plan.hosts.policy()), ", ",
                   plan.hosts.Describe(), "):\n");
  for (const std::string& d : check.differences) {
    absl::StrAppend(&out, "  ", d, "\n");
  }
  if (!check.hint.empty()) absl::StrAppend(&out, check.hint, "\n");
  return out;
}

std::string RenderCheckJson(const PlacementCheck& check) {
  nlohmann::ordered_json j;
  j["matches"] = check.matches;
  j["differences"] = check.differences;
  j["hint"] = check.hint.empty() ? nlohmann::ordered_json(nullptr)
                                 : nlohmann::ordered_json(check.hint);
  return j.dump(2) + "\n";
}

}  // namespace vemesh::plan
