// Which CUDA device a rank of a "cuda" mesh binds (vemesh/comm/nccl/
// cuda_device.h), with no GPU: the pure choice for every rule and error
// text, then (in NCCL builds) the real query through the NCCL seam with a
// fake cudaGetDeviceCount: "no driver" (CUDA error 35, a machine without a
// GPU) reads as no GPU, and CUDA_VISIBLE_DEVICES comes from the environment.

#include <cstdlib>
#include <optional>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "vemesh/comm/nccl/cuda_device.h"
#include "vemesh/comm/nccl/nccl_communicator.h"

#ifdef VEMESH_HAVE_NCCL
#include "vemesh/comm/nccl/internal/nccl_api.h"
#endif

namespace vemesh {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

DeviceChoiceInput Input(int visible, std::optional<std::string> env,
                        int requested, int local_rank, int host_size) {
  DeviceChoiceInput in;
  in.visible_count = visible;
  in.visible_devices = std::move(env);
  in.requested = requested;
  in.host_local_rank = local_rank;
  in.host_size = host_size;
  return in;
}

std::string Message(const absl::StatusOr<int>& s) {
  return std::string(s.status().message());
}

// -- "cuda:N"
// ------------------------------------------------------------------

TEST(ChooseCudaDevice, AnIndexIsThatDeviceWhateverTheHostLocalRank) {
  EXPECT_EQ(*ChooseCudaDevice(Input(8, std::nullopt, 5, 0, 8)), 5);
  EXPECT_EQ(*ChooseCudaDevice(Input(8, std::nullopt, 0, 7, 8)), 0);
  // One device per task: cuda:0 is that device.
  EXPECT_EQ(*ChooseCudaDevice(Input(1, "3", 0, 2, 4)), 0);
}

TEST(ChooseCudaDevice, AnIndexPastTheVisibleDevicesNamesBothAndTheMask) {
  auto s = ChooseCudaDevice(Input(2, "4,5", 2, 0, 1));
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(s), AllOf(HasSubstr("'cuda:2' does not exist"),
                                HasSubstr("sees 2 CUDA device(s)"),
                                HasSubstr("CUDA_VISIBLE_DEVICES='4,5'"),
                                HasSubstr("cuda:0 to cuda:1")));
  auto unset = ChooseCudaDevice(Input(4, std::nullopt, 9, 0, 1));
  EXPECT_EQ(unset.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(unset),
              AllOf(HasSubstr("'cuda:9'"), HasSubstr("sees 4 CUDA device(s)"),
                    HasSubstr("CUDA_VISIBLE_DEVICES is not set")));
}

TEST(ChooseCudaDevice, ANegativeIndexIsRefused) {
  auto s = ChooseCudaDevice(Input(4, std::nullopt, -2, 0, 1));
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(s), HasSubstr("N >= 0"));
}

// -- plain "cuda"
// --------------------------------------------------------------

TEST(ChooseCudaDevice, PlainCudaIsTheHostLocalRank) {
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(*ChooseCudaDevice(Input(4, std::nullopt, -1, r, 4)), r);
    // A mask that leaves several devices: still the host-local rank.
    EXPECT_EQ(*ChooseCudaDevice(Input(4, "0,1,2,3", -1, r, 4)), r);
  }
  EXPECT_EQ(*ChooseCudaDevice(Input(8, std::nullopt, -1, 1, 2)), 1);
}

TEST(ChooseCudaDevice, OneDevicePerTaskIsDeviceZeroOnEveryRank) {
  // srun --gpus-per-task=1: each of four tasks on a host sees its own GPU.
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(*ChooseCudaDevice(Input(1, std::to_string(r), -1, r, 4)), 0);
  }
  // A GPU UUID as the mask.
  EXPECT_EQ(*ChooseCudaDevice(Input(1, "GPU-1a2b", -1, 3, 4)), 0);
}

