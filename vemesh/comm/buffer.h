// vemesh/comm/buffer.h
//
// What the typed Communicator operations take as a buffer: any contiguous,
// sized range of a supported element type (data_type.h): std::vector,
// std::array, std::span, absl::Span, absl::InlinedVector, a C array.
//
//   std::vector<double> grad(1024, 1.0);
//   comm->all_reduce(grad, ReduceOp::kSum);              // std::vector
//   comm->all_reduce(std::span<double>(grad), ReduceOp::kSum);
//   const std::vector<float> mine = {1.5f};
//   std::vector<float> all(comm->size());
//   comm->all_gather(mine, all);                 // const: read only
//   std::vector<float> scratch = {2.5f};
//   comm->all_gather(absl::MakeSpan(scratch), absl::MakeSpan(all));
//
// A buffer that is only read (a send buffer) may be const or mutable; one
// that is written must be mutable (ReadBuffer / WriteBuffer below). A send
// and a recv buffer of one operation hold the same element type (a `const
// float` send with a `float` recv is fine; float with double is a
// static_assert naming the rule).
//
// The asynchronous forms (iall_reduce, isend, ...) keep the buffer's address
// until their Work ends: pass a container that outlives the Work, or a view
// of one (a span). A temporary container (`comm->isend(std::vector<float>{1,
// 2}, 1)`) compiles and dangles, as a temporary torch tensor would.

#ifndef VEMESH_COMM_BUFFER_H_
#define VEMESH_COMM_BUFFER_H_

#include <cstddef>
#include <iterator>
#include <ranges>
#include <type_traits>

namespace vemesh {

// A contiguous, sized range: its elements may be read.
template <typename R>
concept ReadBuffer =
    std::ranges::contiguous_range<R> && std::ranges::sized_range<R>;

// The element type of a buffer without const (float for a
// std::span<const float>).
template <typename R>
using BufferValue = std::remove_cv_t<
    std::remove_reference_t<std::ranges::range_reference_t<R>>>;

// A ReadBuffer whose elements may be written (not a const view).
template <typename R>
concept WriteBuffer = ReadBuffer<R> && !std::is_const_v<
    std::remove_reference_t<std::ranges::range_reference_t<R>>>;

// The pointer and length of a buffer (an lvalue: a range passed as a
// temporary, such as absl::MakeSpan(v), is named by the caller's parameter).
template <typename R>
const BufferValue<R>* ReadData(R& r) {
  return std::ranges::data(r);
}
template <typename R>
BufferValue<R>* WriteData(R& r) {
  return std::ranges::data(r);
}
template <typename R>
size_t BufferSize(R& r) {
  return static_cast<size_t>(std::ranges::size(r));
}

}  // namespace vemesh

#endif  // VEMESH_COMM_BUFFER_H_
