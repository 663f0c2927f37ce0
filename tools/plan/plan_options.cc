#include "tools/plan/plan_options.h"

#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace vemesh::plan {
namespace {

absl::StatusOr<int64_t> ParseInt(absl::string_view flag,
                                 absl::string_view value,
                                 absl::string_view expected) {
  int64_t n = 0;
  if (!absl::SimpleAtoi(value, &n)) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, " expects ", expected, ", got '", value, "'"));
  }
  return n;
}

}  // namespace

absl::StatusOr<OutputFormat> ParseOutputFormat(absl::string_view text) {
  if (text == "table") return OutputFormat::kTable;
  if (text == "json") return OutputFormat::kJson;
  if (text == "svg") return OutputFormat::kSvg;
  return absl::InvalidArgumentError(absl::StrCat(
      "--format expects one of table, json, svg, got '", text, "'"));
}

absl::string_view OutputFormatName(OutputFormat format) {
  switch (format) {
    case OutputFormat::kTable:
      return "table";
    case OutputFormat::kJson:
      return "json";
    case OutputFormat::kSvg:
      return "svg";
  }
  return "table";
}

absl::StatusOr<PlanOptions> ParsePlanArgs(absl::Span<const std::string> args) {
  PlanOptions opts;
  bool have_mesh = false;
  for (size_t i = 0; i < args.size(); ++i) {
    absl::string_view arg = args[i];
    if (arg == "--help" || arg == "-h") {
      opts.help = true;
      continue;
    }
    if (!absl::StartsWith(arg, "--")) {
      return absl::InvalidArgumentError(
          absl::StrCat("unexpected argument '", arg,
                       "'; `vemesh plan` takes only flags "
                       "(see `vemesh plan --help`)"));
    }
    // Split "--flag=value"; otherwise the value is the next argument.
    absl::string_view flag = arg;
    std::optional<absl::string_view> value;
    if (size_t eq = arg.find('='); eq != absl::string_view::npos) {
      flag = arg.substr(0, eq);
      value = arg.substr(eq + 1);
    }
    static constexpr absl::string_view kFlags[] = {
        "--mesh",      "--rank",    "--ranks-per-host",
        "--placement", "--hosts",   "--latency-sensitive",
        "--check",     "--format",  "--color-by",
        "--output",    "--flatten", "--view",
        "--also-mesh"};
    bool known = false;
    for (absl::string_view f : kFlags) known = known || f == flag;
    if (!known) {
      return absl::InvalidArgumentError(absl::StrCat(
          "unknown flag '", flag, "'; expected one of ",
          absl::StrJoin(kFlags, ", "), " (see `vemesh plan --help`)"));
    }
    if (!value.has_value()) {
      if (i + 1 >= args.size()) {
        return absl::InvalidArgumentError(absl::StrCat(flag, " needs a value"));
      }
      value = args[++i];
    }
    if (flag == "--mesh") {
      opts.mesh = std::string(*value);
      have_mesh = true;
    } else if (flag == "--rank") {
      absl::StatusOr<int64_t> r =
          ParseInt(flag, *value, "a global rank (an integer >= 0)");
      if (!r.ok()) return r.status();
      if (*r < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("--rank ", *r, " is out of range: ranks are >= 0"));
      }
      opts.rank = *r;
    } else if (flag == "--ranks-per-host") {
      absl::StatusOr<int64_t> n = ParseInt(flag, *value, "an integer >= 1");
      if (!n.ok()) return n.status();
      if (*n < 1 || *n > kMaxRanksPerHost) {
        return absl::InvalidArgumentError(
            absl::StrCat("--ranks-per-host expects an integer from 1 to ",
                         kMaxRanksPerHost, ", got ", *n));
      }
      opts.ranks_per_host = *n;
    } else if (flag == "--placement") {
      if (*value == "block") {
        opts.placement = PlacementPolicy::kBlock;
      } else if (*value == "cyclic") {
        opts.placement = PlacementPolicy::kCyclic;
      } else if (absl::StartsWith(*value, "hostfile:") &&
                 value->size() > std::string_view("hostfile:").size()) {
        opts.placement = PlacementPolicy::kHostfile;
        opts.hostfile = std::string(value->substr(9));
      } else {
        return absl::InvalidArgumentError(absl::StrCat(
            "--placement expects block, cyclic or hostfile:FILE, got '", *value,
            "'"));
      }
    } else if (flag == "--hosts") {
      absl::StatusOr<int64_t> n =
          ParseInt(flag, *value, "a host count (an integer >= 1)");
      if (!n.ok()) return n.status();
      if (*n < 1) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--hosts expects a host count (an integer >= 1), got ", *n));
      }
      opts.hosts = *n;
    } else if (flag == "--latency-sensitive") {
      // "" turns the warnings off; otherwise comma-separated names.
      std::vector<std::string> names;
      if (!value->empty()) {
        for (absl::string_view name : absl::StrSplit(*value, ',')) {
          if (name.empty()) {
            return absl::InvalidArgumentError(absl::StrCat(
                "--latency-sensitive expects dimension names separated by "
                "commas, e.g. TP,EP, got '",
                *value, "'"));
          }
          names.emplace_back(name);
        }
      }
      opts.latency_sensitive = std::move(names);
    } else if (flag == "--check") {
      if (value->empty()) {
        return absl::InvalidArgumentError(
            "--check expects the file of a job's get_placement() JSON, "
            "got ''");
      }
      opts.check = std::string(*value);
    } else if (flag == "--format") {
      absl::StatusOr<OutputFormat> f = ParseOutputFormat(*value);
      if (!f.ok()) return f.status();
      opts.format = *f;
    } else if (flag == "--color-by") {
      if (value->empty()) {
        return absl::InvalidArgumentError(
            "--color-by expects a dimension name, got ''");
      }
      opts.color_by = std::string(*value);
    } else if (flag == "--flatten" || flag == "--view") {
      absl::StatusOr<GroupSpec> spec =
          ParseGroupSpec(flag == "--flatten", *value);
      if (!spec.ok()) return spec.status();
      opts.groups.push_back(*std::move(spec));
    } else if (flag == "--also-mesh") {
      const size_t colon = value->find(':');
      if (colon == absl::string_view::npos || colon == 0 ||
          colon + 1 == value->size()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--also-mesh expects NAME:SPEC, e.g. experts:PP=2,EDP=1,EP=4, "
            "got '",
            *value, "'"));
      }
      opts.also_meshes.emplace_back(std::string(value->substr(0, colon)),
                                    std::string(value->substr(colon + 1)));
    } else if (flag == "--output") {
      if (value->empty()) {
        return absl::InvalidArgumentError(
            "--output expects a file name, got ''");
      }
      opts.output = std::string(*value);
    }
  }
  if (!have_mesh && !opts.help) {
    return absl::InvalidArgumentError(
        "--mesh is required, e.g. --mesh PP=2,DP=2,TP=2");
  }
  return opts;
}

