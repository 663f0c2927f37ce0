// Save on one decomposition, load on another, at 1, 2 and 4 ranks (MPI):
// row shards to column shards, replicas to shards, flat (FSDP) ranges to
// whole tensors, a world of 4 to sub-worlds of 2 and 1; replicas written
// once and spread; every bad input named on every rank; AsyncSaver.

#include <fcntl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "vemesh/checkpoint/async_saver.h"
#include "vemesh/checkpoint/checkpoint.h"
#include "vemesh/checkpoint/internal/crc32c.h"
#include "vemesh/checkpoint/internal/read.h"
#include "vemesh/checkpoint/manifest.h"
#include "vemesh/checkpoint/safetensors.h"
#include "vemesh/comm/mpi/mpi_communicator.h"

namespace vemesh::checkpoint {
namespace {

using ::testing::HasSubstr;
namespace fs = std::filesystem;

std::shared_ptr<Communicator> World() {
  auto world = MpiCommunicator::World();
  EXPECT_TRUE(world.ok()) << world.status();
  return *world;
}

// A fresh directory every rank names the same (rank 0 makes it).
std::string SharedTempDir(Communicator& comm) {
  char path[256] = {};
  if (comm.rank() == 0) {
    std::strcpy(path, "/tmp/vemesh_ckpt_test_XXXXXX");
    EXPECT_NE(::mkdtemp(path), nullptr);
  }
  EXPECT_TRUE(comm.broadcast(path, sizeof(path), DataType::kUInt8, 0).ok());
  return path;
}

void RemoveShared(Communicator& comm, const std::string& dir) {
  EXPECT_TRUE(comm.barrier().ok());
  if (comm.rank() == 0) {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
}

// Element value: a tensor's seed plus its flat global index (exact in F32
// for these sizes).
std::vector<float> Fill(const std::vector<int64_t>& shape, const Box& box,
                        float seed) {
  std::vector<float> out(BoxNumel(box));
  size_t k = 0;
  const size_t nd = shape.size();
  std::vector<int64_t> idx(box.offsets);
  for (k = 0; k < out.size(); ++k) {
    int64_t flat = 0;
    for (size_t d = 0; d < nd; ++d) flat = flat * shape[d] + idx[d];
    out[k] = seed + static_cast<float>(flat);
    for (size_t d = nd; d-- > 0;) {
      if (++idx[d] < box.offsets[d] + box.lengths[d]) break;
      idx[d] = box.offsets[d];
    }
  }
  return out;
}

Box Rows(int64_t rows, int64_t cols, int part, int parts) {
  return Box{{rows / parts * part, 0}, {rows / parts, cols}};
}
Box Cols(int64_t rows, int64_t cols, int part, int parts) {
  return Box{{0, cols / parts * part}, {rows, cols / parts}};
}

constexpr int64_t kR = 16, kC = 12;

// Saves w [16, 12] in row shards, b [12] replicated, at `step`.
absl::Status SaveRowSharded(Communicator& world, const std::string& dir,
                            int64_t step, float seed = 0) {
  const int n = world.size(), r = world.rank();
  Box rows = Rows(kR, kC, r, n);
  std::vector<float> w = Fill({kR, kC}, rows, seed);
  std::vector<float> b = Fill({kC}, Box{{0}, {kC}}, seed + 1000);
  StateDict state;
  EXPECT_TRUE(state.Add("w", DType::kF32, {kR, kC}, rows, w.data()).ok());
  EXPECT_TRUE(state.AddFull("b", DType::kF32, {kC}, b.data()).ok());
  state.SetMetadata("data_position", absl::StrCat(step * 10));
  return Save(state, step, dir, world);
}

TEST(Checkpoint, RowShardsLoadAsColumnShardsAndWhole) {
  auto world = World();
  const int n = world->size(), r = world->rank();
  const std::string dir = SharedTempDir(*world);
  ASSERT_TRUE(SaveRowSharded(*world, dir, 5).ok());
  auto latest = LatestStep(dir);
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_EQ(**latest, 5);

  Box cols = Cols(kR, kC, r, n);
  std::vector<float> w(BoxNumel(cols), -1), b(kC, -1);
  StateDict want;
  ASSERT_TRUE(want.Add("w", DType::kF32, {kR, kC}, cols, w.data()).ok());
  ASSERT_TRUE(want.AddFull("b", DType::kF32, {kC}, b.data()).ok());
  auto loaded = Load(want, dir, *world);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->step, 5);
  EXPECT_EQ(loaded->metadata.at("data_position"), "50");
  EXPECT_EQ(w, Fill({kR, kC}, cols, 0));
  EXPECT_EQ(b, Fill({kC}, Box{{0}, {kC}}, 1000));

  // Whole, on every rank; and an odd box.
  std::vector<float> all(kR * kC, -1), odd(3 * 5, -1);
  StateDict whole;
  ASSERT_TRUE(whole.AddFull("w", DType::kF32, {kR, kC}, all.data()).ok());
  ASSERT_TRUE(whole.Add("b", DType::kF32, {kC}, Box{{7}, {0}}, nullptr).ok());
  ASSERT_TRUE(Load(whole, dir, *world).ok());
  EXPECT_EQ(all, Fill({kR, kC}, Box{{0, 0}, {kR, kC}}, 0));
  StateDict odd_box;
  Box o{{3, 2}, {3, 5}};
  ASSERT_TRUE(odd_box.Add("w", DType::kF32, {kR, kC}, o, odd.data()).ok());
  ASSERT_TRUE(Load(odd_box, dir, *world).ok());
  EXPECT_EQ(odd, Fill({kR, kC}, o, 0));
  RemoveShared(*world, dir);
}

TEST(Checkpoint, ReplicatedTensorsAreWrittenOnceSpreadOverRanks) {
  auto world = World();
  const int n = world->size();
  const std::string dir = SharedTempDir(*world);
  // 8 replicated tensors of 16 KiB on every rank.
  constexpr int kTensors = 8;
  std::vector<std::vector<float>> data;
  StateDict state;
  for (int t = 0; t < kTensors; ++t) {
    data.push_back(Fill({64, 64}, Box{{0, 0}, {64, 64}}, t * 10000.f));
  }
  for (int t = 0; t < kTensors; ++t) {
    ASSERT_TRUE(state
                    .AddFull(absl::StrCat("p", t), DType::kF32, {64, 64},
                             data[t].data())
                    .ok());
  }
  ASSERT_TRUE(Save(state, 1, dir, *world).ok());
  // Each tensor once in the manifest; the files' data equal in size.
  std::ifstream in(dir + "/step-1/manifest.json");
  std::string text((std::istreambuf_iterator<char>(in)), {});
  auto m = ParseManifest(text);
  ASSERT_TRUE(m.ok()) << m.status();
  uint64_t total = 0;
  for (const auto& [name, t] : m->tensors) {
    EXPECT_EQ(t.pieces.size(), 1u) << name;
  }
  for (const auto& [file, size] : m->files) {
    auto h = ReadSafetensorsHeader(dir + "/step-1/" + file);
    ASSERT_TRUE(h.ok()) << h.status();
    const uint64_t data_bytes = size - h->data_start;
    EXPECT_EQ(data_bytes, 64 * 64 * 4 * (kTensors / n)) << file;
    total += data_bytes;
  }
  EXPECT_EQ(m->files.size(), static_cast<size_t>(n));
  EXPECT_EQ(total, 64u * 64 * 4 * kTensors);
  RemoveShared(*world, dir);
}

TEST(Checkpoint, FlatRangesLoadAsWholeTensors) {
  auto world = World();
  const int n = world->size(), r = world->rank();
  const std::string dir = SharedTempDir(*world);
  // FSDP: the flat concatenation of a [5, 7] and a [11] tensor, cut in n
  // equal ranges (with padding at the end), each rank its range.
  const int64_t total = 5 * 7 + 11, per = (total + n - 1) / n;
  const int64_t begin = per * r, end = std::min(total, per * (r + 1));
  std::vector<std::vector<float>> keep;
  StateDict state;
  struct Param {
    const char* name;
    std::vector<int64_t> shape;
    int64_t at;
  };
  for (const Param& p : {Param{"a", {5, 7}, 0}, Param{"c", {11}, 35}}) {
    for (const Box& box : FlatRangeToBoxes(p.shape, begin - p.at, end - p.at)) {
      keep.push_back(Fill(p.shape, box, 3));
      ASSERT_TRUE(
          state.Add(p.name, DType::kF32, p.shape, box, keep.back().data())
              .ok());
    }
  }
  ASSERT_TRUE(Save(state, 2, dir, *world).ok());
  std::vector<float> a(35), c(11);
  StateDict whole;
  ASSERT_TRUE(whole.AddFull("a", DType::kF32, {5, 7}, a.data()).ok());
  ASSERT_TRUE(whole.AddFull("c", DType::kF32, {11}, c.data()).ok());
  auto loaded = Load(whole, dir, *world);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(a, Fill({5, 7}, Box{{0, 0}, {5, 7}}, 3));
  EXPECT_EQ(c, Fill({11}, Box{{0}, {11}}, 3));
  RemoveShared(*world, dir);
}

TEST(Checkpoint, SavedByTheWorldLoadsOnSmallerWorlds) {
  auto world = World();
  const int n = world->size(), r = world->rank();
  const std::string dir = SharedTempDir(*world);
  ASSERT_TRUE(SaveRowSharded(*world, dir, 9).ok());
  for (int size : {2, 1}) {
    if (size > n) continue;
    auto sub = world->split(r < size ? 0 : -1, r);
    ASSERT_TRUE(sub.ok()) << sub.status();
    if (r >= size) continue;
    ASSERT_NE(*sub, nullptr);
    Box cols = Cols(kR, kC, r, size);
    std::vector<float> w(BoxNumel(cols), -1);
    StateDict want;
    ASSERT_TRUE(want.Add("w", DType::kF32, {kR, kC}, cols, w.data()).ok());
    auto loaded = Load(want, dir, **sub);
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    EXPECT_EQ(w, Fill({kR, kC}, cols, 0)) << "world of " << size;
  }
  RemoveShared(*world, dir);
}

// Loads w in row shards (rank r reads only shard r's file when saved the
// same way) and expects an error containing `text` on every rank.
void ExpectLoadFails(Communicator& world, const std::string& dir,
                     const std::string& text, const std::string& name = "w",
                     std::vector<int64_t> shape = {kR, kC}) {
  Box rows = Rows(shape[0], shape[1], world.rank(), world.size());
  std::vector<float> w(BoxNumel(rows));
  StateDict want;
  ASSERT_TRUE(want.Add(name, DType::kF32, shape, rows, w.data()).ok());
  auto loaded = Load(want, dir, world);
  ASSERT_FALSE(loaded.ok());
  EXPECT_THAT(loaded.status().message(), HasSubstr(text));
}

TEST(Checkpoint, BadShardsAreNamedOnEveryRank) {
  auto world = World();
  const int n = world->size();
  const std::string dir = SharedTempDir(*world);
  ASSERT_TRUE(SaveRowSharded(*world, dir, 1).ok());
  const std::string last = absl::StrCat("shard-", n - 1, ".safetensors");
  const std::string step = dir + "/step-1/";
  auto step_barrier = [&] { ASSERT_TRUE(world->barrier().ok()); };

  // Corrupted: one byte of w's data in the last shard.
  std::ifstream in(step + "manifest.json");
  std::string text((std::istreambuf_iterator<char>(in)), {});
  auto m = ParseManifest(text);
  ASSERT_TRUE(m.ok());
  uint64_t at = 0;
  for (const auto& p : m->tensors.at("w").pieces) {
    if (p.file == last) at = p.offset + 5;
  }
  ASSERT_GT(at, 0u);
  if (world->rank() == 0) {
    int fd = ::open((step + last).c_str(), O_RDWR);
    char c;
    ASSERT_EQ(::pread(fd, &c, 1, at), 1);
    c ^= 0x40;
    ASSERT_EQ(::pwrite(fd, &c, 1, at), 1);
    ::close(fd);
  }
  step_barrier();
  ExpectLoadFails(*world, dir, "checksum mismatch in '" + step + last);
  step_barrier();
  // Truncated.
  if (world->rank() == 0) {
    ASSERT_EQ(::truncate((step + last).c_str(), m->files.at(last) - 3), 0);
  }
  step_barrier();
  ExpectLoadFails(*world, dir, "truncated");
  step_barrier();
  // Missing.
  if (world->rank() == 0) {
    ASSERT_EQ(::unlink((step + last).c_str()), 0);
  }
  step_barrier();
  ExpectLoadFails(*world, dir, step + last);
  step_barrier();
  // Another model: other shape, unknown name.
  ExpectLoadFails(*world, dir, "another model", "w", {kR, kC + 4});
  ExpectLoadFails(*world, dir, "'nope' is not in checkpoint", "nope");
  // No checkpoint at all.
  ExpectLoadFails(*world, dir + "/absent", "no committed checkpoint");
  RemoveShared(*world, dir);
}

// w [16, 12] in 4 row pieces whatever the world size (rank r holds pieces
// r, r + n, ...), and b [12] on every rank.
absl::Status SaveFourRowPieces(Communicator& world, const std::string& dir,
                               int64_t step) {
  StateDict state;
  std::vector<std::vector<float>> rows;
  for (int part = world.rank(); part < 4; part += world.size()) {
    Box box = Rows(kR, kC, part, 4);
    rows.push_back(Fill({kR, kC}, box, 0));
    EXPECT_TRUE(
        state.Add("w", DType::kF32, {kR, kC}, box, rows.back().data()).ok());
  }
  std::vector<float> b = Fill({kC}, Box{{0}, {kC}}, 1000);
  EXPECT_TRUE(state.AddFull("b", DType::kF32, {kC}, b.data()).ok());
  return Save(state, step, dir, world);
}

constexpr char kWrongValues[] = "Load returned OK with wrong values";

// Loads w and b whole; OK only when both are exactly what was saved.
absl::Status LoadWholeExactly(Communicator& world, const std::string& dir) {
  std::vector<float> w(kR * kC, -1), b(kC, -1);
  StateDict want;
  EXPECT_TRUE(want.AddFull("w", DType::kF32, {kR, kC}, w.data()).ok());
  EXPECT_TRUE(want.AddFull("b", DType::kF32, {kC}, b.data()).ok());
  auto loaded = Load(want, dir, world);
  if (!loaded.ok()) return loaded.status();
  if (w != Fill({kR, kC}, Box{{0, 0}, {kR, kC}}, 0) ||
      b != Fill({kC}, Box{{0}, {kC}}, 1000)) {
    return absl::InternalError(kWrongValues);
  }
  return absl::OkStatus();
}

std::string ReadText(const std::string& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), {});
}

