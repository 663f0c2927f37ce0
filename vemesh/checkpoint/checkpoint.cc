// vemesh/checkpoint/checkpoint.cc

#include "vemesh/checkpoint/checkpoint.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <map>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "vemesh/base/status_macros.h"
#include "vemesh/checkpoint/internal/collective.h"
#include "vemesh/checkpoint/internal/crc32c.h"
#include "vemesh/checkpoint/internal/directory.h"
#include "vemesh/checkpoint/internal/file_io.h"
#include "vemesh/checkpoint/internal/json_util.h"
#include "vemesh/checkpoint/internal/read.h"
#include "vemesh/checkpoint/internal/save.h"
#include "vemesh/checkpoint/manifest.h"

namespace vemesh::checkpoint {
namespace {

using internal::File;
using internal::Json;

// Shard bytes read by loads in this process (internal/read.h).
std::atomic<uint64_t> shard_bytes_read{0};

// Reads at most this many bytes of chunks at once.
constexpr uint64_t kReadWindowBytes = uint64_t{64} << 20;
// A resharded load exchanges about this many bytes per rank per round
// (internal::SetLoadRoundBytes changes it for tests).
constexpr uint64_t kRoundBytes = uint64_t{16} << 20;
std::atomic<uint64_t> round_bytes_per_rank{kRoundBytes};

// One contiguous run of bytes: `length` bytes at `src` in the saved piece
// go to address `dst` (for another rank's plan, where only `src` and
// `length` are used, an offset from 0).
struct Run {
  uint64_t src;
  uintptr_t dst;
  uint64_t length;
};

// The runs that copy `part` (inside both) from the saved piece `from` to
// the target box `to` (row-major, elements of `esize` bytes), in increasing
// source order. Trailing dimensions that all three cover fully fuse into
// one run.
void AppendRuns(const Box& from, const Box& to, const Box& part, size_t esize,
                uintptr_t to_data, std::vector<Run>* runs) {
  const size_t nd = part.offsets.size();
  if (nd == 0) {
    runs->push_back(Run{0, to_data, esize});
    return;
  }
  std::vector<uint64_t> from_stride(nd), to_stride(nd);
  uint64_t fs = esize, ts = esize;
  for (size_t d = nd; d-- > 0;) {
    from_stride[d] = fs;
    to_stride[d] = ts;
    fs *= static_cast<uint64_t>(from.lengths[d]);
    ts *= static_cast<uint64_t>(to.lengths[d]);
  }
  // d0: the outermost dimension of the contiguous run.
  size_t d0 = nd - 1;
  uint64_t run = static_cast<uint64_t>(part.lengths[d0]) * esize;
  while (d0 > 0 && part.lengths[d0] == from.lengths[d0] &&
         part.lengths[d0] == to.lengths[d0]) {
    --d0;
    run *= static_cast<uint64_t>(part.lengths[d0]);
  }
  std::vector<int64_t> index(d0, 0);
  while (true) {
    uint64_t src = 0, dst = 0;
    for (size_t d = 0; d < nd; ++d) {
      const int64_t i = part.offsets[d] + (d < d0 ? index[d] : 0);
      src += static_cast<uint64_t>(i - from.offsets[d]) * from_stride[d];
      dst += static_cast<uint64_t>(i - to.offsets[d]) * to_stride[d];
    }
    runs->push_back(Run{src, to_data + dst, run});
    size_t d = d0;
    while (d > 0) {
      if (++index[d - 1] < part.lengths[d - 1]) break;
      index[d - 1] = 0;
      --d;
    }
    if (d == 0) return;
  }
}

// Reads the chunks of `piece` that `runs` touch (sorted by src), checks
// each chunk's CRC32C and copies the runs out.
absl::Status ReadPiece(const File& file, const std::string& tensor,
                       const ManifestPiece& piece, uint64_t chunk_bytes,
                       std::vector<Run>& runs) {
  std::sort(runs.begin(), runs.end(),
            [](const Run& a, const Run& b) { return a.src < b.src; });
  // The chunk indices needed, as sorted [first, last] ranges.
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (const Run& r : runs) {
    if (r.length == 0) continue;
    uint64_t first = r.src / chunk_bytes;
    uint64_t last = (r.src + r.length - 1) / chunk_bytes;
    if (!ranges.empty() && first <= ranges.back().second + 1) {
      ranges.back().second = std::max(ranges.back().second, last);
    } else {
      ranges.emplace_back(first, last);
    }
  }
  const uint64_t window_chunks =
      std::max<uint64_t>(1, kReadWindowBytes / chunk_bytes);
  std::string buffer;
  size_t next_run = 0;
  for (auto [first, last] : ranges) {
    for (uint64_t c = first; c <= last; c += window_chunks) {
      const uint64_t c_end = std::min(last + 1, c + window_chunks);
      const uint64_t begin = c * chunk_bytes;
      const uint64_t end = std::min(piece.length, c_end * chunk_bytes);
      buffer.resize(end - begin);
      VEMESH_RETURN_IF_ERROR(
          file.PreadAll(buffer.data(), end - begin, piece.offset + begin));
      shard_bytes_read += end - begin;
      for (uint64_t k = c; k < c_end; ++k) {
        const uint64_t kb = k * chunk_bytes - begin;
        const uint64_t kn =
            std::min(chunk_bytes, piece.length - k * chunk_bytes);
        if (internal::Crc32c(buffer.data() + kb, kn) != piece.crc32c[k]) {
          return absl::DataLossError(absl::StrCat(
              "checksum mismatch in '", file.path(), "': tensor '", tensor,
              "' piece ", BoxToString(piece.box), " bytes [",
              piece.offset + k * chunk_bytes, ", +", kn, ") (corrupted)"));
        }
      }
      // Copy the parts of the runs inside [begin, end); runs are disjoint
      // and sorted, so their ends are sorted too.
      while (next_run < runs.size() &&
             runs[next_run].src + runs[next_run].length <= begin) {
        ++next_run;
      }
      for (size_t i = next_run; i < runs.size() && runs[i].src < end; ++i) {
        const Run& r = runs[i];
        const uint64_t lo = std::max(r.src, begin);
        const uint64_t hi = std::min(r.src + r.length, end);
        if (lo < hi) {
          std::memcpy(reinterpret_cast<char*>(r.dst + (lo - r.src)),
                      buffer.data() + (lo - begin), hi - lo);
        }
      }
    }
  }
  return absl::OkStatus();
}

// The manifest of the committed step directory `path`, read bounded.
absl::StatusOr<CheckpointManifest> ReadManifestIn(const std::string& path) {
  const std::string manifest_path =
      absl::StrCat(path, "/", internal::kManifestName);
  VEMESH_ASSIGN_OR_RETURN(
      std::string text,
      internal::ReadSmallFile(manifest_path, kMaxManifestBytes));
  CheckpointManifest out;
  VEMESH_ASSIGN_OR_RETURN(out.manifest, ParseManifest(text, manifest_path));
  out.path = path;
  out.manifest_crc32c = internal::Crc32c(text.data(), text.size());
  return out;
}

std::string JobText(const std::string& job) {
  return job.empty() ? std::string("no job (a version 1 checkpoint)")
                     : absl::StrCat("job '", job, "'");
}

// The checkpoint a load reads, chosen and checked as `options` say.
absl::StatusOr<CheckpointManifest> ChooseCheckpoint(
    const std::string& dir, const LoadOptions& options) {
  CheckpointManifest found;
  if (const LoadResult* first = options.same_checkpoint_as) {
    absl::StatusOr<CheckpointManifest> again = ReadManifestIn(first->path);
    if (!again.ok()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "checkpoint '", first->path, "' (step ", first->step, ", ",
          JobText(first->job), ", manifest CRC32C ", first->manifest_crc32c,
          "), which this job read first, cannot be read again: ",
          again.status().message()));
    }
    if (again->manifest_crc32c != first->manifest_crc32c ||
        again->manifest.job != first->job) {
      return absl::FailedPreconditionError(absl::StrCat(
          "checkpoint '", first->path, "' changed since this job read it: ",
          "it read step ", first->step, " of ", JobText(first->job),
          " (manifest CRC32C ", first->manifest_crc32c, "), the directory now ",
          "holds step ", again->manifest.step, " of ",
          JobText(again->manifest.job), " (manifest CRC32C ",
          again->manifest_crc32c, "): one resume must read one checkpoint"));
    }
    found = *std::move(again);
  } else {
    VEMESH_ASSIGN_OR_RETURN(found, ReadManifest(dir, options.step));
  }
  if (!options.job.empty() && found.manifest.job != options.job) {
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint '", found.path, "' belongs to ",
        JobText(found.manifest.job), ", not to this job '", options.job, "'"));
  }
  for (const auto& [key, want] : options.metadata) {
    auto got = found.manifest.metadata.find(key);
    if (got == found.manifest.metadata.end() || got->second != want) {
      return absl::InvalidArgumentError(absl::StrCat(
          "checkpoint '", found.path, "' is of another job: its '", key,
          "' is '",
          got == found.manifest.metadata.end() ? "(none)" : got->second,
          "'; this one's is '", want, "'"));
    }
  }
  return found;
}

