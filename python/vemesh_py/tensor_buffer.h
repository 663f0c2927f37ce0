// python/vemesh_py/tensor_buffer.h
//
// A Python array seen as a communicator buffer, in place and without a copy:
// a numpy array (or anything with the buffer protocol) or any DLPack tensor
// (torch CPU tensors; CUDA tensors for the NCCL backend).
//
//   TensorBuffer grad = TensorBuffer::From(obj, "tensor", /*writable=*/true);
//   comm->all_reduce(grad.data(), grad.data(), grad.count(), grad.type(), op);
//
// The element type must be float32/64, int32/64, int8, uint8, float16 or
// bfloat16 (torch), and the memory C-contiguous; anything else is ValueError
// naming the argument and what was expected. The buffer keeps its Python
// object alive (and its DLPack capsule, whose deleter frees the tensor's
// reference) until the TensorBuffer goes; moving it keeps that guarantee.
//
// That keeps the tensor, not its memory: torch's resize_() (or set_()) of a
// tensor frees the memory it had, whatever holds the tensor. An operation
// that outlives the call (async_op=True) on a DLPack host tensor therefore
// works on a copy (Stage): the tensor's bytes copied in when it starts, the
// result copied back (Unstage) when Python sees it complete, if the tensor
// still has that memory; a resized tensor is an error, never a write into
// freed memory. numpy refuses to resize an array whose buffer is exported,
// and CUDA memory freed by torch stays mapped in its caching allocator:
// both are used in place.

#ifndef VEMESH_PYTHON_TENSOR_BUFFER_H_
#define VEMESH_PYTHON_TENSOR_BUFFER_H_

#include <pybind11/pybind11.h>

#include <cstddef>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "vemesh/comm/data_type.h"

namespace vemesh::python {

class TensorBuffer {
 public:
  // `what` names the argument in errors ("out", "tensor"). Raises
  // ValueError for an unsupported type, a strided tensor or a read-only
  // buffer where `writable`, TypeError for an object that is neither.
  static TensorBuffer From(const pybind11::handle& obj, const char* what,
                           bool writable);

  TensorBuffer(TensorBuffer&&) = default;
  TensorBuffer& operator=(TensorBuffer&&) = default;
  ~TensorBuffer();

  void* data() const { return data_; }
  size_t count() const { return count_; }
  DataType type() const { return type_; }
  // Whether the memory is on a CUDA device (DLPack kDLCUDA).
  bool on_cuda() const { return on_cuda_; }
  // "float32[1024] (numpy)": for messages.
  std::string Describe() const;
  // The Python objects that keep the memory alive.
  pybind11::object owner() const { return owner_; }

  // For an operation that may outlive the call: a DLPack host tensor is
  // copied into memory owned here, and data() points there. No-op for the
  // buffer protocol and CUDA.
  void Stage();
  // Copies a staged, writable buffer back into its tensor (once; the GIL
  // held): FailedPrecondition naming the argument if the tensor no longer
  // has the memory it had when the operation started (resized, set_()).
  absl::Status Unstage();

 private:
  TensorBuffer() = default;

  pybind11::object owner_;    // the array or tensor
  pybind11::object capsule_;  // DLPack capsule, when taken through DLPack
  std::unique_ptr<Py_buffer> view_;  // buffer protocol view, released here
  void* data_ = nullptr;
  size_t count_ = 0;
  DataType type_ = DataType::kFloat32;
  bool on_cuda_ = false;
  bool writable_ = false;
  const char* source_ = "";
  const char* what_ = "";
  // Stage(): the copy the operation works on, and the tensor's own memory.
  std::unique_ptr<std::byte[]> staged_;
  void* tensor_data_ = nullptr;
};

}  // namespace vemesh::python

#endif  // VEMESH_PYTHON_TENSOR_BUFFER_H_
