// RunPipeline against a serial run of the same layers: a chain of
// Linear + tanh layers, one per stage, trained on M micro-batches with
// GPipe and 1F1B. Parameter gradients and the loss must match the serial
// full-batch computation, with sends overlapped (isend) and blocking.
#include <memory>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "strategies_test_util.h"
#include "vemesh/strategies/linear.h"
#include "vemesh/strategies/pipeline_runner.h"

namespace vemesh::strategies {
namespace {

using testing::Close;
using testing::Deterministic;
using testing::InitMesh;
using testing::WorldSize;

constexpr int64_t kWidth = 6;
constexpr int64_t kRows = 3;  // per micro-batch

Linear MakeLayer(int i) {
  return Linear("l", Deterministic(kWidth, kWidth, 0.3 * i),
                Deterministic(1, kWidth, 0.7 * i));
}

// One stage: layer `stage` (tanh except on the last stage), MSE loss at the
// end over all M * kRows rows.
class ChainStage : public PipelineStageModel {
 public:
  ChainStage(int stage, bool last, int mbs, Matrix x, Matrix y)
      : layer_(MakeLayer(stage)),
        last_(last),
        x_(std::move(x)),
        y_(std::move(y)),
        inputs_(mbs),
        outputs_(mbs) {}

  int64_t InputRows(int) const override { return kRows; }
  int64_t InputCols() const override { return kWidth; }
  absl::StatusOr<Matrix> FirstStageInput(int mb) override {
    return Matrix(x_.middleRows(mb * kRows, kRows));
  }
  absl::StatusOr<Matrix> Forward(int mb, const Matrix& in) override {
    inputs_[mb] = in;
    Matrix out = layer_.Forward(in);
    if (!last_) out = out.array().tanh().matrix();
    outputs_[mb] = out;
    return out;
  }
  absl::StatusOr<Matrix> LossGradient(int mb, const Matrix& out) override {
    const Matrix diff = out - y_.middleRows(mb * kRows, kRows);
    sse_ += diff.squaredNorm();
    return Matrix((2.0 / static_cast<double>(y_.size())) * diff);
  }
  absl::StatusOr<Matrix> Backward(int mb, const Matrix& g,
                                  bool need_input_grad) override {
    Matrix grad = g;
    if (!last_)
      grad = (grad.array() * (1 - outputs_[mb].array().square())).matrix();
    Matrix dx = layer_.Backward(inputs_[mb], grad);
    return need_input_grad ? dx : Matrix();
  }

  Linear layer_;
  bool last_;
  Matrix x_, y_;
  std::vector<Matrix> inputs_, outputs_;
  double sse_ = 0;
};

TEST(PipelineTest, MatchesSerialForBothSchedules) {
  const int n = WorldSize();
  ASSERT_TRUE(InitMesh({n}, {"PP"}));
  const int stage =
      static_cast<int>(*VESCALE_DEVICE_MESH.get_pipeline_parallel_rank());
  for (PipelineSchedule schedule :
       {PipelineSchedule::kGPipe, PipelineSchedule::k1F1B}) {
    for (int mbs : {1, 3, 2 * n + 1}) {
      // Sends overlapped with compute (isend) and the blocking baseline.
      for (bool overlap : {true, false}) {
        SCOPED_TRACE(::testing::Message()
                     << PipelineScheduleName(schedule) << ", " << mbs << " mbs"
                     << (overlap ? ", isend" : ", blocking send"));
        const Matrix x = Deterministic(mbs * kRows, kWidth, 11.0);
        const Matrix y = Deterministic(mbs * kRows, kWidth, 12.0);

        // Serial: all n layers on the whole batch.
        std::vector<Linear> ref;
        std::vector<Matrix> acts{x};
        for (int i = 0; i < n; ++i) {
          ref.push_back(MakeLayer(i));
          Matrix out = ref[i].Forward(acts.back());
          if (i + 1 < n) out = out.array().tanh().matrix();
          acts.push_back(out);
        }
        const Matrix diff = acts.back() - y;
        Matrix g = (2.0 / static_cast<double>(y.size())) * diff;
        for (int i = n - 1; i >= 0; --i) {
          if (i + 1 < n)
            g = (g.array() * (1 - acts[i + 1].array().square())).matrix();
          g = ref[i].Backward(acts[i], g);
        }

        ChainStage model(stage, stage == n - 1, mbs, x, y);
        absl::StatusOr<PipelineStats> st =
            RunPipeline(model, {.schedule = schedule,
                                .num_micro_batches = mbs,
                                .overlap_sends = overlap});
        ASSERT_TRUE(st.ok()) << st.status();
        EXPECT_EQ(st->num_stages, n);
        EXPECT_EQ(st->stage, stage);
        const int links = (stage > 0) + (stage < n - 1);
        EXPECT_EQ(st->sends, links * mbs);
        EXPECT_EQ(st->recvs, links * mbs);
        if (schedule == PipelineSchedule::k1F1B) {
          EXPECT_LE(st->max_in_flight, std::min(n - stage, mbs));
        } else {
          EXPECT_EQ(st->max_in_flight, mbs);
        }
        EXPECT_TRUE(
            Close(model.layer_.weight().grad, ref[stage].weight().grad));
        EXPECT_TRUE(Close(model.layer_.bias().grad, ref[stage].bias().grad));
        if (stage == n - 1) {
          EXPECT_NEAR(model.sse_, diff.squaredNorm(),
                      1e-9 * diff.squaredNorm());
        }
      }
    }
  }
}

TEST(PipelineTest, RejectsZeroMicroBatches) {
  ASSERT_TRUE(InitMesh({WorldSize()}, {"PP"}));
  ChainStage model(0, true, 1, Matrix(), Matrix());
  absl::StatusOr<PipelineStats> st =
      RunPipeline(model, {.num_micro_batches = 0});
  EXPECT_EQ(st.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace vemesh::strategies
