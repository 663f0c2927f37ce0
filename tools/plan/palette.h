// tools/plan/palette.h
//
// Distinct fill colours for group i, light enough for black text on top.
// Hues step by the golden angle, so neighbouring indices never look alike and
// any number of groups gets a colour (far-apart indices may come close).
//
//   GroupColor(0);   // "#e6a8a8"-like CSS hex colour

#ifndef VEMESH_TOOLS_PLAN_PALETTE_H_
#define VEMESH_TOOLS_PLAN_PALETTE_H_

#include <cstdint>
#include <string>

namespace vemesh::plan {

std::string GroupColor(int64_t index);

}  // namespace vemesh::plan

#endif  // VEMESH_TOOLS_PLAN_PALETTE_H_