void WriteText(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::trunc | std::ios::binary);
  out << text;
}

// `text` with its manifest_crc32c recomputed: what a writer that lies
// consistently would leave.
std::string Reseal(std::string text) {
  const size_t at = text.rfind(",\n \"manifest_crc32c\"");
  EXPECT_NE(at, std::string::npos);
  text.resize(at);
  return absl::StrCat(text, ",\n \"manifest_crc32c\": ",
                      internal::Crc32c(text.data(), text.size()), "\n}\n");
}

// The case: one bit of manifest.json flipped (a row offset 4 -> 0)
// made two pieces overlap and Load returned OK with most values wrong. Now
// the flip is a checksum mismatch, and the same lie with a recomputed
// checksum is refused as an overlap, on every rank.
TEST(Checkpoint, AManifestThatLiesIsRefused) {
  auto world = World();
  const std::string dir = SharedTempDir(*world);
  ASSERT_TRUE(SaveFourRowPieces(*world, dir, 1).ok());
  const std::string path = dir + "/step-1/manifest.json";
  const std::string good = ReadText(path);
  ASSERT_TRUE(LoadWholeExactly(*world, dir).ok());
  std::string flipped = good;
  const size_t row4 = flipped.find("\"offsets\": [\n      4");
  ASSERT_NE(row4, std::string::npos);
  const size_t digit = flipped.find('4', row4 + 11);
  flipped[digit] = static_cast<char>(flipped[digit] ^ 0x04);  // '4' -> '0'
  ASSERT_EQ(flipped[digit], '0');
  ASSERT_TRUE(world->barrier().ok());
  if (world->rank() == 0) WriteText(path, flipped);
  ASSERT_TRUE(world->barrier().ok());
  absl::Status s = LoadWholeExactly(*world, dir);
  EXPECT_THAT(s.message(), HasSubstr(path + ": checksum mismatch"));
  ASSERT_TRUE(world->barrier().ok());
  if (world->rank() == 0) WriteText(path, Reseal(flipped));
  ASSERT_TRUE(world->barrier().ok());
  s = LoadWholeExactly(*world, dir);
  EXPECT_THAT(s.message(),
              HasSubstr("tensor 'w': pieces [0:4, 0:12] and [0:4, 0:12] "
                        "overlap"));
  RemoveShared(*world, dir);
}

