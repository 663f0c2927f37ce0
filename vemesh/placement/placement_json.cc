// Placement's JSON: the writer (ToJson, what a live job records) and its
// reader (FromJson, what `vemesh plan --check FILE` compares with a plan),
// side by side so that the schema has one home.
#include "vemesh/placement/placement.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "vemesh/base/json_depth.h"

namespace vemesh {
namespace {

// A JSON string: quotes, backslashes and control characters escaped (host
// names come from the machines and are not trusted to be plain).
void AppendJsonString(std::string* out, absl::string_view text) {
  out->push_back('"');
  for (const char c : text) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out->push_back('\\');
      out->push_back(c);
    } else if (u < 0x20) {
      absl::StrAppend(out, "\\u00", absl::Hex(u, absl::kZeroPad2));
    } else {
      out->push_back(c);
    }
  }
  out->push_back('"');
}

template <typename T>
std::string JsonIntArray(const std::vector<T>& values) {
  return absl::StrCat("[", absl::StrJoin(values, ", "), "]");
}

using Json = nlohmann::json;

// The schema nests three levels deep; anything much deeper is not a
// placement, and is refused before the parser recurses into it.
constexpr int kMaxDepth = 8;
// Host names and dimension names longer than this are not names.
constexpr size_t kMaxNameBytes = 4096;
constexpr int64_t kMaxDims = 64;

class FieldReader {
 public:
  explicit FieldReader(absl::string_view source) : source_(source) {}

  // `got` is shown as JSON, cut short; an array as its length.
  absl::Status Error(absl::string_view field, absl::string_view expected,
                     const Json* got) const {
    std::string shown = got->dump();
    if (got->is_array() && got->size() > 4) {
      shown = absl::StrCat("an array of ", got->size());
    }
    if (shown.size() > 60) shown = shown.substr(0, 57) + "...";
    return absl::InvalidArgumentError(
        absl::StrCat("placement file '", source_, "': field '", field,
                     "': expected ", expected, ", got ", shown));
  }

  absl::StatusOr<const Json*> Member(const Json& object,
                                     absl::string_view parent,
                                     const char* key) const {
    const std::string field =
        parent.empty() ? std::string(key) : absl::StrCat(parent, ".", key);
    auto it = object.find(key);
    if (it == object.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "placement file '", source_, "': field '", field,
          "' is missing (expected the JSON of DeviceMesh::get_placement())"));
    }
    return &*it;
  }

  absl::StatusOr<int64_t> Int(const Json& v, absl::string_view field,
                              int64_t lo, int64_t hi) const {
    if (!v.is_number_integer()) {
      return Error(field, absl::StrCat("an integer from ", lo, " to ", hi), &v);
    }
    // Unsigned values above INT64_MAX are out of range either way.
    if (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(hi)) {
      return Error(field, absl::StrCat("an integer from ", lo, " to ", hi), &v);
    }
    const int64_t n = v.get<int64_t>();
    if (n < lo || n > hi) {
      return Error(field, absl::StrCat("an integer from ", lo, " to ", hi), &v);
    }
    return n;
  }

  absl::StatusOr<std::string> Name(const Json& v,
                                   absl::string_view field) const {
    if (!v.is_string() || v.get_ref<const std::string&>().empty() ||
        v.get_ref<const std::string&>().size() > kMaxNameBytes) {
      return Error(field, "a non-empty name (a JSON string)", &v);
    }
    return v.get<std::string>();
  }

  absl::Status Array(const Json& v, absl::string_view field, int64_t max,
                     absl::string_view what) const {
    if (!v.is_array() || static_cast<int64_t>(v.size()) > max) {
      return Error(field, absl::StrCat("an array of at most ", max, " ", what),
                   &v);
    }
    return absl::OkStatus();
  }

 private:
  std::string source_;
};

}  // namespace

