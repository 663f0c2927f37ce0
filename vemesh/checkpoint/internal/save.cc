// vemesh/checkpoint/internal/save.cc

#include "vemesh/checkpoint/internal/save.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <tuple>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "vemesh/base/status_macros.h"
#include "vemesh/checkpoint/internal/collective.h"
#include "vemesh/checkpoint/internal/crc32c.h"
#include "vemesh/checkpoint/internal/directory.h"
#include "vemesh/checkpoint/internal/file_io.h"
#include "vemesh/checkpoint/internal/json_util.h"
#include "vemesh/checkpoint/safetensors.h"
#include "vemesh/comm/agreement.h"

namespace vemesh::checkpoint::internal {
namespace {

bool Printable(const std::string& s, bool allow_space_controls) {
  for (unsigned char c : s) {
    if (allow_space_controls && (c == '\n' || c == '\t')) continue;
    if (c < 0x20 || c > 0x7e) return false;
  }
  return true;
}

uint64_t PieceBytes(const Box& box, DType dtype) {
  return static_cast<uint64_t>(BoxNumel(box)) * DTypeSize(dtype);
}

std::string ShardName(int rank) {
  return absl::StrCat("shard-", rank, ".safetensors");
}

std::string PieceKey(const std::string& name, const Box& box) {
  return absl::StrCat(name, "@", absl::StrJoin(box.offsets, ","));
}

// This rank's description for the plan: its pieces, and rank 0's step
// directory and metadata; or the error that stops the save.
std::string Describe(const StateDict& state, int64_t step,
                     const std::string& dir, const std::string& job,
                     const std::string& mesh, const absl::Status& error,
                     const std::string& step_dir_name) {
  Json j = Json::object();
  if (!error.ok()) {
    j["err"] =
        absl::StrCat(static_cast<int>(error.code()), ":", error.message());
    return DumpJson(j);
  }
  if (!step_dir_name.empty()) {
    j["dir"] = step_dir_name;
    j["mesh"] = mesh;
    j["meta"] = Json::object();
    for (const auto& [k, v] : state.metadata()) j["meta"][k] = v;
  }
  j["step"] = step;
  j["at"] = dir;
  j["job"] = job;
  Json pieces = Json::array();
  for (const Piece& p : state.pieces()) {
    pieces.push_back({p.name, std::string(DTypeName(p.dtype)), p.global_shape,
                      p.box.offsets, p.box.lengths});
  }
  j["pieces"] = std::move(pieces);
  return DumpJson(j);
}

absl::Status DecodeError(const std::string& text, int rank) {
  size_t colon = text.find(':');
  int code = static_cast<int>(absl::StatusCode::kInternal);
  if (colon != std::string::npos) {
    code = std::atoi(text.substr(0, colon).c_str());
    if (code <= 0 || code > 16)
      code = static_cast<int>(absl::StatusCode::kInternal);
  }
  return absl::Status(
      static_cast<absl::StatusCode>(code),
      absl::StrCat("rank ", rank, ": ",
                   colon == std::string::npos ? text : text.substr(colon + 1)));
}

std::string ShapeText(DType dtype, const std::vector<int64_t>& shape) {
  return absl::StrCat(DTypeName(dtype), " [", absl::StrJoin(shape, ", "), "]");
}

// Builds the plan from every rank's description; the same on every rank,
// since every rank computes it from the same input.
absl::StatusOr<SavePlan> BuildPlan(const std::vector<std::string>& all,
                                   SavePlan plan) try {
  struct Key {
    std::string name;
    Box box;
    bool operator<(const Key& o) const {
      return std::tie(name, box.offsets, box.lengths) <
             std::tie(o.name, o.box.offsets, o.box.lengths);
    }
  };
  struct Holders {
    DType dtype;
    std::vector<std::pair<int, size_t>> ranks;  // (rank, local index)
  };
  std::map<Key, Holders> distinct;
  std::map<std::string, int> first_holder;  // the rank that named it first
  int64_t step0 = 0;
  std::string dir0, job0;
  for (size_t r = 0; r < all.size(); ++r) {
    VEMESH_ASSIGN_OR_RETURN(Json j, ParseJson(all[r], "checkpoint plan", 8));
    if (j.contains("err")) return DecodeError(j["err"].get<std::string>(), r);
    // Every rank must save the same step into the same directory (the
    // same text on every rank: each compares with rank 0's).
    const int64_t step = j.at("step").get<int64_t>();
    const std::string at = j.at("at").get<std::string>();
    const std::string job = j.at("job").get<std::string>();
    if (r == 0) {
      step0 = step;
      dir0 = at;
      job0 = job;
    } else if (job != job0) {
      return absl::InvalidArgumentError(DisagreementMessage(
          "checkpoint SaveOptions::job (every rank must pass the same)",
          static_cast<int>(r), absl::StrCat("'", job, "'"), 0,
          absl::StrCat("'", job0, "'")));
    } else if (step != step0 || at != dir0) {
      // The one format of a disagreement (comm/agreement.h), from the plan
      // already gathered: no collective more.
      return absl::InvalidArgumentError(DisagreementMessage(
          "checkpoint save step and directory (every rank must pass the "
          "same)",
          static_cast<int>(r), absl::StrCat("step ", step, " into '", at, "'"),
          0, absl::StrCat("step ", step0, " into '", dir0, "'")));
    }
    if (r == 0) {
      plan.step_dir_name = j.at("dir").get<std::string>();
      plan.mesh = j.at("mesh").get<std::string>();
      for (auto it = j.at("meta").begin(); it != j.at("meta").end(); ++it) {
        plan.metadata[it.key()] = it.value().get<std::string>();
      }
    }
    size_t index = 0;
    for (const Json& p : j.at("pieces")) {
      std::string name = p.at(0).get<std::string>();
      VEMESH_ASSIGN_OR_RETURN(DType dtype,
                              DTypeFromName(p.at(1).get<std::string>()));
      auto shape = p.at(2).get<std::vector<int64_t>>();
      Box box{p.at(3).get<std::vector<int64_t>>(),
              p.at(4).get<std::vector<int64_t>>()};
      auto [t, fresh] = plan.tensors.try_emplace(name);
      if (fresh) {
        t->second.dtype = dtype;
        t->second.shape = shape;
        first_holder[name] = static_cast<int>(r);
      } else if (t->second.dtype != dtype || t->second.shape != shape) {
        return absl::InvalidArgumentError(DisagreementMessage(
            absl::StrCat("checkpoint tensor '", name, "' dtype and shape"),
            static_cast<int>(r), ShapeText(dtype, shape), first_holder[name],
            ShapeText(t->second.dtype, t->second.shape)));
      }
      if (BoxNumel(box) > 0) {
        Holders& h = distinct[Key{name, box}];
        h.dtype = dtype;
        h.ranks.emplace_back(static_cast<int>(r), index);
      }
      ++index;
    }
  }
  // The distinct pieces of a tensor must tile it (replicas are one piece):
  // a load copies every element from the one piece that holds it, and a
  // manifest whose pieces do not tile is refused (manifest.h).
  std::map<std::string, std::vector<Box>> boxes;
  for (const auto& [key, h] : distinct) boxes[key.name].push_back(key.box);
  for (const auto& [name, t] : plan.tensors) {
    absl::Status s = CheckTiling(boxes[name], t.shape);
    if (!s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor '", name, "': ", s.message(),
          " (the pieces the ranks hold must be disjoint or equal, and cover "
          "the tensor)"));
    }
  }
  // Each distinct piece goes to the holder that has written the fewest bytes
  // so far (lowest rank on ties): replicas are spread, deterministically.
  plan.bytes_per_rank.assign(all.size(), 0);
  for (const auto& [key, h] : distinct) {
    const uint64_t bytes = PieceBytes(key.box, h.dtype);
    const std::pair<int, size_t>* best = &h.ranks[0];
    for (const auto& holder : h.ranks) {
      if (plan.bytes_per_rank[holder.first] <
          plan.bytes_per_rank[best->first]) {
        best = &holder;
      }
    }
    plan.bytes_per_rank[best->first] += bytes;
    if (best->first == plan.rank) {
      plan.mine.push_back(
          PlannedPiece{key.name, key.box, h.dtype, bytes, best->second});
    }
  }
  plan.step_dir = absl::StrCat(plan.dir, "/", plan.step_dir_name);
  return plan;
} catch (const Json::exception& e) {
  return absl::InternalError(absl::StrCat(
      "checkpoint plan: a rank's description is malformed: ", e.what()));
}

}  // namespace

