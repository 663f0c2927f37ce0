// vemesh/comm/nccl/nccl_communicator.h
//
// The NCCL backend of Communicator: device buffers, bootstrapped over a host
// communicator (MPI under mpirun, Gloo under torchrun / env://). Built when
// CUDA and NCCL are found (VEMESH_HAVE_NCCL); otherwise nccl_stub.cc beside
// this file gives the two functions below, and they answer Unimplemented.
//
//   absl::StatusOr<int> gpus = CudaDeviceCount();   // error when no GPU
//   std::shared_ptr<Communicator> host_world = ...;  // MPI or Gloo
//   auto nccl = CreateNcclCommunicator(host_world, /*device=*/local_rank);
//   float* grad = ...;                              // device memory
//   (*nccl)->all_reduce(grad, grad, n, DataType::kFloat32, ReduceOp::kSum);
//
// Every NCCL communicator is paired with a host-memory *twin* (any CPU
// backend) holding the same members in the same order. The twin answers
// ranks() and carries the bootstrap: rank 0 makes the unique id and
// broadcasts it over the twin, so no MPI is needed. `split` splits the twin
// and the NCCL communicator (ncclCommSplit) with the same color and key: two
// collectives per split, whatever the number of groups.
//
// Operations run on a private CUDA stream of the communicator's device and
// are synchronised before they return, so they are blocking like the MPI
// backend. Every CUDA and NCCL return code becomes a Status (Internal with
// the library's message). `send` and `recv` to oneself cannot complete
// separately in NCCL: use `send_recv`, which groups them.

#ifndef VEMESH_COMM_NCCL_NCCL_COMMUNICATOR_H_
#define VEMESH_COMM_NCCL_NCCL_COMMUNICATOR_H_

#include <memory>

#include "absl/status/statusor.h"
#include "vemesh/comm/communicator.h"

namespace vemesh {

// The number of CUDA devices this process sees. An error (FailedPrecondition
// with CUDA's message, or Unimplemented without NCCL support) when there is
// none: tests skip with `GTEST_SKIP() << "no GPU: " << status`.
absl::StatusOr<int> CudaDeviceCount();

// Collective over `twin`: an NCCL communicator with the same members, on
// CUDA device `device` of this process. The twin is kept (shared).
absl::StatusOr<std::shared_ptr<Communicator>> CreateNcclCommunicator(
    std::shared_ptr<Communicator> twin, int device);

}  // namespace vemesh

#ifdef VEMESH_HAVE_NCCL

// NCCL's and CUDA's opaque handles, so this header does not need their
// headers (they stay private to the library).
struct ncclComm;
struct CUstream_st;

namespace vemesh {

class NcclCommunicator final : public Communicator {
 public:
  // See CreateNcclCommunicator.
  static absl::StatusOr<std::shared_ptr<NcclCommunicator>> Create(
      std::shared_ptr<Communicator> twin, int device);
  ~NcclCommunicator() override;

  int rank() const override { return twin_->rank(); }
  int size() const override { return twin_->size(); }
  absl::Span<const int> ranks() const override { return twin_->ranks(); }
  absl::string_view backend() const override { return "nccl"; }

  absl::Status barrier() override;
  absl::Status broadcast(void* data, size_t count, DataType type,
                         int root) override;
  absl::Status all_reduce(const void* send, void* recv, size_t count,
                          DataType type, ReduceOp op) override;
  absl::Status all_gather(const void* send, void* recv, size_t count,
                          DataType type) override;
  absl::Status reduce_scatter(const void* send, void* recv, size_t count,
                              DataType type, ReduceOp op) override;
  absl::Status send(const void* data, size_t count, DataType type,
                    int peer) override;
  absl::Status recv(void* data, size_t count, DataType type,
                    int peer) override;
  absl::Status send_recv(const void* send_data, size_t send_count, int dest,
                         void* recv_data, size_t recv_count, int source,
                         DataType type) override;
  using Communicator::all_gather;
  using Communicator::all_reduce;
  using Communicator::broadcast;
  using Communicator::recv;
  using Communicator::reduce_scatter;
  using Communicator::send;
  using Communicator::send_recv;

  absl::StatusOr<std::shared_ptr<Communicator>> split(int color,
                                                      int key) override;
  // `handle` is the ncclComm_t.
  NativeHandle native_handle() const override;

  int device() const { return device_; }
  const std::shared_ptr<Communicator>& twin() const { return twin_; }

 private:
  NcclCommunicator(std::shared_ptr<Communicator> twin, int device,
                   ncclComm* comm, CUstream_st* stream);
  // Selects the device, runs `enqueue`, then waits for the stream.
  template <typename Enqueue>
  absl::Status Run(absl::string_view op, Enqueue enqueue);
  absl::Status CheckPeer(absl::string_view op, int peer) const;

  std::shared_ptr<Communicator> twin_;
  int device_;
  ncclComm* comm_;
  CUstream_st* stream_;
  // A one-element device buffer for barrier (an all_reduce of nothing).
  void* scratch_ = nullptr;
};

}  // namespace vemesh

#endif  // VEMESH_HAVE_NCCL

#endif  // VEMESH_COMM_NCCL_NCCL_COMMUNICATOR_H_
