// The checkpoint's pure parts: boxes, FlatRangeToBoxes, CRC32C, the
// safetensors header and the manifest (their writers and bounded parsers).

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "vemesh/checkpoint/box.h"
#include "vemesh/checkpoint/internal/crc32c.h"
#include "vemesh/checkpoint/manifest.h"
#include "vemesh/checkpoint/safetensors.h"

namespace vemesh::checkpoint {
namespace {

using ::testing::HasSubstr;

int64_t Flat(const std::vector<int64_t>& shape,
             const std::vector<int64_t>& index) {
  int64_t f = 0;
  for (size_t d = 0; d < shape.size(); ++d) f = f * shape[d] + index[d];
  return f;
}

// Every flat range of random small shapes: the boxes are in flat order,
// each a contiguous run, together exactly [begin, end), at most 2*nd-1.
TEST(FlatRangeToBoxes, CoversExactlyTheRangeInFewBoxes) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 3000; ++trial) {
    const int nd = 1 + rng() % 4;
    std::vector<int64_t> shape(nd);
    int64_t numel = 1;
    for (auto& s : shape) {
      s = 1 + rng() % 5;
      numel *= s;
    }
    int64_t begin = rng() % (numel + 1);
    int64_t end = begin + rng() % (numel - begin + 1);
    std::vector<Box> boxes = FlatRangeToBoxes(shape, begin, end);
    ASSERT_LE(boxes.size(), static_cast<size_t>(2 * nd - 1));
    int64_t pos = begin;
    for (const Box& b : boxes) {
      ASSERT_TRUE(CheckBox(b, shape).ok()) << BoxToString(b);
      ASSERT_GT(BoxNumel(b), 0);
      // Contiguous: the box's first element is at pos and its last at
      // pos + numel - 1.
      std::vector<int64_t> last(nd);
      for (int d = 0; d < nd; ++d) last[d] = b.offsets[d] + b.lengths[d] - 1;
      ASSERT_EQ(Flat(shape, b.offsets), pos);
      ASSERT_EQ(Flat(shape, last), pos + BoxNumel(b) - 1);
      pos += BoxNumel(b);
    }
    ASSERT_EQ(pos, begin == end ? begin : end);
  }
}

TEST(FlatRangeToBoxes, EdgeCases) {
  EXPECT_TRUE(FlatRangeToBoxes({4, 4}, 5, 5).empty());
  EXPECT_TRUE(FlatRangeToBoxes({4, 0}, 0, 10).empty());
  EXPECT_EQ(FlatRangeToBoxes({}, 0, 1).size(), 1u);
  auto whole = FlatRangeToBoxes({3, 4}, -5, 100);  // clamped
  ASSERT_EQ(whole.size(), 1u);
  EXPECT_EQ(whole[0], (Box{{0, 0}, {3, 4}}));
}

TEST(Box, IntersectAndCheck) {
  auto i = Intersect(Box{{0, 0}, {4, 4}}, Box{{2, 3}, {4, 4}});
  ASSERT_TRUE(i);
  EXPECT_EQ(*i, (Box{{2, 3}, {2, 1}}));
  EXPECT_FALSE(Intersect(Box{{0}, {2}}, Box{{2}, {2}}));
  EXPECT_THAT(CheckBox(Box{{3}, {2}}, std::vector<int64_t>{4}).message(),
              HasSubstr("not inside shape [4]"));
}

TEST(Crc32c, KnownValue) {
  const char text[] = "123456789";
  EXPECT_EQ(internal::Crc32c(text, 9), 0xE3069283u);
  uint32_t split =
      internal::Crc32cExtend(internal::Crc32c(text, 4), text + 4, 5);
  EXPECT_EQ(split, 0xE3069283u);
}

TEST(Safetensors, HeaderRoundTrip) {
  std::vector<SafetensorsTensor> ts = {{"a@0,0", DType::kF32, {2, 3}, 0, 24},
                                       {"b", DType::kBF16, {5}, 24, 34}};
  std::string head = SafetensorsHeaderBytes(ts, {{"format", "pt"}});
  EXPECT_EQ(head.size() % 8, 0u);
  auto h = ParseSafetensors(head, head.size() + 34);
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(h->data_start, head.size());
  ASSERT_EQ(h->tensors.size(), 2u);
  EXPECT_EQ(h->metadata.at("format"), "pt");
}

