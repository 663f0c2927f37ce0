#include "tools/plan/render_table.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace vemesh::plan {
namespace {

// Left-aligned columns, two spaces apart.
class TextTable {
 public:
  void Row(std::vector<std::string> cells) {
    rows_.push_back(std::move(cells));
  }
  // A line printed as is, not aligned (the "..." of a summary).
  void Note(std::string line) { rows_.push_back({"\x01" + line}); }

  std::string Render(absl::string_view indent) const {
    std::vector<size_t> width;
    for (const auto& row : rows_) {
      if (IsNote(row)) continue;
      width.resize(std::max(width.size(), row.size()), 0);
      for (size_t i = 0; i < row.size(); ++i) {
        width[i] = std::max(width[i], row[i].size());
      }
    }
    std::string out;
    for (const auto& row : rows_) {
      std::string line(indent);
      if (IsNote(row)) {
        absl::StrAppend(&line, row[0].substr(1));
      } else {
        for (size_t i = 0; i < row.size(); ++i) {
          absl::StrAppend(&line, row[i]);
          if (i + 1 < row.size()) {
            line.append(width[i] - row[i].size() + 2, ' ');
          }
        }
      }
      absl::StrAppend(&out, line, "\n");
    }
    return out;
  }

 private:
  static bool IsNote(const std::vector<std::string>& row) {
    return row.size() == 1 && !row[0].empty() && row[0][0] == '\x01';
  }
  std::vector<std::vector<std::string>> rows_;
};

std::string Coord(const Coordinate& c) {
  return absl::StrCat("[", absl::StrJoin(c, ","), "]");
}

std::string Members(const GroupSummary& g) {
  if (g.complete()) return absl::StrCat("[", absl::StrJoin(g.ranks, ", "), "]");
  return absl::StrCat("[", absl::StrJoin(g.ranks, ", "), ", ... ",
                      g.size - g.ranks.size() - g.tail.size(), " more ..., ",
                      absl::StrJoin(g.tail, ", "), "]");
}

std::string Hosts(const GroupSummary& g) {
  if (!g.hosts.empty()) {
    return absl::StrCat(g.hosts.size() == 1 ? "host " : "hosts ",
                        absl::StrJoin(g.hosts, ","));
  }
  return absl::StrCat(g.host_count, " hosts");
}

// A dimension as the tables name it: "TP", "EP=DP,TP" (flattened), "view
// DP,TP".
std::string Label(const DimPlan& d) {
  if (d.spans.empty()) return d.name;
  if (d.flattened)
    return absl::StrCat(d.name, "=", absl::StrJoin(d.spans, ","));
  return absl::StrCat("view ", d.name);
}

std::string OrNone(const std::optional<int64_t>& r) {
  return r.has_value() ? absl::StrCat(*r) : "none";
}

// A host as the tables show it: its index, and its name from a hostfile.
std::string HostLabel(const Plan& plan, int64_t host) {
  if (plan.hosts.names().empty()) return absl::StrCat(host);
  return absl::StrCat(host, " (", plan.hosts.names()[host], ")");
}

void AppendHeader(const Plan& plan, std::string& out) {
  const HostMap& hosts = plan.hosts;
  absl::StrAppend(&out, "mesh ", plan.mesh_spec, ": ", plan.layout.size(),
                  plan.layout.size() == 1 ? " rank" : " ranks", " on ",
                  hosts.host_count(),
                  hosts.host_count() == 1 ? " host" : " hosts");
  switch (hosts.policy()) {
    case PlacementPolicy::kBlock:
      absl::StrAppend(&out, " of ", hosts.ranks_per_host(), " ranks\n");
      break;
    case PlacementPolicy::kCyclic:
      absl::StrAppend(&out, ", cyclic: host = rank % ", hosts.host_count(),
                      "\n");
      break;
    case PlacementPolicy::kHostfile:
      absl::StrAppend(&out, " from hostfile '", plan.hostfile_path, "' (",
                      hosts.Describe(), ")\n");
      break;
  }
  if (plan.summarized) {
    absl::StrAppend(&out, "(more than ", kListLimit,
                    " ranks: ranks and groups are summarised)\n");
  }
  absl::StrAppend(&out, "\n");
  TextTable t;
  t.Row({"dim", "size", "stride", "groups", "locality", "crossing"});
  std::vector<const DimPlan*> rows;
  for (const DimPlan& d : plan.dims) rows.push_back(&d);
  for (const DimPlan& d : plan.derived) rows.push_back(&d);
  for (const DimPlan* dp : rows) {
    const DimPlan& d = *dp;
    t.Row({Label(d), absl::StrCat(d.size),
           d.stride > 0 ? absl::StrCat(d.stride) : "-",
           absl::StrCat(d.locality.group_count),
           std::string(LocalityName(d.locality.locality)),
           absl::StrCat(d.locality.crossing_groups, "/",
                        d.locality.group_count)});
  }
  absl::StrAppend(&out, t.Render(""));
}

void AppendRanks(const Plan& plan, std::string& out) {
  absl::StrAppend(&out, "\nranks (coordinate is [",
                  absl::StrJoin(plan.layout.dim_names(), ","), "])\n");
  TextTable t;
  t.Row({"rank", "coordinate", "host", "local"});
  for (size_t i = 0; i < plan.ranks.size(); ++i) {
    const RankRow& r = plan.ranks[i];
    if (i > 0 && r.rank != plan.ranks[i - 1].rank + 1 && plan.summarized) {
      t.Note(absl::StrCat("... ", plan.layout.size() - plan.ranks.size(),
                          " ranks not shown ..."));
    }
    t.Row({absl::StrCat(r.rank), Coord(r.coordinate), HostLabel(plan, r.host),
           absl::StrCat(r.local)});
  }
  absl::StrAppend(&out, t.Render("  "));
}

void AppendGroups(const Plan& plan, std::string& out) {
  std::vector<const DimPlan*> all;
  for (const DimPlan& d : plan.dims) all.push_back(&d);
  for (const DimPlan& d : plan.derived) all.push_back(&d);
  for (const DimPlan* dp : all) {
    const DimPlan& d = *dp;
    absl::StrAppend(&out, "\n", Label(d), " groups: ", d.locality.group_count,
                    " of ", d.size, " ranks, ",
                    LocalityName(d.locality.locality), "\n");
    if (!d.spans.empty()) {
      absl::StrAppend(&out, "  (", d.flattened ? "flattened" : "view", " over ",
                      absl::StrJoin(d.spans, ","),
                      d.adjacent ? ": adjacent dimensions"
                                 : ": dimensions not adjacent in the mesh "
                                   "(strided groups)",
                      ")\n");
    }
    TextTable t;
    for (size_t i = 0; i < d.groups.size(); ++i) {
      const GroupSummary& g = d.groups[i];
      if (i > 0 && g.index != d.groups[i - 1].index + 1) {
        t.Note(absl::StrCat("... ", d.locality.group_count - d.groups.size(),
                            " groups not shown ..."));
      }
      t.Row({absl::StrCat("#", g.index), Hosts(g), Members(g)});
    }
    absl::StrAppend(&out, t.Render("  "));
  }
}

void AppendRankView(const Plan& plan, const RankView& v, std::string& out) {
  absl::StrAppend(&out, "\nrank ", v.rank, ": coordinate ", Coord(v.coordinate),
                  " (", absl::StrJoin(plan.layout.dim_names(), ","), "), host ",
                  HostLabel(plan, v.host), ", local rank ", v.local, "\n");
  TextTable t;
  t.Row({"dim", "index", "group", "hosts", "prev", "next", "members", "peers"});
  std::vector<const RankView::DimView*> rows;
  for (const RankView::DimView& d : v.dims) rows.push_back(&d);
  for (const RankView::DimView& d : v.derived) rows.push_back(&d);
  for (size_t i = 0; i < rows.size(); ++i) {
    const RankView::DimView& d = *rows[i];
    // Peers: the group without this rank, elided like the group.
    GroupSummary peers = d.group;
    std::erase(peers.ranks, v.rank);
    std::erase(peers.tail, v.rank);
    peers.size = d.group.size - 1;
    const std::string peer_text = Members(peers);
    const std::string name =
        i < v.dims.size() ? d.name : Label(plan.derived[i - v.dims.size()]);
    t.Row({name, absl::StrCat(d.index_in_group, "/", d.group.size),
           absl::StrCat("#", d.group.index), Hosts(d.group), OrNone(d.prev),
           OrNone(d.next), Members(d.group), peer_text});
  }
  absl::StrAppend(&out, t.Render("  "));
  if (v.pipeline.has_value()) {
    const RankView::Pipeline& p = *v.pipeline;
    absl::StrAppend(&out, "pipeline (", p.dim, "): stage ", p.stage, " of ",
                    p.stages, ", prev stage rank ", OrNone(p.prev),
                    ", next stage rank ", OrNone(p.next));
    if (p.stage == 0) absl::StrAppend(&out, " (first stage)");
    if (p.stage == p.stages - 1) absl::StrAppend(&out, " (last stage)");
    absl::StrAppend(&out, "\n");
  } else {
    absl::StrAppend(&out, "pipeline: the mesh has no ", kPipelineDim,
                    " dimension\n");
  }
}

void AppendLaunch(const Plan& plan, std::string& out) {
  const HostMap& hosts = plan.hosts;
  absl::StrAppend(&out, "\nplacement: ",
                  hosts.policy() == PlacementPolicy::kCyclic
                      ? hosts.Describe()
                      : absl::StrCat(PlacementPolicyName(hosts.policy()), ", ",
                                     hosts.Describe()));
  switch (hosts.policy()) {
    case PlacementPolicy::kBlock:
      absl::StrAppend(&out, " (host = rank / ", hosts.ranks_per_host(),
                      ", local rank = rank % ", hosts.ranks_per_host(), ")\n");
      break;
    case PlacementPolicy::kCyclic:
      absl::StrAppend(&out, " (host = rank % ", hosts.host_count(),
                      ", local rank = rank / ", hosts.host_count(), ")\n");
      break;
    case PlacementPolicy::kHostfile:
      absl::StrAppend(&out, " (hosts filled in file order)\n");
      break;
  }
  absl::StrAppend(&out, "launch with this placement:\n");
  for (const LaunchLine& l : plan.launch) {
    if (l.command.empty()) {
      absl::StrAppend(&out, "  ", l.launcher, ": none (", l.note, ")\n");
    } else if (l.note.empty()) {
      absl::StrAppend(&out, "  ", l.command, "\n");
    } else {
      absl::StrAppend(&out, "  ", l.command, "   # ", l.note, "\n");
    }
  }
}

// Every mesh of the job and what each dimension shares (--also-mesh).
void AppendSharing(const MeshSharing& s, std::string& out) {
  absl::StrAppend(&out, "\nMeshes (", s.meshes.size(),
                  ", over the same ranks): ", s.distinct_groups,
                  " distinct rank sets (one communicator each) for ",
                  s.total_dims, " dimensions\n");
  for (const MeshEntry& m : s.meshes) {
    absl::StrAppend(&out, "  ", m.name, "  ", m.spec, "\n");
    for (const SharedDim& d : m.dims) {
      absl::StrAppend(&out, "    ", d.name, d.flattened ? " (flattened)" : "",
                      "  size ", d.size, "  ",
                      d.shared_with.empty()
                          ? std::string("new groups")
                          : absl::StrCat("shares ", d.shared_with),
                      "\n");
    }
  }
}

}  // namespace

std::string RenderTable(const Plan& plan) {
  std::string out;
  AppendHeader(plan, out);
  if (plan.rank_view.has_value()) {
    AppendRankView(plan, *plan.rank_view, out);
  } else {
    AppendRanks(plan, out);
    AppendGroups(plan, out);
  }
  AppendLaunch(plan, out);
  if (plan.sharing.has_value()) AppendSharing(*plan.sharing, out);
  for (const PlanWarning& w : plan.warnings) {
    absl::StrAppend(&out, "\nWARNING: ", w.message, "\n");
  }
  return out;
}

}  // namespace vemesh::plan
