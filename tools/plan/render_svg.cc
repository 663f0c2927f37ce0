#include "tools/plan/render_svg.h"

#include <algorithm>
#include <variant>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "tools/plan/group_summary.h"
#include "tools/plan/palette.h"

namespace vemesh::plan {
namespace {

constexpr int kMargin = 20;
constexpr int kTitleHeight = 64;
constexpr int kCellHeight = 46;
constexpr int kGap = 8;
constexpr int kHostPad = 12;
constexpr int kHostTitle = 24;
constexpr int kHostGap = 18;
constexpr int kMaxRowWidth = 1000;  // host boxes wrap past this width
constexpr int kLegendWidth = 420;
constexpr int kLineHeight = 19;
constexpr size_t kWrapColumns = 56;
constexpr char kFont[] = "DejaVu Sans, Verdana, Arial, sans-serif";

std::string Escape(absl::string_view text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string Text(int x, int y, absl::string_view text, int size,
                 absl::string_view extra = "") {
  return absl::StrCat("<text x=\"", x, "\" y=\"", y, "\" font-size=\"", size,
                      "\"", extra.empty() ? "" : " ", extra, ">", Escape(text),
                      "</text>\n");
}

// Greedy word wrap for the legend (SVG 1.1 text does not wrap).
std::vector<std::string> Wrap(absl::string_view text) {
  std::vector<std::string> lines;
  std::string line;
  for (absl::string_view word : absl::StrSplit(text, ' ', absl::SkipEmpty())) {
    if (!line.empty() && line.size() + 1 + word.size() > kWrapColumns) {
      lines.push_back(line);
      line.clear();
    }
    absl::StrAppend(&line, line.empty() ? "" : " ", word);
  }
  if (!line.empty()) lines.push_back(line);
  return lines;
}

// What one slot of the host grid shows: a host, or how many were skipped.
struct SkippedHosts {
  int64_t count;
};
using HostSlot = std::variant<int64_t, SkippedHosts>;

std::string CoordLabel(const Coordinate& c) {
  return absl::StrCat("(", absl::StrJoin(c, ","), ")");
}

// "host 1  (ranks 4-7)"; cyclic: "host 1  (ranks 1,3,...,7)"; a hostfile's
// host goes by its name.
std::string HostTitle(const HostMap& hosts, int64_t host) {
  const int64_t n = hosts.host_size(host);
  const int64_t first = hosts.rank_on(host, 0);
  const int64_t last = hosts.rank_on(host, n - 1);
  std::string name = hosts.names().empty()
                         ? absl::StrCat("host ", host)
                         : hosts.names()[static_cast<size_t>(host)];
  if (hosts.policy() != PlacementPolicy::kCyclic || n == 1) {
    return absl::StrCat(name, "  (ranks ", first, "-", last, ")");
  }
  if (n == 2) return absl::StrCat(name, "  (ranks ", first, ",", last, ")");
  return absl::StrCat(name, "  (ranks ", first, ",", hosts.rank_on(host, 1),
                      n > 3 ? ",...," : ",", last, ")");
}

}  // namespace

std::string RenderSvg(const Plan& plan) {
  const MeshLayout& layout = plan.layout;
  const HostMap& hosts = plan.hosts;
  // The colour groups: one dimension, or several (--flatten, --view), whose
  // members the legend lists through the layout with them merged.
  const std::vector<std::string> color_dims =
      plan.color_dims.empty()
          ? std::vector<std::string>{layout.dim_name(plan.color_dim)}
          : plan.color_dims;
  const std::string color_name =
      plan.color_name.empty() ? color_dims[0] : plan.color_name;
  const MeshLayout color_layout =
      color_dims.size() == 1
          ? layout
          : layout.flatten(color_dims, color_name).value_or(layout);
  const int64_t color_dim =
      color_layout.find_dim(color_dims.size() == 1 ? color_dims[0] : color_name)
          .value_or(plan.color_dim);

  // Which hosts to draw: all, or the first two and the last.
  std::vector<HostSlot> slots;
  {
    const std::vector<int64_t> shown =
        plan.summarized
            ? SampleIndices(hosts.host_count(), 2, 1)
            : SampleIndices(hosts.host_count(), hosts.host_count(), 0);
    for (size_t i = 0; i < shown.size(); ++i) {
      if (i > 0 && shown[i] != shown[i - 1] + 1) {
        slots.push_back(SkippedHosts{shown[i] - shown[i - 1] - 1});
      }
      slots.push_back(shown[i]);
    }
  }

  // Cell geometry: wide enough for the longest rank and coordinate labels.
  const auto digits = [](int64_t v) {
    return static_cast<int>(absl::StrCat(v).size());
  };
  int coord_chars = static_cast<int>(layout.ndim()) + 1;
  for (int64_t n : layout.shape()) coord_chars += digits(n - 1);
  const int rank_chars = 5 + digits(layout.size() - 1);
  const int cell_w = std::max(84, 8 * std::max(coord_chars, rank_chars) + 16);
  const int64_t cells_per_host =
      std::min(hosts.max_host_size(), kMaxCellsPerHost);
  const int cols = static_cast<int>(
      std::min<int64_t>({hosts.max_host_size(), 8, layout.size()}));
  const int64_t max_cells = std::min(cells_per_host, layout.size());
  const int rows = static_cast<int>((max_cells + cols - 1) / cols);
  const int host_w = 2 * kHostPad + cols * cell_w + (cols - 1) * kGap;
  const int host_h =
      kHostTitle + kHostPad + rows * (kCellHeight + kGap) - kGap + kHostPad;
  const int per_row =
      std::max(1, std::min(static_cast<int>(slots.size()),
                           (kMaxRowWidth + kHostGap) / (host_w + kHostGap)));
  const int grid_rows =
      (static_cast<int>(slots.size()) + per_row - 1) / per_row;
  const int grid_w = per_row * host_w + (per_row - 1) * kHostGap;
  const int grid_h = grid_rows * host_h + (grid_rows - 1) * kHostGap;

  std::string body;
  // Groups of the colour dimension in the order they first appear.
  std::vector<int64_t> legend_groups;
  int64_t legend_overflow = 0;
  auto note_group = [&](int64_t g) {
    if (std::find(legend_groups.begin(), legend_groups.end(), g) !=
        legend_groups.end()) {
      return;
    }
    if (static_cast<int64_t>(legend_groups.size()) < kMaxLegendEntries) {
      legend_groups.push_back(g);
    } else {
      ++legend_overflow;
    }
  };

  for (size_t s = 0; s < slots.size(); ++s) {
    const int x0 =
        kMargin + static_cast<int>(s % per_row) * (host_w + kHostGap);
    const int y0 =
        kTitleHeight + static_cast<int>(s / per_row) * (host_h + kHostGap);
    if (const SkippedHosts* skip = std::get_if<SkippedHosts>(&slots[s])) {
      absl::StrAppend(&body, "<rect x=\"", x0, "\" y=\"", y0, "\" width=\"",
                      host_w, "\" height=\"", host_h,
                      "\" rx=\"10\" fill=\"#fafafa\" stroke=\"#999\" "
                      "stroke-dasharray=\"6 4\"/>\n");
      body += Text(x0 + host_w / 2, y0 + host_h / 2,
                   absl::StrCat("... ", skip->count, " more hosts ..."), 15,
                   "text-anchor=\"middle\" fill=\"#555\"");
      continue;
    }
    const int64_t host = std::get<int64_t>(slots[s]);
    const int64_t on_host = hosts.host_size(host);
    absl::StrAppend(&body, "<rect x=\"", x0, "\" y=\"", y0, "\" width=\"",
                    host_w, "\" height=\"", host_h,
                    "\" rx=\"10\" fill=\"#f4f6f8\" stroke=\"#445\" "
                    "stroke-width=\"2\"/>\n");
    body += Text(x0 + kHostPad, y0 + 18, HostTitle(hosts, host), 14,
                 "font-weight=\"bold\" fill=\"#223\"");
    const bool elided = on_host > cells_per_host;
    for (int64_t i = 0; i < std::min(on_host, cells_per_host); ++i) {
      const int cx =
          x0 + kHostPad + static_cast<int>(i % cols) * (cell_w + kGap);
      const int cy = y0 + kHostTitle + kHostPad +
                     static_cast<int>(i / cols) * (kCellHeight + kGap);
      if (elided && i == cells_per_host - 1) {
        absl::StrAppend(&body, "<rect x=\"", cx, "\" y=\"", cy, "\" width=\"",
                        cell_w, "\" height=\"", kCellHeight,
                        "\" rx=\"5\" fill=\"#fff\" stroke=\"#999\" "
                        "stroke-dasharray=\"4 3\"/>\n");
        body += Text(cx + cell_w / 2, cy + 28,
                     absl::StrCat("+", on_host - i, " more"), 12,
                     "text-anchor=\"middle\" fill=\"#555\"");
        break;
      }
      const int64_t rank = hosts.rank_on(host, i);
      absl::StatusOr<Coordinate> coord = layout.coordinate_of(rank);
      absl::StatusOr<MeshLayout::GroupPosition> pos =
          layout.group_position(color_dims, rank);
      if (!coord.ok() || !pos.ok()) continue;  // not a member (rank table)
      note_group(pos->group);
      const bool picked =
          plan.rank_view.has_value() && plan.rank_view->rank == rank;
      absl::StrAppend(&body, "<rect x=\"", cx, "\" y=\"", cy, "\" width=\"",
                      cell_w, "\" height=\"", kCellHeight,
                      "\" rx=\"5\" fill=\"", GroupColor(pos->group),
                      "\" stroke=\"", picked ? "#000" : "#667",
                      "\" stroke-width=\"", picked ? 4 : 1, "\"/>\n");
      body += Text(cx + cell_w / 2, cy + 19, absl::StrCat("rank ", rank), 13,
                   "text-anchor=\"middle\" font-weight=\"bold\" fill=\"#111\"");
      body += Text(cx + cell_w / 2, cy + 37, CoordLabel(*coord), 12,
                   "text-anchor=\"middle\" fill=\"#222\"");
    }
  }

  // Legend: colours, coordinate order, locality of each dimension, warnings.
  const int lx = kMargin + grid_w + 30;
  int ly = kTitleHeight + 14;
  std::string legend;
  legend += Text(lx, ly, absl::StrCat("colour = ", color_name, " group"), 14,
                 "font-weight=\"bold\" fill=\"#223\"");
  ly += kLineHeight + 4;
  for (int64_t g : legend_groups) {
    absl::StrAppend(&legend, "<rect x=\"", lx, "\" y=\"", ly - 13,
                    "\" width=\"16\" height=\"16\" rx=\"3\" fill=\"",
                    GroupColor(g), "\" stroke=\"#667\"/>\n");
    std::vector<int64_t> members;
    const int64_t n = color_layout.shape()[color_dim];
    for (int64_t k : SampleIndices(n, 3, 1)) {
      members.push_back(color_layout.group_member(color_dim, g, k));
    }
    std::string list =
        absl::StrJoin(members.begin(), members.end() - (n > 4), ", ");
    if (n > 4) absl::StrAppend(&list, ", ..., ", members.back());
    legend +=
        Text(lx + 24, ly, absl::StrCat(color_name, " #", g, ": ranks ", list),
             13, "fill=\"#222\"");
    ly += kLineHeight + 2;
  }
  if (legend_overflow > 0) {
    legend += Text(
        lx, ly, absl::StrCat("... and ", legend_overflow, " more groups drawn"),
        13, "fill=\"#555\"");
    ly += kLineHeight;
  }
  ly += 10;
  legend +=
      Text(lx, ly, "dimensions", 14, "font-weight=\"bold\" fill=\"#223\"");
  ly += kLineHeight + 2;
  for (const DimPlan& d : plan.dims) {
    const bool bad =
        d.locality.crossing_groups > 0 && d.name == kTensorParallelDim;
    legend += Text(lx, ly,
                   absl::StrCat(d.name, "=", d.size, ": ",
                                LocalityName(d.locality.locality), " (",
                                d.locality.crossing_groups, " of ",
                                d.locality.group_count, " groups cross hosts)"),
                   13, bad ? "fill=\"#b00020\"" : "fill=\"#222\"");
    ly += kLineHeight;
  }
  for (const DimPlan& d : plan.derived) {
    legend += Text(
        lx, ly,
        absl::StrCat(
            d.flattened ? "" : "view ", d.name,
            d.flattened ? absl::StrCat("=", absl::StrJoin(d.spans, ",")) : "",
            " (", d.size, d.adjacent ? "" : ", not adjacent", "): ",
            LocalityName(d.locality.locality), " (", d.locality.crossing_groups,
            " of ", d.locality.group_count, " groups cross hosts)"),
        13, "fill=\"#222\"");
    ly += kLineHeight;
  }
  for (const PlanWarning& w : plan.warnings) {
    ly += 10;
    legend +=
        Text(lx, ly, "WARNING", 14, "font-weight=\"bold\" fill=\"#b00020\"");
    ly += kLineHeight;
    for (const std::string& line : Wrap(w.message)) {
      legend += Text(lx, ly, line, 12, "fill=\"#b00020\"");
      ly += kLineHeight - 3;
    }
  }

  const int width = lx + kLegendWidth + kMargin;
  const int height = std::max(kTitleHeight + grid_h, ly) + kMargin;
  std::string svg = absl::StrCat(
      "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
      "<svg xmlns=\"http://www.w3.org/2000/svg\" version=\"1.1\" width=\"",
      width, "\" height=\"", height, "\" viewBox=\"0 0 ", width, " ", height,
      "\" font-family=\"", kFont, "\">\n",
      "<rect width=\"100%\" height=\"100%\" fill=\"#ffffff\"/>\n");
  svg += Text(kMargin, 28,
              absl::StrCat("vemesh plan ", plan.mesh_spec, ": ", layout.size(),
                           " ranks on ", hosts.host_count(), " hosts, ",
                           hosts.Describe()),
              18, "font-weight=\"bold\" fill=\"#111\"");
  svg += Text(
      kMargin, 50,
      absl::StrCat(
          "cell: rank and coordinate (", absl::StrJoin(layout.dim_names(), ","),
          ")", plan.summarized ? "; summarised: not every host is drawn" : ""),
      13, "fill=\"#444\"");
  absl::StrAppend(&svg, body, legend, "</svg>\n");
  return svg;
}

}  // namespace vemesh::plan