std::string ShapeText(DType dtype, const std::vector<int64_t>& shape) {
  return absl::StrCat(DTypeName(dtype), " [", absl::StrJoin(shape, ", "), "]");
}

// Per saved piece (tensor name, index in its pieces), the runs that copy
// out of it into `state`'s pieces.
using Wanted = std::map<std::pair<std::string, size_t>, std::vector<Run>>;

absl::StatusOr<Wanted> PlanRuns(const std::vector<Piece>& targets,
                                const CheckpointManifest& found) {
  const Manifest& m = found.manifest;
  const std::string manifest_path =
      absl::StrCat(found.path, "/", internal::kManifestName);
  Wanted wanted;
  for (const Piece& p : targets) {
    auto t = m.tensors.find(p.name);
    if (t == m.tensors.end()) {
      return absl::NotFoundError(
          absl::StrCat("tensor '", p.name, "' is not in checkpoint '",
                       manifest_path, "' (a checkpoint of another model?)"));
    }
    if (t->second.dtype != p.dtype || t->second.shape != p.global_shape) {
      return absl::FailedPreconditionError(absl::StrCat(
          "tensor '", p.name, "' is ",
          ShapeText(t->second.dtype, t->second.shape), " in checkpoint '",
          manifest_path, "' but ", ShapeText(p.dtype, p.global_shape),
          " here (a checkpoint of another model)"));
    }
    const int64_t need = BoxNumel(p.box);
    if (need == 0) continue;
    int64_t covered = 0;
    for (size_t i = 0; i < t->second.pieces.size(); ++i) {
      std::optional<Box> part = Intersect(t->second.pieces[i].box, p.box);
      if (!part) continue;
      covered += BoxNumel(*part);
      AppendRuns(t->second.pieces[i].box, p.box, *part, DTypeSize(p.dtype),
                 reinterpret_cast<uintptr_t>(p.data), &wanted[{p.name, i}]);
    }
    if (covered != need) {
      return absl::NotFoundError(absl::StrCat(
          "tensor '", p.name, "' box ", BoxToString(p.box), ": checkpoint '",
          manifest_path, "' holds ", covered, " of its ", need, " elements"));
    }
  }
  for (auto& [key, runs] : wanted) {
    std::sort(runs.begin(), runs.end(),
              [](const Run& a, const Run& b) { return a.src < b.src; });
  }
  return wanted;
}

