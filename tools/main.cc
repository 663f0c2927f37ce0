// tools/main.cc
//
// The `vemesh` command: a subcommand, then its flags.
//
//   vemesh plan --mesh PP=2,DP=2,TP=2 --ranks-per-host 4
//   vemesh plan --mesh PP=2,DP=2,TP=2 --placement cyclic --hosts 2
//   vemesh plan --mesh PP=2,DP=2,TP=2 --ranks-per-host 4 --check placement.json
//   vemesh plan --help
//   vemesh checkpoint inspect /ckpt
//   vemesh checkpoint export /ckpt model.safetensors
//   vemesh --help
//
// Each subcommand is a function in a library (tools/plan/ for `plan`,
// tools/checkpoint/ for `checkpoint`), so this file only dispatches.

#include <iostream>
#include <string>
#include <vector>

#include "tools/checkpoint/checkpoint_command.h"
#include "tools/plan/plan_command.h"

namespace {

constexpr char kUsage[] =
    "Usage: vemesh <command> [flags]\n"
    "\n"
    "Commands:\n"
    "  plan     plan a device mesh: ranks, groups, hosts (no communication);\n"
    "           with --check, compare it with a job's reported placement\n"
    "  checkpoint  inspect a checkpoint directory (verifying every checksum)\n"
    "           or export its tensors to one safetensors file\n"
    "\n"
    "Run `vemesh <command> --help` for a command's flags.\n";

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty()) {
    std::cerr << kUsage;
    return vemesh::plan::kExitUsage;
  }
  const std::string command = args.front();
  if (command == "--help" || command == "-h" || command == "help") {
    return vemesh::plan::WriteToStream(kUsage, std::cout, std::cerr);
  }
  if (command == "plan") {
    return vemesh::plan::RunPlanCommand(
        std::vector<std::string>(args.begin() + 1, args.end()), std::cout,
        std::cerr);
  }
  if (command == "checkpoint") {
    return vemesh::checkpoint_tool::RunCheckpointCommand(
        std::vector<std::string>(args.begin() + 1, args.end()), std::cout,
        std::cerr);
  }
  std::cerr << "vemesh: unknown command '" << command
            << "'; expected one of: plan, checkpoint (see `vemesh --help`)\n";
  return vemesh::plan::kExitUsage;
}
