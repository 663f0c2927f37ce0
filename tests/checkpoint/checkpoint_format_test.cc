// The checkpoint's pure parts: boxes, FlatRangeToBoxes, CRC32C, the
// safetensors header and the manifest (their writers and bounded parsers).

#include <algorithm>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
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
  m.job = "job-a";
  m.mesh = "DP=2";
  m.metadata["k"] = "v";
  m.files["shard-0.safetensors"] = 200;
  ManifestTensor t;
  t.dtype = DType::kF32;
  t.shape = {4, 4};
  t.pieces.push_back(ManifestPiece{
      Box{{0, 0}, {2, 4}}, "shard-0.safetensors", "w@0,0", 64, 32, {1234}});
  t.pieces.push_back(ManifestPiece{
      Box{{2, 0}, {2, 4}}, "shard-0.safetensors", "w@2,0", 96, 32, {5678}});
  m.tensors["w"] = t;
  return m;
}

TEST(Manifest, RoundTrip) {
  Manifest m = SmallManifest();
  auto back = ParseManifest(ManifestToJson(m));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->version, 2);
  EXPECT_EQ(back->step, 7);
  EXPECT_EQ(back->job, "job-a");
  EXPECT_EQ(back->mesh, "DP=2");
  EXPECT_EQ(back->metadata.at("k"), "v");
  EXPECT_EQ(back->tensors.at("w").pieces[0].crc32c[0], 1234u);
  EXPECT_EQ(ManifestToJson(*back), ManifestToJson(m));
}

// What a writer that recomputes the checksum would write: `text` with its
// manifest_crc32c recomputed (tests of the checks behind the checksum).
std::string Reseal(std::string text) {
  const size_t at = text.rfind(",\n \"manifest_crc32c\"");
  EXPECT_NE(at, std::string::npos);
  text.resize(at);
  return absl::StrCat(text, ",\n \"manifest_crc32c\": ",
                      internal::Crc32c(text.data(), text.size()), "\n}\n");
}

// The manifest carries its own CRC32C: every single-bit flip of every byte
// (the checksum's own digits and the layout included) is refused.
TEST(Manifest, EveryFlippedBitIsRefused) {
  const std::string good = ManifestToJson(SmallManifest());
  ASSERT_TRUE(ParseManifest(good).ok());
  int refused = 0, flips = 0;
  for (size_t i = 0; i < good.size(); ++i) {
    for (int bit = 0; bit < 8; ++bit) {
      std::string bad = good;
      bad[i] = static_cast<char>(bad[i] ^ (1 << bit));
      ++flips;
      auto m = ParseManifest(bad, "m.json");
      if (!m.ok()) {
        ++refused;
        EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
      } else {
        ADD_FAILURE() << "byte " << i << " bit " << bit << " ('" << good[i]
                      << "') flipped and accepted";
      }
    }
  }
  EXPECT_EQ(refused, flips);
  std::string flipped = good;
  flipped[good.find("\"step\": 7") + 8] = '6';
  EXPECT_THAT(ParseManifest(flipped, "m.json").status().message(),
              HasSubstr("m.json: checksum mismatch"));
}

// Behind the checksum (a writer that lies consistently): pieces must tile
// the tensor, keys appear once, and only the format's keys appear.
TEST(Manifest, PiecesMustTileAndKeysAppearOnce) {
  const std::string good = ManifestToJson(SmallManifest());
  // The issue's case: a row offset 2 -> 0 makes the pieces overlap (and
  // leaves rows 2..3 to nobody); counting covered elements missed it.
  std::string overlap = good;
  const size_t second = overlap.find("\"offsets\": [\n      2");
  ASSERT_NE(second, std::string::npos);
  overlap[overlap.find('2', second + 11)] = '0';
  EXPECT_THAT(
      ParseManifest(Reseal(overlap), "m.json").status().message(),
      HasSubstr("tensor 'w': pieces [0:2, 0:4] and [0:2, 0:4] overlap"));
  Manifest gap = SmallManifest();
  gap.tensors["w"].pieces.pop_back();
  EXPECT_THAT(ParseManifest(ManifestToJson(gap), "m.json").status().message(),
              HasSubstr("pieces cover 8 of the 16 elements of shape [4, 4] "
                        "(a gap)"));
  // Two pieces pointing at the same bytes of a file.
  Manifest shared = SmallManifest();
  shared.tensors["w"].pieces[1].offset = 80;
  EXPECT_THAT(ParseManifest(ManifestToJson(shared)).status().message(),
              HasSubstr("share bytes of file 'shard-0.safetensors'"));
  // A repeated key, anywhere: refused (nlohmann alone keeps the last).
  std::string twice = good;
  twice.replace(twice.find("\"k\": \"v\""), 8, "\"k\": \"v\", \"k\": \"w\"");
  EXPECT_THAT(ParseManifest(Reseal(twice), "m.json").status().message(),
              HasSubstr("the key \"k\" appears twice"));
  std::string step_twice = good;
  step_twice.replace(step_twice.find("\"step\": 7"), 9,
                     "\"step\": 7, \"step\": 9");
  EXPECT_THAT(ParseManifest(Reseal(step_twice)).status().message(),
              HasSubstr("\"step\" appears twice"));
  // A key the format does not define (a flipped bit in a key's name).
  std::string unknown = good;
  unknown.replace(unknown.find("\"mesh\""), 6, "\"mash\"");
  EXPECT_THAT(ParseManifest(Reseal(unknown)).status().message(),
              HasSubstr("unknown key \"mash\""));
}

