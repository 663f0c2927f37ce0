// tools/checkpoint/checkpoint_command.cc

#include "tools/checkpoint/checkpoint_command.h"

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/strings/numbers.h"
#include "vemesh/checkpoint/export.h"
#include "vemesh/checkpoint/inspect.h"

namespace vemesh::checkpoint_tool {
namespace {

constexpr char kUsage[] =
    "Usage: vemesh checkpoint inspect DIR [--step S]\n"
    "       vemesh checkpoint export DIR OUT.safetensors [--step S]\n"
    "\n"
    "inspect  list the owner, the step directories and the checkpoint's\n"
    "         step, job, mesh, metadata and tensors; verify every chunk's\n"
    "         CRC32C (exit 1 naming each bad chunk)\n"
    "export   write every tensor whole, under its name, into one\n"
    "         safetensors file (readable without vemesh)\n"
    "--step S the newest committed checkpoint of step S (default: the one\n"
    "         `latest` names)\n";

}  // namespace

int RunCheckpointCommand(absl::Span<const std::string> args, std::ostream& out,
                         std::ostream& err) {
  std::vector<std::string> positional;
  std::optional<int64_t> step;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--help" || a == "-h") {
      out << kUsage;
      return kExitOk;
    }
    if (a == "--step" || a.rfind("--step=", 0) == 0) {
      std::string value;
      if (a == "--step") {
        if (i + 1 == args.size()) {
          err << "vemesh checkpoint: --step needs a value\n" << kUsage;
          return kExitUsage;
        }
        value = args[++i];
      } else {
        value = a.substr(7);
      }
      int64_t s = 0;
      if (!absl::SimpleAtoi(value, &s) || s < 0) {
        err << "vemesh checkpoint: --step '" << value
            << "': expected a step number >= 0\n";
        return kExitUsage;
      }
      step = s;
      continue;
    }
    if (a.rfind("--", 0) == 0) {
      err << "vemesh checkpoint: unknown flag '" << a << "'\n" << kUsage;
      return kExitUsage;
    }
    positional.push_back(a);
  }
  if (positional.empty()) {
    err << kUsage;
    return kExitUsage;
  }
  const std::string& verb = positional[0];
  if (verb == "inspect" && positional.size() == 2) {
    absl::Status s = checkpoint::InspectCheckpoint(positional[1], step, out);
    out.flush();
    if (!s.ok()) {
      err << "vemesh checkpoint inspect: " << s.message() << "\n";
      return kExitBad;
    }
    return kExitOk;
  }
  if (verb == "export" && positional.size() == 3) {
    absl::StatusOr<checkpoint::ExportResult> r =
        checkpoint::ExportSafetensors(positional[1], positional[2], step);
    if (!r.ok()) {
      err << "vemesh checkpoint export: " << r.status().message() << "\n";
      return kExitBad;
    }
    out << "exported step " << r->step << " from " << r->path << ": "
        << r->tensors << " tensors, " << r->bytes << " bytes to "
        << positional[2] << "\n";
    out.flush();
    return out ? kExitOk : kExitBad;
  }
  err << "vemesh checkpoint: expected 'inspect DIR' or 'export DIR OUT', got";
  for (const std::string& p : positional) err << " '" << p << "'";
  err << "\n" << kUsage;
  return kExitUsage;
}

}  // namespace vemesh::checkpoint_tool