std::string WithLength(uint64_t n, const std::string& json) {
  std::string out(8, '\0');
  std::memcpy(out.data(), &n, 8);
  return out + json;
}

TEST(Safetensors, BadHeadersAreRefusedBeforeAllocating) {
  // A huge length: refused from the 8 bytes alone.
  auto huge = ParseSafetensors(WithLength(uint64_t{1} << 62, ""), 1 << 20);
  EXPECT_THAT(huge.status().message(), HasSubstr("beyond the file"));
  std::string bad = R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,8]}})";
  EXPECT_THAT(ParseSafetensors(WithLength(bad.size(), bad), 8 + bad.size() + 8)
                  .status()
                  .message(),
              HasSubstr("do not match"));
  std::string past =
      R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})";
  EXPECT_THAT(
      ParseSafetensors(WithLength(past.size(), past), 8 + past.size() + 8)
          .status()
          .message(),
      HasSubstr("data_offsets"));
  std::string dtype =
      R"({"a":{"dtype":"F8","shape":[1],"data_offsets":[0,1]}})";
  EXPECT_THAT(
      ParseSafetensors(WithLength(dtype.size(), dtype), 100).status().message(),
      HasSubstr("'F8'"));
  std::string deep(100, '[');
  EXPECT_THAT(
      ParseSafetensors(WithLength(deep.size(), deep), 200).status().message(),
      HasSubstr("levels deep; at most"));
}

Manifest SmallManifest() {
  Manifest m;
  m.step = 7;
  m.world_size = 2;
  m.metadata["k"] = "v";
  m.files["shard-0.safetensors"] = 200;
  ManifestTensor t;
  t.dtype = DType::kF32;
  t.shape = {4, 4};
  t.pieces.push_back(ManifestPiece{
      Box{{0, 0}, {2, 4}}, "shard-0.safetensors", "w@0,0", 64, 32, {1234}});
  m.tensors["w"] = t;
  return m;
}

TEST(Manifest, RoundTrip) {
  Manifest m = SmallManifest();
  auto back = ParseManifest(ManifestToJson(m));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->step, 7);
  EXPECT_EQ(back->metadata.at("k"), "v");
  EXPECT_EQ(back->tensors.at("w").pieces[0].crc32c[0], 1234u);
}

TEST(Manifest, InconsistentManifestsAreRefused) {
  Manifest m = SmallManifest();
  m.tensors["w"].pieces[0].length = 33;
  EXPECT_THAT(ParseManifest(ManifestToJson(m)).status().message(),
              HasSubstr("not the box's size"));
  m = SmallManifest();
  m.tensors["w"].pieces[0].offset = 190;
  EXPECT_THAT(ParseManifest(ManifestToJson(m)).status().message(),
              HasSubstr("beyond file"));
  m = SmallManifest();
  m.tensors["w"].pieces[0].box = Box{{3, 0}, {2, 4}};
  EXPECT_THAT(ParseManifest(ManifestToJson(m)).status().message(),
              HasSubstr("not inside shape"));
  m = SmallManifest();
  m.tensors["w"].pieces[0].file = "../etc";
  EXPECT_THAT(ParseManifest(ManifestToJson(m)).status().message(),
              HasSubstr("lacks"));
  m = SmallManifest();
  m.tensors["w"].pieces[0].crc32c.clear();
  EXPECT_THAT(ParseManifest(ManifestToJson(m)).status().message(),
              HasSubstr("CRC32C"));
  EXPECT_FALSE(ParseManifest("{").ok());
  EXPECT_FALSE(ParseManifest("[]").ok());
  EXPECT_THAT(ParseManifest(R"({"format":"x"})").status().message(),
              HasSubstr("vemesh-checkpoint"));
}

}  // namespace
}  // namespace vemesh::checkpoint
