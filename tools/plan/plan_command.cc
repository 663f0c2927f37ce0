#include "tools/plan/plan_command.h"

#include <cerrno>
#include <cstring>
#include <fstream>

#include "tools/plan/placement_check.h"
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

namespace {

// Writes the command's output to --output FILE, or to `out`.
int Emit(const std::string& text, const std::optional<std::string>& output,
         std::ostream& out, std::ostream& err) {
  if (!output.has_value()) return WriteToStream(text, out, err);
  std::ofstream file(*output, std::ios::binary | std::ios::trunc);
  file << text;
  file.close();
  if (!file) {
    err << "vemesh plan: cannot write --output '" << *output << "'\n";
    return kExitIoError;
  }
  return kExitOk;
}

}  // namespace

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
  if (options->check.has_value()) {
    if (options->format == OutputFormat::kSvg) {
      err << "vemesh plan: --check prints a comparison: expected --format "
             "table or json, got svg\n";
      return kExitUsage;
    }
    absl::StatusOr<Placement> job = LoadJobPlacement(*options->check);
    absl::StatusOr<PlacementCheck> check =
        job.ok() ? CheckPlacement(*plan, *job)
                 : absl::StatusOr<PlacementCheck>(job.status());
    if (!check.ok()) {
      err << "vemesh plan: " << check.status().message() << "\n";
      return kExitUsage;
    }
    text = options->format == OutputFormat::kJson
               ? RenderCheckJson(*check)
               : RenderCheck(*plan, *job, *check);
    const int code = Emit(text, options->output, out, err);
    if (code != kExitOk) return code;
    return check->matches ? kExitOk : kExitMismatch;
  }
  switch (options->format) {
    case OutputFormat::kTable:
      text = RenderTable(*plan);
      break;
    case OutputFormat::kJson:
      text = RenderJson(*plan);
      break;
    case OutputFormat::kSvg:
      text = RenderSvg(*plan);
      break;
  }
  return Emit(text, options->output, out, err);
}

}  // namespace vemesh::plan
