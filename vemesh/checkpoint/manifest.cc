// vemesh/checkpoint/manifest.cc

#include "vemesh/checkpoint/manifest.h"

#include <algorithm>
#include <initializer_list>
#include <tuple>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "vemesh/base/status_macros.h"
#include "vemesh/checkpoint/internal/crc32c.h"
#include "vemesh/checkpoint/internal/json_util.h"

namespace vemesh::checkpoint {
namespace {

using internal::Json;

using internal::kMaxDim;
using internal::kMaxDims;
constexpr int64_t kMaxFileBytes = int64_t{1} << 60;

constexpr char kChecksumKey[] = "manifest_crc32c";

// What follows the checksummed bytes: the last member and the end.
std::string ChecksumSuffix(uint32_t crc) {
  return absl::StrCat(",\n \"", kChecksumKey, "\": ", crc, "\n}\n");
}

// Keys an object of the format may hold: any other is refused (a flipped
// bit in a key name must not turn a member into an ignored one).
absl::Status OnlyKeys(const Json& object,
                      std::initializer_list<const char*> allowed,
                      absl::string_view where) {
  for (auto it = object.begin(); it != object.end(); ++it) {
    if (std::find_if(allowed.begin(), allowed.end(), [&](const char* a) {
          return it.key() == a;
        }) == allowed.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": unknown key \"", absl::CHexEscape(it.key()), "\""));
    }
  }
  return absl::OkStatus();
}

bool Printable(const std::string& s) {
  return std::all_of(s.begin(), s.end(),
                     [](unsigned char c) { return c >= 0x20 && c <= 0x7e; });
}

bool PlainFileName(const std::string& s) {
  if (s.empty() || s.size() > 255 || s == "." || s == "..") return false;
  for (unsigned char c : s) {
    if (c == '/' || c < 0x20 || c > 0x7e) return false;
  }
  return true;
}

}  // namespace

std::string ManifestToJson(const Manifest& m) {
  Json j = Json::object();
  j["format"] = "vemesh-checkpoint";
  j["version"] = 2;
  j["step"] = m.step;
  j["world_size"] = m.world_size;
  j["chunk_bytes"] = m.chunk_bytes;
  j["job"] = m.job;
  j["mesh"] = m.mesh;
  j["metadata"] = Json::object();
  for (const auto& [k, v] : m.metadata) j["metadata"][k] = v;
  j["files"] = Json::object();
  for (const auto& [k, v] : m.files) j["files"][k] = v;
  j["tensors"] = Json::object();
  for (const auto& [name, t] : m.tensors) {
    Json pieces = Json::array();
    for (const ManifestPiece& p : t.pieces) {
      pieces.push_back({{"offsets", p.box.offsets},
                        {"lengths", p.box.lengths},
                        {"file", p.file},
                        {"key", p.key},
                        {"offset", p.offset},
                        {"length", p.length},
                        {"crc32c", p.crc32c}});
    }
    j["tensors"][name] = {{"dtype", std::string(DTypeName(t.dtype))},
                          {"shape", t.shape},
                          {"pieces", std::move(pieces)}};
  }
  // The body ends "\n}"; the checksum of what precedes it goes last.
  std::string text = internal::DumpJson(j, 1);
  text.resize(text.size() - 2);
  const uint32_t crc = internal::Crc32c(text.data(), text.size());
  return text + ChecksumSuffix(crc);
}

