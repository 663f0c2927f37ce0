#include "vemesh/strategies/periodic_checkpoint.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "vemesh/strategies/training_metadata.h"

namespace vemesh::strategies {

absl::StatusOr<std::unique_ptr<PeriodicCheckpoint>> PeriodicCheckpoint::Create(
    std::shared_ptr<Communicator> world, PeriodicCheckpointOptions options) {
  if (world == nullptr) {
    return absl::InvalidArgumentError(
        "PeriodicCheckpoint: world is null; expected the communicator of the "
        "ranks holding one copy of the model");
  }
  if (options.dir.empty()) {
    return absl::InvalidArgumentError(
        "PeriodicCheckpoint: options.dir is empty; expected a directory");
  }
  if (options.every < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("PeriodicCheckpoint: options.every is ", options.every,
                     "; expected >= 0 (0: never saves)"));
  }
  if (options.keep_last < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("PeriodicCheckpoint: options.keep_last is ",
                     options.keep_last, "; expected >= 1"));
  }
  return std::unique_ptr<PeriodicCheckpoint>(
      new PeriodicCheckpoint(std::move(world), std::move(options)));
}

PeriodicCheckpoint::PeriodicCheckpoint(std::shared_ptr<Communicator> world,
                                       PeriodicCheckpointOptions options)
    : world_(std::move(world)), options_(std::move(options)) {}

PeriodicCheckpoint::~PeriodicCheckpoint() = default;

absl::StatusOr<int64_t> PeriodicCheckpoint::Restore(TrainingState& state) {
  absl::StatusOr<std::optional<int64_t>> latest =
      checkpoint::LatestStep(options_.dir);
  // Every rank reads the directory alike, but one verdict all the same: a
  // rank that sees none while another loads would hang the load.
  int64_t found = latest.ok() && latest->has_value() ? 1 : 0;
  if (absl::Status s =
          world_->all_reduce(absl::MakeSpan(&found, 1), ReduceOp::kMin);
      !s.ok()) {
    return s;
  }
  if (!latest.ok()) return latest.status();
  if (found == 0) return 0;
  // The identity is checked inside the load, from the one manifest it
  // reads, before any buffer is written: a checkpoint of another model
  // with the same shapes is refused untouched.
  checkpoint::StateDict dict;
  if (absl::Status s = state.get_state_dict(&dict); !s.ok()) return s;
  checkpoint::LoadOptions load;
  load.metadata.insert(options_.identity.begin(), options_.identity.end());
  absl::StatusOr<checkpoint::LoadResult> loaded =
      checkpoint::Load(dict, options_.dir, *world_, load);
  if (!loaded.ok()) return loaded.status();
  // Step counts are not written in place.
  if (absl::Status s = state.set_state_dict(); !s.ok()) return s;
  if (options_.adopt_restored_job && !loaded->job.empty()) {
    options_.job = loaded->job;
  }
  restored_ = *std::move(loaded);
  return restored_->step;
}

absl::StatusOr<std::optional<int64_t>> PeriodicCheckpoint::AfterStep(
    TrainingState& state, int64_t step, bool writer) {
  if (options_.every == 0 || step % options_.every != 0) {
    return std::optional<int64_t>();
  }
  absl::StatusOr<std::optional<int64_t>> committed = Finish();
  if (!committed.ok()) return committed;
  // One verdict per copy: a writer flag that differs across its ranks
  // would start a collective save on some of them only.
  int64_t flag[2] = {writer ? 1 : 0, writer ? -1 : 0};
  if (absl::Status s = world_->all_reduce(absl::MakeSpan(flag), ReduceOp::kMax);
      !s.ok()) {
    return s;
  }
  if (flag[0] != -flag[1]) {
    return absl::InvalidArgumentError(
        absl::StrCat("PeriodicCheckpoint::AfterStep(step ", step,
                     "): `writer` differs across the ranks of one copy (rank ",
                     world_->rank(), " passed ", writer ? "true" : "false",
                     "); expected the same value on every rank of `world`"));
  }
  if (!writer) return committed;
  if (saver_ == nullptr) {
    absl::StatusOr<std::unique_ptr<checkpoint::AsyncSaver>> saver =
        checkpoint::AsyncSaver::Create(*world_);
    if (!saver.ok()) return saver.status();
    saver_ = *std::move(saver);
  }
  checkpoint::StateDict dict;
  if (absl::Status s = state.get_state_dict(&dict); !s.ok()) return s;
  SetTrainingMetadata(options_.identity, step, &dict);
  checkpoint::SaveOptions save;
  save.keep_last = options_.keep_last;
  save.job = options_.job;
  save.mesh = options_.mesh;
  if (absl::Status s = saver_->Start(dict, step, options_.dir, save); !s.ok()) {
    return s;
  }
  in_flight_ = step;
  return committed;
}

absl::StatusOr<std::optional<int64_t>> PeriodicCheckpoint::Finish() {
  if (!in_flight_.has_value()) return std::optional<int64_t>();
  const int64_t step = *in_flight_;
  in_flight_.reset();
  if (absl::Status s = saver_->Wait(); !s.ok()) return s;
  return std::optional<int64_t>(step);
}

}  // namespace vemesh::strategies
