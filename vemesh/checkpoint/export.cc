// vemesh/checkpoint/export.cc

#include "vemesh/checkpoint/export.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <map>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "vemesh/base/status_macros.h"
#include "vemesh/checkpoint/checkpoint.h"
#include "vemesh/checkpoint/internal/file_io.h"
#include "vemesh/checkpoint/internal/read.h"
#include "vemesh/checkpoint/safetensors.h"
#include "vemesh/checkpoint/state_dict.h"

namespace vemesh::checkpoint {
namespace {

// Bytes of one tensor read and written at a time.
constexpr uint64_t kWindowBytes = uint64_t{64} << 20;

uint64_t Numel(const std::vector<int64_t>& shape) {
  uint64_t n = 1;
  for (int64_t s : shape) n *= static_cast<uint64_t>(s);
  return n;
}

// Writes every tensor of `found` after `head` into `file`.
absl::Status WriteTensors(const CheckpointManifest& found,
                          const std::string& head, internal::File& file,
                          uint64_t* bytes) {
  VEMESH_RETURN_IF_ERROR(file.WriteAll(head.data(), head.size()));
  std::vector<char> buffer;
  for (const auto& [name, t] : found.manifest.tensors) {
    const uint64_t esize = DTypeSize(t.dtype);
    const uint64_t numel = Numel(t.shape);
    const uint64_t window = std::max<uint64_t>(1, kWindowBytes / esize);
    for (uint64_t begin = 0; begin < numel; begin += window) {
      const uint64_t end = std::min(numel, begin + window);
      buffer.resize((end - begin) * esize);
      // The window's elements as row-major contiguous boxes, in flat order:
      // each box's data lands where it belongs in the flat buffer.
      StateDict want;
      uint64_t at = 0;
      for (const Box& box : FlatRangeToBoxes(t.shape, begin, end)) {
        VEMESH_RETURN_IF_ERROR(
            want.Add(name, t.dtype, t.shape, box, buffer.data() + at));
        at += static_cast<uint64_t>(BoxNumel(box)) * esize;
      }
      VEMESH_RETURN_IF_ERROR(internal::FillFromManifest(want, found));
      VEMESH_RETURN_IF_ERROR(file.WriteAll(buffer.data(), buffer.size()));
      *bytes += buffer.size();
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ExportResult> ExportSafetensors(const std::string& dir,
                                               const std::string& out,
                                               std::optional<int64_t> step) {
  VEMESH_ASSIGN_OR_RETURN(CheckpointManifest found, ReadManifest(dir, step));
  const Manifest& m = found.manifest;
  std::vector<SafetensorsTensor> entries;
  uint64_t offset = 0;
  for (const auto& [name, t] : m.tensors) {
    const uint64_t bytes = Numel(t.shape) * DTypeSize(t.dtype);
    entries.push_back(
        SafetensorsTensor{name, t.dtype, t.shape, offset, offset + bytes});
    offset += bytes;
  }
  std::map<std::string, std::string> metadata(m.metadata.begin(),
                                              m.metadata.end());
  metadata["format"] = "pt";
  metadata["vemesh.step"] = absl::StrCat(m.step);
  metadata["vemesh.job"] = m.job;
  metadata["vemesh.mesh"] = m.mesh;
  metadata["vemesh.source"] = found.path;
  const std::string head = SafetensorsHeaderBytes(entries, metadata);
  const std::string tmp = out + ".tmp";
  ExportResult result;
  absl::Status written;
  {
    VEMESH_ASSIGN_OR_RETURN(internal::File file, internal::File::Create(tmp));
    written = WriteTensors(found, head, file, &result.bytes);
    if (written.ok()) written = file.Sync();
    if (written.ok()) written = file.Close();
  }
  if (written.ok() && std::rename(tmp.c_str(), out.c_str()) != 0) {
    written = internal::FileError(errno, "cannot rename to", out);
  }
  if (!written.ok()) {
    std::remove(tmp.c_str());
    return written;
  }
  result.path = found.path;
  result.step = m.step;
  result.tensors = static_cast<int64_t>(m.tensors.size());
  return result;
}

}  // namespace vemesh::checkpoint
