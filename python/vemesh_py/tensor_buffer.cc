#include "tensor_buffer.h"

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "errors.h"

namespace py = pybind11;

namespace vemesh::python {
namespace {

// The DLPack ABI (dlpack.h, v0.x as torch 1.13 and numpy 1.24 export it):
// only the fields read here, in their ABI order.
struct DLDevice {
  int32_t device_type;  // 1 = CPU, 2 = CUDA, 3 = CUDA host (pinned)
  int32_t device_id;
};
struct DLDataType {
  uint8_t code;  // 0 int, 1 uint, 2 float, 4 bfloat
  uint8_t bits;
  uint16_t lanes;
};
struct DLTensor {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides;  // null: compact row-major
  uint64_t byte_offset;
};
struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(DLManagedTensor*);
};
constexpr int32_t kDLCPU = 1;
constexpr int32_t kDLCUDA = 2;
constexpr int32_t kDLCUDAHost = 3;

[[noreturn]] void Bad(const char* what, const std::string& text) {
  RaiseStatus(absl::InvalidArgumentError(absl::StrCat(what, ": ", text)));
}

std::optional<DataType> FromDlpack(DLDataType t) {
  if (t.lanes != 1) return std::nullopt;
  switch (t.code) {
    case 0:
      if (t.bits == 32) return DataType::kInt32;
      if (t.bits == 64) return DataType::kInt64;
      if (t.bits == 8) return DataType::kInt8;
      break;
    case 1:
      if (t.bits == 8) return DataType::kUInt8;
      break;
    case 2:
      if (t.bits == 32) return DataType::kFloat32;
      if (t.bits == 64) return DataType::kFloat64;
      if (t.bits == 16) return DataType::kFloat16;
      break;
    case 4:
      if (t.bits == 16) return DataType::kBFloat16;
      break;
  }
  return std::nullopt;
}

// A struct-module format character (numpy's), by kind and size.
std::optional<DataType> FromFormat(const char* format, Py_ssize_t itemsize) {
  std::string f = format != nullptr ? format : "B";
  if (!f.empty() && (f[0] == '<' || f[0] == '=' || f[0] == '@')) {
    f = f.substr(1);
  }
  if (f.size() != 1) return std::nullopt;
  switch (f[0]) {
    case 'f':
      return DataType::kFloat32;
    case 'd':
      return DataType::kFloat64;
    case 'e':
      return DataType::kFloat16;
    case 'b':
      return DataType::kInt8;
    case 'B':
      return DataType::kUInt8;
    case 'i':
    case 'l':
    case 'q':
      if (itemsize == 4) return DataType::kInt32;
      if (itemsize == 8) return DataType::kInt64;
      break;
  }
  return std::nullopt;
}

constexpr const char* kTypes =
    "float32, float64, int32, int64, int8, uint8, float16 or bfloat16";

}  // namespace

TensorBuffer::~TensorBuffer() {
  if (view_ != nullptr) {
    py::gil_scoped_acquire gil;
    PyBuffer_Release(view_.get());
  }
}

std::string TensorBuffer::Describe() const {
  return absl::StrCat(DataTypeName(type_), "[", count_, "] (", source_, ")");
}

