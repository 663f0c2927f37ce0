// Checks the pipeline schedules without any communication: every stage's op
// list is run together under rendezvous semantics (a send completes only
// when its receiver is at the matching receive, as MPI's unbuffered
// protocol does), for every stage count and micro-batch count in range.
#include "vemesh/strategies/pipeline_schedule.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace vemesh::strategies {
namespace {

using Kind = PipelineOp::Kind;

// Runs all stages to completion; returns "" or what went wrong. Also
// reports the largest number of micro-batches in flight (forward done,
// backward not yet) per stage.
std::string Simulate(PipelineSchedule schedule, int stages, int mbs,
                     std::vector<int>* max_in_flight) {
  std::vector<std::vector<PipelineOp>> ops(stages);
  for (int s = 0; s < stages; ++s) {
    ops[s] = BuildStageSchedule(schedule, stages, s, mbs);
  }
  std::vector<size_t> pc(stages, 0);
  std::vector<std::vector<int>> fwd_done(stages, std::vector<int>(mbs, 0));
  std::vector<std::vector<int>> bwd_done(stages, std::vector<int>(mbs, 0));
  std::vector<std::vector<int>> act_in(stages, std::vector<int>(mbs, 0));
  std::vector<std::vector<int>> grad_in(stages, std::vector<int>(mbs, 0));
  max_in_flight->assign(stages, 0);
  std::vector<int> in_flight(stages, 0);

  auto at = [&](int s) -> const PipelineOp* {
    return pc[s] < ops[s].size() ? &ops[s][pc[s]] : nullptr;
  };
  for (bool progress = true; progress;) {
    progress = false;
    for (int s = 0; s < stages; ++s) {
      const PipelineOp* op = at(s);
      if (op == nullptr) continue;
      const int mb = op->micro_batch;
      switch (op->kind) {
        case Kind::kForward:
          if (s > 0 && !act_in[s][mb]) {
            return absl::StrCat("stage ", s, " fwd ", mb, " before its input");
          }
          fwd_done[s][mb]++;
          max_in_flight->at(s) = std::max(max_in_flight->at(s), ++in_flight[s]);
          ++pc[s];
          progress = true;
          break;
        case Kind::kBackward:
          if (!fwd_done[s][mb] || (s + 1 < stages && !grad_in[s][mb])) {
            return absl::StrCat("stage ", s, " bwd ", mb, " too early");
          }
          bwd_done[s][mb]++;
          --in_flight[s];
          ++pc[s];
          progress = true;
          break;
        case Kind::kSendActivation:
        case Kind::kSendGradient: {
          const bool act = op->kind == Kind::kSendActivation;
          const int peer = act ? s + 1 : s - 1;
          if (peer < 0 || peer >= stages) return "send off the pipeline";
          const PipelineOp* other = at(peer);
          const Kind want = act ? Kind::kRecvActivation : Kind::kRecvGradient;
          if (other == nullptr || other->kind != want) break;  // blocked
          if (other->micro_batch != mb) {
            return absl::StrCat("stage ", s, " sends mb ", mb, " but stage ",
                                peer, " receives mb ", other->micro_batch);
          }
          if (act ? !fwd_done[s][mb] : !bwd_done[s][mb]) {
            return absl::StrCat("stage ", s, " sends mb ", mb, " uncomputed");
          }
          (act ? act_in : grad_in)[peer][mb] = 1;
          ++pc[s];
          ++pc[peer];
          progress = true;
          break;
        }
        case Kind::kRecvActivation:
        case Kind::kRecvGradient:
          break;  // completed by the sender's turn
      }
    }
  }
  for (int s = 0; s < stages; ++s) {
    if (pc[s] != ops[s].size()) {
      return absl::StrCat("deadlock: stage ", s, " stuck at ",
                          PipelineOpToString(ops[s][pc[s]]));
    }
    for (int mb = 0; mb < mbs; ++mb) {
      if (fwd_done[s][mb] != 1 || bwd_done[s][mb] != 1) {
        return absl::StrCat("stage ", s, " mb ", mb, " ran fwd ",
                            fwd_done[s][mb], "x, bwd ", bwd_done[s][mb], "x");
      }
    }
  }
  return "";
}

class ScheduleTest : public ::testing::TestWithParam<PipelineSchedule> {};

TEST_P(ScheduleTest, CompletesWithoutDeadlockUnderRendezvous) {
  for (int stages = 1; stages <= 8; ++stages) {
    for (int mbs = 1; mbs <= 12; ++mbs) {
      std::vector<int> in_flight;
      EXPECT_EQ(Simulate(GetParam(), stages, mbs, &in_flight), "")
          << stages << " stages, " << mbs << " micro-batches";
      if (GetParam() == PipelineSchedule::k1F1B) {
        for (int s = 0; s < stages; ++s) {
          EXPECT_LE(in_flight[s], std::min(stages - s, mbs))
              << "stage " << s << " of " << stages << ", " << mbs << " mbs";
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Both, ScheduleTest,
                         ::testing::Values(PipelineSchedule::kGPipe,
                                           PipelineSchedule::k1F1B),
                         [](const auto& info) {
                           return std::string(PipelineScheduleName(info.param));
                         });

TEST(PipelineScheduleTest, OneF1BOnTwoStagesInterleaves) {
  std::vector<std::string> got;
  for (const PipelineOp& op :
       BuildStageSchedule(PipelineSchedule::k1F1B, 2, 0, 3)) {
    got.push_back(PipelineOpToString(op));
  }
  EXPECT_EQ(got, (std::vector<std::string>{"fwd 0", "send-act 0", "fwd 1",
                                           "send-act 1", "recv-grad 0", "bwd 0",
                                           "fwd 2", "send-act 2", "recv-grad 1",
                                           "bwd 1", "recv-grad 2", "bwd 2"}));
}

TEST(PipelineScheduleTest, SingleStageIsForwardThenBackward) {
  std::vector<PipelineOp> ops =
      BuildStageSchedule(PipelineSchedule::k1F1B, 1, 0, 2);
  EXPECT_EQ(ops, (std::vector<PipelineOp>{{Kind::kForward, 0},
                                          {Kind::kBackward, 0},
                                          {Kind::kForward, 1},
                                          {Kind::kBackward, 1}}));
}

TEST(PipelineScheduleTest, BadArgumentsGiveNoOps) {
  EXPECT_TRUE(BuildStageSchedule(PipelineSchedule::kGPipe, 2, 2, 4).empty());
  EXPECT_TRUE(BuildStageSchedule(PipelineSchedule::kGPipe, 2, 0, 0).empty());
}

TEST(PipelineScheduleTest, ParsesNames) {
  EXPECT_EQ(*ParsePipelineSchedule("GPipe"), PipelineSchedule::kGPipe);
  EXPECT_EQ(*ParsePipelineSchedule("1f1b"), PipelineSchedule::k1F1B);
  absl::StatusOr<PipelineSchedule> bad = ParsePipelineSchedule("zigzag");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("zigzag"), std::string::npos);
}

}  // namespace
}  // namespace vemesh::strategies