// The shard files of one checkpoint, opened once each and checked against
// the manifest's sizes.
class ShardFiles {
 public:
  explicit ShardFiles(const CheckpointManifest& found) : found_(found) {}
  absl::StatusOr<const File*> Get(const std::string& name) {
    auto f = files_.find(name);
    if (f == files_.end()) {
      const std::string file_path = absl::StrCat(found_.path, "/", name);
      VEMESH_ASSIGN_OR_RETURN(File opened, File::OpenRead(file_path));
      VEMESH_ASSIGN_OR_RETURN(uint64_t size, opened.Size());
      const uint64_t listed = found_.manifest.files.at(name);
      if (size != listed) {
        return absl::DataLossError(absl::StrCat(
            "shard '", file_path, "' is ", size, " bytes, the manifest says ",
            listed, size < listed ? " (truncated)" : ""));
      }
      f = files_.emplace(name, std::move(opened)).first;
    }
    return &f->second;
  }

 private:
  const CheckpointManifest& found_;
  std::map<std::string, File> files_;
};

}  // namespace

uint64_t ShardBytesRead() { return shard_bytes_read.load(); }

namespace internal {

absl::Status FillFromManifest(StateDict& state,
                              const CheckpointManifest& found) {
  const Manifest& m = found.manifest;
  VEMESH_ASSIGN_OR_RETURN(Wanted wanted, PlanRuns(state.pieces(), found));
  ShardFiles files(found);
  for (auto& [key, runs] : wanted) {
    const ManifestPiece& piece = m.tensors.at(key.first).pieces[key.second];
    VEMESH_ASSIGN_OR_RETURN(const File* f, files.Get(piece.file));
    VEMESH_RETURN_IF_ERROR(
        ReadPiece(*f, key.first, piece, m.chunk_bytes, runs));
  }
  return absl::OkStatus();
}

void SetLoadRoundBytes(uint64_t bytes_per_rank) {
  round_bytes_per_rank = bytes_per_rank == 0 ? kRoundBytes : bytes_per_rank;
}

}  // namespace internal

