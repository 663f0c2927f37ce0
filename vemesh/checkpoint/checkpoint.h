// vemesh/checkpoint/checkpoint.h
//
// Sharded checkpoints that outlive the mesh: every rank saves the pieces it
// holds, and any other decomposition (another mesh shape, world size or
// strategy) loads them, each rank reading only the bytes it needs.
//
//   StateDict state;                        // vemesh/checkpoint/state_dict.h
//   state.Add("w", DType::kF32, {16, 16}, Box{{4 * rank, 0}, {4, 16}}, rows);
//   state.SetMetadata("data_position", "1234");
//   absl::Status s = Save(state, /*step=*/100, "/ckpt", *world);
//   ...
//   // Another job, another decomposition (here column shards):
//   StateDict want;
//   want.Add("w", DType::kF32, {16, 16}, Box{{0, 8 * rank}, {16, 8}}, cols);
//   absl::StatusOr<LoadResult> r = Load(want, "/ckpt", *world2);
//   // r->step == 100, r->metadata["data_position"] == "1234".
//
// On disk (docs/USER_GUIDE.md, "Checkpoints"):
//   <dir>/step-<S>/shard-<rank>.safetensors   what rank <rank> wrote
//   <dir>/step-<S>/manifest.json              the commit point, written last
//   <dir>/latest                              names the newest step directory
//   <dir>/owner                               the job that owns <dir>
// A tensor piece held by several ranks (a replica) is written once, by one
// of its holders, the holders taking turns so that no rank writes every
// replicated tensor. The manifest lists each tensor's dtype, global shape
// and pieces (box, file, byte range, CRC32C per 1 MiB chunk). It is written
// by rank 0 only after every rank's shard is durable (fsync of file and
// directory), then `latest` is replaced atomically (rename): a crash at any
// moment leaves the previous checkpoint loadable.
//
// Collective: every rank of `world` calls Save (same step, same dir) or
// Load; a failure on any rank is returned, the same status, on every rank.
// The time is bounded by the disk and by `world`'s timeout (set_timeout).
// `world` carries small host buffers (piece lists, statuses): an MPI or Gloo
// communicator, not NCCL's. `dir` is one directory every rank sees (one
// host, or a shared file system); piece data is host memory.

#ifndef VEMESH_CHECKPOINT_CHECKPOINT_H_
#define VEMESH_CHECKPOINT_CHECKPOINT_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "vemesh/checkpoint/manifest.h"
#include "vemesh/checkpoint/state_dict.h"
#include "vemesh/comm/communicator.h"