TensorBuffer TensorBuffer::From(const py::handle& obj, const char* what,
                                bool writable) {
  TensorBuffer b;
  b.owner_ = py::reinterpret_borrow<py::object>(obj);
  b.writable_ = writable;
  b.what_ = what;
  // The buffer protocol first (numpy, bytearray, memoryview); DLPack for
  // what lacks it (torch tensors).
  if (PyObject_CheckBuffer(obj.ptr())) {
    auto view = std::make_unique<Py_buffer>();
    int flags = PyBUF_STRIDES | PyBUF_FORMAT;
    if (writable) flags |= PyBUF_WRITABLE;
    if (PyObject_GetBuffer(obj.ptr(), view.get(), flags) != 0) {
      PyErr_Clear();
      if (writable && PyObject_GetBuffer(obj.ptr(), view.get(),
                                         PyBUF_STRIDES | PyBUF_FORMAT) == 0) {
        PyBuffer_Release(view.get());
        Bad(what, "the array is read-only; vemesh writes into it in place");
      }
      Bad(what, "the buffer cannot be read as a strided array");
    }
    b.view_ = std::move(view);
    Py_buffer& v = *b.view_;
    std::optional<DataType> type = FromFormat(v.format, v.itemsize);
    if (!type) {
      Bad(what, absl::StrCat("element format '", v.format ? v.format : "?",
                             "' (itemsize ", v.itemsize,
                             ") is not supported; expected ", kTypes));
    }
    if (!PyBuffer_IsContiguous(&v, 'C')) {
      Bad(what,
          "the array is not C-contiguous; pass a contiguous array "
          "(numpy.ascontiguousarray) so vemesh can work in place");
    }
    b.type_ = *type;
    b.data_ = v.buf;
    b.count_ = static_cast<size_t>(v.len / v.itemsize);
    b.source_ = "buffer";
    return b;
  }
  if (!py::hasattr(obj, "__dlpack__")) {
    PyErr_SetString(PyExc_TypeError,
                    absl::StrCat(what,
                                 ": expected a numpy array (buffer protocol) "
                                 "or a DLPack tensor (torch.Tensor), got ",
                                 std::string(py::str(obj.get_type())))
                        .c_str());
    throw py::error_already_set();
  }
  // torch refuses __dlpack__ on a tensor that requires grad; callers pass
  // .detach() (which shares memory) as they would to torch.distributed.
  b.capsule_ = obj.attr("__dlpack__")();
  auto* managed = static_cast<DLManagedTensor*>(
      PyCapsule_GetPointer(b.capsule_.ptr(), "dltensor"));
  if (managed == nullptr) throw py::error_already_set();
  // The capsule keeps its name: its own destructor calls the deleter when
  // the capsule goes (that is the consumer's duty only once renamed).
  const DLTensor& t = managed->dl_tensor;
  std::optional<DataType> type = FromDlpack(t.dtype);
  if (!type) {
    Bad(what, absl::StrCat("DLPack dtype (code ", t.dtype.code, ", ",
                           t.dtype.bits, " bits, ", t.dtype.lanes,
                           " lanes) is not supported; expected ", kTypes));
  }
  int64_t count = 1;
  for (int32_t d = 0; d < t.ndim; ++d) count *= t.shape[d];
  if (t.strides != nullptr && count > 0) {
    int64_t expected = 1;
    for (int32_t d = t.ndim - 1; d >= 0; --d) {
      if (t.shape[d] != 1 && t.strides[d] != expected) {
        Bad(what,
            "the tensor is not contiguous; pass tensor.contiguous() so "
            "vemesh can work in place");
      }
      expected *= t.shape[d];
    }
  }
  if (t.device.device_type == kDLCUDA) {
    b.on_cuda_ = true;
  } else if (t.device.device_type != kDLCPU &&
             t.device.device_type != kDLCUDAHost) {
    Bad(what, absl::StrCat("DLPack device type ", t.device.device_type,
                           " is not supported; expected a CPU (1) or CUDA "
                           "(2) tensor"));
  }
  b.type_ = *type;
  b.data_ = static_cast<char*>(t.data) + t.byte_offset;
  b.count_ = static_cast<size_t>(count);
  b.source_ = b.on_cuda_ ? "dlpack cuda" : "dlpack cpu";
  return b;
}

void TensorBuffer::Stage() {
  if (capsule_.is_none() || on_cuda_ || staged_ != nullptr) return;
  const size_t bytes = count_ * SizeOf(type_);
  staged_ = std::make_unique<std::byte[]>(bytes == 0 ? 1 : bytes);
  if (bytes > 0) std::memcpy(staged_.get(), data_, bytes);
  tensor_data_ = data_;
  data_ = staged_.get();
}

absl::Status TensorBuffer::Unstage() {
  if (staged_ == nullptr || !writable_) return absl::OkStatus();
  // The tensor's memory now: a fresh capsule says where it is and how long.
  void* now = nullptr;
  int64_t count = -1;
  try {
    py::object capsule = owner_.attr("__dlpack__")();
    auto* managed = static_cast<DLManagedTensor*>(
        PyCapsule_GetPointer(capsule.ptr(), "dltensor"));
    if (managed == nullptr) throw py::error_already_set();
    const DLTensor& t = managed->dl_tensor;
    now = static_cast<char*>(t.data) + t.byte_offset;
    count = 1;
    for (int32_t d = 0; d < t.ndim; ++d) count *= t.shape[d];
  } catch (py::error_already_set&) {
    PyErr_Clear();
  }
  const size_t bytes = count_ * SizeOf(type_);
  const bool same =
      now == tensor_data_ && count == static_cast<int64_t>(count_);
  if (same && bytes > 0) std::memcpy(tensor_data_, staged_.get(), bytes);
  data_ = tensor_data_;
  staged_.reset();  // once
  if (!same) {
    return absl::FailedPreconditionError(absl::StrCat(
        what_,
        ": the tensor was resized (or given other memory) while the "
        "asynchronous operation ran; its result was not written into it "
        "(keep a tensor's shape until wait() returns)"));
  }
  return absl::OkStatus();
}

}  // namespace vemesh::python
