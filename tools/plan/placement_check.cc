#include "tools/plan/placement_check.h"

#include <algorithm>
#include <fstream>
#include <map>
#include <utility>

#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "vemesh/layout/mesh_spec.h"

namespace vemesh::plan {
namespace {

using Json = nlohmann::json;

// The schema nests three levels deep; anything much deeper is not a
// placement, and is refused before the parser recurses into it.
constexpr int kMaxDepth = 8;
// Host names and dimension names longer than this are not names.
constexpr size_t kMaxNameBytes = 4096;
constexpr int64_t kMaxDims = 64;

class FieldReader {
 public:
  explicit FieldReader(absl::string_view source) : source_(source) {}

  // `got` is shown as JSON, cut short; an array as its length.
  absl::Status Error(absl::string_view field, absl::string_view expected,
                     const Json* got) const {
    std::string shown = got->dump();
    if (got->is_array() && got->size() > 4) {
      shown = absl::StrCat("an array of ", got->size());
    }
    if (shown.size() > 60) shown = shown.substr(0, 57) + "...";
    return absl::InvalidArgumentError(
        absl::StrCat("placement file '", source_, "': field '", field,
                     "': expected ", expected, ", got ", shown));
  }

  absl::StatusOr<const Json*> Member(const Json& object,
                                     absl::string_view parent,
                                     const char* key) const {
    const std::string field =
        parent.empty() ? std::string(key) : absl::StrCat(parent, ".", key);
    auto it = object.find(key);
    if (it == object.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "placement file '", source_, "': field '", field,
          "' is missing (expected the JSON of DeviceMesh::get_placement())"));
    }
    return &*it;
  }

  absl::StatusOr<int64_t> Int(const Json& v, absl::string_view field,
                              int64_t lo, int64_t hi) const {
    if (!v.is_number_integer()) {
      return Error(field, absl::StrCat("an integer from ", lo, " to ", hi),
                   &v);
    }
    // Unsigned values above INT64_MAX are out of range either way.
    if (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(hi)) {
      return Error(field, absl::StrCat("an integer from ", lo, " to ", hi),
                   &v);
    }
    const int64_t n = v.get<int64_t>();
    if (n < lo || n > hi) {
      return Error(field, absl::StrCat("an integer from ", lo, " to ", hi),
                   &v);
    }
    return n;
  }

  absl::StatusOr<std::string> Name(const Json& v,
                                   absl::string_view field) const {
    if (!v.is_string() || v.get_ref<const std::string&>().empty() ||
        v.get_ref<const std::string&>().size() > kMaxNameBytes) {
      return Error(field, "a non-empty name (a JSON string)", &v);
    }
    return v.get<std::string>();
  }

  absl::Status Array(const Json& v, absl::string_view field, int64_t max,
                     absl::string_view what) const {
    if (!v.is_array() || static_cast<int64_t>(v.size()) > max) {
      return Error(field, absl::StrCat("an array of at most ", max, " ", what),
                   &v);
    }
    return absl::OkStatus();
  }

 private:
  std::string source_;
};

