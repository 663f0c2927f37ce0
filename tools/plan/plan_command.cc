#include "tools/plan/plan_command.h"

#include <cerrno>
#include <cstring>
#include <fstream>

#include "tools/plan/plan.h"
#include "tools/plan/plan_options.h"
#include "tools/plan/render_json.h"
#include "tools/plan/render_svg.h"
#include "tools/plan/render_table.h"

namespace vemesh::plan {

int WriteToStream(absl::string_view text, std::ostream& out,
                  std::ostream& err) {
  errno = 0;
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  // Flushed here, not at exit: a full disk or a closed stdout only shows up
  // when the bytes are handed to the system, and exit would drop the error.
  out.flush();
  if (out) return kExitOk;
  const int saved = errno;
  err << "vemesh: cannot write the output (" << text.size()
      << " bytes) to stdout" << (saved != 0 ? ": " : "")
      << (saved != 0 ? std::strerror(saved) : "")
      << "; expected a writable stdout, or pass --output FILE\n";
  return kExitIoError;
}

int RunPlanCommand(absl::Span<const std::string> args, std::ostream& out,
                   std::ostream& err) {
  absl::StatusOr<PlanOptions> options = ParsePlanArgs(args);
  if (!options.ok()) {
    err << "vemesh plan: " << options.status().message() << "\n";
    return kExitUsage;
  }
  if (options->help) return WriteToStream(PlanUsage(), out, err);
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
  if (!options->output.has_value()) return WriteToStream(text, out, err);
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
