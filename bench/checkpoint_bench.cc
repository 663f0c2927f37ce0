// bench/checkpoint_bench.cc
//
// Checkpoint save and load throughput against the disk's own sequential
// write and read bandwidth, measured in the same job on the same files'
// sizes, and the training stall per save: AsyncSaver::Start against a
// blocking Save.
//
//   mpirun --oversubscribe -n 8 build/release/bench/checkpoint_bench
//       --mib_per_rank=32 --reps=3 --dir=/tmp      (one command line)
//
// Every rank holds --mib_per_rank MiB of row shards (4 tensors) plus one
// replicated 1 MiB tensor (written once). A sample is the time from a
// barrier to the slowest rank's end (max over ranks), best of --reps.
//   disk write: each rank writes a file of its shard's size and fsyncs it
//               (all ranks at once: what dd + sync would do);
//   disk read:  each rank reads its file back after dropping it from the
//               page cache (posix_fadvise DONTNEED after fsync);
//   save:       Save(), fsync of shards and manifest included;
//   load:       Load() onto the same row decomposition, shards dropped from
//               the cache first; and onto column shards (resharded: every
//               rank reads a strip of every piece, so more chunks);
//   stall:      the time training waits: Save() vs AsyncSaver::Start (the
//               copy; Wait() is reported too);
//   bytes read: shard bytes every rank read in each load, summed, as a
//               multiple of the checkpoint (1.0: each byte read once);
//   manifest:   ManifestToJson + ParseManifest (checksum, keys, tiling,
//               file ranges) of a manifest of 10^3 and 10^5 pieces.

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "vemesh/checkpoint/async_saver.h"
#include "vemesh/checkpoint/checkpoint.h"
#include "vemesh/checkpoint/manifest.h"
#include "vemesh/comm/mpi/mpi_communicator.h"
#include "vemesh/comm/mpi/mpi_environment.h"

ABSL_FLAG(int64_t, mib_per_rank, 32, "MiB of row shards each rank holds");
ABSL_FLAG(int, reps, 3, "samples of each measurement (best is reported)");
ABSL_FLAG(std::string, dir, "/tmp", "where the files go");
ABSL_FLAG(bool, smoke, false, "1 MiB per rank, one repetition");