// Nesting depth of the JSON text, strings skipped: a linear pre-scan.
int MaxDepth(absl::string_view text) {
  int depth = 0, max_depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      max_depth = std::max(max_depth, ++depth);
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return max_depth;
}

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
      out.plan_flags = absl::StrCat("--placement block --ranks-per-host ",
                                    sizes[0]);
    } else {
      std::vector<int64_t> shown(sizes.begin(),
                                 sizes.begin() + std::min<int64_t>(hosts, 8));
      out.description =
          absl::StrCat("block over hosts of uneven sizes (",
                       absl::StrJoin(shown, ","), hosts > 8 ? ",..." : "",
                       "): a hostfile's slots");
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

absl::StatusOr<JobPlacement> ParseJobPlacement(absl::string_view text,
                                               absl::string_view source) {
  const FieldReader f(source);
  if (static_cast<int64_t>(text.size()) > kMaxPlacementFileBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "placement file '", source, "' has ", text.size(),
        " bytes: expected at most ", kMaxPlacementFileBytes));
  }
  if (const int depth = MaxDepth(text); depth > kMaxDepth) {
    return absl::InvalidArgumentError(absl::StrCat(
        "placement file '", source, "' nests ", depth,
        " levels deep: expected the JSON of DeviceMesh::get_placement() "
        "(at most ", kMaxDepth, ")"));
  }
  Json j;
  try {
    j = Json::parse(text.begin(), text.end());
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(
        "placement file '", source, "' is not JSON: ", e.what()));
  }
  if (!j.is_object()) {
    return f.Error("(top level)", "a JSON object", &j);
  }
  JobPlacement out;
  absl::StatusOr<const Json*> v = f.Member(j, "", "vemesh_placement");
  if (!v.ok()) return v.status();
  if (!(*v)->is_number_integer() || (*v)->get<int64_t>() != 1) {
    return f.Error("vemesh_placement", "1 (the only version there is)", *v);
  }

  v = f.Member(j, "", "world_size");
  if (!v.ok()) return v.status();
  absl::StatusOr<int64_t> world = f.Int(**v, "world_size", 1, kMaxCheckedRanks);
  if (!world.ok()) return world.status();
  out.world_size = *world;

  // mesh
  v = f.Member(j, "", "mesh");
  if (!v.ok()) return v.status();
  const Json& mesh = **v;
  if (!mesh.is_object()) return f.Error("mesh", "an object", &mesh);
  v = f.Member(mesh, "mesh", "dim_names");
  if (!v.ok()) return v.status();
  if (absl::Status s = f.Array(**v, "mesh.dim_names", kMaxDims, "names");
      !s.ok()) {
    return s;
  }
  for (size_t i = 0; i < (*v)->size(); ++i) {
    absl::StatusOr<std::string> name =
        f.Name((**v)[i], absl::StrCat("mesh.dim_names[", i, "]"));
    if (!name.ok()) return name.status();
    out.dim_names.push_back(*std::move(name));
  }
  v = f.Member(mesh, "mesh", "shape");
  if (!v.ok()) return v.status();
  if (absl::Status s = f.Array(**v, "mesh.shape", kMaxDims, "sizes");
      !s.ok()) {
    return s;
  }
  int64_t product = 1;
  for (size_t i = 0; i < (*v)->size(); ++i) {
    absl::StatusOr<int64_t> n =
        f.Int((**v)[i], absl::StrCat("mesh.shape[", i, "]"), 1, *world);
    if (!n.ok()) return n.status();
    product = std::min(product * *n, kMaxCheckedRanks + 1);
    out.shape.push_back(*n);
  }
  if (out.shape.size() != out.dim_names.size() || out.shape.empty()) {
    return f.Error("mesh.shape",
                   absl::StrCat("one size per name of mesh.dim_names (",
                                out.dim_names.size(), ")"),
                   *v);
  }
  // A mesh may cover part of its world (get_placement() lists every rank
  // of the world), never more.
  if (product > out.world_size) {
    return f.Error("mesh.shape",
                   absl::StrCat("sizes whose product is at most world_size ",
                                out.world_size),
                   *v);
  }

  // hosts, rank_hosts
  v = f.Member(j, "", "hosts");
  if (!v.ok()) return v.status();
  if (absl::Status s = f.Array(**v, "hosts", out.world_size, "host names");
      !s.ok()) {
    return s;
  }
  if ((*v)->empty()) return f.Error("hosts", "at least one host name", *v);
  for (size_t i = 0; i < (*v)->size(); ++i) {
    absl::StatusOr<std::string> name =
        f.Name((**v)[i], absl::StrCat("hosts[", i, "]"));
    if (!name.ok()) return name.status();
    out.hosts.push_back(*std::move(name));
  }
  v = f.Member(j, "", "rank_hosts");
  if (!v.ok()) return v.status();
  if (!(*v)->is_array() ||
      static_cast<int64_t>((*v)->size()) != out.world_size) {
    return f.Error("rank_hosts",
                   absl::StrCat("an array of world_size (", out.world_size,
                                ") host indices"),
                   *v);
  }
  out.rank_hosts.reserve(static_cast<size_t>(out.world_size));
  const int64_t last_host = static_cast<int64_t>(out.hosts.size()) - 1;
  for (size_t i = 0; i < (*v)->size(); ++i) {
    absl::StatusOr<int64_t> h = f.Int(
        (**v)[i], absl::StrCat("rank_hosts[", i, "] (an index into hosts)"), 0,
        last_host);
    if (!h.ok()) return h.status();
    out.rank_hosts.push_back(*h);
  }

  // dims
  v = f.Member(j, "", "dims");
  if (!v.ok()) return v.status();
  if (!(*v)->is_array() || (*v)->size() != out.dim_names.size()) {
    return f.Error("dims",
                   absl::StrCat("one entry per mesh dimension (",
                                out.dim_names.size(), ")"),
                   *v);
  }
  for (size_t i = 0; i < (*v)->size(); ++i) {
    const Json& d = (**v)[i];
    const std::string field = absl::StrCat("dims[", i, "]");
    if (!d.is_object()) return f.Error(field, "an object", &d);
    JobPlacement::Dim dim;
    absl::StatusOr<const Json*> m = f.Member(d, field, "name");
    if (!m.ok()) return m.status();
    absl::StatusOr<std::string> name = f.Name(**m, field + ".name");
    if (!name.ok()) return name.status();
    dim.name = *std::move(name);
    if (dim.name != out.dim_names[i]) {
      return f.Error(field + ".name",
                     absl::StrCat("'", out.dim_names[i],
                                  "' (mesh.dim_names[", i, "])"),
                     *m);
    }
    int64_t* targets[] = {&dim.group_count, &dim.group_size,
                          &dim.crossing_groups};
    const char* keys[] = {"group_count", "group_size", "crossing_groups"};
    for (int k = 0; k < 3; ++k) {
      m = f.Member(d, field, keys[k]);
      if (!m.ok()) return m.status();
      absl::StatusOr<int64_t> n = f.Int(
          **m, absl::StrCat(field, ".", keys[k]), k == 2 ? 0 : 1, *world);
      if (!n.ok()) return n.status();
      *targets[k] = *n;
    }
    if (dim.crossing_groups > dim.group_count) {
      return f.Error(field + ".crossing_groups",
                     absl::StrCat("at most group_count (", dim.group_count,
                                  ")"),
                     &d["crossing_groups"]);
    }
    out.dims.push_back(std::move(dim));
  }
  return out;
}

