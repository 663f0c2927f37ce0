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

#ifndef VEMESH_PYTHON_TENSOR_BUFFER_H_
#define VEMESH_PYTHON_TENSOR_BUFFER_H_

#include <pybind11/pybind11.h>

#include <cstddef>
#include <memory>
#include <string>

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

 private:
  TensorBuffer() = default;

  pybind11::object owner_;    // the array or tensor
  pybind11::object capsule_;  // DLPack capsule, when taken through DLPack
  std::unique_ptr<Py_buffer> view_;  // buffer protocol view, released here
  void* data_ = nullptr;
  size_t count_ = 0;
  DataType type_ = DataType::kFloat32;
  bool on_cuda_ = false;
  const char* source_ = "";
};

}  // namespace vemesh::python

#endif  // VEMESH_PYTHON_TENSOR_BUFFER_H_