namespace vemesh::checkpoint {
namespace {

constexpr int64_t kCols = 1024;  // floats per row: 4 KiB rows

// Seconds to write and parse (every check) a manifest of `pieces` pieces:
// 100 tensors [pieces / 100, 256] F32 in one-row pieces over 8 files,
// column-split in two for every other tensor (so the tiling is checked in
// two dimensions). Best of 3.
double ManifestCheckSeconds(int64_t pieces) {
  Manifest m;
  const int64_t per_tensor = pieces / 100;
  for (int f = 0; f < 8; ++f) {
    m.files[absl::StrCat("shard-", f, ".safetensors")] = uint64_t{1} << 40;
  }
  uint64_t at[8] = {};
  int64_t k = 0;
  for (int t = 0; t < 100; ++t) {
    ManifestTensor& mt = m.tensors[absl::StrCat("t", t)];
    const bool split = t % 2 == 1;
    const int64_t rows = split ? per_tensor / 2 : per_tensor;
    mt.shape = {rows, 256};
    for (int64_t row = 0; row < rows; ++row) {
      for (int half = 0; half < (split ? 2 : 1); ++half) {
        const int f = static_cast<int>(k++ % 8);
        const int64_t cols = split ? 128 : 256;
        ManifestPiece p{Box{{row, half * 128}, {1, cols}},
                        absl::StrCat("shard-", f, ".safetensors"),
                        absl::StrCat("t", t, "@", row),
                        at[f],
                        static_cast<uint64_t>(cols) * 4,
                        {0}};
        at[f] += p.length;
        mt.pieces.push_back(std::move(p));
      }
    }
  }
  double best = 1e30;
  for (int rep = 0; rep < 3; ++rep) {
    const absl::Time t0 = absl::Now();
    const std::string text = ManifestToJson(m);
    absl::StatusOr<Manifest> back = ParseManifest(text, "bench");
    const double s = absl::ToDoubleSeconds(absl::Now() - t0);
    if (!back.ok()) {
      std::fprintf(stderr, "checkpoint_bench: %s\n",
                   back.status().ToString().c_str());
      return -1;
    }
    best = std::min(best, s);
  }
  return best;
}

void DropFromCache(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return;
  ::fdatasync(fd);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

void DropDirFromCache(const std::string& dir) {
  std::error_code ec;
  for (auto& e : std::filesystem::recursive_directory_iterator(dir, ec)) {
    if (e.is_regular_file()) DropFromCache(e.path().string());
  }
}

// Seconds from a barrier to the slowest rank's end of `body`.
template <typename F>
double Timed(Communicator& world, F&& body) {
  (void)world.barrier();
  absl::Time t0 = absl::Now();
  body();
  double mine = absl::ToDoubleSeconds(absl::Now() - t0), slowest = 0;
  (void)world.all_reduce(&mine, &slowest, 1, DataType::kFloat64,
                         ReduceOp::kMax);
  return slowest;
}

int Run(Communicator& world) {
  const bool smoke = absl::GetFlag(FLAGS_smoke);
  const int64_t mib = smoke ? 1 : absl::GetFlag(FLAGS_mib_per_rank);
  const int reps = smoke ? 1 : absl::GetFlag(FLAGS_reps);
  const int n = world.size(), r = world.rank();
  char root[256] = {};
  if (r == 0) {
    std::string t = absl::GetFlag(FLAGS_dir) + "/vemesh_ckpt_bench_XXXXXX";
    std::snprintf(root, sizeof(root), "%s", t.c_str());
    if (::mkdtemp(root) == nullptr) root[0] = 0;
  }
  (void)world.broadcast(root, sizeof(root), DataType::kUInt8, 0);
  if (root[0] == 0) {
    std::fprintf(stderr, "checkpoint_bench: cannot make a directory\n");
    return 1;
  }
  const std::string dir = root;
  // State: 4 row-sharded tensors of mib/4 MiB per rank, one replicated.
  const int64_t rows_per_rank = mib * (1 << 20) / 4 / (kCols * 4);
  std::vector<std::vector<float>> data(5);
  StateDict state;
  for (int t = 0; t < 4; ++t) {
    data[t].assign(rows_per_rank * kCols, static_cast<float>(r + t));
    (void)state.Add(
        absl::StrCat("layer", t), DType::kF32, {rows_per_rank * n, kCols},
        Box{{rows_per_rank * r, 0}, {rows_per_rank, kCols}}, data[t].data());
  }
  data[4].assign(256 * kCols, 1.f);
  (void)state.AddFull("embedding", DType::kF32, {256, kCols}, data[4].data());
  const double total_bytes =
      static_cast<double>(4 * rows_per_rank * kCols * 4) * n + 256 * kCols * 4;
  const int64_t my_bytes =
      4 * rows_per_rank * kCols * 4 + (r == 0 ? 256 * kCols * 4 : 0);

  double disk_w = 1e30, disk_r = 1e30, save = 1e30, load = 1e30, reshard = 1e30,
         start = 1e30, wait = 1e30;
  // Shard bytes read by the last load of each kind, over all ranks.
  int64_t load_read = 0, reshard_read = 0;
  auto read_since = [&](uint64_t before) {
    int64_t mine = static_cast<int64_t>(ShardBytesRead() - before);
    int64_t sum = 0;
    (void)world.all_reduce(&mine, &sum, 1, DataType::kInt64, ReduceOp::kSum);
    return sum;
  };
  std::vector<char> buf(my_bytes, 'x');
  const std::string file = absl::StrCat(dir, "/dd-", r);
  absl::Status status;
  int64_t step = 0;
  auto saver = AsyncSaver::Create(world);
  if (!saver.ok()) return 1;
  for (int rep = 0; rep < reps; ++rep) {
    disk_w = std::min(
        disk_w, Timed(world, [&] {
          int fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
          for (int64_t at = 0; at < my_bytes;) {
            ssize_t k = ::write(fd, buf.data() + at, my_bytes - at);
            if (k <= 0) break;
            at += k;
          }
          ::fsync(fd);
          ::close(fd);
        }));
    DropFromCache(file);
    disk_r = std::min(disk_r, Timed(world, [&] {
                        int fd = ::open(file.c_str(), O_RDONLY);
                        for (int64_t at = 0; at < my_bytes;) {
                          ssize_t k =
                              ::pread(fd, buf.data() + at, my_bytes - at, at);
                          if (k <= 0) break;
                          at += k;
                        }
                        ::close(fd);
                      }));
    ::unlink(file.c_str());
    const std::string ck = dir + "/ckpt";
    save = std::min(save, Timed(world, [&] {
                      status.Update(Save(state, ++step, ck, world));
                    }));
    if (r == 0) DropDirFromCache(ck);
    (void)world.barrier();
    uint64_t before = ShardBytesRead();
    load = std::min(load, Timed(world, [&] {
                      status.Update(Load(state, ck, world).status());
                    }));
    load_read = read_since(before);
    // Column shards of every layer: a resharded load.
    std::vector<std::vector<float>> cols(4);
    StateDict by_cols;
    const int64_t cw = kCols / n;
    for (int t = 0; t < 4; ++t) {
      cols[t].resize(rows_per_rank * n * cw);
      (void)by_cols.Add(
          absl::StrCat("layer", t), DType::kF32, {rows_per_rank * n, kCols},
          Box{{0, cw * r}, {rows_per_rank * n, cw}}, cols[t].data());
    }
    if (r == 0) DropDirFromCache(ck);
    (void)world.barrier();
    before = ShardBytesRead();
    reshard = std::min(reshard, Timed(world, [&] {
                         status.Update(Load(by_cols, ck, world).status());
                       }));
    reshard_read = read_since(before);
    start = std::min(start, Timed(world, [&] {
                       status.Update((*saver)->Start(state, ++step, ck));
                     }));
    wait =
        std::min(wait, Timed(world, [&] { status.Update((*saver)->Wait()); }));
  }
  if (r == 0) {
    const double mb = total_bytes / 1e6;
    std::printf(
        "checkpoint_bench: %d ranks, %.1f MB checkpoint (%lld MiB of "
        "row shards per rank + 1 MiB replicated), best of %d\n",
        n, mb, static_cast<long long>(mib), reps);
    std::printf("  disk write+fsync   %8.1f ms  %8.1f MB/s\n", disk_w * 1e3,
                mb / disk_w);
    std::printf(
        "  save               %8.1f ms  %8.1f MB/s  (%.0f%% of disk write)\n",
        save * 1e3, mb / save, 100 * disk_w / save);
    std::printf("  disk read (cold)   %8.1f ms  %8.1f MB/s\n", disk_r * 1e3,
                mb / disk_r);
    std::printf(
        "  load, same shards  %8.1f ms  %8.1f MB/s  (%.0f%% of disk read)\n",
        load * 1e3, mb / load, 100 * disk_r / load);
    std::printf(
        "  load, rows->cols   %8.1f ms  %8.1f MB/s  (%.0f%% of disk read)\n",
        reshard * 1e3, mb / reshard, 100 * disk_r / reshard);
    std::printf(
        "  stall per save: blocking Save %.1f ms, AsyncSaver::Start %.1f ms "
        "(%.1fx less); Wait %.1f ms later\n",
        save * 1e3, start * 1e3, save / start, wait * 1e3);
    std::printf(
        "  bytes read per load, all ranks: same shards %.2fx, rows->cols "
        "%.2fx the checkpoint\n",
        load_read / total_bytes, reshard_read / total_bytes);
    for (int64_t pieces : {int64_t{1000}, int64_t{100000}}) {
      const double t = ManifestCheckSeconds(pieces);
      std::printf(
          "  manifest of %lld pieces: to JSON and parsed with every "
          "check in %.1f ms (%.2f us per piece)\n",
          static_cast<long long>(pieces), t * 1e3, t * 1e6 / pieces);
    }
    std::printf("  status: %s\n", status.ToString().c_str());
  }
  (void)world.barrier();
  if (r == 0) {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
  return status.ok() ? 0 : 1;
}

}  // namespace
}  // namespace vemesh::checkpoint

int main(int argc, char** argv) {
  vemesh::MpiSession mpi(&argc, &argv);
  absl::ParseCommandLine(argc, argv);
  auto world = vemesh::MpiCommunicator::World();
  if (!mpi.status().ok() || !world.ok()) return 1;
  return vemesh::checkpoint::Run(**world);
}