absl::StatusOr<JobPlacement> LoadJobPlacement(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::InvalidArgumentError(
        absl::StrCat("--check: cannot open placement file '", path, "'"));
  }
  // One byte past the bound tells a file that is too big, without reading
  // (or holding) the rest of it.
  std::string text(static_cast<size_t>(kMaxPlacementFileBytes + 1), '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<size_t>(in.gcount()));
  return ParseJobPlacement(text, path);
}

absl::StatusOr<PlacementCheck> CheckPlacement(const Plan& plan,
                                              const JobPlacement& job) {
  const MeshLayout& layout = plan.layout;
  const int64_t world = layout.size();
  if (world > kMaxCheckedRanks) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--check compares every rank: expected a mesh of at most ",
        kMaxCheckedRanks, " ranks, got ", plan.mesh_spec, " (", world,
        " ranks)"));
  }
  PlacementCheck out;
  const HostMap& hosts = plan.hosts;
  const bool same_mesh =
      job.dim_names == layout.dim_names() && job.shape == layout.shape();
  if (!same_mesh) {
    out.differences.push_back(absl::StrCat(
        "mesh: plan ", plan.mesh_spec, ", job ",
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
    out.differences.push_back(absl::StrCat("hosts: plan ", hosts.host_count(),
                                           ", job ", job_hosts));
  }

  // Crossing groups, dimension by dimension (only comparable on one mesh).
  if (same_mesh) {
    for (size_t d = 0; d < plan.dims.size(); ++d) {
      const DimLocality& p = plan.dims[d].locality;
      const JobPlacement::Dim& jd = job.dims[d];
      if (p.group_count != jd.group_count || p.group_size != jd.group_size) {
        out.differences.push_back(absl::StrCat(
            jd.name, ": plan ", p.group_count, " groups of ", p.group_size,
            ", job ", jd.group_count, " of ", jd.group_size));
      }
      if (p.crossing_groups != jd.crossing_groups) {
        out.differences.push_back(absl::StrCat(
            jd.name, ": plan ", p.crossing_groups, " crossing groups, job ",
            jd.crossing_groups));
      }
    }
  }

  // Rank r sits as planned iff its plan host and its job host hold exactly
  // the same ranks: every rank of the plan host is on that one job host, and
  // every rank of the job host on that one plan host. One pass marks the
  // hosts whose ranks are split (O(world), arrays, no hashing).
  constexpr int64_t kSplit = -2;
  std::vector<int64_t> plan_to_job(static_cast<size_t>(hosts.host_count()),
                                   -1);
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
    for (int64_t q = 0; q < world && static_cast<int64_t>(job_ranks.size()) <
                                         kListedHostRanks;
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
    out.differences.push_back(absl::StrCat(
        "... and ", moved_count - kMaxNamedRanks,
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
    out.hint = absl::StrCat("the job's placement is ", shape.description,
                            "; the plan assumes ",
                            PlacementPolicyName(hosts.policy()), ", ",
                            hosts.Describe(), ". Launch as planned with ",
                            absl::StrJoin(launch, " or "));
    if (!shape.plan_flags.empty()) {
      absl::StrAppend(&out.hint, "; or plan what the job did with ",
                      shape.plan_flags);
    }
  }
  return out;
}

std::string RenderCheck(const Plan& plan, const JobPlacement& job,
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
  std::string out = absl::StrCat("plan and job placement differ (plan: ",
                                 plan.mesh_spec, ", ",
                                 PlacementPolicyName(plan.hosts.policy()), ", ",
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
