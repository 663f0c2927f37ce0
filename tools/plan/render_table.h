// tools/plan/render_table.h
//
// The terminal form of a Plan (`vemesh plan`, the default format):
//
//   mesh PP=2,DP=2,TP=2: 8 ranks on 2 hosts of 4 ranks
//
//   dim  size  stride  groups  locality    crossing
//   PP   2     4       4       cross-host  4/4
//   ...
//
// then every rank's coordinate and host, the groups of each dimension, and
// any WARNING. With a rank view (--rank) the per-rank and per-group listings
// give way to that rank's view. Big worlds print their first and last rows
// with a "..." line saying how many were left out.

#ifndef VEMESH_TOOLS_PLAN_RENDER_TABLE_H_
#define VEMESH_TOOLS_PLAN_RENDER_TABLE_H_

#include <string>

#include "tools/plan/plan.h"

namespace vemesh::plan {

std::string RenderTable(const Plan& plan);

}  // namespace vemesh::plan

#endif  // VEMESH_TOOLS_PLAN_RENDER_TABLE_H_