absl::StatusOr<GroupSpec> ParseGroupSpec(bool flattened,
                                         absl::string_view text) {
  const absl::string_view flag = flattened ? "--flatten" : "--view";
  const absl::string_view expected =
      flattened ? "NAME=DIM,DIM,..., e.g. EP=DP,TP" : "DIM,DIM,..., e.g. DP,TP";
  GroupSpec spec;
  spec.flattened = flattened;
  absl::string_view dims = text;
  if (flattened) {
    const size_t eq = text.find('=');
    if (eq == absl::string_view::npos || eq == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(flag, " expects ", expected, ", got '", text, "'"));
    }
    spec.name = std::string(text.substr(0, eq));
    dims = text.substr(eq + 1);
  }
  for (absl::string_view d : absl::StrSplit(dims, ',')) {
    if (d.empty() || d.find('=') != absl::string_view::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat(flag, " expects ", expected, ", got '", text, "'"));
    }
    spec.dims.emplace_back(d);
  }
  if (!flattened) spec.name = std::string(dims);
  return spec;
}

std::string PlanUsage() {
  return absl::StrCat(
      "Usage: vemesh plan --mesh NAME=SIZE,... [flags]\n"
      "\n"
      "Plans a device mesh without any communication: where each rank lands,\n"
      "the groups of every dimension, and which of them cross hosts.\n"
      "\n"
      "Flags:\n"
      "  --mesh SPEC            the mesh, outermost dimension first, e.g.\n"
      "                         PP=2,DP=2,TP=2 (required)\n"
      "  --rank R               show the view of global rank R: coordinate,\n"
      "                         host, groups, peers, pipeline neighbours\n"
      "  --ranks-per-host N     ranks on one host (default ",
      kDefaultRanksPerHost, ", at most ", kMaxRanksPerHost,
      ")\n"
      "  --placement P          how the launcher places ranks on hosts:\n"
      "                         block (default): host = rank / N\n"
      "                           (srun --distribution=block, mpirun --map-by "
      "slot)\n"
      "                         cyclic: host = rank % hosts, round-robin\n"
      "                           (srun --distribution=cyclic, mpirun --map-by "
      "node)\n"
      "                         hostfile:FILE: an Open MPI hostfile, lines\n"
      "                           'node0 slots=4', filled in order (--map-by "
      "slot)\n"
      "  --hosts H              the host count (block, cyclic); default: the\n"
      "                         hosts that --ranks-per-host fills\n"
      "  --latency-sensitive L  dimensions whose groups should stay inside a\n"
      "                         host, e.g. TP,EP,CP (default TP; '' for "
      "none):\n"
      "                         a warning names the order or placement that\n"
      "                         keeps them inside\n"
      "  --check FILE           compare the plan with the placement a job\n"
      "                         reported (DeviceMesh::get_placement() JSON);\n"
      "                         exit 0 when they agree, 3 when they differ\n"
      "  --format FMT           table (default), json or svg\n"
      "  --color-by DIM         svg: colour the groups of DIM (default TP, or\n"
      "                         the last dimension when there is no TP)\n"
      "  --flatten NAME=D1,D2   also show the groups of D1,D2 flattened into\n"
      "                         NAME (DeviceMesh::flatten; adjacent or not,\n"
      "                         e.g. EP=DP,TP or PP_TP=PP,TP); repeatable\n"
      "  --view D1,D2           also show the groups of the sub-mesh over\n"
      "                         D1,D2 (mesh[{\"D1\",\"D2\"}]); repeatable\n"
      "                         --color-by takes NAME or D1,D2 too\n"
      "  --also-mesh NAME:SPEC  another mesh of the job over the same ranks\n"
      "                         (a named registry mesh, e.g.\n"
      "                         experts:PP=2,EDP=1,EP=4): every mesh is\n"
      "                         listed with the groups it shares (the same\n"
      "                         rank sets: one communicator); repeatable\n"
      "  --output FILE          write to FILE instead of stdout\n"
      "  --help                 show this text\n"
      "\n"
      "Worlds of more than 256 ranks are summarised in every format; any\n"
      "mesh whose size fits in a signed 64-bit integer is planned.\n"
      "\n"
      "Examples:\n"
      "  vemesh plan --mesh PP=4,DP=2,TP=8 --ranks-per-host 8\n"
      "  vemesh plan --mesh PP=2,DP=2,TP=2 --rank 5\n"
      "  vemesh plan --mesh PP=2,DP=2,TP=2 --placement cyclic --hosts 2\n"
      "  vemesh plan --mesh PP=2,EP=2,TP=2 --placement hostfile:hosts.txt "
      "--latency-sensitive TP,EP\n"
      "  vemesh plan --mesh PP=2,DP=2,TP=2 --ranks-per-host 4 --check "
      "placement.json\n"
      "  vemesh plan --mesh PP=2,DP=2,TP=2 --ranks-per-host 4 --format svg "
      "--output plan.svg\n"
      "  vemesh plan --mesh PP=2,DP=2,TP=2 --ranks-per-host 4 --flatten "
      "EP=DP,TP --view PP,TP\n");
}

}  // namespace vemesh::plan
