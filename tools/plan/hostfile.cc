#include "tools/plan/hostfile.h"

#include <fstream>
#include <map>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace vemesh::plan {
namespace {

absl::Status LineError(absl::string_view path, int64_t line,
                       absl::string_view text, absl::string_view expected) {
  return absl::InvalidArgumentError(absl::StrCat("hostfile '", path, "' line ",
                                                 line, ": '", text,
                                                 "': expected ", expected));
}

// "slots=4" -> 4; the key must match.
bool ParseCount(absl::string_view token, absl::string_view key,
                int64_t* value) {
  if (!absl::ConsumePrefix(&token, key)) return false;
  if (!absl::ConsumePrefix(&token, "=")) return false;
  return absl::SimpleAtoi(token, value);
}

}  // namespace

int64_t Hostfile::total_slots() const {
  int64_t total = 0;
  for (int64_t s : slots) total += s;  // bounded: hosts * slots < 2^36
  return total;
}

absl::StatusOr<Hostfile> ParseHostfile(absl::string_view text,
                                       absl::string_view path) {
  Hostfile out;
  out.path = std::string(path);
  std::map<std::string, int64_t, std::less<>> first_line;
  int64_t line_no = 0;
  for (absl::string_view raw : absl::StrSplit(text, '\n')) {
    ++line_no;
    absl::string_view line = raw;
    if (size_t hash = line.find('#'); hash != absl::string_view::npos) {
      line = line.substr(0, hash);
    }
    line = absl::StripAsciiWhitespace(line);
    if (line.empty()) continue;
    const absl::string_view shown = absl::StripAsciiWhitespace(raw);
    std::vector<absl::string_view> tokens =
        absl::StrSplit(line, absl::ByAnyChar(" \t\r"), absl::SkipEmpty());
    const std::string name(tokens[0]);
    if (name.find('=') != std::string::npos) {
      return LineError(path, line_no, shown,
                       "a host name first, e.g. 'node0 slots=4'");
    }
    int64_t slots = -1;
    for (size_t i = 1; i < tokens.size(); ++i) {
      int64_t v = 0;
      if (absl::StartsWith(tokens[i], "slots=")) {
        if (!ParseCount(tokens[i], "slots", &v) || v < 1 ||
            v > kMaxSlotsPerHost) {
          return LineError(
              path, line_no, shown,
              absl::StrCat("slots=N with N from 1 to ", kMaxSlotsPerHost,
                           ", got '", tokens[i], "'"));
        }
        slots = v;
      } else if (absl::StartsWith(tokens[i], "max_slots=") ||
                 absl::StartsWith(tokens[i], "max-slots=")) {
        // A cap for oversubscription; it does not move ranks under
        // --map-by slot, so it is only checked.
        if (!ParseCount(tokens[i], tokens[i].substr(0, tokens[i].find('=')),
                        &v) ||
            v < 1) {
          return LineError(
              path, line_no, shown,
              absl::StrCat("max_slots=N with N >= 1, got '", tokens[i], "'"));
        }
      } else {
        return LineError(
            path, line_no, shown,
            absl::StrCat("'HOST slots=N [max_slots=M]'; '", tokens[i],
                         "' is not slots= or max_slots="));
      }
    }
    if (slots < 0) {
      return LineError(
          path, line_no, shown,
          absl::StrCat("'", name,
                       " slots=N': without slots Open MPI counts "
                       "the host's cores, which the planner cannot know"));
    }
    if (auto it = first_line.find(name); it != first_line.end()) {
      return LineError(
          path, line_no, shown,
          absl::StrCat("each host once; '", name, "' is already on line ",
                       it->second, " (merge the two lines' slots)"));
    }
    if (static_cast<int64_t>(out.names.size()) >= kMaxHostfileHosts) {
      return LineError(path, line_no, shown,
                       absl::StrCat("at most ", kMaxHostfileHosts, " hosts"));
    }
    first_line.emplace(name, line_no);
    out.names.push_back(name);
    out.slots.push_back(slots);
  }
  if (out.names.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("hostfile '", path,
                     "' lists no hosts: expected lines like "
                     "'node0 slots=4'"));
  }
  return out;
}

absl::StatusOr<Hostfile> LoadHostfile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot open hostfile '", path, "'"));
  }
  // Read at most one byte past the bound: a bigger file is refused before
  // it is held in memory.
  std::string text(static_cast<size_t>(kMaxHostfileBytes + 1), '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<size_t>(in.gcount()));
  if (static_cast<int64_t>(text.size()) > kMaxHostfileBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("hostfile '", path, "' is larger than ", kMaxHostfileBytes,
                     " bytes: expected a hostfile"));
  }
  return ParseHostfile(text, path);
}

absl::StatusOr<HostMap> HostMapFromHostfile(const Hostfile& hostfile,
                                            int64_t world_size) {
  const int64_t total = hostfile.total_slots();
  if (total < world_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "hostfile '", hostfile.path, "' has ", total,
        " slots but the mesh has ", world_size, " ranks: expected at least ",
        world_size, " slots (Open MPI refuses this without --oversubscribe)"));
  }
  std::vector<std::string> names;
  std::vector<int64_t> sizes;
  int64_t left = world_size;
  for (size_t i = 0; i < hostfile.names.size() && left > 0; ++i) {
    const int64_t take = std::min(left, hostfile.slots[i]);
    names.push_back(hostfile.names[i]);
    sizes.push_back(take);
    left -= take;
  }
  return HostMap::Slots(std::move(names), std::move(sizes));
}

}  // namespace vemesh::plan
