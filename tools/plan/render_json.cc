#include "tools/plan/render_json.h"

#include <nlohmann/json.hpp>

namespace vemesh::plan {
namespace {

// ordered_json keeps keys in insertion order: the schema's documented order.
using Json = nlohmann::ordered_json;

Json OptionalRank(const std::optional<int64_t>& rank) {
  return rank.has_value() ? Json(*rank) : Json(nullptr);
}

Json GroupJson(const GroupSummary& g) {
  Json j;
  j["index"] = g.index;
  j["size"] = g.size;
  j["complete"] = g.complete();
  j["ranks"] = g.ranks;
  if (!g.complete()) j["ranks_tail"] = g.tail;
  j["host_count"] = g.host_count;
  if (g.complete()) j["hosts"] = g.hosts;
  j["crosses_hosts"] = g.host_count > 1;
  return j;
}

// A host's name from the hostfile; null under block and cyclic placement.
Json HostName(const HostMap& hosts, int64_t host) {
  if (hosts.names().empty()) return Json(nullptr);
  return Json(hosts.names()[static_cast<size_t>(host)]);
}

Json RankViewJson(const RankView& v, const HostMap& hosts) {
  Json j;
  j["rank"] = v.rank;
  j["coordinate"] =
      std::vector<int64_t>(v.coordinate.begin(), v.coordinate.end());
  j["host"] = v.host;
  j["host_name"] = HostName(hosts, v.host);
  j["local_rank"] = v.local;
  Json dims = Json::array();
  for (const RankView::DimView& d : v.dims) {
    Json dj;
    dj["name"] = d.name;
    dj["index_in_group"] = d.index_in_group;
    dj["group"] = GroupJson(d.group);
    std::vector<int64_t> peers;
    for (int64_t r : d.group.ranks) {
      if (r != v.rank) peers.push_back(r);
    }
    for (int64_t r : d.group.tail) {
      if (r != v.rank) peers.push_back(r);
    }
    dj["peers"] = peers;
    dj["prev"] = OptionalRank(d.prev);
    dj["next"] = OptionalRank(d.next);
    dims.push_back(std::move(dj));
  }
  j["dims"] = std::move(dims);
  Json derived = Json::array();
  for (const RankView::DimView& d : v.derived) {
    Json dj;
    dj["name"] = d.name;
    dj["index_in_group"] = d.index_in_group;
    dj["group"] = GroupJson(d.group);
    dj["prev"] = OptionalRank(d.prev);
    dj["next"] = OptionalRank(d.next);
    derived.push_back(std::move(dj));
  }
  j["derived"] = std::move(derived);
  if (v.pipeline.has_value()) {
    Json p;
    p["dim"] = v.pipeline->dim;
    p["stage"] = v.pipeline->stage;
    p["stages"] = v.pipeline->stages;
    p["first_stage"] = v.pipeline->stage == 0;
    p["last_stage"] = v.pipeline->stage == v.pipeline->stages - 1;
    p["prev"] = OptionalRank(v.pipeline->prev);
    p["next"] = OptionalRank(v.pipeline->next);
    j["pipeline"] = std::move(p);
  } else {
    j["pipeline"] = nullptr;
  }
  return j;
}

Json DimJson(const DimPlan& d) {
  Json dj;
  dj["name"] = d.name;
  dj["size"] = d.size;
  dj["stride"] = d.stride;
  dj["group_count"] = d.locality.group_count;
  dj["group_size"] = d.locality.group_size;
  dj["locality"] = LocalityName(d.locality.locality);
  dj["crossing_groups"] = d.locality.crossing_groups;
  Json groups;
  groups["total"] = d.locality.group_count;
  groups["listed"] = d.groups.size();
  Json gitems = Json::array();
  for (const GroupSummary& g : d.groups) gitems.push_back(GroupJson(g));
  groups["items"] = std::move(gitems);
  dj["groups"] = std::move(groups);
  return dj;
}

}  // namespace

std::string RenderJson(const Plan& plan) {
  Json j;
  j["schema"] = kJsonSchema;

  Json mesh;
  mesh["spec"] = plan.mesh_spec;
  mesh["world_size"] = plan.layout.size();
  mesh["shape"] = plan.layout.shape();
  mesh["dim_names"] = plan.layout.dim_names();
  j["mesh"] = std::move(mesh);

  Json hosts;
  // Block: the ranks per host; cyclic, hostfile: the largest host.
  hosts["ranks_per_host"] = plan.hosts.ranks_per_host();
  hosts["count"] = plan.hosts.host_count();
  j["hosts"] = std::move(hosts);

  Json placement;
  placement["policy"] = PlacementPolicyName(plan.hosts.policy());
  placement["description"] = plan.hosts.Describe();
  if (plan.hosts.policy() == PlacementPolicy::kHostfile) {
    placement["hostfile"] = plan.hostfile_path;
    placement["host_names"] = plan.hosts.names();
    std::vector<int64_t> sizes;
    for (int64_t h = 0; h < plan.hosts.host_count(); ++h) {
      sizes.push_back(plan.hosts.host_size(h));
    }
    placement["host_sizes"] = sizes;
  } else {
    placement["hostfile"] = nullptr;
    placement["host_names"] = nullptr;
    placement["host_sizes"] = nullptr;
  }
  Json launch = Json::array();
  for (const LaunchLine& l : plan.launch) {
    Json lj;
    lj["launcher"] = l.launcher;
    lj["command"] = l.command.empty() ? Json(nullptr) : Json(l.command);
    lj["note"] = l.note;
    launch.push_back(std::move(lj));
  }
  placement["launch"] = std::move(launch);
  j["placement"] = std::move(placement);

  j["summarized"] = plan.summarized;

  Json ranks;
  ranks["total"] = plan.layout.size();
  ranks["listed"] = plan.ranks.size();
  Json items = Json::array();
  for (const RankRow& r : plan.ranks) {
    Json rj;
    rj["rank"] = r.rank;
    rj["coordinate"] =
        std::vector<int64_t>(r.coordinate.begin(), r.coordinate.end());
    rj["host"] = r.host;
    rj["host_name"] = HostName(plan.hosts, r.host);
    rj["local_rank"] = r.local;
    items.push_back(std::move(rj));
  }
  ranks["items"] = std::move(items);
  j["ranks"] = std::move(ranks);

  Json dims = Json::array();
  Json derived = Json::array();
  for (const DimPlan& d : plan.dims) dims.push_back(DimJson(d));
  for (const DimPlan& d : plan.derived) {
    Json dj = DimJson(d);
    dj["kind"] = d.flattened ? "flatten" : "view";
    dj["spans"] = d.spans;
    dj["adjacent"] = d.adjacent;
    derived.push_back(std::move(dj));
  }
  j["dims"] = std::move(dims);
  j["derived"] = std::move(derived);
  j["color_by"] = plan.color_name;
  j["color_dims"] = plan.color_dims;

  Json warnings = Json::array();
  for (const PlanWarning& w : plan.warnings) {
    Json wj;
    wj["code"] = w.code;
    wj["dim"] = w.dim;
    wj["message"] = w.message;
    if (w.suggestion.found) {
      wj["suggested_order"] = w.suggestion.order;
      wj["suggested_mesh"] = w.suggestion.mesh_spec;
    } else {
      wj["suggested_order"] = nullptr;
      wj["suggested_mesh"] = nullptr;
    }
    wj["suggested_placement"] =
        w.placement_fix.has_value()
            ? Json(std::string(PlacementPolicyName(*w.placement_fix)))
            : Json(nullptr);
    warnings.push_back(std::move(wj));
  }
  j["warnings"] = std::move(warnings);

  if (plan.sharing.has_value()) {
    Json meshes = Json::array();
    for (const MeshEntry& m : plan.sharing->meshes) {
      Json mj;
      mj["name"] = m.name;
      mj["mesh"] = m.spec;
      Json dims = Json::array();
      for (const SharedDim& d : m.dims) {
        Json dj;
        dj["name"] = d.name;
        dj["size"] = d.size;
        dj["flattened"] = d.flattened;
        dj["shared_with"] =
            d.shared_with.empty() ? Json(nullptr) : Json(d.shared_with);
        dims.push_back(std::move(dj));
      }
      mj["dims"] = std::move(dims);
      meshes.push_back(std::move(mj));
    }
    j["meshes"] = std::move(meshes);
    j["distinct_groups"] = plan.sharing->distinct_groups;
  } else {
    j["meshes"] = nullptr;
  }
  j["rank_view"] = plan.rank_view.has_value()
                       ? RankViewJson(*plan.rank_view, plan.hosts)
                       : Json(nullptr);
  return j.dump(2) + "\n";
}

}  // namespace vemesh::plan
