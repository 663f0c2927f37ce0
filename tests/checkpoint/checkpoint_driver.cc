// A small program around Save and Load for the tests that need a process of
// their own: the SIGKILL-during-save script (kill_during_save.sh) and the
// Python reader test (read_shard_test.py). Its ranks are threads of this
// process joined by Gloo over a MemoryStore, so one SIGKILL stops every
// rank at the same random point, and no launcher is needed.
//
//   checkpoint_driver save DIR STEP RANKS ROWS   # w [ROWS, 256] F32 in row
//                                                # shards, b [256] F32 and
//                                                # ids [16] I64 replicated
//   checkpoint_driver verify DIR MIN MAX   # loads the latest with 1 rank,
//                                          # checks values and MIN<=step<=MAX,
//                                          # prints "loaded step S"
// Values: w[i] = (3*i + 1009*step) mod 2^23, b[i] = w's formula + 1,
// ids[i] = 100*step + i (exact in F32 and I64).

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/time/time.h"
#include "vemesh/checkpoint/checkpoint.h"
#include "vemesh/checkpoint/manifest.h"
#include "vemesh/comm/gloo/gloo_communicator.h"
#include "vemesh/rendezvous/memory_store.h"

namespace vemesh::checkpoint {
namespace {

constexpr int64_t kCols = 256;

float W(int64_t flat, int64_t step) {
  return static_cast<float>((3 * flat + 1009 * step) % (int64_t{1} << 23));
}

int Fail(const std::string& what) {
  std::fprintf(stderr, "checkpoint_driver: %s\n", what.c_str());
  return 1;
}

absl::Status SaveRank(std::shared_ptr<Communicator> comm,
                      const std::string& dir, int64_t step, int64_t rows) {
  const int n = comm->size(), r = comm->rank();
  const int64_t per = rows / n;
  std::vector<float> w(per * kCols), b(kCols);
  std::vector<int64_t> ids(16);
  for (int64_t i = 0; i < per * kCols; ++i) w[i] = W(per * kCols * r + i, step);
  for (int64_t i = 0; i < kCols; ++i) b[i] = W(i, step) + 1;
  for (int64_t i = 0; i < 16; ++i) ids[i] = 100 * step + i;
  StateDict state;
  absl::Status s = state.Add("w", DType::kF32, {rows, kCols},
                             Box{{per * r, 0}, {per, kCols}}, w.data());
  if (s.ok()) s = state.AddFull("b", DType::kF32, {kCols}, b.data());
  if (s.ok()) s = state.AddFull("ids", DType::kI64, {16}, ids.data());
  state.SetMetadata("step", std::to_string(step));
  if (!s.ok()) return s;
  return Save(state, step, dir, *comm);
}

int RunSave(const std::string& dir, int64_t step, int ranks, int64_t rows) {
  auto store = std::make_shared<MemoryStore>();
  std::vector<int> globals(ranks);
  for (int r = 0; r < ranks; ++r) globals[r] = r;
  std::vector<absl::Status> results(ranks);
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] {
      auto comm = GlooCommunicator::Create(store, "world", r, ranks, globals,
                                           absl::Seconds(60));
      results[r] = comm.ok() ? SaveRank(*comm, dir, step, rows) : comm.status();
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < ranks; ++r) {
    if (!results[r].ok()) return Fail(results[r].ToString());
  }
  std::printf("saved step %lld\n", static_cast<long long>(step));
  return 0;
}

int RunVerify(const std::string& dir, int64_t min, int64_t max) {
  auto comm = GlooCommunicator::Create(std::make_shared<MemoryStore>(), "v", 0,
                                       1, {0}, absl::Seconds(60));
  if (!comm.ok()) return Fail(comm.status().ToString());
  // b and ids first (their shapes are fixed), then w at the shape the
  // manifest of the same checkpoint gives.
  std::vector<float> b(kCols);
  std::vector<int64_t> ids(16);
  StateDict small;
  (void)small.AddFull("b", DType::kF32, {kCols}, b.data());
  (void)small.AddFull("ids", DType::kI64, {16}, ids.data());
  auto first = Load(small, dir, **comm);
  if (!first.ok()) return Fail(first.status().ToString());
  const int64_t step = first->step;
  if (step < min || step > max) {
    return Fail("loaded step " + std::to_string(step) + " outside [" +
                std::to_string(min) + ", " + std::to_string(max) + "]");
  }
  for (int64_t i = 0; i < kCols; ++i) {
    if (b[i] != W(i, step) + 1)
      return Fail("b differs at " + std::to_string(i));
  }
  for (int64_t i = 0; i < 16; ++i) {
    if (ids[i] != 100 * step + i) return Fail("ids differs");
  }
  std::ifstream in(first->path + "/manifest.json");
  std::string text((std::istreambuf_iterator<char>(in)), {});
  auto manifest = ParseManifest(text);
  if (!manifest.ok()) return Fail(manifest.status().ToString());
  const int64_t rows = manifest->tensors.at("w").shape.at(0);
  std::vector<float> w(rows * kCols);
  StateDict whole;
  (void)whole.AddFull("w", DType::kF32, {rows, kCols}, w.data());
  // From the same checkpoint as the first load (its directory, manifest
  // bytes and job), as a resume does.
  LoadOptions same;
  same.same_checkpoint_as = &*first;
  auto second = Load(whole, dir, **comm, same);
  if (!second.ok()) return Fail(second.status().ToString());
  for (int64_t i = 0; i < rows * kCols; ++i) {
    if (w[i] != W(i, step)) return Fail("w differs at " + std::to_string(i));
  }
  std::printf("loaded step %lld\n", static_cast<long long>(step));
  return 0;
}

}  // namespace
}  // namespace vemesh::checkpoint

int main(int argc, char** argv) {
  using vemesh::checkpoint::Fail;
  std::vector<std::string> a(argv + 1, argv + argc);
  int64_t x = 0, y = 0, z = 0;
  if (a.size() == 5 && a[0] == "save" && absl::SimpleAtoi(a[2], &x) &&
      absl::SimpleAtoi(a[3], &y) && absl::SimpleAtoi(a[4], &z) && y >= 1 &&
      y <= 64 && z >= y && z % y == 0) {
    return vemesh::checkpoint::RunSave(a[1], x, static_cast<int>(y), z);
  }
  if (a.size() == 4 && a[0] == "verify" && absl::SimpleAtoi(a[2], &x) &&
      absl::SimpleAtoi(a[3], &y)) {
    return vemesh::checkpoint::RunVerify(a[1], x, y);
  }
  return Fail(
      "usage: checkpoint_driver save DIR STEP RANKS ROWS (ROWS a multiple of "
      "RANKS <= 64) | verify DIR MIN MAX");
}