// Mutations of a real checkpoint's manifest.json, each then loaded: a
// flipped bit in every byte is refused (the manifest's checksum), and
// every integer changed (to 0, v - 1, v + 1, v + 4, 2v) with the checksum
// recomputed either is refused or loads exactly the saved values: no
// mutation loads wrong values silently. One process (the mutations are the
// same on every world size).
TEST(Checkpoint, NoManifestMutationLoadsSilently) {
  auto world = World();
  if (world->size() != 1) GTEST_SKIP() << "one process is enough";
  const std::string dir = SharedTempDir(*world);
  ASSERT_TRUE(SaveFourRowPieces(*world, dir, 1).ok());
  const std::string path = dir + "/step-1/manifest.json";
  const std::string good = ReadText(path);
  int flips = 0, refused = 0;
  // One bit per byte (bit i mod 8) here, through the files and Load; every
  // bit of every byte is Manifest.EveryFlippedBitIsRefused (parser only).
  for (size_t i = 0; i < good.size(); ++i) {
    for (int bit = static_cast<int>(i % 8); bit == static_cast<int>(i % 8);
         ++bit) {
      std::string bad = good;
      bad[i] = static_cast<char>(bad[i] ^ (1 << bit));
      WriteText(path, bad);
      ++flips;
      absl::Status s = LoadWholeExactly(*world, dir);
      if (!s.ok() && s.message() != kWrongValues) {
        ++refused;
      } else {
        ADD_FAILURE() << "byte " << i << " bit " << bit << ": " << s;
      }
    }
  }
  EXPECT_EQ(refused, flips);
  // Integers behind a recomputed checksum.
  const size_t body_end = good.rfind(",\n \"manifest_crc32c\"");
  int changed = 0, harmless = 0;
  for (size_t i = 0; i < body_end; ++i) {
    if (!std::isdigit(static_cast<unsigned char>(good[i])) ||
        (i > 0 && std::isdigit(static_cast<unsigned char>(good[i - 1])))) {
      continue;
    }
    size_t end = i;
    while (end < body_end &&
           std::isdigit(static_cast<unsigned char>(good[end])))
      ++end;
    // Digits inside a string (a file or key name) are changed too.
    const uint64_t v = std::stoull(good.substr(i, end - i));
    for (uint64_t to : {uint64_t{0}, v - 1, v + 1, v + 4, 2 * v}) {
      if (to == v || (v == 0 && to == v - 1)) continue;
      std::string bad = good;
      bad.replace(i, end - i, std::to_string(to));
      WriteText(path, Reseal(bad));
      ++changed;
      absl::Status s = LoadWholeExactly(*world, dir);
      EXPECT_NE(s.message(), kWrongValues)
          << "value " << v << " at byte " << i << " -> " << to << ": " << s;
      harmless += s.ok();
    }
  }
  std::printf(
      "manifest mutations: %d bit flips, all refused; %d integer "
      "changes resealed, %d loaded the exact values, the rest "
      "refused\n",
      flips, changed, harmless);
  WriteText(path, good);
  EXPECT_TRUE(LoadWholeExactly(*world, dir).ok());
  RemoveShared(*world, dir);
}