absl::StatusOr<SavePlan> PlanSave(const StateDict& state, int64_t step,
                                  const std::string& dir, Communicator& world,
                                  const SaveOptions& options) {
  SavePlan plan;
  plan.step = step;
  plan.rank = world.rank();
  plan.world_size = world.size();
  plan.keep_last = options.keep_last;
  plan.job = options.job;
  plan.dir = dir;
  absl::Status local;
  if (step < 0) {
    local = absl::InvalidArgumentError(
        absl::StrCat("checkpoint step ", step, ": expected >= 0"));
  } else if (options.keep_last < 1) {
    local = absl::InvalidArgumentError(absl::StrCat(
        "SaveOptions::keep_last ", options.keep_last, ": expected >= 1"));
  } else if (dir.empty()) {
    local = absl::InvalidArgumentError("checkpoint directory: empty path");
  } else if (options.job.size() > 255 || !Printable(options.job, false) ||
             options.mesh.size() > 4096 || !Printable(options.mesh, false)) {
    local = absl::InvalidArgumentError(absl::StrCat(
        "SaveOptions::job '", absl::CHexEscape(options.job.substr(0, 255)),
        "' and ::mesh: expected printable ASCII (job at most 255 bytes)"));
  }
  for (const auto& [k, v] : state.metadata()) {
    if (!local.ok()) break;
    if (k.empty() || !Printable(k, false) || !Printable(v, true)) {
      local = absl::InvalidArgumentError(
          absl::StrCat("checkpoint metadata '", absl::CHexEscape(k),
                       "': keys and values must be printable ASCII"));
    }
  }
  std::string step_dir_name;
  if (local.ok() && plan.rank == 0) {
    absl::StatusOr<std::string> name = PrepareStepDir(dir, step, options.job);
    if (name.ok()) {
      step_dir_name = *name;
    } else {
      local = name.status();
    }
  }
  VEMESH_ASSIGN_OR_RETURN(
      std::vector<std::string> all,
      AllGatherStrings(world, Describe(state, step, dir, options.job,
                                       options.mesh, local, step_dir_name)));
  absl::StatusOr<SavePlan> built = BuildPlan(all, std::move(plan));
  if (!built.ok() && !step_dir_name.empty()) {
    std::error_code ec;  // nothing will be written: no empty step directory
    std::filesystem::remove_all(absl::StrCat(dir, "/", step_dir_name), ec);
  }
  return built;
}

