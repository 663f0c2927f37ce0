// tools/plan/hostfile.h
//
// An Open MPI hostfile, as `vemesh plan --placement hostfile:FILE` reads it:
// one host per line with its slots, `#` comments and blank lines allowed.
//
//   # two nodes of uneven size
//   node0 slots=4
//   node1 slots=2 max_slots=8
//
//   absl::StatusOr<Hostfile> h = ParseHostfile(text, "hosts.txt");
//   h->names;   // {"node0", "node1"}
//   h->slots;   // {4, 2}
//
// Open MPI's `--map-by slot` (its default) fills node0's 4 slots, then
// node1's: HostMapFromHostfile gives that placement for a world.
//
// A line without slots=N is refused: Open MPI then counts the host's cores,
// which a plan made elsewhere cannot know. A host listed twice is refused
// too (merge its lines). Every error is InvalidArgument naming the file, the
// line number, the bad text and what was expected.

#ifndef VEMESH_TOOLS_PLAN_HOSTFILE_H_
#define VEMESH_TOOLS_PLAN_HOSTFILE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "vemesh/placement/host_map.h"

namespace vemesh::plan {

// Bounds that keep a hostfile cheap to read and plan: far above any cluster.
inline constexpr int64_t kMaxHostfileBytes = int64_t{4} << 20;
inline constexpr int64_t kMaxHostfileHosts = int64_t{1} << 16;
inline constexpr int64_t kMaxSlotsPerHost = int64_t{1} << 20;

struct Hostfile {
  std::string path;
  std::vector<std::string> names;
  std::vector<int64_t> slots;
  int64_t total_slots() const;
};

// `path` only names the file in messages.
absl::StatusOr<Hostfile> ParseHostfile(absl::string_view text,
                                       absl::string_view path);

// Reads and parses `path` (at most kMaxHostfileBytes).
absl::StatusOr<Hostfile> LoadHostfile(const std::string& path);

// Ranks 0..world_size-1 filled slot by slot, host by host; hosts left empty
// are dropped. InvalidArgument naming both numbers when the slots are fewer
// than the ranks.
absl::StatusOr<HostMap> HostMapFromHostfile(const Hostfile& hostfile,
                                            int64_t world_size);

}  // namespace vemesh::plan

#endif  // VEMESH_TOOLS_PLAN_HOSTFILE_H_
