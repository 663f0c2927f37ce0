// vemesh/checkpoint/inspect.cc

#include "vemesh/checkpoint/inspect.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "vemesh/base/status_macros.h"
#include "vemesh/checkpoint/checkpoint.h"
#include "vemesh/checkpoint/internal/crc32c.h"
#include "vemesh/checkpoint/internal/directory.h"
#include "vemesh/checkpoint/internal/file_io.h"

namespace vemesh::checkpoint {
namespace {

constexpr uint64_t kReadBytes = uint64_t{8} << 20;

std::string Quoted(const std::string& s) {
  return s.empty() ? std::string("(none)") : absl::StrCat("'", s, "'");
}

}  // namespace

absl::Status InspectCheckpoint(const std::string& dir,
                               std::optional<int64_t> step, std::ostream& out) {
  VEMESH_ASSIGN_OR_RETURN(std::optional<std::string> owner,
                          internal::ReadOwner(dir));
  out << "checkpoint directory " << dir
      << " (owner: " << (owner ? absl::StrCat("job '", *owner, "'") : "none")
      << ")\n";
  std::string latest;
  if (absl::StatusOr<std::string> l = internal::ReadSmallFile(
          absl::StrCat(dir, "/", internal::kLatestName), 4096);
      l.ok()) {
    latest = std::string(absl::StripAsciiWhitespace(*l));
  }
  VEMESH_ASSIGN_OR_RETURN(std::vector<internal::StepDir> dirs,
                          internal::ListStepDirs(dir));
  out << "steps:\n";
  for (const internal::StepDir& d : dirs) {
    out << "  " << d.name << ": step " << d.step;
    if (!d.committed) {
      out << ", uncommitted";
    } else {
      absl::StatusOr<std::string> text = internal::ReadSmallFile(
          absl::StrCat(dir, "/", d.name, "/", internal::kManifestName),
          kMaxManifestBytes);
      absl::StatusOr<Manifest> parsed =
          text.ok() ? ParseManifest(*text, d.name)
                    : absl::StatusOr<Manifest>(text.status());
      if (parsed.ok()) {
        out << ", committed, job " << Quoted(parsed->job);
      } else {
        out << ", committed, manifest unreadable: "
            << parsed.status().message();
      }
    }
    if (d.name == latest) out << " (latest)";
    out << "\n";
  }
  VEMESH_ASSIGN_OR_RETURN(CheckpointManifest found, ReadManifest(dir, step));
  const Manifest& m = found.manifest;
  out << "checkpoint " << found.path << ": step " << m.step << ", job "
      << Quoted(m.job) << ", mesh " << Quoted(m.mesh) << ", world size "
      << m.world_size << ", format version " << m.version
      << ", manifest CRC32C " << found.manifest_crc32c << "\n";
  for (const auto& [k, v] : m.metadata) {
    out << "  metadata " << k << " = " << v << "\n";
  }
  uint64_t total = 0, chunks = 0;
  out << "tensors (" << m.tensors.size() << "):\n";
  for (const auto& [name, t] : m.tensors) {
    uint64_t bytes = 0;
    for (const ManifestPiece& p : t.pieces) bytes += p.length;
    total += bytes;
    out << "  " << name << "  " << DTypeName(t.dtype) << " ["
        << absl::StrJoin(t.shape, ", ") << "]  " << t.pieces.size()
        << (t.pieces.size() == 1 ? " piece, " : " pieces, ") << bytes
        << " bytes\n";
  }
  // Verify: every piece of every tensor, chunk by chunk.
  int bad = 0;
  std::string first_bad;
  auto report = [&](const std::string& line) {
    out << "  BAD " << line << "\n";
    if (bad++ == 0) first_bad = line;
  };
  std::vector<char> buffer;
  for (const auto& [file, size] : m.files) {
    const std::string path = absl::StrCat(found.path, "/", file);
    absl::StatusOr<internal::File> f = internal::File::OpenRead(path);
    absl::StatusOr<uint64_t> actual =
        f.ok() ? f->Size() : absl::StatusOr<uint64_t>(f.status());
    if (!actual.ok()) {
      report(absl::StrCat("shard: ", actual.status().message()));
      continue;
    }
    if (*actual != size) {
      report(absl::StrCat("shard: '", path, "' is ", *actual,
                          " bytes, the manifest says ", size,
                          *actual < size ? " (truncated)" : ""));
      continue;
    }
    for (const auto& [name, t] : m.tensors) {
      for (const ManifestPiece& p : t.pieces) {
        if (p.file != file) continue;
        for (uint64_t k = 0; k < p.crc32c.size(); ++k) {
          const uint64_t begin = k * m.chunk_bytes;
          const uint64_t n = std::min(m.chunk_bytes, p.length - begin);
          uint32_t crc = 0;
          absl::Status read;
          for (uint64_t at = 0; at < n && read.ok(); at += kReadBytes) {
            const uint64_t len = std::min(kReadBytes, n - at);
            buffer.resize(len);
            read = f->PreadAll(buffer.data(), len, p.offset + begin + at);
            if (read.ok())
              crc = internal::Crc32cExtend(crc, buffer.data(), len);
          }
          ++chunks;
          if (!read.ok()) {
            report(absl::StrCat("chunk: ", read.message()));
          } else if (crc != p.crc32c[k]) {
            report(absl::StrCat("chunk: tensor '", name, "' piece ",
                                BoxToString(p.box), " in '", file, "' bytes [",
                                p.offset + begin, ", +", n, "): CRC32C ", crc,
                                ", the manifest says ", p.crc32c[k]));
          }
        }
      }
    }
  }
  if (bad > 0) {
    out << "verify: " << bad << " of " << chunks << " chunks or shards bad\n";
    return absl::DataLossError(absl::StrCat(
        "checkpoint '", found.path, "': ", bad,
        bad == 1 ? " bad chunk or shard: " : " bad chunks or shards, first: ",
        first_bad));
  }
  out << "verify: " << chunks << " chunks in " << m.files.size() << " files, "
      << total << " bytes: every CRC32C matches\n";
  return absl::OkStatus();
}

}  // namespace vemesh::checkpoint