// The case 1: a resume loads the parameters from the checkpoint
// `latest` names, then the optimizer state with a second load. Another
// job's step-10.1, committed but killed before it moved `latest`, was what
// a second Load(..., step 10) read. With same_checkpoint_as, the second
// load reads the first one's directory, checked against its manifest
// bytes and job; a directory re-saved since is an error naming both.
LoadOptions Options(std::optional<int64_t> step, const LoadResult* same,
                    std::string job) {
  LoadOptions o;
  o.step = step;
  o.same_checkpoint_as = same;
  o.job = std::move(job);
  return o;
}

TEST(Checkpoint, OneResumeReadsOneCheckpoint) {
  auto world = World();
  const int n = world->size(), r = world->rank();
  const std::string dir = SharedTempDir(*world);
  const std::string other = SharedTempDir(*world);
  auto save = [&](const std::string& where, float seed,
                  const std::string& job) {
    Box rows = Rows(kR, kC, r, n);
    std::vector<float> w = Fill({kR, kC}, rows, seed);
    std::vector<float> m = Fill({kR, kC}, rows, seed + 500);  // "exp_avg"
    StateDict state;
    EXPECT_TRUE(state.Add("w", DType::kF32, {kR, kC}, rows, w.data()).ok());
    EXPECT_TRUE(
        state.Add("w.exp_avg", DType::kF32, {kR, kC}, rows, m.data()).ok());
    return Save(state, 10, where, *world, {.job = job, .mesh = "DP=n"});
  };
  ASSERT_TRUE(save(dir, 0, "job-a").ok());
  ASSERT_TRUE(save(other, 7, "job-b").ok());
  ASSERT_TRUE(world->barrier().ok());
  if (r == 0) {  // job B's step 10, committed, `latest` not moved
    fs::rename(other + "/step-10", dir + "/step-10.1");
  }
  ASSERT_TRUE(world->barrier().ok());
  Box cols = Cols(kR, kC, r, n);
  std::vector<float> w(BoxNumel(cols)), m(BoxNumel(cols));
  StateDict params, opt;
  ASSERT_TRUE(params.Add("w", DType::kF32, {kR, kC}, cols, w.data()).ok());
  ASSERT_TRUE(opt.Add("w.exp_avg", DType::kF32, {kR, kC}, cols, m.data()).ok());
  auto first =
      Load(params, dir, *world, Options(std::nullopt, nullptr, "job-a"));
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->path, dir + "/step-10");
  EXPECT_EQ(first->job, "job-a");
  EXPECT_EQ(first->mesh, "DP=n");
  EXPECT_EQ(w, Fill({kR, kC}, cols, 0));
  // The old way: "the newest committed directory of step 10" is job B's.
  auto by_step = Load(opt, dir, *world, 10);
  ASSERT_TRUE(by_step.ok());
  EXPECT_EQ(by_step->path, dir + "/step-10.1");
  EXPECT_EQ(m, Fill({kR, kC}, cols, 507));
  // One checkpoint: the first load's.
  auto second = Load(opt, dir, *world, Options(std::nullopt, &*first, ""));
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(second->path, dir + "/step-10");
  EXPECT_EQ(m, Fill({kR, kC}, cols, 500));
  // Another job's checkpoint when this job is named: refused naming both.
  auto wrong_job = Load(opt, dir, *world, Options(10, nullptr, "job-a"));
  EXPECT_EQ(wrong_job.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(wrong_job.status().message(),
              HasSubstr("step-10.1' belongs to job 'job-b', not to this job "
                        "'job-a'"));
  // The first directory re-saved between the two loads: refused, naming
  // what each read.
  ASSERT_TRUE(world->barrier().ok());
  if (r == 0) {
    fs::remove_all(dir + "/step-10");
    fs::remove_all(dir + "/step-10.1");
  }
  ASSERT_TRUE(world->barrier().ok());
  ASSERT_TRUE(save(dir, 3, "job-a").ok());
  auto changed = Load(opt, dir, *world, Options(std::nullopt, &*first, ""));
  EXPECT_EQ(changed.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(
      changed.status().message(),
      HasSubstr(absl::StrCat("checkpoint '", dir,
                             "/step-10' changed since this job read it: it "
                             "read step 10 of job 'job-a' (manifest CRC32C ",
                             first->manifest_crc32c, ")")));
  RemoveShared(*world, other);
  RemoveShared(*world, dir);
}

// The case 3: two jobs in one directory wrote the same latest.tmp,
// one died "cannot rename", and the other's keep_last rotation deleted the
// first's checkpoints. Now the directory records its owner: a second job is
// refused at its first save, naming both, with nothing written; rotation
// removes only the saving job's own checkpoints.
TEST(Checkpoint, OneDirectoryOneJob) {
  auto world = World();
  const int n = world->size(), r = world->rank();
  const std::string dir = SharedTempDir(*world);
  const std::string other = SharedTempDir(*world);
  Box rows = Rows(kR, kC, r, n);
  std::vector<float> w = Fill({kR, kC}, rows, 0);
  StateDict state;
  ASSERT_TRUE(state.Add("w", DType::kF32, {kR, kC}, rows, w.data()).ok());
  auto save = [&](const std::string& where, int64_t step,
                  const std::string& job) {
    SaveOptions o;
    o.keep_last = 2;
    o.job = job;
    return Save(state, step, where, *world, o);
  };
  ASSERT_TRUE(save(dir, 1, "job-a").ok());
  ASSERT_TRUE(save(dir, 2, "job-a").ok());
  EXPECT_EQ(ReadText(dir + "/owner"), "job-a\n");
  // Job B, and a save that names no job: refused at once, on every rank.
  absl::Status b = save(dir, 3, "job-b");
  EXPECT_EQ(b.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(b.message(), HasSubstr(absl::StrCat(
                               "checkpoint directory '", dir,
                               "' belongs to job 'job-a' (its file '", dir,
                               "/owner'); job 'job-b' may not "
                               "write into it")));
  EXPECT_THAT(save(dir, 3, "").message(),
              HasSubstr("a save that names no job (set SaveOptions::job) may "
                        "not write into it"));
  EXPECT_FALSE(fs::exists(dir + "/step-3"));
  EXPECT_EQ(**LatestStep(dir), 2);
  // The same check before any save (not collective, claims nothing).
  EXPECT_TRUE(CheckCanWrite(dir, "job-a").ok());
  EXPECT_THAT(CheckCanWrite(dir, "job-b").message(),
              HasSubstr("belongs to job 'job-a'"));
  EXPECT_TRUE(CheckCanWrite(dir + "/absent", "job-b").ok());
  // Job B's checkpoint that got in anyway (copied beside job A's), and an
  // unnamed one: job A's rotation (keep_last 2) removes only job A's.
  ASSERT_TRUE(save(other, 2, "job-b").ok());
  ASSERT_TRUE(world->barrier().ok());
  if (r == 0) fs::rename(other + "/step-2", dir + "/step-2.1");
  ASSERT_TRUE(world->barrier().ok());
  for (int64_t step : {3, 4, 5}) ASSERT_TRUE(save(dir, step, "job-a").ok());
  EXPECT_FALSE(fs::exists(dir + "/step-1"));
  EXPECT_FALSE(fs::exists(dir + "/step-2"));
  EXPECT_FALSE(fs::exists(dir + "/step-3"));
  EXPECT_TRUE(fs::exists(dir + "/step-4/manifest.json"));
  EXPECT_TRUE(fs::exists(dir + "/step-5/manifest.json"));
  EXPECT_TRUE(fs::exists(dir + "/step-2.1/manifest.json"));  // job B's
  // An unowned directory stays open to unnamed saves (as before); the
  // first named save claims it.
  const std::string open = SharedTempDir(*world);
  ASSERT_TRUE(save(open, 1, "").ok());
  EXPECT_FALSE(fs::exists(open + "/owner"));
  // Every rank has looked before the next save's rank 0 claims it.
  ASSERT_TRUE(world->barrier().ok());
  ASSERT_TRUE(save(open, 2, "job-c").ok());
  EXPECT_EQ(ReadText(open + "/owner"), "job-c\n");
  EXPECT_FALSE(save(open, 3, "").ok());
  RemoveShared(*world, open);
  RemoveShared(*world, other);
  RemoveShared(*world, dir);
}

// Issue 43, item 4: a resharded load reads each needed chunk once per job.
// Row shards loaded as column shards: every rank's strip touches every
// chunk, so each rank read the whole checkpoint before (n times in all);
// now one rank reads each chunk and sends the others their parts. The
// values are exact, and the bytes read over all ranks are the checkpoint's.
TEST(Checkpoint, AReshardedLoadReadsEachChunkOnce) {
  auto world = World();
  const int n = world->size(), r = world->rank();
  const std::string dir = SharedTempDir(*world);
  // w [512, 1024] F32: 2 MiB, 2 chunks per rank's piece at 4 ranks.
  constexpr int64_t kRows = 512, kCols = 1024;
  Box rows = Rows(kRows, kCols, r, n);
  std::vector<float> w = Fill({kRows, kCols}, rows, 0);
  StateDict state;
  ASSERT_TRUE(state.Add("w", DType::kF32, {kRows, kCols}, rows, w.data()).ok());
  ASSERT_TRUE(Save(state, 1, dir, *world).ok());
  Box cols = Cols(kRows, kCols, r, n);
  std::vector<float> got(BoxNumel(cols), -1);
  StateDict want;
  ASSERT_TRUE(
      want.Add("w", DType::kF32, {kRows, kCols}, cols, got.data()).ok());
  const uint64_t before = ShardBytesRead();
  auto loaded = Load(want, dir, *world);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(got, Fill({kRows, kCols}, cols, 0));
  int64_t mine = static_cast<int64_t>(ShardBytesRead() - before);
  int64_t total = 0;
  ASSERT_TRUE(
      world->all_reduce(&mine, &total, 1, DataType::kInt64, ReduceOp::kSum)
          .ok());
  EXPECT_EQ(total, kRows * kCols * 4) << "bytes read over " << n << " ranks";
  if (r == 0) {
    std::printf(
        "rows -> columns on %d ranks: %lld bytes read in all, the "
        "checkpoint holds %lld\n",
        n, static_cast<long long>(total),
        static_cast<long long>(kRows * kCols * 4));
  }
  // A corrupted chunk is named on every rank, though one rank read it.
  ASSERT_TRUE(world->barrier().ok());
  if (r == 0) {
    const std::string shard = dir + "/step-1/shard-0.safetensors";
    auto m = ParseManifest(ReadText(dir + "/step-1/manifest.json"));
    ASSERT_TRUE(m.ok());
    const uint64_t at = m->tensors.at("w").pieces[0].offset + 10;
    int fd = ::open(shard.c_str(), O_RDWR);
    char c;
    ASSERT_EQ(::pread(fd, &c, 1, at), 1);
    c ^= 0x01;
    ASSERT_EQ(::pwrite(fd, &c, 1, at), 1);
    ::close(fd);
  }
  ASSERT_TRUE(world->barrier().ok());
  auto bad = Load(want, dir, *world);
  EXPECT_THAT(bad.status().message(),
              HasSubstr("checksum mismatch in '" + dir +
                        "/step-1/shard-0.safetensors'"));
  RemoveShared(*world, dir);
}

// A resharded load exchanges its chunks in rounds (the next round's reads
// asked of the kernel while this one is sent): a round per chunk gives the
// same tensors as one round, and a chunk corrupted in a late round is named
// on every rank (every rank stops at the same round).
TEST(Checkpoint, AReshardedLoadInRoundsEqualsOneRound) {
  auto world = World();
  const int n = world->size(), r = world->rank();
  const std::string dir = SharedTempDir(*world);
  // a [2048, 1024] F32 (8 MiB, 8 chunks) and b [300, 1024] (a partial
  // last chunk), row shards saved.
  constexpr int64_t kRows = 2048, kBRows = 300, kCols = 1024;
  Box a_rows = Rows(kRows, kCols, r, n), b_rows = Rows(kBRows, kCols, r, n);
  std::vector<float> a = Fill({kRows, kCols}, a_rows, 0);
  std::vector<float> b = Fill({kBRows, kCols}, b_rows, 7);
  StateDict state;
  ASSERT_TRUE(
      state.Add("a", DType::kF32, {kRows, kCols}, a_rows, a.data()).ok());
  ASSERT_TRUE(
      state.Add("b", DType::kF32, {kBRows, kCols}, b_rows, b.data()).ok());
  ASSERT_TRUE(Save(state, 1, dir, *world).ok());
  Box a_cols = Cols(kRows, kCols, r, n), b_cols = Cols(kBRows, kCols, r, n);
  std::vector<float> got_a(BoxNumel(a_cols), -1), got_b(BoxNumel(b_cols), -1);
  StateDict want;
  ASSERT_TRUE(
      want.Add("a", DType::kF32, {kRows, kCols}, a_cols, got_a.data()).ok());
  ASSERT_TRUE(
      want.Add("b", DType::kF32, {kBRows, kCols}, b_cols, got_b.data()).ok());
  internal::SetLoadRoundBytes(1);  // a round per chunk
  auto loaded = Load(want, dir, *world);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(got_a, Fill({kRows, kCols}, a_cols, 0));
  EXPECT_EQ(got_b, Fill({kBRows, kCols}, b_cols, 7));
  // The last chunk of b's last piece (the last round) corrupted.
  ASSERT_TRUE(world->barrier().ok());
  std::string shard;
  if (r == 0) {
    auto m = ParseManifest(ReadText(dir + "/step-1/manifest.json"));
    ASSERT_TRUE(m.ok());
    const auto& piece = m->tensors.at("b").pieces.back();
    shard = dir + "/step-1/" + piece.file;
    const uint64_t at = piece.offset + piece.length - 5;
    int fd = ::open(shard.c_str(), O_RDWR);
    char c;
    ASSERT_EQ(::pread(fd, &c, 1, at), 1);
    c ^= 0x01;
    ASSERT_EQ(::pwrite(fd, &c, 1, at), 1);
    ::close(fd);
  }
  ASSERT_TRUE(world->barrier().ok());
  auto bad = Load(want, dir, *world);
  internal::SetLoadRoundBytes(0);
  EXPECT_THAT(bad.status().message(), HasSubstr("checksum mismatch in '"));
  EXPECT_THAT(bad.status().message(), HasSubstr("tensor 'b'"));
  RemoveShared(*world, dir);
}

// Load reads only the 1 MiB chunks its boxes overlap: a corrupted byte in a
// chunk nobody asks for goes unnoticed; the whole tensor sees it.
TEST(Checkpoint, LoadReadsOnlyTheChunksItNeeds) {
  auto world = World();
  const int n = world->size(), r = world->rank();
  const std::string dir = SharedTempDir(*world);
  constexpr int64_t kRows = 1024, kCols = 1024;  // 4 MiB per rank's rows
  Box rows{{kRows * r, 0}, {kRows, kCols}};
  std::vector<float> w = Fill({kRows * n, kCols}, rows, 0);
  StateDict state;
  ASSERT_TRUE(
      state.Add("big", DType::kF32, {kRows * n, kCols}, rows, w.data()).ok());
  ASSERT_TRUE(Save(state, 1, dir, *world).ok());
  // Flip a byte in the last chunk of rank 0's piece (rows 768..1023).
  if (r == 0) {
    std::ifstream in(dir + "/step-1/manifest.json");
    std::string text((std::istreambuf_iterator<char>(in)), {});
    auto m = ParseManifest(text);
    ASSERT_TRUE(m.ok());
    for (const auto& p : m->tensors.at("big").pieces) {
      if (p.box.offsets[0] != 0) continue;
      int fd = ::open((dir + "/step-1/" + p.file).c_str(), O_RDWR);
      const off_t at = static_cast<off_t>(p.offset + p.length - 100);
      char c;
      ASSERT_EQ(::pread(fd, &c, 1, at), 1);
      c ^= 1;
      ASSERT_EQ(::pwrite(fd, &c, 1, at), 1);
      ::close(fd);
    }
  }
  ASSERT_TRUE(world->barrier().ok());
  // Rows 0..1 of rank 0's piece: chunk 0 only.
  std::vector<float> head(2 * kCols);
  StateDict few;
  Box first{{0, 0}, {2, kCols}};
  ASSERT_TRUE(
      few.Add("big", DType::kF32, {kRows * n, kCols}, first, head.data()).ok());
  auto ok = Load(few, dir, *world);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(head, Fill({kRows * n, kCols}, first, 0));
  std::vector<float> all(kRows * n * kCols);
  StateDict whole;
  ASSERT_TRUE(
      whole.AddFull("big", DType::kF32, {kRows * n, kCols}, all.data()).ok());
  auto bad = Load(whole, dir, *world);
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("checksum mismatch"));
  RemoveShared(*world, dir);
}

TEST(Checkpoint, ASaveThatFailsKeepsThePreviousCheckpoint) {
  auto world = World();
  const std::string dir = SharedTempDir(*world);
  ASSERT_TRUE(SaveRowSharded(*world, dir, 1, 0).ok());
  // A state that disagrees across ranks (at 1 rank: a bad metadata byte).
  StateDict bad;
  std::vector<float> x(4);
  ASSERT_TRUE(
      bad.AddFull("x", DType::kF32, {world->rank() == 0 ? 4 : 2}, x.data())
          .ok());
  if (world->size() == 1) bad.SetMetadata("k", std::string(1, '\x01'));
  absl::Status s = Save(bad, 2, dir, *world);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.message(), world->size() == 1
                               ? HasSubstr("printable ASCII")
                               : HasSubstr("tensor 'x' dtype and "
                                           "shape: rank 1 has F32 "
                                           "[2], rank 0 has F32 [4]"));
  // Ranks that disagree on the step.
  if (world->size() > 1) {
    s = SaveRowSharded(*world, dir, world->rank() == 0 ? 3 : 4);
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
    EXPECT_THAT(s.message(), HasSubstr("rank 1 has step 4 into '"));
    EXPECT_THAT(s.message(), HasSubstr("rank 0 has step 3 into '"));
  }
  auto latest = LatestStep(dir);
  ASSERT_TRUE(latest.ok());
  EXPECT_EQ(**latest, 1);
  std::vector<float> w(kR * kC);
  StateDict want;
  ASSERT_TRUE(want.AddFull("w", DType::kF32, {kR, kC}, w.data()).ok());
  ASSERT_TRUE(Load(want, dir, *world).ok());
  RemoveShared(*world, dir);
}

