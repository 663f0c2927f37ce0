#include "tools/plan/plan_command.h"

#include <fstream>

#include "tools/plan/plan.h"
#include "tools/plan/plan_options.h"
#include "tools/plan/render_json.h"
#include "tools/plan/render_svg.h"
#include "tools/plan/render_table.h"

namespace vemesh::plan {

int RunPlanCommand(absl::Span<const std::string> args, std::ostream& out,
                   std::ostream& err) {
  absl::StatusOr<PlanOptions> options = ParsePlanArgs(args);
  if (!options.ok()) {
    err << "vemesh plan: " << options.status().message() << "\n";
    return kExitUsage;
  }
  if (options->help) {
    out << PlanUsage();
    return kExitOk;
  }
  absl::StatusOr<Plan> plan = BuildPlanFromOptions(*options);
  if (!plan.ok()) {
    err << "vemesh plan: " << plan.status().message() << "\n";
    return kExitUsage;
  }
  std::string text;
  switch (options->format) {
    case OutputFormat::kTable: text = RenderTable(*plan); break;
    case OutputFormat::kJson: text = RenderJson(*plan); break;
    case OutputFormat::kSvg: text = RenderSvg(*plan); break;
  }
  if (!options->output.has_value()) {
    out << text;
    return kExitOk;
  }
  std::ofstream file(*options->output, std::ios::binary | std::ios::trunc);
  file << text;
  file.close();
  if (!file) {
    err << "vemesh plan: cannot write --output '" << *options->output
        << "'\n";
    return kExitIoError;
  }
  return kExitOk;
}

}  // namespace vemesh::plan