namespace {

// One contiguous part of a run inside one chunk of a saved piece: the unit
// a reader sends. `piece` numbers the manifest's pieces (tensors in name
// order, then their pieces in order).
struct Segment {
  uint64_t piece;
  uint64_t src;  // in the saved piece's bytes
  uint64_t length;
};

// Collective over `world` (every rank with the same manifest): fills
// `state` with each chunk any rank needs read by exactly one of the ranks
// that need it (the one with the fewest bytes assigned so far), verified
// there, and its bytes sent to the others over `world` (all_to_all_v): a
// resharded load reads the checkpoint once, not once per rank that
// touches a chunk. Errors (planning, reading) are agreed: the same on
// every rank.
absl::Status SharedRead(StateDict& state, const CheckpointManifest& found,
                        Communicator& world) {
  const Manifest& m = found.manifest;
  const int n = world.size(), me = world.rank();
  const uint64_t chunk = m.chunk_bytes;
  // The manifest's pieces, numbered.
  std::vector<std::pair<const std::string*, const ManifestPiece*>> pieces;
  std::map<std::pair<std::string, size_t>, uint64_t> piece_id;
  for (const auto& [name, t] : m.tensors) {
    for (size_t i = 0; i < t.pieces.size(); ++i) {
      piece_id[{name, i}] = pieces.size();
      pieces.emplace_back(&name, &t.pieces[i]);
    }
  }
  // Runs cut at chunk boundaries, in (piece, src) order (with each
  // segment's destination address when `dst` is given).
  auto cut = [&](const Wanted& wanted, std::vector<Segment>* out,
                 std::vector<char*>* dst) {
    for (const auto& [key, runs] : wanted) {
      const uint64_t id = piece_id.at(key);
      for (const Run& r : runs) {
        uint64_t at = r.src;
        while (at < r.src + r.length) {
          const uint64_t end =
              std::min(r.src + r.length, (at / chunk + 1) * chunk);
          out->push_back(Segment{id, at, end - at});
          if (dst != nullptr) {
            dst->push_back(reinterpret_cast<char*>(r.dst + (at - r.src)));
          }
          at = end;
        }
      }
    }
  };
  absl::StatusOr<Wanted> wanted = PlanRuns(state.pieces(), found);
  std::vector<Segment> mine;
  std::vector<char*> mine_dst;
  if (wanted.ok()) cut(*wanted, &mine, &mine_dst);
  VEMESH_RETURN_IF_ERROR(internal::AgreeStatus(world, wanted.status()));
  // Every rank's boxes to every rank (small: a few per tensor), and from
  // them every rank's segments, computed here as their owner computed them.
  Json boxes = Json::array();
  for (const Piece& p : state.pieces()) {
    boxes.push_back({p.name, p.box.offsets, p.box.lengths});
  }
  VEMESH_ASSIGN_OR_RETURN(
      std::vector<std::string> all,
      internal::AllGatherStrings(world, internal::DumpJson(boxes)));
  std::vector<std::vector<Segment>> segs(n);
  for (int r = 0; r < n; ++r) {
    if (r == me) {
      segs[r] = mine;
      continue;
    }
    std::vector<Piece> theirs;
    absl::StatusOr<Json> j = internal::ParseJson(all[r], "load plan", 8);
    absl::Status parsed = j.status();
    if (parsed.ok()) {
      try {
        for (const Json& b : *j) {
          Piece p;
          p.name = b.at(0).get<std::string>();
          const ManifestTensor& t = m.tensors.at(p.name);
          p.dtype = t.dtype;
          p.global_shape = t.shape;
          p.box = Box{b.at(1).get<std::vector<int64_t>>(),
                      b.at(2).get<std::vector<int64_t>>()};
          theirs.push_back(std::move(p));
        }
      } catch (const std::exception& e) {
        parsed = absl::InternalError(e.what());
      }
    }
    absl::StatusOr<Wanted> w =
        parsed.ok() ? PlanRuns(theirs, found) : absl::StatusOr<Wanted>(parsed);
    if (!w.ok()) {
      return absl::InternalError(
          absl::StrCat("checkpoint load: rank ", r,
                       "'s plan differs here: ", w.status().message()));
    }
    cut(*w, &segs[r], nullptr);
  }
  // The manifest's chunks numbered in (piece, chunk) order: piece `id`'s
  // chunk k is chunk first_chunk[id] + k. Vectors indexed by it replace
  // per-segment map lookups (a column load cuts ~10^5 segments per rank).
  std::vector<uint64_t> first_chunk(pieces.size() + 1, 0);
  for (size_t id = 0; id < pieces.size(); ++id) {
    first_chunk[id + 1] =
        first_chunk[id] + (pieces[id].second->length + chunk - 1) / chunk;
  }
  const uint64_t chunks = first_chunk.back();
  auto chunk_of = [&](const Segment& sg) {
    return first_chunk[sg.piece] + sg.src / chunk;
  };
  auto chunk_length = [&](uint64_t id, uint64_t k) {
    return std::min(chunk, pieces[id].second->length - k * chunk);
  };
  // Each needed chunk's reader: of the ranks that need it, the one with the
  // fewest bytes to read so far (the lowest on ties); the same on every rank.
  std::vector<int> reader(chunks, -1);
  {
    std::vector<std::vector<int>> needers(chunks);
    for (int r = 0; r < n; ++r) {
      for (const Segment& sg : segs[r]) {
        std::vector<int>& v = needers[chunk_of(sg)];
        if (v.empty() || v.back() != r) v.push_back(r);
      }
    }
    std::vector<uint64_t> load(n, 0);
    for (size_t id = 0; id < pieces.size(); ++id) {
      for (uint64_t c = first_chunk[id]; c < first_chunk[id + 1]; ++c) {
        if (needers[c].empty()) continue;
        int best = needers[c][0];
        for (int r : needers[c]) {
          if (load[r] < load[best]) best = r;
        }
        load[best] += chunk_length(id, c - first_chunk[id]);
        reader[c] = best;
      }
    }
  }
  // The segments this rank reads, per chunk: (destination, segment).
  std::vector<std::vector<std::pair<int, const Segment*>>> to_send(chunks);
  for (int r = 0; r < n; ++r) {
    for (const Segment& sg : segs[r]) {
      const uint64_t c = chunk_of(sg);
      if (reader[c] == me) to_send[c].emplace_back(r, &sg);
    }
  }
  // Rounds: consecutive chunks of about kRoundBytes per rank of the job's
  // bytes each, the same on every rank. A round is read, verified, sent and
  // unpacked before the next; the next round's reads are asked of the
  // kernel first, so the disk reads it while this round is exchanged.
  const uint64_t round_bytes =
      round_bytes_per_rank.load() * static_cast<uint64_t>(n);
  std::vector<uint64_t> round_end;  // exclusive chunk bounds
  {
    uint64_t bytes = 0;
    for (size_t id = 0; id < pieces.size(); ++id) {
      for (uint64_t c = first_chunk[id]; c < first_chunk[id + 1]; ++c) {
        if (reader[c] < 0) continue;
        bytes += chunk_length(id, c - first_chunk[id]);
        if (bytes >= round_bytes) {
          round_end.push_back(c + 1);
          bytes = 0;
        }
      }
    }
    if (round_end.empty() || round_end.back() < chunks) {
      round_end.push_back(chunks);
    }
  }
  // This rank's reads: windows of consecutive chunks of one piece (at most
  // kReadWindowBytes), inside one round, in chunk order.
  struct Window {
    uint64_t piece, first, last;  // chunk ids [first, last]
  };
  std::vector<std::vector<Window>> windows(round_end.size());
  {
    size_t round = 0;
    for (size_t id = 0; id < pieces.size(); ++id) {
      for (uint64_t c = first_chunk[id]; c < first_chunk[id + 1]; ++c) {
        while (c >= round_end[round]) ++round;
        if (reader[c] != me) continue;
        std::vector<Window>& w = windows[round];
        if (!w.empty() && w.back().piece == id && w.back().last + 1 == c &&
            (c - w.back().first + 1) * chunk <=
                std::max(kReadWindowBytes, chunk)) {
          w.back().last = c;
        } else {
          w.push_back(Window{id, c, c});
        }
      }
    }
  }
  ShardFiles files(found);
  // The window's bytes in its piece: [begin, end).
  auto bounds = [&](const Window& w) {
    const ManifestPiece& p = *pieces[w.piece].second;
    const uint64_t begin = (w.first - first_chunk[w.piece]) * chunk;
    const uint64_t end =
        std::min(p.length, (w.last - first_chunk[w.piece] + 1) * chunk);
    return std::make_pair(begin, end);
  };
  auto prefetch = [&](size_t round) {
    if (round >= windows.size()) return;
    for (const Window& w : windows[round]) {
      const ManifestPiece& p = *pieces[w.piece].second;
      absl::StatusOr<const File*> f = files.Get(p.file);
      if (!f.ok()) return;  // the read reports it
      auto [begin, end] = bounds(w);
      (*f)->WillNeed(p.offset + begin, end - begin);
    }
  };
  // Where each of this rank's segments unpacks from: segments are in
  // (piece, src) order, so each round's are a contiguous range of `mine`.
  size_t next_mine = 0;
  std::string buffer;
  std::vector<char> send, recv;
  prefetch(0);
  uint64_t round_first = 0;
  for (size_t round = 0; round < round_end.size(); ++round) {
    prefetch(round + 1);
    // What goes where in this round: bytes from this rank to each rank.
    std::vector<size_t> send_counts(n, 0), recv_counts(n, 0);
    for (uint64_t c = round_first; c < round_end[round]; ++c) {
      for (const auto& [to, sg] : to_send[c]) {
        if (to != me) send_counts[to] += sg->length;
      }
    }
    size_t mine_end = next_mine;
    while (mine_end < mine.size() &&
           chunk_of(mine[mine_end]) < round_end[round]) {
      const int from = reader[chunk_of(mine[mine_end])];
      if (from != me) recv_counts[from] += mine[mine_end].length;
      ++mine_end;
    }
    std::vector<size_t> send_at(n, 0);
    size_t send_total = 0;
    for (int r = 0; r < n; ++r) {
      send_at[r] = send_total;
      send_total += send_counts[r];
    }
    // Read this round's windows, verify each chunk, and pack the segments
    // in (piece, src) order per destination: the order each unpacks.
    send.resize(send_total);
    absl::Status read;
    for (const Window& w : windows[round]) {
      const ManifestPiece& p = *pieces[w.piece].second;
      absl::StatusOr<const File*> f = files.Get(p.file);
      if (!f.ok()) {
        read = f.status();
        break;
      }
      auto [begin, end] = bounds(w);
      buffer.resize(end - begin);
      read = (*f)->PreadAll(buffer.data(), end - begin, p.offset + begin);
      shard_bytes_read += end - begin;
      for (uint64_t c = w.first; read.ok() && c <= w.last; ++c) {
        const uint64_t k = c - first_chunk[w.piece];
        const uint64_t kb = k * chunk - begin;
        const uint64_t kn = chunk_length(w.piece, k);
        if (internal::Crc32c(buffer.data() + kb, kn) != p.crc32c[k]) {
          read = absl::DataLossError(absl::StrCat(
              "checksum mismatch in '", (*f)->path(), "': tensor '",
              *pieces[w.piece].first, "' piece ", BoxToString(p.box),
              " bytes [", p.offset + k * chunk, ", +", kn, ") (corrupted)"));
          break;
        }
        for (const auto& [to, sg] : to_send[c]) {
          const char* from = buffer.data() + (sg->src - begin);
          if (to == me) {
            std::memcpy(mine_dst[sg - segs[me].data()], from, sg->length);
          } else {
            std::memcpy(send.data() + send_at[to], from, sg->length);
            send_at[to] += sg->length;
          }
        }
      }
      if (!read.ok()) break;
    }
    VEMESH_RETURN_IF_ERROR(internal::AgreeStatus(world, read));
    size_t recv_total = 0;
    for (size_t c : recv_counts) recv_total += c;
    recv.resize(recv_total);
    VEMESH_RETURN_IF_ERROR(world.all_to_all_v(
        send.data(), send_counts, recv.data(), recv_counts, DataType::kUInt8));
    // Unpack: this round's segments of this rank in order, each from its
    // reader's stream (those it read itself are in place already).
    std::vector<size_t> recv_at(n, 0);
    for (int r = 1; r < n; ++r) {
      recv_at[r] = recv_at[r - 1] + recv_counts[r - 1];
    }
    for (size_t i = next_mine; i < mine_end; ++i) {
      const int from = reader[chunk_of(mine[i])];
      if (from == me) continue;  // copied when read
      std::memcpy(mine_dst[i], recv.data() + recv_at[from], mine[i].length);
      recv_at[from] += mine[i].length;
    }
    next_mine = mine_end;
    round_first = round_end[round];
  }
  return absl::OkStatus();
}

LoadResult ResultOf(const CheckpointManifest& found) {
  LoadResult result;
  result.step = found.manifest.step;
  result.path = found.path;
  result.job = found.manifest.job;
  result.mesh = found.manifest.mesh;
  result.manifest_crc32c = found.manifest_crc32c;
  for (const auto& [k, v] : found.manifest.metadata) result.metadata[k] = v;
  return result;
}

}  // namespace

