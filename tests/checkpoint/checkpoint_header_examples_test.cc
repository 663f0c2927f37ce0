// The usage examples at the top of vemesh/checkpoint/'s public headers,
// copied here so that the compiler checks them (as
// tests/docs/header_examples_test.cc does for the other floors): those that
// need other ranks are compiled in functions never called; the others run
// and their comments' values are checked. When a header's example changes,
// change its copy here.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "vemesh/base/status_macros.h"
#include "vemesh/checkpoint/async_saver.h"
#include "vemesh/checkpoint/box.h"
#include "vemesh/checkpoint/checkpoint.h"
#include "vemesh/checkpoint/dtype.h"
#include "vemesh/checkpoint/manifest.h"
#include "vemesh/checkpoint/safetensors.h"
#include "vemesh/checkpoint/state_dict.h"

namespace vemesh::checkpoint {
namespace {

void Train(int64_t) {}

// vemesh/checkpoint/checkpoint.h
[[maybe_unused]] absl::Status CheckpointExample(
    std::shared_ptr<Communicator> world, std::shared_ptr<Communicator> world2,
    int64_t rank, float* rows, float* cols) {
  StateDict state;  // vemesh/checkpoint/state_dict.h
  VEMESH_RETURN_IF_ERROR(
      state.Add("w", DType::kF32, {16, 16}, Box{{4 * rank, 0}, {4, 16}}, rows));
  state.SetMetadata("data_position", "1234");
  absl::Status s = Save(state, /*step=*/100, "/ckpt", *world);
  // Another job, another decomposition (here column shards):
  StateDict want;
  VEMESH_RETURN_IF_ERROR(
      want.Add("w", DType::kF32, {16, 16}, Box{{0, 8 * rank}, {16, 8}}, cols));
  absl::StatusOr<LoadResult> r = Load(want, "/ckpt", *world2);
  return r.ok() ? s : r.status();
}

// vemesh/checkpoint/async_saver.h
[[maybe_unused]] absl::Status AsyncSaverExample(
    std::shared_ptr<Communicator> world, const StateDict& state) {
  VEMESH_ASSIGN_OR_RETURN(auto saver, AsyncSaver::Create(*world));
  for (int64_t step = 1; step <= 300; ++step) {
    Train(step);
    if (step % 100 == 0) {
      VEMESH_RETURN_IF_ERROR(saver->Start(state, step, "/ckpt"));
    }
  }
  VEMESH_RETURN_IF_ERROR(saver->Wait());  // the last save is committed
  return absl::OkStatus();
}

// vemesh/checkpoint/dtype.h
TEST(CheckpointHeaderExamples, DType) {
  DType t = DType::kF32;
  EXPECT_EQ(DTypeName(t), "F32");
  EXPECT_EQ(DTypeSize(t), 4u);
  auto back = DTypeFromName("BF16");
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(*back, DType::kBF16);
}

// vemesh/checkpoint/box.h
TEST(CheckpointHeaderExamples, Box) {
  Box rows{{4, 0}, {4, 16}};
  EXPECT_EQ(BoxNumel(rows), 64);
  std::vector<Box> boxes = FlatRangeToBoxes({16, 16}, 10, 40);
  ASSERT_EQ(boxes.size(), 3u);
  EXPECT_EQ(boxes[0], (Box{{0, 10}, {1, 6}}));
  EXPECT_EQ(boxes[1], (Box{{1, 0}, {1, 16}}));
  EXPECT_EQ(boxes[2], (Box{{2, 0}, {1, 8}}));
}

// vemesh/checkpoint/state_dict.h
TEST(CheckpointHeaderExamples, StateDict) {
  std::vector<float> w_rows(4 * 16);
  StateDict state;
  absl::Status s = state.Add("layer0.weight", DType::kF32, {16, 16},
                             Box{{4, 0}, {4, 16}}, w_rows.data());
  EXPECT_TRUE(s.ok()) << s;
  state.SetMetadata("data_position", "1234");
  EXPECT_EQ(state.pieces().size(), 1u);
}

// vemesh/checkpoint/safetensors.h
TEST(CheckpointHeaderExamples, Safetensors) {
  std::vector<SafetensorsTensor> ts = {{"w", DType::kF32, {4, 16}, 0, 256}};
  std::string head = SafetensorsHeaderBytes(ts, {{"format", "pt"}});
  auto h = ParseSafetensors(head + std::string(256, '\0'), head.size() + 256);
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(h->data_start, head.size());
  EXPECT_EQ(h->tensors[0].shape, (std::vector<int64_t>{4, 16}));
}

// vemesh/checkpoint/manifest.h
TEST(CheckpointHeaderExamples, Manifest) {
  Manifest m;
  m.step = 100;
  absl::StatusOr<Manifest> back =
      ParseManifest(ManifestToJson(m), "step-100/manifest.json");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->step, 100);
}

}  // namespace
}  // namespace vemesh::checkpoint