// Version 1 (before the checksum, job and mesh) still parses, with every
// other check; a version 1 manifest with a checksum is a damaged version 2.
TEST(Manifest, Version1StillParses) {
  const std::string v1 =
      R"({"format": "vemesh-checkpoint", "version": 1, "step": 3,
          "world_size": 1, "chunk_bytes": 1048576, "metadata": {},
          "files": {"shard-0.safetensors": 80},
          "tensors": {"b": {"dtype": "F32", "shape": [2], "pieces": [
            {"offsets": [0], "lengths": [2], "file": "shard-0.safetensors",
             "key": "b@0", "offset": 72, "length": 8, "crc32c": [1]}]}}})";
  auto m = ParseManifest(v1);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->version, 1);
  EXPECT_EQ(m->job, "");
  std::string sealed = v1;
  sealed.insert(sealed.size() - 1, R"(, "manifest_crc32c": 5)");
  EXPECT_THAT(ParseManifest(sealed).status().message(),
              HasSubstr("unknown key \"manifest_crc32c\""));
  std::string v2 = v1;
  v2.replace(v2.find("\"version\": 1"), 12, "\"version\": 2");
  EXPECT_THAT(ParseManifest(v2).status().message(),
              HasSubstr("\"manifest_crc32c\""));
}

// CheckTiling against a brute-force count on random small boxes, and on
// exact partitions (grids, flat ranges) that must pass.
TEST(CheckTiling, AgreesWithCountingEveryElement) {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 2000; ++trial) {
    const int nd = 1 + rng() % 3;
    std::vector<int64_t> shape(nd);
    int64_t numel = 1;
    for (auto& s : shape) {
      s = 1 + rng() % 4;
      numel *= s;
    }
    std::vector<Box> boxes;
    if (trial % 2 == 0) {
      // An exact partition: random cut points of flat ranges.
      int64_t at = 0;
      while (at < numel) {
        const int64_t next = at + 1 + rng() % numel;
        for (Box& b : FlatRangeToBoxes(shape, at, next)) boxes.push_back(b);
        at = next;
      }
    } else {
      const int n = rng() % 5;
      for (int k = 0; k < n; ++k) {
        Box b;
        for (int d = 0; d < nd; ++d) {
          const int64_t off = rng() % shape[d];
          b.offsets.push_back(off);
          b.lengths.push_back(rng() % (shape[d] - off + 1));
        }
        boxes.push_back(b);
      }
    }
    std::vector<int> count(numel, 0);
    for (const Box& b : boxes) {
      for (int64_t f = 0; f < numel; ++f) {
        int64_t rem = f;
        bool in = true;
        for (int d = nd - 1; d >= 0; --d) {
          const int64_t i = rem % shape[d];
          rem /= shape[d];
          in = in && i >= b.offsets[d] && i < b.offsets[d] + b.lengths[d];
        }
        count[f] += in;
      }
    }
    const bool exact =
        std::all_of(count.begin(), count.end(), [](int c) { return c == 1; });
    EXPECT_EQ(CheckTiling(boxes, shape).ok(), exact) << "trial " << trial;
    if (trial % 2 == 0) {
      EXPECT_TRUE(exact);
    }
  }
  EXPECT_TRUE(CheckTiling({Box{}}, {}).ok());
  EXPECT_FALSE(CheckTiling({Box{}, Box{}}, {}).ok());
  EXPECT_FALSE(CheckTiling({}, {}).ok());
}

TEST(Manifest, InconsistentManifestsAreRefused) {
  Manifest m = SmallManifest();
  m.tensors["w"].pieces[0].length = 33;  // (checked before the tiling)
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
