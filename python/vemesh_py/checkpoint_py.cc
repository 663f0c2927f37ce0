#include "checkpoint_py.h"

#include <pybind11/stl.h>

#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "errors.h"
#include "tensor_buffer.h"
#include "vemesh/base/status_macros.h"
#include "vemesh/checkpoint/async_saver.h"
#include "vemesh/checkpoint/box.h"
#include "vemesh/checkpoint/checkpoint.h"
#include "vemesh/checkpoint/state_dict.h"
#include "vemesh/comm/communicator.h"

namespace py = pybind11;

namespace vemesh::python {
namespace {

using checkpoint::Box;
using checkpoint::DType;
using checkpoint::StateDict;

std::optional<DType> ToDType(DataType type) {
  switch (type) {
    case DataType::kFloat32:
      return DType::kF32;
    case DataType::kFloat64:
      return DType::kF64;
    case DataType::kBFloat16:
      return DType::kBF16;
    case DataType::kFloat16:
      return DType::kF16;
    case DataType::kInt64:
      return DType::kI64;
    case DataType::kInt32:
      return DType::kI32;
    case DataType::kUInt8:
      return DType::kU8;
    default:
      return std::nullopt;
  }
}

std::string ShapeText(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

// The buffers a StateDict points into, kept alive (and their Python
// objects) until the save or load returns.
struct Held {
  std::vector<TensorBuffer> buffers;
  StateDict state;
};

// One entry (see checkpoint_py.h) added to `held`. Python errors (a value
// that is no array, a read-only array to load into) come back as statuses,
// so that every rank can agree on them first.
absl::Status AddEntry(const py::handle& obj, bool writable, Held& held) {
  if (!py::isinstance<py::tuple>(obj) || py::len(obj) != 6) {
    return absl::InvalidArgumentError(
        "internal: a checkpoint entry is (name, array, global_shape, "
        "offsets, lengths, flat_offset)");
  }
  py::tuple entry = py::reinterpret_borrow<py::tuple>(obj);
  const std::string name = entry[0].cast<std::string>();
  const std::string what = absl::StrCat("tensor '", name, "'");
  TensorBuffer buffer = TensorBuffer::From(entry[1], what.c_str(), writable);
  if (buffer.on_cuda()) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": a CUDA tensor; checkpoints read and write host memory"));
  }
  std::optional<DType> dtype = ToDType(buffer.type());
  if (!dtype) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": ", buffer.Describe(),
        " has no checkpoint dtype; expected float32, float64, bfloat16, "
        "float16, int64, int32 or uint8"));
  }
  const std::vector<int64_t> shape = entry[2].cast<std::vector<int64_t>>();
  // The global element count, refused past int64 before anything uses it.
  int64_t numel = 1;
  for (int64_t n : shape) {
    if (n < 0 || (n > 0 && numel > std::numeric_limits<int64_t>::max() / n)) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, ": global shape ", ShapeText(shape),
          " is not a shape (a size < 0, or more than 2^63 elements)"));
    }
    numel *= n;
  }
  const int64_t count = static_cast<int64_t>(buffer.count());
  char* base = static_cast<char*>(buffer.data());
  if (!entry[3].is_none()) {
    Box box{entry[3].cast<std::vector<int64_t>>(),
            entry[4].cast<std::vector<int64_t>>()};
    if (box.offsets.size() != shape.size() ||
        box.lengths.size() != shape.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, ": offsets ", ShapeText(box.offsets), " and local shape ",
          ShapeText(box.lengths), " must have the rank of the global shape ",
          ShapeText(shape)));
    }
    VEMESH_RETURN_IF_ERROR(checkpoint::CheckBox(box, shape));
    if (checkpoint::BoxNumel(box) != count) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": ", buffer.Describe(), " holds ", count,
                       " elements but its box ", checkpoint::BoxToString(box),
                       " has ", checkpoint::BoxNumel(box)));
    }
    VEMESH_RETURN_IF_ERROR(held.state.Add(name, *dtype, shape, box, base));
  } else {
    const int64_t offset = entry[5].cast<int64_t>();
    if (offset < 0 || offset > numel || count > numel - offset) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": flat elements [", offset, ", ", offset, " + ",
                       count, ") are not inside the ", numel,
                       " elements of global shape ", ShapeText(shape)));
    }
    // The runs of a flat range are consecutive in the array, in flat order.
    const size_t esize = checkpoint::DTypeSize(*dtype);
    int64_t at = 0;
    for (Box& box :
         checkpoint::FlatRangeToBoxes(shape, offset, offset + count)) {
      const int64_t n = checkpoint::BoxNumel(box);
      VEMESH_RETURN_IF_ERROR(
          held.state.Add(name, *dtype, shape, std::move(box),
                         base + static_cast<size_t>(at) * esize));
      at += n;
    }
  }
  held.buffers.push_back(std::move(buffer));
  return absl::OkStatus();
}

