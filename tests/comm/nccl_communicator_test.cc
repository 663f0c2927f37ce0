// The NCCL backend on one rank and one GPU: creation, split, collectives and
// an exchange with oneself. Without a GPU (or without NCCL in the build)
// every test skips and says why.

#include "vemesh/comm/nccl/nccl_communicator.h"

#include <cstdint>
#include <cstdio>
#include <memory>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "vemesh/comm/gloo/gloo_communicator.h"
#include "vemesh/comm/mpi/mpi_communicator.h"
#include "vemesh/device_mesh.h"
#include "vemesh/rendezvous/memory_store.h"

#ifdef VEMESH_HAVE_NCCL
#include <cuda_runtime.h>
#endif

namespace vemesh {
namespace {

#define SKIP_WITHOUT_GPU()                                    \
  do {                                                        \
    absl::StatusOr<int> gpus = CudaDeviceCount();             \
    if (!gpus.ok()) GTEST_SKIP() << "no GPU: " << gpus.status(); \
  } while (0)

TEST(CudaDeviceCount, ExplainsItsAnswer) {
  absl::StatusOr<int> gpus = CudaDeviceCount();
  if (gpus.ok()) {
    EXPECT_GT(*gpus, 0);
  } else {
    EXPECT_FALSE(gpus.status().message().empty());
    std::printf("no GPU here: %s\n", gpus.status().ToString().c_str());
  }
}

#ifdef VEMESH_HAVE_NCCL

// Device memory holding `values`; freed with the object.
template <typename T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(const std::vector<T>& values) : size_(values.size()) {
    EXPECT_EQ(cudaMalloc(&data_, size_ * sizeof(T)), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(data_, values.data(), size_ * sizeof(T),
                         cudaMemcpyHostToDevice),
              cudaSuccess);
  }
  ~DeviceBuffer() { cudaFree(data_); }
  T* data() { return data_; }
  std::vector<T> Read() const {
    std::vector<T> out(size_);
    EXPECT_EQ(cudaMemcpy(out.data(), data_, size_ * sizeof(T),
                         cudaMemcpyDeviceToHost),
              cudaSuccess);
    return out;
  }

