// tools/plan/render_svg.h
//
// The picture of a Plan (`vemesh plan --format svg`): one box per host, one
// cell per rank labelled with its rank and coordinate, cells filled by the
// group of the colour dimension (--color-by, TP by default), a legend naming
// each colour's group, each dimension's host locality and any warning. The
// rank of --rank, if given, is outlined.
//
// Big worlds are summarised: the first two hosts and the last are drawn, at
// most kMaxCellsPerHost cells each, with boxes saying what was left out, so
// the picture stays small for a million ranks.
//
//   std::string svg = RenderSvg(plan);   // a standalone SVG 1.1 document

#ifndef VEMESH_TOOLS_PLAN_RENDER_SVG_H_
#define VEMESH_TOOLS_PLAN_RENDER_SVG_H_

#include <string>

#include "tools/plan/plan.h"

namespace vemesh::plan {

inline constexpr int64_t kMaxCellsPerHost = 32;
inline constexpr int64_t kMaxLegendEntries = 16;

std::string RenderSvg(const Plan& plan);

}  // namespace vemesh::plan

#endif  // VEMESH_TOOLS_PLAN_RENDER_SVG_H_
