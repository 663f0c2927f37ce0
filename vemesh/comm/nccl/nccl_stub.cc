// The NCCL entry points of a build without CUDA/NCCL: they answer
// Unimplemented, so callers (DeviceMesh for "cuda") fail with a clear
// reason instead of failing to link.
#include "vemesh/comm/nccl/nccl_communicator.h"

#ifndef VEMESH_HAVE_NCCL

namespace vemesh {

absl::StatusOr<int> CudaDeviceCount() {
  return absl::UnimplementedError(
      "vemesh was built without CUDA/NCCL (VEMESH_WITH_NCCL=OFF or not found)");
}

absl::StatusOr<std::shared_ptr<Communicator>> CreateNcclCommunicator(
    std::shared_ptr<Communicator>, int, const NcclOptions&) {
  return CudaDeviceCount().status();
}

absl::StatusOr<std::shared_ptr<Communicator>> CreateNcclCommunicator(
    std::shared_ptr<Communicator>, const CudaDeviceRequest&,
    const NcclOptions&) {
  return CudaDeviceCount().status();
}

absl::StatusOr<std::vector<std::shared_ptr<Communicator>>>
CreateNcclGroupsOverStore(const std::shared_ptr<Store>&, absl::string_view, int,
                          int, std::vector<NcclStoreGroup>,
                          const CudaDeviceRequest&, absl::Duration,
                          const NcclOptions&) {
  return CudaDeviceCount().status();
}

absl::StatusOr<std::vector<std::shared_ptr<Communicator>>>
CreateNcclGroupsOverWorld(const std::shared_ptr<Communicator>&,
                          absl::string_view, absl::Span<const SplitRequest>,
                          const CudaDeviceRequest&, absl::Duration,
                          const NcclOptions&) {
  return CudaDeviceCount().status();
}

}  // namespace vemesh

#endif  // VEMESH_HAVE_NCCL