absl::Status Save(const StateDict& state, int64_t step, const std::string& dir,
                  Communicator& world, const SaveOptions& options) {
  VEMESH_ASSIGN_OR_RETURN(internal::SavePlan plan,
                          internal::PlanSave(state, step, dir, world, options));
  absl::StatusOr<internal::ShardResult> mine =
      internal::WriteShard(plan, internal::PlannedData(plan, state));
  return internal::CommitSave(plan, mine, world);
}

absl::StatusOr<LoadResult> Load(StateDict& state, const std::string& dir,
                                Communicator& world,
                                std::optional<int64_t> step) {
  LoadOptions options;
  options.step = step;
  return Load(state, dir, world, options);
}

absl::StatusOr<LoadResult> Load(StateDict& state, const std::string& dir,
                                Communicator& world,
                                const LoadOptions& options) {
  absl::StatusOr<CheckpointManifest> found = ChooseCheckpoint(dir, options);
  VEMESH_RETURN_IF_ERROR(internal::AgreeStatus(world, found.status()));
  absl::StatusOr<LoadResult> local = ResultOf(*found);
  // Every rank read the same manifest unless the directory changed under
  // the load; check that the step, the manifest's bytes and the directory
  // agree.
  const int64_t path_crc =
      internal::Crc32c(local->path.data(), local->path.size());
  int64_t mine[3] = {local->step, local->manifest_crc32c, path_crc};
  int64_t lo[3], hi[3];
  VEMESH_RETURN_IF_ERROR(
      world.all_reduce(mine, lo, 3, DataType::kInt64, ReduceOp::kMin));
  VEMESH_RETURN_IF_ERROR(
      world.all_reduce(mine, hi, 3, DataType::kInt64, ReduceOp::kMax));
  if (lo[0] != hi[0]) {
    return absl::AbortedError(absl::StrCat(
        "checkpoint '", dir, "' changed during the load: ranks read steps ",
        lo[0], " to ", hi[0]));
  }
  if (lo[1] != hi[1] || lo[2] != hi[2]) {
    return absl::AbortedError(absl::StrCat(
        "checkpoint '", dir, "' changed during the load: ranks read ",
        "different manifests of step ", lo[0]));
  }
  // The same manifest everywhere: read each needed chunk once per job.
  if (world.size() == 1) {
    VEMESH_RETURN_IF_ERROR(internal::AgreeStatus(
        world, internal::FillFromManifest(state, *found)));
  } else {
    VEMESH_RETURN_IF_ERROR(SharedRead(state, *found, world));
  }
  return local;
}

