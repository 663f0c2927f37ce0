// vemesh/checkpoint/internal/directory.h
//
// The layout of a checkpoint directory: step-<S>[.<n>] directories (n > 0
// when step S was saved again while an earlier save of S was committed), a
// manifest.json in each committed one, and `latest`, which names one.
//
//   VEMESH_ASSIGN_OR_RETURN(std::optional<std::string> path,
//                           FindCheckpoint("/ckpt", std::nullopt));
//   // *path == "/ckpt/step-100"

#ifndef VEMESH_CHECKPOINT_INTERNAL_DIRECTORY_H_
#define VEMESH_CHECKPOINT_INTERNAL_DIRECTORY_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace vemesh::checkpoint::internal {

inline constexpr char kManifestName[] = "manifest.json";
inline constexpr char kLatestName[] = "latest";
// The job that owns the directory: its name and a newline. Created once,
// atomically (link), by the first named save; never rewritten.
inline constexpr char kOwnerName[] = "owner";

struct StepDir {
  int64_t step = 0;
  int64_t n = 0;
  std::string name;
  bool committed = false;  // holds manifest.json
};

std::string StepDirName(int64_t step, int64_t n);
// "step-12" -> {12, 0}, "step-12.3" -> {12, 3}; nullopt for other names.
std::optional<StepDir> ParseStepDirName(const std::string& name);
// The step directories in `dir`, sorted by (step, n). An absent `dir` has
// none.
absl::StatusOr<std::vector<StepDir>> ListStepDirs(const std::string& dir);

// The committed step directory Load reads: given `step`, its newest
// committed directory; otherwise the one `latest` names when it is
// committed, else the newest committed one. nullopt when there is none.
absl::StatusOr<std::optional<std::string>> FindCheckpoint(
    const std::string& dir, std::optional<int64_t> step);

// The job named by <dir>/owner, or nullopt when the directory has none.
absl::StatusOr<std::optional<std::string>> ReadOwner(const std::string& dir);

// OK when `job` may write into `dir` (absent, unowned, or owned by `job`;
// an unnamed save only into an unowned one); else FailedPrecondition naming
// the owner and `job`. Claims nothing.
absl::Status CheckOwner(const std::string& dir, const std::string& job);

// Rank 0, before a save: creates `dir`, checks that `job` may write into it
// (one directory, one job: a directory owned by another job, or owned at
// all when `job` is empty, is FailedPrecondition naming both; a named job
// claims an unowned directory), then creates a fresh step directory for
// `step` (reusing an uncommitted step-<S>, emptied, or the next step-<S>.<n>
// after committed ones) and returns its name.
absl::StatusOr<std::string> PrepareStepDir(const std::string& dir, int64_t step,
                                           const std::string& job);

// Rank 0, after `latest` names `current`: removes this job's committed step
// directories (their manifest names `job`) beyond its newest `keep_last`
// (never `current`), and uncommitted ones older than `current` (crashed
// saves). Another job's checkpoints, and manifests that do not parse, are
// never removed nor counted. Each committed one loses its manifest first
// (fsynced), so a crash mid-removal never leaves a manifest without its
// shards.
absl::Status RemoveOldSteps(const std::string& dir, const std::string& current,
                            int keep_last, const std::string& job);

}  // namespace vemesh::checkpoint::internal

#endif  // VEMESH_CHECKPOINT_INTERNAL_DIRECTORY_H_