 private:
  T* data_ = nullptr;
  size_t size_;
};

TEST(NcclCommunicator, OneRankEndToEnd) {
  SKIP_WITHOUT_GPU();
  auto world = MpiCommunicator::World();
  ASSERT_TRUE(world.ok()) << world.status();
  if ((*world)->size() != 1) GTEST_SKIP() << "runs on one rank";
  const int64_t before = LiveCommunicatorCount();
  {
    auto nccl = CreateNcclCommunicator(*world, 0);
    ASSERT_TRUE(nccl.ok()) << nccl.status();
    Communicator& comm = **nccl;
    EXPECT_EQ(comm.backend(), "nccl");
    EXPECT_EQ(comm.size(), 1);
    EXPECT_EQ(comm.global_rank(), 0);
    EXPECT_TRUE(comm.barrier().ok());

    DeviceBuffer<float> x({1.f, 2.f, 3.f});
    ASSERT_TRUE(comm.all_reduce(x.data(), x.data(), 3, DataType::kFloat32,
                                ReduceOp::kSum)
                    .ok());
    EXPECT_EQ(x.Read(), (std::vector<float>{1.f, 2.f, 3.f}));

    DeviceBuffer<int64_t> gathered({0, 0});
    DeviceBuffer<int64_t> mine({41, 42});
    ASSERT_TRUE(
        comm.all_gather(mine.data(), gathered.data(), 2, DataType::kInt64)
            .ok());
    EXPECT_EQ(gathered.Read(), (std::vector<int64_t>{41, 42}));

    DeviceBuffer<double> in({5.0, 6.0});
    DeviceBuffer<double> out({0.0, 0.0});
    ASSERT_TRUE(comm.send_recv(in.data(), 2, 0, out.data(), 2, 0,
                               DataType::kFloat64)
                    .ok());
    EXPECT_EQ(out.Read(), (std::vector<double>{5.0, 6.0}));

    auto child = comm.split(0, 0);
    ASSERT_TRUE(child.ok()) << child.status();
    ASSERT_NE(*child, nullptr);
    EXPECT_EQ((*child)->size(), 1);
    DeviceBuffer<int32_t> y({7});
    ASSERT_TRUE((*child)
                    ->all_reduce(y.data(), y.data(), 1, DataType::kInt32,
                                 ReduceOp::kMax)
                    .ok());
    EXPECT_EQ(y.Read(), (std::vector<int32_t>{7}));
    auto none = comm.split(-1, 0);
    ASSERT_TRUE(none.ok()) << none.status();
    EXPECT_EQ(*none, nullptr);

    // Host memory is refused with a clear error, not a crash.
    std::vector<float> host(3);
    absl::Status s = comm.all_reduce(host.data(), host.data(), 3,
                                     DataType::kFloat32, ReduceOp::kSum);
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  }
  EXPECT_EQ(LiveCommunicatorCount(), before);
}

TEST(NcclCommunicator, CudaDeviceMeshOnOneRank) {
  SKIP_WITHOUT_GPU();
  auto mesh = init_device_mesh("cuda", {1, 1}, {"DP", "TP"});
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  auto tp = mesh->get_group("TP");
  ASSERT_TRUE(tp.ok()) << tp.status();
  EXPECT_EQ((*tp)->backend(), "nccl");
  DeviceBuffer<float> x({2.f});
  ASSERT_TRUE(
      (*tp)->all_reduce(x.data(), x.data(), 1, DataType::kFloat32,
                        ReduceOp::kSum)
          .ok());
  EXPECT_EQ(x.Read(), (std::vector<float>{2.f}));
  auto flat = mesh->flatten({"DP", "TP"});
  ASSERT_TRUE(flat.ok()) << flat.status();
  EXPECT_EQ((*flat)->size(), 1);
  EXPECT_THAT(mesh->ToString(), ::testing::HasSubstr("backend=nccl (device type cuda; unique id over the "));
  std::printf("vemesh: %s\n", mesh->ToString().c_str());
}

// NCCL without MPI: the twin is a one-rank Gloo world over an in-process
// store, as under torchrun. Every collective and dtype on device memory.
TEST(NcclCommunicator, GlooTwinEveryOpAndDtype) {
  SKIP_WITHOUT_GPU();
  auto store = std::make_shared<MemoryStore>();
  auto twin = GlooCommunicator::Create(store, "nccl-twin", 0, 1, {0},
                                       absl::Seconds(30));
  ASSERT_TRUE(twin.ok()) << twin.status();
  auto nccl = CreateNcclCommunicator(*twin, 0);
  ASSERT_TRUE(nccl.ok()) << nccl.status();
  Communicator& comm = **nccl;
  EXPECT_EQ(comm.backend(), "nccl");
  auto check = [&](auto zero) {
    using T = decltype(zero);
    const DataType type = DataTypeOf<T>();
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kMin}) {
      DeviceBuffer<T> x({T(3), T(1), T(2)});
      ASSERT_TRUE(comm.all_reduce(x.data(), x.data(), 3, type, op).ok());
      EXPECT_EQ(x.Read(), (std::vector<T>{T(3), T(1), T(2)}));
      DeviceBuffer<T> in({T(4), T(5)});
      DeviceBuffer<T> out({T(0), T(0)});
      ASSERT_TRUE(comm.reduce_scatter(in.data(), out.data(), 2, type, op).ok());
      EXPECT_EQ(out.Read(), (std::vector<T>{T(4), T(5)}));
    }
    DeviceBuffer<T> b({T(9), T(8)});
    ASSERT_TRUE(comm.broadcast(b.data(), 2, type, 0).ok());
    EXPECT_EQ(b.Read(), (std::vector<T>{T(9), T(8)}));
    DeviceBuffer<T> mine({T(6)});
    DeviceBuffer<T> all({T(0)});
    ASSERT_TRUE(comm.all_gather(mine.data(), all.data(), 1, type).ok());
    EXPECT_EQ(all.Read(), (std::vector<T>{T(6)}));
  };
  check(float{});
  check(double{});
  check(int32_t{});
  check(int64_t{});
  EXPECT_TRUE(comm.barrier().ok());
}

TEST(NcclCommunicator, CudaMeshOfThreeDimensionsWithAGlooDimension) {
  SKIP_WITHOUT_GPU();
  MeshOptions options;
  options.backend_override = {{"DP", "gloo"}};
  auto mesh = init_device_mesh("cuda", {1, 1, 1}, {"PP", "DP", "TP"}, options);
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  EXPECT_THAT(mesh->ToString(), ::testing::HasSubstr("backend=nccl [dim 1:gloo]"));
  EXPECT_EQ((*mesh->get_group("TP"))->backend(), "nccl");
  EXPECT_EQ((*mesh->get_group("PP"))->backend(), "nccl");
  EXPECT_EQ((*mesh->get_group("DP"))->backend(), "gloo");
  std::vector<float> host = {1.5f};
  ASSERT_TRUE((*mesh->get_group("DP"))->all_reduce(absl::MakeSpan(host),
                                                   ReduceOp::kSum).ok());
  EXPECT_EQ(host[0], 1.5f);
}

#endif  // VEMESH_HAVE_NCCL

}  // namespace
}  // namespace vemesh