// What the Python side found wrong: (absl code name, message).
using PythonError = std::optional<std::pair<std::string, std::string>>;

absl::Status FromPython(const std::pair<std::string, std::string>& error) {
  for (absl::StatusCode code :
       {absl::StatusCode::kNotFound, absl::StatusCode::kFailedPrecondition,
        absl::StatusCode::kDataLoss, absl::StatusCode::kUnimplemented}) {
    if (error.first == absl::StatusCodeToString(code)) {
      return absl::Status(code, error.second);
    }
  }
  return absl::InvalidArgumentError(error.second);
}

// Every entry added to `held`; the first error (or the Python side's
// `error`) as a status.
absl::Status Build(const py::list& entries, bool writable,
                   const PythonError& error, Held& held) {
  if (error) return FromPython(*error);
  for (const py::handle& entry : entries) {
    absl::Status s;
    try {
      s = AddEntry(entry, writable, held);
    } catch (py::error_already_set& e) {
      s = absl::InvalidArgumentError(py::str(e.value()).cast<std::string>());
    } catch (const py::cast_error& e) {
      s = absl::InvalidArgumentError(absl::StrCat(
          "internal: a checkpoint entry of the wrong types: ", e.what()));
    }
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

void CheckHostGroup(const Communicator& group) {
  if (group.backend() == "nccl") {
    RaiseStatus(absl::InvalidArgumentError(
        "process_group: an NCCL communicator; checkpoints exchange host "
        "buffers: pass an MPI or Gloo group (a 'cpu' mesh)"));
  }
}

py::dict ToDict(const std::map<std::string, std::string>& m) {
  py::dict d;
  for (const auto& [k, v] : m) d[py::str(k)] = py::str(v);
  return d;
}

// What a save (blocking, or started in the background) takes from Python:
// the state with its metadata into `held`, the options; the local status
// of building them, to be agreed over the group.
absl::Status PrepareSave(const py::list& entries, int keep_last,
                         const std::map<std::string, std::string>& metadata,
                         const std::string& job, const std::string& mesh,
                         const PythonError& error, Held& held,
                         checkpoint::SaveOptions& options) {
  const absl::Status local = Build(entries, /*writable=*/false, error, held);
  for (const auto& [k, v] : metadata) held.state.SetMetadata(k, v);
  options.keep_last = keep_last;
  options.job = job;
  options.mesh = mesh;
  return local;
}

void Save(const py::list& entries, const std::string& dir,
          const std::shared_ptr<Communicator>& group, int64_t step,
          int keep_last, const std::map<std::string, std::string>& metadata,
          const std::string& job, const std::string& mesh,
          const PythonError& error) {
  CheckHostGroup(*group);
  Held held;
  checkpoint::SaveOptions options;
  const absl::Status local = PrepareSave(entries, keep_last, metadata, job,
                                         mesh, error, held, options);
  absl::Status s;
  {
    py::gil_scoped_release nogil;
    s = checkpoint::AgreeStatus(*group, local);
    if (s.ok()) s = checkpoint::Save(held.state, step, dir, *group, options);
  }
  ThrowIfError(s);
}

py::dict Load(const py::list& entries, const std::string& dir,
              const std::shared_ptr<Communicator>& group,
              std::optional<int64_t> step, const std::string& job,
              const PythonError& error) {
  CheckHostGroup(*group);
  Held held;
  const absl::Status local = Build(entries, /*writable=*/true, error, held);
  absl::StatusOr<checkpoint::LoadResult> r;
  {
    py::gil_scoped_release nogil;
    absl::Status s = checkpoint::AgreeStatus(*group, local);
    if (s.ok()) {
      checkpoint::LoadOptions options;
      options.step = step;
      options.job = job;
      r = checkpoint::Load(held.state, dir, *group, options);
    } else {
      r = s;
    }
  }
  ThrowIfError(r.status());
  py::dict out;
  out["step"] = r->step;
  out["path"] = r->path;
  out["metadata"] = ToDict(std::map<std::string, std::string>(
      r->metadata.begin(), r->metadata.end()));
  out["job"] = r->job;
  out["mesh"] = r->mesh;
  return out;
}

py::dict ReadManifest(const std::string& dir, std::optional<int64_t> step) {
  absl::StatusOr<checkpoint::CheckpointManifest> r;
  {
    py::gil_scoped_release nogil;
    r = checkpoint::ReadManifest(dir, step);
  }
  ThrowIfError(r.status());
  const checkpoint::Manifest& m = r->manifest;
  py::dict tensors;
  for (const auto& [name, t] : m.tensors) {
    py::list pieces;
    uint64_t bytes = 0;
    for (const checkpoint::ManifestPiece& p : t.pieces) {
      py::dict piece;
      piece["offsets"] = p.box.offsets;
      piece["lengths"] = p.box.lengths;
      piece["file"] = p.file;
      piece["offset"] = p.offset;
      piece["length"] = p.length;
      pieces.append(std::move(piece));
      bytes += p.length;
    }
    py::dict d;
    d["dtype"] = std::string(checkpoint::DTypeName(t.dtype));
    d["shape"] = t.shape;
    d["pieces"] = std::move(pieces);
    d["bytes"] = bytes;
    tensors[py::str(name)] = std::move(d);
  }
  py::dict files;
  for (const auto& [name, size] : m.files) files[py::str(name)] = size;
  py::dict out;
  out["step"] = m.step;
  out["path"] = r->path;
  out["world_size"] = m.world_size;
  out["metadata"] = ToDict(m.metadata);
  out["files"] = std::move(files);
  out["tensors"] = std::move(tensors);
  return out;
}

// checkpoint::AsyncSaver on Python arrays: start() copies this rank's
// pieces and returns (the buffers may change at once), a writer thread
// writes the shard file, wait() (or the next start()) commits on the
// calling thread over `group` itself (CreateOn: an elastic mesh's groups
// cannot be split; start and wait run on the caller's thread, between its
// other operations on the group). Collective like save.
class PyAsyncSaver {
 public:
  explicit PyAsyncSaver(const std::shared_ptr<Communicator>& group)
      : group_(group) {
    CheckHostGroup(*group_);
    saver_ = Unwrap(checkpoint::AsyncSaver::CreateOn(group_));
  }

  void Start(const py::list& entries, const std::string& dir, int64_t step,
             int keep_last, const std::map<std::string, std::string>& metadata,
             const std::string& job, const std::string& mesh,
             const PythonError& error) {
    Held held;
    checkpoint::SaveOptions options;
    const absl::Status local = PrepareSave(entries, keep_last, metadata, job,
                                           mesh, error, held, options);
    absl::Status s;
    {
      py::gil_scoped_release nogil;
      s = checkpoint::AgreeStatus(*group_, local);
      if (s.ok()) s = saver_->Start(held.state, step, dir, options);
    }
    ThrowIfError(s);
  }

  void Wait() {
    absl::Status s;
    {
      py::gil_scoped_release nogil;
      s = saver_->Wait();
    }
    ThrowIfError(s);
  }

  bool in_flight() const { return saver_->in_flight(); }

 private:
  std::shared_ptr<Communicator> group_;
  std::unique_ptr<checkpoint::AsyncSaver> saver_;
};

}  // namespace

void RegisterCheckpoint(py::module_& m) {
  py::module_ c = m.def_submodule(
      "_checkpoint",
      "The C++ checkpoint (vemesh/checkpoint/) on Python arrays; "
      "vemesh.checkpoint is its Python face.");
  c.def("save", &Save, py::arg("entries"), py::arg("checkpoint_id"),
        py::arg("group"), py::arg("step"), py::arg("keep_last"),
        py::arg("metadata"), py::arg("job") = "", py::arg("mesh") = "",
        py::arg("error") = py::none());
  py::class_<PyAsyncSaver>(c, "AsyncSaver")
      .def(py::init<const std::shared_ptr<Communicator>&>(), py::arg("group"))
      .def("start", &PyAsyncSaver::Start, py::arg("entries"),
           py::arg("checkpoint_id"), py::arg("step"), py::arg("keep_last"),
           py::arg("metadata"), py::arg("job") = "", py::arg("mesh") = "",
           py::arg("error") = py::none())
      .def("wait", &PyAsyncSaver::Wait)
      .def_property_readonly("in_flight", &PyAsyncSaver::in_flight);
  c.def("load", &Load, py::arg("entries"), py::arg("checkpoint_id"),
        py::arg("group"), py::arg("step") = py::none(), py::arg("job") = "",
        py::arg("error") = py::none());
  c.def("read_manifest", &ReadManifest, py::arg("checkpoint_id"),
        py::arg("step") = py::none());
  c.def("latest_step", [](const std::string& dir) {
    absl::StatusOr<std::optional<int64_t>> r;
    {
      py::gil_scoped_release nogil;
      r = checkpoint::LatestStep(dir);
    }
    return Unwrap(std::move(r));
  });
}

}  // namespace vemesh::python