absl::StatusOr<Manifest> ParseManifest(absl::string_view text,
                                       absl::string_view what) {
  if (text.size() > kMaxManifestBytes) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", text.size(),
                                                   " bytes, above the limit ",
                                                   kMaxManifestBytes));
  }
  VEMESH_ASSIGN_OR_RETURN(Json j, internal::ParseJson(text, what));
  if (!j.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": not a JSON object"));
  }
  VEMESH_ASSIGN_OR_RETURN(std::string format,
                          internal::GetString(j, "format", what));
  if (format != "vemesh-checkpoint") {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": format '", format, "', expected 'vemesh-checkpoint'"));
  }
  Manifest m;
  VEMESH_ASSIGN_OR_RETURN(m.version,
                          internal::GetInt(j, "version", 1, 2, what));
  if (m.version == 1) {
    VEMESH_RETURN_IF_ERROR(
        OnlyKeys(j,
                 {"format", "version", "step", "world_size", "chunk_bytes",
                  "metadata", "files", "tensors"},
                 what));
  } else {
    VEMESH_RETURN_IF_ERROR(
        OnlyKeys(j,
                 {"format", "version", "step", "world_size", "chunk_bytes",
                  "job", "mesh", "metadata", "files", "tensors", kChecksumKey},
                 what));
    // The checksum first: nothing else of a damaged manifest is believed.
    VEMESH_ASSIGN_OR_RETURN(
        int64_t crc, internal::GetInt(j, kChecksumKey, 0, UINT32_MAX, what));
    const std::string suffix = ChecksumSuffix(static_cast<uint32_t>(crc));
    if (!absl::EndsWith(text, suffix)) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": \"", kChecksumKey,
                       "\" is not the last line as written (edited or "
                       "damaged)"));
    }
    const uint32_t actual =
        internal::Crc32c(text.data(), text.size() - suffix.size());
    if (actual != static_cast<uint32_t>(crc)) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": checksum mismatch (the manifest says ", crc,
                       ", its bytes have ", actual, "): damaged"));
    }
    VEMESH_ASSIGN_OR_RETURN(m.job, internal::GetString(j, "job", what));
    VEMESH_ASSIGN_OR_RETURN(m.mesh, internal::GetString(j, "mesh", what));
    if (!Printable(m.job) || !Printable(m.mesh)) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": \"job\" and \"mesh\" must be printable ASCII"));
    }
  }
  VEMESH_ASSIGN_OR_RETURN(m.step,
                          internal::GetInt(j, "step", 0, INT64_MAX, what));
  VEMESH_ASSIGN_OR_RETURN(m.world_size,
                          internal::GetInt(j, "world_size", 1, 1 << 24, what));
  VEMESH_ASSIGN_OR_RETURN(int64_t chunk,
                          internal::GetInt(j, "chunk_bytes", 1, 1 << 30, what));
  m.chunk_bytes = static_cast<uint64_t>(chunk);
  auto meta = j.find("metadata");
  if (meta == j.end() || !meta->is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": \"metadata\" is missing or not an object"));
  }
  for (auto it = meta->begin(); it != meta->end(); ++it) {
    if (!it.value().is_string()) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": metadata \"", it.key(), "\" is not a string"));
    }
    m.metadata[it.key()] = it.value().get<std::string>();
  }
  auto files = j.find("files");
  if (files == j.end() || !files->is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": \"files\" is missing or not an object"));
  }
  for (auto it = files->begin(); it != files->end(); ++it) {
    if (!PlainFileName(it.key())) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, ": file name '", it.key(), "' is not a plain file name"));
    }
    VEMESH_ASSIGN_OR_RETURN(
        int64_t size,
        internal::AsInt(it.value(), 0, kMaxFileBytes,
                        absl::StrCat(what, ": file '", it.key(), "' size")));
    m.files[it.key()] = static_cast<uint64_t>(size);
  }
  auto tensors = j.find("tensors");
  if (tensors == j.end() || !tensors->is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": \"tensors\" is missing or not an object"));
  }
  for (auto it = tensors->begin(); it != tensors->end(); ++it) {
    const std::string where = absl::StrCat(what, ": tensor '", it.key(), "'");
    const Json& tj = it.value();
    if (!tj.is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, " is not an object"));
    }
    VEMESH_RETURN_IF_ERROR(OnlyKeys(tj, {"dtype", "shape", "pieces"}, where));
    ManifestTensor t;
    VEMESH_ASSIGN_OR_RETURN(std::string dtype,
                            internal::GetString(tj, "dtype", where));
    absl::StatusOr<DType> dt = DTypeFromName(dtype);
    if (!dt.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": ", dt.status().message()));
    }
    t.dtype = *dt;
    VEMESH_ASSIGN_OR_RETURN(
        t.shape,
        internal::GetIntArray(tj, "shape", kMaxDims, 0, kMaxDim, where));
    auto pieces = tj.find("pieces");
    if (pieces == tj.end() || !pieces->is_array()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": \"pieces\" is missing or not an array"));
    }
    for (const Json& pj : *pieces) {
      if (!pj.is_object()) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": a piece is not an object"));
      }
      VEMESH_RETURN_IF_ERROR(OnlyKeys(
          pj,
          {"offsets", "lengths", "file", "key", "offset", "length", "crc32c"},
          where));
      ManifestPiece p;
      VEMESH_ASSIGN_OR_RETURN(
          p.box.offsets,
          internal::GetIntArray(pj, "offsets", kMaxDims, 0, kMaxDim, where));
      VEMESH_ASSIGN_OR_RETURN(
          p.box.lengths,
          internal::GetIntArray(pj, "lengths", kMaxDims, 0, kMaxDim, where));
      if (absl::Status s = CheckBox(p.box, t.shape); !s.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": ", s.message()));
      }
      VEMESH_ASSIGN_OR_RETURN(p.file, internal::GetString(pj, "file", where));
      auto file = m.files.find(p.file);
      if (file == m.files.end()) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, ": piece in file '", p.file, "', which \"files\" lacks"));
      }
      VEMESH_ASSIGN_OR_RETURN(p.key, internal::GetString(pj, "key", where));
      VEMESH_ASSIGN_OR_RETURN(
          int64_t offset,
          internal::GetInt(pj, "offset", 0, kMaxFileBytes, where));
      VEMESH_ASSIGN_OR_RETURN(
          int64_t length,
          internal::GetInt(pj, "length", 0, kMaxFileBytes, where));
      p.offset = static_cast<uint64_t>(offset);
      p.length = static_cast<uint64_t>(length);
      // Box bytes: each length <= 2^50 and the box inside a shape whose
      // numel may still overflow; compare in 128 bits.
      unsigned __int128 bytes = DTypeSize(t.dtype);
      for (int64_t l : p.box.lengths) {
        bytes *= static_cast<uint64_t>(l);
        if (bytes > static_cast<unsigned __int128>(kMaxFileBytes)) break;
      }
      if (bytes != p.length) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, " piece ", BoxToString(p.box), ": length ",
                         p.length, " is not the box's size in bytes"));
      }
      if (p.offset > file->second || p.length > file->second - p.offset) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, " piece ", BoxToString(p.box), ": bytes [",
                         p.offset, ", +", p.length, ") are beyond file '",
                         p.file, "' (", file->second, " bytes)"));
      }
      const uint64_t chunks = (p.length + m.chunk_bytes - 1) / m.chunk_bytes;
      auto crcs = pj.find("crc32c");
      if (crcs == pj.end() || !crcs->is_array() || crcs->size() != chunks) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, " piece ", BoxToString(p.box), ": expected ", chunks,
            " CRC32C values (one per ", m.chunk_bytes, " bytes)"));
      }
      for (const Json& c : *crcs) {
        VEMESH_ASSIGN_OR_RETURN(int64_t v,
                                internal::AsInt(c, 0, UINT32_MAX, where));
        p.crc32c.push_back(static_cast<uint32_t>(v));
      }
      t.pieces.push_back(std::move(p));
    }
    // The pieces must tile the tensor: a load copies each element from the
    // one piece that holds it, and counting covered elements is not enough.
    std::vector<Box> boxes;
    boxes.reserve(t.pieces.size());
    for (const ManifestPiece& p : t.pieces) boxes.push_back(p.box);
    if (absl::Status s = CheckTiling(boxes, t.shape); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": ", s.message()));
    }
    m.tensors[it.key()] = std::move(t);
  }
  // No two pieces share bytes of a file (each chunk checksum covers one
  // piece's bytes only).
  std::vector<
      std::tuple<const std::string*, uint64_t, uint64_t, const std::string*>>
      ranges;
  for (const auto& [name, t] : m.tensors) {
    for (const ManifestPiece& p : t.pieces) {
      if (p.length > 0) ranges.emplace_back(&p.file, p.offset, p.length, &name);
    }
  }
  std::sort(ranges.begin(), ranges.end(), [](const auto& a, const auto& b) {
    return std::tie(*std::get<0>(a), std::get<1>(a)) <
           std::tie(*std::get<0>(b), std::get<1>(b));
  });
  for (size_t i = 1; i < ranges.size(); ++i) {
    const auto& [file_a, off_a, len_a, name_a] = ranges[i - 1];
    const auto& [file_b, off_b, len_b, name_b] = ranges[i];
    if (*file_a == *file_b && off_b < off_a + len_a) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": tensors '", *name_a, "' and '", *name_b,
                       "' have pieces that share bytes of file '", *file_a,
                       "' (at ", off_b, ")"));
    }
  }
  return m;
}

}  // namespace vemesh::checkpoint
