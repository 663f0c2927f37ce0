// vemesh/checkpoint/checkpoint.cc

#include "vemesh/checkpoint/checkpoint.h"

#include <algorithm>
#include <cstring>
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
#include "vemesh/checkpoint/internal/read.h"
#include "vemesh/checkpoint/internal/save.h"
#include "vemesh/checkpoint/manifest.h"

namespace vemesh::checkpoint {
namespace {

using internal::File;

// Reads at most this many bytes of chunks at once.
constexpr uint64_t kReadWindowBytes = uint64_t{64} << 20;

// One contiguous run of bytes: `length` bytes at `src` in the saved piece
// go to `dst`.
struct Run {
  uint64_t src;
  char* dst;
  uint64_t length;
};

// The runs that copy `part` (inside both) from the saved piece `from` to
// the target box `to` (row-major, elements of `esize` bytes), in increasing
// source order. Trailing dimensions that all three cover fully fuse into
// one run.
void AppendRuns(const Box& from, const Box& to, const Box& part, size_t esize,
                char* to_data, std::vector<Run>* runs) {
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
          std::memcpy(r.dst + (lo - r.src), buffer.data() + (lo - begin),
                      hi - lo);
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
  return found;
}

std::string ShapeText(DType dtype, const std::vector<int64_t>& shape) {
  return absl::StrCat(DTypeName(dtype), " [", absl::StrJoin(shape, ", "), "]");
}

}  // namespace

namespace internal {

absl::Status FillFromManifest(StateDict& state,
                              const CheckpointManifest& found) {
  const Manifest& m = found.manifest;
  const std::string& path = found.path;
  const std::string manifest_path =
      absl::StrCat(path, "/", internal::kManifestName);

  // Per saved piece, the runs to copy out of it.
  std::map<std::pair<std::string, size_t>, std::vector<Run>> wanted;
  for (const Piece& p : state.pieces()) {
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
                 static_cast<char*>(p.data), &wanted[{p.name, i}]);
    }
    if (covered != need) {
      return absl::NotFoundError(absl::StrCat(
          "tensor '", p.name, "' box ", BoxToString(p.box), ": checkpoint '",
          manifest_path, "' holds ", covered, " of its ", need, " elements"));
    }
  }
  std::map<std::string, File> files;
  for (auto& [key, runs] : wanted) {
    const ManifestPiece& piece = m.tensors.at(key.first).pieces[key.second];
    auto f = files.find(piece.file);
    if (f == files.end()) {
      const std::string file_path = absl::StrCat(path, "/", piece.file);
      VEMESH_ASSIGN_OR_RETURN(File opened, File::OpenRead(file_path));
      VEMESH_ASSIGN_OR_RETURN(uint64_t size, opened.Size());
      const uint64_t listed = m.files.at(piece.file);
      if (size != listed) {
        return absl::DataLossError(absl::StrCat(
            "shard '", file_path, "' is ", size, " bytes, the manifest says ",
            listed, size < listed ? " (truncated)" : ""));
      }
      f = files.emplace(piece.file, std::move(opened)).first;
    }
    VEMESH_RETURN_IF_ERROR(
        ReadPiece(f->second, key.first, piece, m.chunk_bytes, runs));
  }
  return absl::OkStatus();
}

}  // namespace internal

namespace {

// This rank's part of a load, with no communication.
absl::StatusOr<LoadResult> LoadLocal(StateDict& state, const std::string& dir,
                                     const LoadOptions& options) {
  VEMESH_ASSIGN_OR_RETURN(CheckpointManifest found,
                          ChooseCheckpoint(dir, options));
  VEMESH_RETURN_IF_ERROR(internal::FillFromManifest(state, found));
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
  absl::StatusOr<LoadResult> local = LoadLocal(state, dir, options);
  VEMESH_RETURN_IF_ERROR(internal::AgreeStatus(world, local.status()));
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