absl::StatusOr<std::optional<int64_t>> LatestStep(const std::string& dir) {
  VEMESH_ASSIGN_OR_RETURN(std::optional<std::string> path,
                          internal::FindCheckpoint(dir, std::nullopt));
  if (!path) return std::optional<int64_t>();
  VEMESH_ASSIGN_OR_RETURN(CheckpointManifest m, ReadManifestIn(*path));
  return std::optional<int64_t>(m.manifest.step);
}

absl::Status CheckCanWrite(const std::string& dir, const std::string& job) {
  return internal::CheckOwner(dir, job);
}

absl::Status AgreeStatus(Communicator& world, const absl::Status& local) {
  return internal::AgreeStatus(world, local);
}

absl::StatusOr<CheckpointManifest> ReadManifest(const std::string& dir,
                                                std::optional<int64_t> step) {
  VEMESH_ASSIGN_OR_RETURN(std::optional<std::string> path,
                          internal::FindCheckpoint(dir, step));
  if (!path) {
    return absl::NotFoundError(
        step ? absl::StrCat("no committed checkpoint of step ", *step, " in '",
                            dir, "'")
             : absl::StrCat("no committed checkpoint in '", dir, "'"));
  }
  return ReadManifestIn(*path);
}

}  // namespace vemesh::checkpoint