std::vector<const void*> PlannedData(const SavePlan& plan,
                                     const StateDict& state) {
  std::vector<const void*> out;
  for (const PlannedPiece& p : plan.mine) {
    out.push_back(state.pieces()[p.local_index].data);
  }
  return out;
}

absl::StatusOr<ShardResult> WriteShard(const SavePlan& plan,
                                       const std::vector<const void*>& data) {
  ShardResult out;
  out.file = ShardName(plan.rank);
  const std::string path = absl::StrCat(plan.step_dir, "/", out.file);
  std::vector<SafetensorsTensor> entries;
  uint64_t at = 0;
  for (const PlannedPiece& p : plan.mine) {
    entries.push_back(SafetensorsTensor{PieceKey(p.name, p.box), p.dtype,
                                        p.box.lengths, at, at + p.bytes});
    at += p.bytes;
  }
  const std::string head = SafetensorsHeaderBytes(
      entries, {{"format", "vemesh"}, {"step", absl::StrCat(plan.step)}});
  VEMESH_ASSIGN_OR_RETURN(File f, File::Create(path));
  VEMESH_RETURN_IF_ERROR(f.WriteAll(head.data(), head.size()));
  uint64_t offset = head.size();
  for (size_t i = 0; i < plan.mine.size(); ++i) {
    const PlannedPiece& p = plan.mine[i];
    ManifestPiece m;
    m.box = p.box;
    m.file = out.file;
    m.key = entries[i].name;
    m.offset = offset;
    m.length = p.bytes;
    const char* bytes = static_cast<const char*>(data[i]);
    for (uint64_t c = 0; c < p.bytes; c += kDefaultChunkBytes) {
      m.crc32c.push_back(
          Crc32c(bytes + c, std::min(kDefaultChunkBytes, p.bytes - c)));
    }
    // One large write per piece: the kernel sees dd's sequential pattern.
    VEMESH_RETURN_IF_ERROR(f.WriteAll(bytes, p.bytes));
    offset += p.bytes;
    out.pieces.emplace_back(p.name, std::move(m));
  }
  VEMESH_RETURN_IF_ERROR(f.Sync());
  VEMESH_RETURN_IF_ERROR(f.Close());
  out.file_size = offset;
  return out;
}