TEST(ChooseCudaDevice, ARankPastTheVisibleDevicesNamesBothNumbers) {
  auto s = ChooseCudaDevice(Input(2, "0,1", -1, 3, 4));
  EXPECT_EQ(s.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(Message(s), AllOf(HasSubstr("host-local rank 3 (of 4"),
                                HasSubstr("sees only 2 device(s)"),
                                HasSubstr("CUDA_VISIBLE_DEVICES='0,1'"),
                                HasSubstr("--gpus-per-task=1")));
  // One GPU and no mask: the ranks would share it; refused, not shared.
  auto shared = ChooseCudaDevice(Input(1, std::nullopt, -1, 1, 2));
  EXPECT_EQ(shared.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(Message(shared),
              AllOf(HasSubstr("host-local rank 1 (of 2"),
                    HasSubstr("sees only 1 device(s)"),
                    HasSubstr("CUDA_VISIBLE_DEVICES is not set")));
}

TEST(ChooseCudaDevice, NoVisibleDeviceIsNoGpu) {
  auto s = ChooseCudaDevice(Input(0, "", -1, 0, 1));
  EXPECT_EQ(s.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(Message(s), AllOf(HasSubstr("no usable GPU"),
                                HasSubstr("CUDA_VISIBLE_DEVICES=''")));
}

TEST(ChooseCudaDevice, AHostLocalRankOutsideItsHostIsRefused) {
  auto s = ChooseCudaDevice(Input(4, std::nullopt, -1, 4, 4));
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(s), HasSubstr("host-local rank 4 of a host of 4"));
}

// -- the real query, through the NCCL seam -----------------------------------

#ifndef VEMESH_HAVE_NCCL

TEST(ChooseCudaDeviceHere, WithoutNcclSaysSo) {
  auto s = ChooseCudaDeviceHere({});
  EXPECT_EQ(s.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(Message(s), HasSubstr("without CUDA/NCCL"));
}

#else  // VEMESH_HAVE_NCCL

// cudaGetDeviceCount answers `code_` and `count_`.
struct FakeCount {
  static inline cudaError_t code_ = cudaSuccess;
  static inline int count_ = 0;
  NcclApi table = NcclApi::Real();
  std::optional<ScopedNcclApi> installed;
  std::optional<std::string> saved_env;

  FakeCount(cudaError_t code, int count) {
    code_ = code;
    count_ = count;
    table.cudaGetDeviceCount = [](int* n) {
      *n = count_;
      return code_;
    };
    installed.emplace(table);
    if (const char* v = std::getenv("CUDA_VISIBLE_DEVICES")) saved_env = v;
  }
  ~FakeCount() {
    if (saved_env.has_value()) {
      setenv("CUDA_VISIBLE_DEVICES", saved_env->c_str(), 1);
    } else {
      unsetenv("CUDA_VISIBLE_DEVICES");
    }
  }
};

TEST(ChooseCudaDeviceHere, NoDriverIsNoGpu) {
  FakeCount fake(cudaErrorInsufficientDriver, 0);  // error 35
  auto count = CudaDeviceCount();
  EXPECT_EQ(count.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(count.status().message()),
              AllOf(HasSubstr("no usable GPU"), HasSubstr("(35)")));
  auto s = ChooseCudaDeviceHere({});
  EXPECT_EQ(s.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(Message(s), HasSubstr("no usable GPU"));
}

TEST(ChooseCudaDeviceHere, ReadsTheMaskFromTheEnvironment) {
  FakeCount fake(cudaSuccess, 1);
  setenv("CUDA_VISIBLE_DEVICES", "5", 1);
  EXPECT_EQ(*ChooseCudaDeviceHere({-1, 3, 4}), 0);
  unsetenv("CUDA_VISIBLE_DEVICES");
  auto s = ChooseCudaDeviceHere({-1, 3, 4});
  EXPECT_EQ(s.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(Message(s), AllOf(HasSubstr("host-local rank 3"),
                                HasSubstr("sees only 1 device(s)")));
}

#endif  // VEMESH_HAVE_NCCL

}  // namespace
}  // namespace vemesh