namespace vemesh::checkpoint {

struct SaveOptions {
  // Keep the last K committed step directories (older ones are removed
  // after `latest` names the new one); at least 1.
  int keep_last = 2;
  // The job saving (printable ASCII, at most 255 bytes), recorded in the
  // manifest; a load may require it (LoadOptions::job).
  std::string job;
  // The saving mesh as the job describes it ("DP=2,TP=4"), recorded in the
  // manifest for `vemesh checkpoint inspect`; free text, printable ASCII.
  std::string mesh;
};

// Collective over `world`. Writes <dir>/step-<S>/shard-<rank>.safetensors
// (+ fsync), then rank 0 writes <dir>/step-<S>/manifest.json last (temp
// file, fsync, rename, fsync of the directory), then replaces <dir>/latest
// atomically and removes step directories beyond keep_last. Saving a step
// that is already committed writes a new directory step-<S>.<n> (the old
// one stays loadable until the new one is committed). Errors (a bad state,
// a directory without permission, a full disk) name the file or tensor and
// are the same on every rank; nothing is committed then.
absl::Status Save(const StateDict& state, int64_t step, const std::string& dir,
                  Communicator& world, const SaveOptions& options = {});

struct LoadResult {
  int64_t step = 0;
  std::string path;  // the step directory read
  absl::flat_hash_map<std::string, std::string> metadata;
  std::string job;   // the manifest's owning job ("" for version 1)
  std::string mesh;  // the saving mesh, as described ("" when not given)
  // CRC32C of the manifest.json bytes read: which checkpoint this was.
  uint32_t manifest_crc32c = 0;
};

struct LoadOptions {
  // Given: the newest committed directory of this step instead of the one
  // `latest` names.
  std::optional<int64_t> step;
  // Given (the result of an earlier load, e.g. a resume's parameters):
  // exactly that step directory, whose manifest must still be the bytes the
  // earlier load read (same CRC32C, same job). The loads of one resume read
  // one checkpoint: a directory removed, re-saved or replaced since is
  // FailedPrecondition naming both. `step` is ignored then.
  const LoadResult* same_checkpoint_as = nullptr;
  // Non-empty: the manifest must name this job (FailedPrecondition naming
  // both jobs otherwise; a version 1 manifest names none).
  std::string job;
  // Each key must have been saved with this value in the manifest's
  // metadata (what the model is): InvalidArgument naming the checkpoint,
  // the key and both values otherwise, on every rank, before any piece of
  // `state` is written (the manifest is read once).
  std::map<std::string, std::string> metadata = {};
};

// Collective. Fills every piece of `state` from the checkpoint <dir>/latest
// names (or, given `step`, the newest committed directory of that step),
// bit-identical: the ranks agree on one manifest, then each 1 MiB chunk
// that any rank's boxes overlap is read by one of those ranks, its CRC32C
// verified, and its parts sent to the others (all_to_all_v over `world`):
// each byte is read once per job, also when the layout differs. Errors name the
// file or tensor and are the same on every rank: no checkpoint, a missing or
// truncated shard, a checksum mismatch, a tensor the checkpoint lacks, a
// dtype or shape that differs ("of another model"), a part of a box that no
// saved piece covers.
absl::StatusOr<LoadResult> Load(StateDict& state, const std::string& dir,
                                Communicator& world,
                                std::optional<int64_t> step = std::nullopt);
// The same, with the choice of checkpoint and its checks in `options`.
// Every rank must read the same manifest (path and CRC32C): Aborted naming
// the directory when they did not (it changed during the load).
absl::StatusOr<LoadResult> Load(StateDict& state, const std::string& dir,
                                Communicator& world,
                                const LoadOptions& options);

// Not collective. The step of the checkpoint Load would read from <dir>
// (its committed manifest), or nullopt when <dir> holds none (absent or
// empty). An error when <dir> cannot be read.
absl::StatusOr<std::optional<int64_t>> LatestStep(const std::string& dir);

// Not collective. One directory, one job: OK when a save naming `job`
// (SaveOptions::job) may write into `dir` (absent, unowned, or owned by
// `job`; a save naming no job only into an unowned one); otherwise
// FailedPrecondition naming the owning job and `job`. Save checks the same
// (and a named job's first save claims the directory: <dir>/owner); call
// this to refuse before a job spends time it cannot checkpoint.
absl::Status CheckCanWrite(const std::string& dir, const std::string& job);

// Collective over `world`: OK when every rank's `local` is OK, else the
// first failed rank's status (by rank), its message prefixed "rank R: ", on
// every rank; the errors of Save and Load are agreed this way. For callers
// that check their own input before a Save or Load (the Python module), so
// that a bad input on one rank fails every rank rather than leaving them
// in the collective.
absl::Status AgreeStatus(Communicator& world, const absl::Status& local);

// What a checkpoint holds, without its data.
struct CheckpointManifest {
  std::string path;  // the step directory
  Manifest manifest;
  uint32_t manifest_crc32c = 0;  // of the manifest.json bytes read
};

// Not collective. The manifest of the checkpoint Load would read from <dir>
// (given `step`, the newest committed directory of that step), read bounded
// (kMaxManifestBytes) and checked (ParseManifest): tensor names, dtypes,
// shapes and pieces, the step and the metadata. NotFound when <dir> holds
// no committed checkpoint (of that step); the parse error naming the file
// for a damaged one.
absl::StatusOr<CheckpointManifest> ReadManifest(
    const std::string& dir, std::optional<int64_t> step = std::nullopt);

// Shard-file bytes this process has read in loads so far: how often a byte
// is read per job (bench/checkpoint_bench.cc, the tests).
uint64_t ShardBytesRead();

}  // namespace vemesh::checkpoint

#endif  // VEMESH_CHECKPOINT_CHECKPOINT_H_