std::string Placement::ToJson() const {
  std::string out =
      absl::StrCat("{\"vemesh_placement\": 1, \"world_size\": ", world_size,
                   ", \"mesh\": {\"dim_names\": [");
  for (size_t i = 0; i < dim_names.size(); ++i) {
    if (i > 0) out += ", ";
    AppendJsonString(&out, dim_names[i]);
  }
  absl::StrAppend(&out, "], \"shape\": ", JsonIntArray(shape),
                  "}, \"hosts\": [");
  for (size_t i = 0; i < hosts.size(); ++i) {
    if (i > 0) out += ", ";
    AppendJsonString(&out, hosts[i]);
  }
  absl::StrAppend(&out, "], \"rank_hosts\": ", JsonIntArray(rank_hosts),
                  ", \"dims\": [");
  for (size_t i = 0; i < dims.size(); ++i) {
    if (i > 0) out += ", ";
    out += "{\"name\": ";
    AppendJsonString(&out, dims[i].name);
    absl::StrAppend(&out, ", \"group_count\": ", dims[i].group_count,
                    ", \"group_size\": ", dims[i].group_size,
                    ", \"crossing_groups\": ", dims[i].crossing_groups, "}");
  }
  out += "]}";
  return out;
}

absl::StatusOr<Placement> Placement::FromJson(absl::string_view text,
                                              absl::string_view source) {
  const FieldReader f(source);
  if (static_cast<int64_t>(text.size()) > kMaxPlacementJsonBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("placement file '", source, "' has ", text.size(),
                     " bytes: expected at most ", kMaxPlacementJsonBytes));
  }
  if (const int depth = JsonNestingDepth(text); depth > kMaxDepth) {
    return absl::InvalidArgumentError(absl::StrCat(
        "placement file '", source, "' nests ", depth,
        " levels deep: expected the JSON of DeviceMesh::get_placement() "
        "(at most ",
        kMaxDepth, ")"));
  }
  Json j;
  try {
    j = Json::parse(text.begin(), text.end());
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("placement file '", source, "' is not JSON: ", e.what()));
  }
  if (!j.is_object()) {
    return f.Error("(top level)", "a JSON object", &j);
  }
  Placement out;
  absl::StatusOr<const Json*> v = f.Member(j, "", "vemesh_placement");
  if (!v.ok()) return v.status();
  if (!(*v)->is_number_integer() || (*v)->get<int64_t>() != 1) {
    return f.Error("vemesh_placement", "1 (the only version there is)", *v);
  }

  v = f.Member(j, "", "world_size");
  if (!v.ok()) return v.status();
  absl::StatusOr<int64_t> world =
      f.Int(**v, "world_size", 1, kMaxPlacementJsonRanks);
  if (!world.ok()) return world.status();
  out.world_size = *world;

  // mesh
  v = f.Member(j, "", "mesh");
  if (!v.ok()) return v.status();
  const Json& mesh = **v;
  if (!mesh.is_object()) return f.Error("mesh", "an object", &mesh);
  v = f.Member(mesh, "mesh", "dim_names");
  if (!v.ok()) return v.status();
  if (absl::Status s = f.Array(**v, "mesh.dim_names", kMaxDims, "names");
      !s.ok()) {
    return s;
  }
  for (size_t i = 0; i < (*v)->size(); ++i) {
    absl::StatusOr<std::string> name =
        f.Name((**v)[i], absl::StrCat("mesh.dim_names[", i, "]"));
    if (!name.ok()) return name.status();
    out.dim_names.push_back(*std::move(name));
  }
  v = f.Member(mesh, "mesh", "shape");
  if (!v.ok()) return v.status();
  if (absl::Status s = f.Array(**v, "mesh.shape", kMaxDims, "sizes"); !s.ok()) {
    return s;
  }
  int64_t product = 1;
  for (size_t i = 0; i < (*v)->size(); ++i) {
    absl::StatusOr<int64_t> n =
        f.Int((**v)[i], absl::StrCat("mesh.shape[", i, "]"), 1, *world);
    if (!n.ok()) return n.status();
    product = std::min(product * *n, kMaxPlacementJsonRanks + 1);
    out.shape.push_back(*n);
  }
  if (out.shape.size() != out.dim_names.size() || out.shape.empty()) {
    return f.Error("mesh.shape",
                   absl::StrCat("one size per name of mesh.dim_names (",
                                out.dim_names.size(), ")"),
                   *v);
  }
  // A mesh may cover part of its world (get_placement() lists every rank
  // of the world), never more.
  if (product > out.world_size) {
    return f.Error("mesh.shape",
                   absl::StrCat("sizes whose product is at most world_size ",
                                out.world_size),
                   *v);
  }

  // hosts, rank_hosts
  v = f.Member(j, "", "hosts");
  if (!v.ok()) return v.status();
  if (absl::Status s = f.Array(**v, "hosts", out.world_size, "host names");
      !s.ok()) {
    return s;
  }
  if ((*v)->empty()) return f.Error("hosts", "at least one host name", *v);
  for (size_t i = 0; i < (*v)->size(); ++i) {
    absl::StatusOr<std::string> name =
        f.Name((**v)[i], absl::StrCat("hosts[", i, "]"));
    if (!name.ok()) return name.status();
    out.hosts.push_back(*std::move(name));
  }
  v = f.Member(j, "", "rank_hosts");
  if (!v.ok()) return v.status();
  if (!(*v)->is_array() ||
      static_cast<int64_t>((*v)->size()) != out.world_size) {
    return f.Error("rank_hosts",
                   absl::StrCat("an array of world_size (", out.world_size,
                                ") host indices"),
                   *v);
  }
  out.rank_hosts.reserve(static_cast<size_t>(out.world_size));
  const int64_t last_host = static_cast<int64_t>(out.hosts.size()) - 1;
  for (size_t i = 0; i < (*v)->size(); ++i) {
    absl::StatusOr<int64_t> h = f.Int(
        (**v)[i], absl::StrCat("rank_hosts[", i, "] (an index into hosts)"), 0,
        last_host);
    if (!h.ok()) return h.status();
    out.rank_hosts.push_back(static_cast<int32_t>(*h));
  }

  // dims
  v = f.Member(j, "", "dims");
  if (!v.ok()) return v.status();
  if (!(*v)->is_array() || (*v)->size() != out.dim_names.size()) {
    return f.Error("dims",
                   absl::StrCat("one entry per mesh dimension (",
                                out.dim_names.size(), ")"),
                   *v);
  }
  for (size_t i = 0; i < (*v)->size(); ++i) {
    const Json& d = (**v)[i];
    const std::string field = absl::StrCat("dims[", i, "]");
    if (!d.is_object()) return f.Error(field, "an object", &d);
    DimPlacement dim;
    absl::StatusOr<const Json*> m = f.Member(d, field, "name");
    if (!m.ok()) return m.status();
    absl::StatusOr<std::string> name = f.Name(**m, field + ".name");
    if (!name.ok()) return name.status();
    dim.name = *std::move(name);
    if (dim.name != out.dim_names[i]) {
      return f.Error(
          field + ".name",
          absl::StrCat("'", out.dim_names[i], "' (mesh.dim_names[", i, "])"),
          *m);
    }
    int64_t* targets[] = {&dim.group_count, &dim.group_size,
                          &dim.crossing_groups};
    const char* keys[] = {"group_count", "group_size", "crossing_groups"};
    for (int k = 0; k < 3; ++k) {
      m = f.Member(d, field, keys[k]);
      if (!m.ok()) return m.status();
      absl::StatusOr<int64_t> n =
          f.Int(**m, absl::StrCat(field, ".", keys[k]), k == 2 ? 0 : 1, *world);
      if (!n.ok()) return n.status();
      *targets[k] = *n;
    }
    if (dim.crossing_groups > dim.group_count) {
      return f.Error(
          field + ".crossing_groups",
          absl::StrCat("at most group_count (", dim.group_count, ")"),
          &d["crossing_groups"]);
    }
    out.dims.push_back(std::move(dim));
  }
  return out;
}

}  // namespace vemesh
