// vemesh/checkpoint/safetensors.cc

#include "vemesh/checkpoint/safetensors.h"

#include <bit>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "vemesh/base/status_macros.h"
#include "vemesh/checkpoint/internal/file_io.h"
#include "vemesh/checkpoint/internal/json_util.h"

namespace vemesh::checkpoint {
namespace {

using internal::Json;

static_assert(std::endian::native == std::endian::little,
              "checkpoint files are little-endian; a big-endian host would "
              "need byte swaps");

using internal::kMaxDim;
using internal::kMaxDims;

// numel * size without overflow; nullopt when it overflows uint64.
bool ByteSize(const std::vector<int64_t>& shape, size_t elem, uint64_t* out) {
  unsigned __int128 n = elem;
  for (int64_t d : shape) {
    n *= static_cast<uint64_t>(d);
    if (n > UINT64_MAX) return false;
  }
  *out = static_cast<uint64_t>(n);
  return true;
}

}  // namespace

std::string SafetensorsHeaderBytes(
    const std::vector<SafetensorsTensor>& tensors,
    const std::map<std::string, std::string>& metadata) {
  // ordered_json keeps the tensors in file order, as readers list them.
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json m = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) m[k] = v;
    j["__metadata__"] = std::move(m);
  }
  for (const SafetensorsTensor& t : tensors) {
    j[t.name] = {{"dtype", std::string(DTypeName(t.dtype))},
                 {"shape", t.shape},
                 {"data_offsets", {t.begin, t.end}}};
  }
  std::string text =
      j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
  while ((8 + text.size()) % 8 != 0) text.push_back(' ');
  std::string out(8, '\0');
  uint64_t n = text.size();
  std::memcpy(out.data(), &n, 8);
  return out + text;
}

absl::StatusOr<SafetensorsHeader> ParseSafetensors(absl::string_view bytes,
                                                   uint64_t file_size,
                                                   absl::string_view what) {
  if (bytes.size() < 8 || file_size < 8) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": ", file_size,
                     " bytes, too short for the 8-byte header length"));
  }
  uint64_t n;
  std::memcpy(&n, bytes.data(), 8);
  if (n > kMaxSafetensorsHeaderBytes || n > file_size - 8) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": header length ", n, " is beyond the file (", file_size,
        " bytes) or the limit (", kMaxSafetensorsHeaderBytes, ")"));
  }
  if (bytes.size() - 8 < n) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": ", bytes.size(), " bytes given, the header needs ", 8 + n));
  }
  SafetensorsHeader out;
  out.data_start = 8 + n;
  const uint64_t data_size = file_size - out.data_start;
  VEMESH_ASSIGN_OR_RETURN(Json j,
                          internal::ParseJson(bytes.substr(8, n), what));
  if (!j.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": the header is not a JSON object"));
  }
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& key = it.key();
    const Json& v = it.value();
    if (key == "__metadata__") {
      if (!v.is_object()) {
        return absl::InvalidArgumentError(
            absl::StrCat(what, ": __metadata__ is not an object"));
      }
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string()) {
          return absl::InvalidArgumentError(absl::StrCat(
              what, ": __metadata__ \"", m.key(), "\" is not a string"));
        }
        out.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    const std::string where = absl::StrCat(what, ": tensor '", key, "'");
    if (!v.is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, " is not an object"));
    }
    SafetensorsTensor t;
    t.name = key;
    VEMESH_ASSIGN_OR_RETURN(std::string dtype,
                            internal::GetString(v, "dtype", where));
    absl::StatusOr<DType> dt = DTypeFromName(dtype);
    if (!dt.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": ", dt.status().message()));
    }
    t.dtype = *dt;
    VEMESH_ASSIGN_OR_RETURN(t.shape, internal::GetIntArray(v, "shape", kMaxDims,
                                                           0, kMaxDim, where));
    VEMESH_ASSIGN_OR_RETURN(
        std::vector<int64_t> offsets,
        internal::GetIntArray(v, "data_offsets", 2, 0, INT64_MAX, where));
    if (offsets.size() != 2 || offsets[0] > offsets[1] ||
        static_cast<uint64_t>(offsets[1]) > data_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": data_offsets must be [begin, end] with begin <= end <= ",
          data_size, " (the data's size)"));
    }
    t.begin = static_cast<uint64_t>(offsets[0]);
    t.end = static_cast<uint64_t>(offsets[1]);
    uint64_t bytes_needed = 0;
    if (!ByteSize(t.shape, DTypeSize(t.dtype), &bytes_needed) ||
        bytes_needed != t.end - t.begin) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": shape and dtype ", dtype, " do not match data_offsets (",
          t.end - t.begin, " bytes)"));
    }
    out.tensors.push_back(std::move(t));
  }
  return out;
}

absl::StatusOr<SafetensorsHeader> ReadSafetensorsHeader(
    const std::string& path) {
  VEMESH_ASSIGN_OR_RETURN(internal::File f, internal::File::OpenRead(path));
  VEMESH_ASSIGN_OR_RETURN(uint64_t size, f.Size());
  const std::string what = absl::StrCat("safetensors file '", path, "'");
  if (size < 8) return ParseSafetensors("", size, what);
  std::string bytes(8, '\0');
  VEMESH_RETURN_IF_ERROR(f.PreadAll(bytes.data(), 8, 0));
  uint64_t n;
  std::memcpy(&n, bytes.data(), 8);
  if (n > kMaxSafetensorsHeaderBytes || n > size - 8) {
    return ParseSafetensors(bytes, size, what);  // the bound's error
  }
  bytes.resize(8 + n);
  VEMESH_RETURN_IF_ERROR(f.PreadAll(bytes.data() + 8, n, 8));
  return ParseSafetensors(bytes, size, what);
}

}  // namespace vemesh::checkpoint