absl::Status CommitSave(const SavePlan& plan,
                        const absl::StatusOr<ShardResult>& mine,
                        Communicator& world) {
  std::string text;
  if (!mine.ok()) {
    Json j = {{"err", absl::StrCat(static_cast<int>(mine.status().code()), ":",
                                   mine.status().message())}};
    text = DumpJson(j);
  } else {
    Json pieces = Json::array();
    for (const auto& [name, p] : mine->pieces) {
      pieces.push_back({name, p.box.offsets, p.box.lengths, p.key, p.offset,
                        p.length, p.crc32c});
    }
    text = DumpJson(
        {{"file", mine->file}, {"size", mine->file_size}, {"pieces", pieces}});
  }
  VEMESH_ASSIGN_OR_RETURN(std::vector<std::string> all,
                          AllGatherStrings(world, text));
  absl::Status result;
  Manifest m;
  m.step = plan.step;
  m.world_size = plan.world_size;
  m.job = plan.job;
  m.mesh = plan.mesh;
  m.metadata = plan.metadata;
  m.tensors = plan.tensors;
  try {
    for (size_t r = 0; r < all.size() && result.ok(); ++r) {
      VEMESH_ASSIGN_OR_RETURN(Json j,
                              ParseJson(all[r], "checkpoint commit", 8));
      if (j.contains("err")) {
        result = DecodeError(j["err"].get<std::string>(), r);
        break;
      }
      m.files[j.at("file").get<std::string>()] = j.at("size").get<uint64_t>();
      for (const Json& p : j.at("pieces")) {
        ManifestPiece piece;
        piece.box = Box{p.at(1).get<std::vector<int64_t>>(),
                        p.at(2).get<std::vector<int64_t>>()};
        piece.file = j.at("file").get<std::string>();
        piece.key = p.at(3).get<std::string>();
        piece.offset = p.at(4).get<uint64_t>();
        piece.length = p.at(5).get<uint64_t>();
        piece.crc32c = p.at(6).get<std::vector<uint32_t>>();
        m.tensors[p.at(0).get<std::string>()].pieces.push_back(
            std::move(piece));
      }
    }
  } catch (const Json::exception& e) {
    result = absl::InternalError(absl::StrCat(
        "checkpoint commit: a rank's result is malformed: ", e.what()));
  }
  if (!result.ok()) {
    // Nothing is committed; free the space (a full disk) now.
    if (plan.rank == 0) {
      std::error_code ec;
      std::filesystem::remove_all(plan.step_dir, ec);
    }
    return result;
  }
  absl::Status local;
  if (plan.rank == 0) {
    // Shards are fsynced by their writers; their names in the step
    // directory become durable here, before the manifest commits them.
    local = SyncDirectory(plan.step_dir);
    if (local.ok()) {
      local = WriteFileAtomically(
          absl::StrCat(plan.step_dir, "/", kManifestName), ManifestToJson(m));
    }
    if (!local.ok()) {
      std::error_code ec;  // not committed: free the space
      std::filesystem::remove_all(plan.step_dir, ec);
    }
    if (local.ok()) {
      local = WriteFileAtomically(absl::StrCat(plan.dir, "/", kLatestName),
                                  plan.step_dir_name + "\n");
    }
    if (local.ok()) {
      local = RemoveOldSteps(plan.dir, plan.step_dir_name, plan.keep_last,
                             plan.job);
    }
  }
  return AgreeStatus(world, local);
}

}  // namespace vemesh::checkpoint::internal
