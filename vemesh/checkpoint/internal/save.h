// vemesh/checkpoint/internal/save.h
//
// A save in three steps, so that AsyncSaver can run the middle one on a
// thread of its own:
//   1. PlanSave (collective): every rank's piece list to every rank, and one
//      deterministic plan: which rank writes each distinct (tensor, box).
//   2. WriteShard (local, no communication): this rank's shard file, fsynced.
//   3. CommitSave (collective): every rank's result to every rank; rank 0
//      writes the manifest and `latest` when all succeeded; one status.
//
//   VEMESH_ASSIGN_OR_RETURN(SavePlan plan, PlanSave(state, step, dir, world,
//                                                   options));
//   absl::StatusOr<ShardResult> mine = WriteShard(plan, PlannedData(plan,
//   state)); return CommitSave(plan, mine, world);

#ifndef VEMESH_CHECKPOINT_INTERNAL_SAVE_H_
#define VEMESH_CHECKPOINT_INTERNAL_SAVE_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "vemesh/checkpoint/checkpoint.h"
#include "vemesh/checkpoint/manifest.h"
#include "vemesh/checkpoint/state_dict.h"
#include "vemesh/comm/communicator.h"

namespace vemesh::checkpoint::internal {

struct PlannedPiece {
  std::string name;
  Box box;
  DType dtype = DType::kF32;
  uint64_t bytes = 0;
  size_t local_index = 0;  // in the saving rank's StateDict::pieces()
};

struct SavePlan {
  int64_t step = 0;
  int rank = 0;
  int world_size = 0;
  int keep_last = 2;
  std::string job;   // SaveOptions::job (every rank's the same)
  std::string mesh;  // SaveOptions::mesh (rank 0's)
  std::string dir;
  std::string step_dir_name;                      // "step-<S>"
  std::string step_dir;                           // dir + "/" + step_dir_name
  std::map<std::string, std::string> metadata;    // rank 0's
  std::map<std::string, ManifestTensor> tensors;  // shapes, no pieces yet
  std::vector<PlannedPiece> mine;  // what this rank writes, in file order
  // Bytes each rank writes (for tests and benchmarks of the spread).
  std::vector<uint64_t> bytes_per_rank;
};

struct ShardResult {
  std::string file;  // shard-<rank>.safetensors
  uint64_t file_size = 0;
  std::vector<std::pair<std::string, ManifestPiece>> pieces;  // (tensor, piece)
};

absl::StatusOr<SavePlan> PlanSave(const StateDict& state, int64_t step,
                                  const std::string& dir, Communicator& world,
                                  const SaveOptions& options);
// The data of plan.mine, from `state`.
std::vector<const void*> PlannedData(const SavePlan& plan,
                                     const StateDict& state);
absl::StatusOr<ShardResult> WriteShard(const SavePlan& plan,
                                       const std::vector<const void*>& data);
absl::Status CommitSave(const SavePlan& plan,
                        const absl::StatusOr<ShardResult>& mine,
                        Communicator& world);

}  // namespace vemesh::checkpoint::internal

#endif  // VEMESH_CHECKPOINT_INTERNAL_SAVE_H_
