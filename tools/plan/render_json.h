// tools/plan/render_json.h
//
// The JSON form of a Plan (`vemesh plan --format json`): a stable schema,
// "vemesh.plan/1", described field by field in docs/PLANNER.md. Keys keep a
// fixed order; new fields may be added within version 1, none removed or
// renamed.
//
//   std::string text = RenderJson(plan);   // ends with a newline

#ifndef VEMESH_TOOLS_PLAN_RENDER_JSON_H_
#define VEMESH_TOOLS_PLAN_RENDER_JSON_H_

#include <string>

#include "tools/plan/plan.h"

namespace vemesh::plan {

inline constexpr char kJsonSchema[] = "vemesh.plan/1";

std::string RenderJson(const Plan& plan);

}  // namespace vemesh::plan

#endif  // VEMESH_TOOLS_PLAN_RENDER_JSON_H_