TEST(Checkpoint, KeepLastAndSavingAStepAgain) {
  auto world = World();
  const std::string dir = SharedTempDir(*world);
  for (int step : {1, 2, 3})
    ASSERT_TRUE(SaveRowSharded(*world, dir, step).ok());
  EXPECT_FALSE(fs::exists(dir + "/step-1"));
  EXPECT_TRUE(fs::exists(dir + "/step-2/manifest.json"));
  // Step 3 again (different values): a new directory, then the newest.
  ASSERT_TRUE(SaveRowSharded(*world, dir, 3, 500).ok());
  EXPECT_TRUE(fs::exists(dir + "/step-3.1/manifest.json"));
  std::vector<float> w(kR * kC);
  StateDict want;
  ASSERT_TRUE(want.AddFull("w", DType::kF32, {kR, kC}, w.data()).ok());
  auto loaded = Load(want, dir, *world);
  ASSERT_TRUE(loaded.ok());
  EXPECT_EQ(loaded->path, dir + "/step-3.1");
  EXPECT_EQ(w, Fill({kR, kC}, Box{{0, 0}, {kR, kC}}, 500));
  // An explicit step: its newest directory. Step 2 was the third newest
  // (keep_last 2): removed.
  auto three = Load(want, dir, *world, 3);
  ASSERT_TRUE(three.ok()) << three.status();
  EXPECT_EQ(three->path, dir + "/step-3.1");
  auto two = Load(want, dir, *world, 2);
  EXPECT_THAT(two.status().message(),
              HasSubstr("no committed checkpoint of step 2"));
  // ReadManifest finds what Load reads, without the data.
  auto manifest = ReadManifest(dir);
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  EXPECT_EQ(manifest->path, dir + "/step-3.1");
  EXPECT_EQ(manifest->manifest.step, 3);
  EXPECT_EQ(manifest->manifest.world_size, world->size());
  EXPECT_EQ(manifest->manifest.metadata.at("data_position"), "30");
  EXPECT_EQ(manifest->manifest.tensors.at("w").shape,
            (std::vector<int64_t>{kR, kC}));
  EXPECT_EQ(manifest->manifest.tensors.at("w").pieces.size(),
            static_cast<size_t>(world->size()));
  EXPECT_EQ(ReadManifest(dir, 2).status().code(), absl::StatusCode::kNotFound);
  // A caller's own check agreed like Save's and Load's errors: the first
  // failed rank's, on every rank.
  EXPECT_TRUE(AgreeStatus(*world, absl::OkStatus()).ok());
  const int last = world->size() - 1;
  absl::Status agreed = AgreeStatus(
      *world, world->rank() == last ? absl::DataLossError("bad bytes")
                                    : absl::OkStatus());
  EXPECT_EQ(agreed.code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(agreed.message(), absl::StrCat("rank ", last, ": bad bytes"));
  EXPECT_THAT(ReadManifest(dir + "/absent").status().message(),
              HasSubstr("no committed checkpoint in"));
  RemoveShared(*world, dir);
}

// Root only (mount needs CAP_SYS_ADMIN): a tmpfs of 256 KiB that a 1 MiB
// tensor cannot fit, and one mounted read-only; else chmod (non-root).
TEST(Checkpoint, FullDiskAndReadOnlyDirectoryAreNamed) {
  auto world = World();
  const std::string dir = SharedTempDir(*world);
  const std::string small = dir + "/small", ro = dir + "/ro";
  int mounted = 1;
  if (world->rank() == 0) {
    fs::create_directories(small);
    fs::create_directories(ro);
    if (::mount("tmpfs", small.c_str(), "tmpfs", 0, "size=256k") != 0 ||
        ::mount("tmpfs", ro.c_str(), "tmpfs", MS_RDONLY, "size=64k") != 0) {
      mounted = 0;
    }
  }
  ASSERT_TRUE(world->broadcast(&mounted, 1, DataType::kInt32, 0).ok());
  if (!mounted) {
    RemoveShared(*world, dir);
    GTEST_SKIP() << "cannot mount a tmpfs here (not root or no "
                    "CAP_SYS_ADMIN): full-disk and read-only cases not run";
  }
  // A small checkpoint fits; a large one does not; the small one loads.
  ASSERT_TRUE(SaveRowSharded(*world, small, 1).ok());
  std::vector<float> big(1 << 18, 1.f);
  StateDict large;
  Box part{{int64_t{1 << 18} * world->rank()}, {1 << 18}};
  ASSERT_TRUE(large
                  .Add("big", DType::kF32, {int64_t{1 << 18} * world->size()},
                       part, big.data())
                  .ok());
  absl::Status full = Save(large, 2, small, *world);
  ASSERT_FALSE(full.ok());
  EXPECT_THAT(full.message(), HasSubstr("No space left on device"));
  EXPECT_THAT(full.message(), HasSubstr(small + "/step-2/shard-"));
  auto latest = LatestStep(small);
  ASSERT_TRUE(latest.ok());
  EXPECT_EQ(**latest, 1);
  std::vector<float> w(kR * kC);
  StateDict want;
  ASSERT_TRUE(want.AddFull("w", DType::kF32, {kR, kC}, w.data()).ok());
  ASSERT_TRUE(Load(want, small, *world).ok());
  // Read-only.
  absl::Status denied = SaveRowSharded(*world, ro + "/ckpt", 1);
  ASSERT_FALSE(denied.ok());
  EXPECT_THAT(denied.message(), HasSubstr(ro + "/ckpt"));
  EXPECT_THAT(denied.message(), HasSubstr("Read-only file system"));
  ASSERT_TRUE(world->barrier().ok());
  if (world->rank() == 0) {
    ::umount(small.c_str());
    ::umount(ro.c_str());
  }
  RemoveShared(*world, dir);
}

TEST(AsyncSaver, SavesWhatStartSawAndKeepsOneInFlight) {
  auto world = World();
  const int n = world->size(), r = world->rank();
  const std::string dir = SharedTempDir(*world);
  auto saver = AsyncSaver::Create(*world);
  ASSERT_TRUE(saver.ok()) << saver.status();
  Box rows = Rows(kR, kC, r, n);
  std::vector<float> w = Fill({kR, kC}, rows, 0);
  StateDict state;
  ASSERT_TRUE(state.Add("w", DType::kF32, {kR, kC}, rows, w.data()).ok());
  ASSERT_TRUE((*saver)->Start(state, 1, dir).ok());
  EXPECT_TRUE((*saver)->in_flight());
  std::fill(w.begin(), w.end(), -7.f);               // training goes on
  ASSERT_TRUE((*saver)->Start(state, 2, dir).ok());  // commits step 1
  ASSERT_TRUE((*saver)->Wait().ok());
  EXPECT_FALSE((*saver)->in_flight());
  std::vector<float> all(kR * kC);
  StateDict want;
  ASSERT_TRUE(want.AddFull("w", DType::kF32, {kR, kC}, all.data()).ok());
  auto one = Load(want, dir, *world, 1);
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(all, Fill({kR, kC}, Box{{0, 0}, {kR, kC}}, 0));
  auto two = Load(want, dir, *world);
  ASSERT_TRUE(two.ok());
  EXPECT_EQ(two->step, 2);
  EXPECT_EQ(all, std::vector<float>(kR * kC, -7.f));
  // Destroyed with a save in flight: joined, not committed.
  ASSERT_TRUE((*saver)->Start(state, 3, dir).ok());
  saver->reset();
  auto latest = LatestStep(dir);
  ASSERT_TRUE(latest.ok());
  EXPECT_EQ(**latest, 2);
  RemoveShared(*world, dir);
}

}  // namespace
}  // namespace vemesh::checkpoint
