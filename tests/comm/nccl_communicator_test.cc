// The NCCL backend on one rank and one GPU: creation, split, every
// operation for every data type (values computed on the host), the
// asynchronous forms on a caller's stream, and abort. A one-rank NCCL group
// is valid, so each operation's result is known on the host: the rank's own
// block, moved out of place into a buffer that starts as a sentinel.
// Without a GPU (or without NCCL in the build) every test skips and says
// why.

#include "vemesh/comm/nccl/nccl_communicator.h"

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "vemesh/comm/gloo/gloo_communicator.h"
#include "vemesh/comm/mpi/mpi_communicator.h"
#include "vemesh/mesh/device_mesh.h"
#include "vemesh/rendezvous/memory_store.h"

#ifdef VEMESH_HAVE_NCCL
#include <cuda_runtime.h>
#endif

namespace vemesh {
namespace {

#define SKIP_WITHOUT_GPU()                                       \
  do {                                                           \
    absl::StatusOr<int> gpus = CudaDeviceCount();                \
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
    ASSERT_TRUE(
        comm.send_recv(in.data(), 2, 0, out.data(), 2, 0, DataType::kFloat64)
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
  ASSERT_TRUE((*tp)
                  ->all_reduce(x.data(), x.data(), 1, DataType::kFloat32,
                               ReduceOp::kSum)
                  .ok());
  EXPECT_EQ(x.Read(), (std::vector<float>{2.f}));
  auto flat = mesh->flatten({"DP", "TP"});
  ASSERT_TRUE(flat.ok()) << flat.status();
  EXPECT_EQ((*flat)->size(), 1);
  EXPECT_THAT(mesh->ToString(),
              ::testing::HasSubstr(
                  "backend=nccl (device type cuda; unique id over the "));
  std::printf("vemesh: %s\n", mesh->ToString().c_str());
}

// A one-rank NCCL communicator over a one-rank Gloo twin (no MPI needed).
absl::StatusOr<std::shared_ptr<Communicator>> OneRankNccl() {
  auto store = std::make_shared<MemoryStore>();
  auto twin =
      GlooCommunicator::Create(store, "nccl-one", 0, 1, {0}, absl::Seconds(30));
  if (!twin.ok()) return twin.status();
  return CreateNcclCommunicator(*twin, 0);
}

template <typename T>
double AsDouble(T v) {
  if constexpr (std::is_same_v<T, BFloat16> || std::is_same_v<T, Float16>) {
    return static_cast<float>(v);
  } else {
    return static_cast<double>(v);
  }
}

template <typename T>
std::vector<double> AsDoubles(const std::vector<T>& values) {
  std::vector<double> out;
  for (const T& v : values) out.push_back(AsDouble(v));
  return out;
}

// Small integers, exact in every type (int8 and bfloat16 included).
template <typename T>
std::vector<T> Ramp(size_t n, int first) {
  std::vector<T> out;
  for (size_t i = 0; i < n; ++i) {
    out.push_back(T(static_cast<float>(first + static_cast<int>(i))));
  }
  return out;
}

// Every operation of one data type on a one-rank group. Each result is
// written out of place into a buffer of sentinels, so an operation that did
// nothing fails.
template <typename T>
void EveryOperation(Communicator& comm) {
  const DataType type = DataTypeOf<T>();
  SCOPED_TRACE(std::string(DataTypeName(type)));
  const std::vector<T> in = Ramp<T>(4, 3);         // 3 4 5 6
  const std::vector<T> sentinel = Ramp<T>(4, 90);  // never an answer
  const std::vector<double> want = AsDoubles(in);
  std::vector<ReduceOp> reductions = {ReduceOp::kSum, ReduceOp::kProd,
                                      ReduceOp::kMin, ReduceOp::kMax};
  if (IsFloatingPoint(type)) reductions.push_back(ReduceOp::kAvg);
  for (ReduceOp op : reductions) {
    SCOPED_TRACE(std::string(ReduceOpName(op)));
    DeviceBuffer<T> send(in);
    DeviceBuffer<T> recv(sentinel);
    ASSERT_TRUE(comm.all_reduce(send.data(), recv.data(), 4, type, op).ok());
    EXPECT_EQ(AsDoubles(recv.Read()), want) << "all_reduce";
    DeviceBuffer<T> reduced(sentinel);
    ASSERT_TRUE(comm.reduce(send.data(), reduced.data(), 4, type, op, 0).ok());
    EXPECT_EQ(AsDoubles(reduced.Read()), want) << "reduce";
    DeviceBuffer<T> scattered(sentinel);
    ASSERT_TRUE(
        comm.reduce_scatter(send.data(), scattered.data(), 4, type, op).ok());
    EXPECT_EQ(AsDoubles(scattered.Read()), want) << "reduce_scatter";
    DeviceBuffer<T> scattered_v(sentinel);
    const std::vector<size_t> counts = {4};
    ASSERT_TRUE(
        comm.reduce_scatter_v(send.data(), scattered_v.data(), counts, type, op)
            .ok());
    EXPECT_EQ(AsDoubles(scattered_v.Read()), want) << "reduce_scatter_v";
    // In place: the answer overwrites the input.
    DeviceBuffer<T> same(in);
    ASSERT_TRUE(comm.all_reduce(same.data(), same.data(), 4, type, op).ok());
    EXPECT_EQ(AsDoubles(same.Read()), want) << "in-place all_reduce";
  }
  DeviceBuffer<T> send(in);
  {
    DeviceBuffer<T> data(in);
    ASSERT_TRUE(comm.broadcast(data.data(), 4, type, 0).ok());
    EXPECT_EQ(AsDoubles(data.Read()), want) << "broadcast";
  }
  auto moved = [&](absl::string_view what, auto run) {
    DeviceBuffer<T> recv(sentinel);
    absl::Status s = run(recv.data());
    ASSERT_TRUE(s.ok()) << what << ": " << s;
    EXPECT_EQ(AsDoubles(recv.Read()), want) << what;
  };
  const std::vector<size_t> four = {4};
  moved("all_gather",
        [&](T* r) { return comm.all_gather(send.data(), r, 4, type); });
  moved("all_gather_v",
        [&](T* r) { return comm.all_gather_v(send.data(), r, four, type); });
  moved("gather",
        [&](T* r) { return comm.gather(send.data(), r, 4, type, 0); });
  moved("scatter",
        [&](T* r) { return comm.scatter(send.data(), r, 4, type, 0); });
  moved("all_to_all",
        [&](T* r) { return comm.all_to_all(send.data(), r, 4, type); });
  moved("all_to_all_v", [&](T* r) {
    return comm.all_to_all_v(send.data(), four, r, four, type);
  });
  moved("send_recv with oneself",
        [&](T* r) { return comm.send_recv(send.data(), 4, 0, r, 4, 0, type); });
  moved("batch_send_recv", [&](T* r) {
    const std::vector<P2POp> ops = {P2POp::Send(send.data(), 4, type, 0),
                                    P2POp::Recv(r, 4, type, 0)};
    return comm.batch_send_recv(ops);
  });
  // Zero-count blocks are skipped: nothing is written.
  {
    DeviceBuffer<T> untouched(sentinel);
    const std::vector<size_t> none = {0};
    ASSERT_TRUE(
        comm.all_to_all_v(send.data(), none, untouched.data(), none, type)
            .ok());
    EXPECT_EQ(AsDoubles(untouched.Read()), AsDoubles(sentinel));
  }
  EXPECT_TRUE(comm.barrier().ok());
}

TEST(NcclCommunicator, OneRankEveryOperationAndDataType) {
  SKIP_WITHOUT_GPU();
  auto nccl = OneRankNccl();
  ASSERT_TRUE(nccl.ok()) << nccl.status();
  Communicator& comm = **nccl;
  EveryOperation<float>(comm);
  EveryOperation<double>(comm);
  EveryOperation<int32_t>(comm);
  EveryOperation<int64_t>(comm);
  EveryOperation<BFloat16>(comm);
  EveryOperation<Float16>(comm);
  EveryOperation<int8_t>(comm);
  EveryOperation<uint8_t>(comm);
}

// The asynchronous forms enqueue on the caller's stream: once the Work is
// done, that stream has nothing left, and the result is there.
TEST(NcclCommunicator, AsyncFormsOnACallersStream) {
  SKIP_WITHOUT_GPU();
  auto nccl = OneRankNccl();
  ASSERT_TRUE(nccl.ok()) << nccl.status();
  Communicator& comm = **nccl;
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
            cudaSuccess);
  AsyncOptions options;
  options.stream = stream;
  {
    DeviceBuffer<float> send({1.5f, 2.5f});
    DeviceBuffer<float> recv({0.f, 0.f});
    auto work = comm.iall_reduce(send.data(), recv.data(), 2,
                                 DataType::kFloat32, ReduceOp::kAvg, options);
    ASSERT_TRUE(work.ok()) << work.status();
    absl::Status s = (*work)->wait(absl::Now() + absl::Seconds(60));
    ASSERT_TRUE(s.ok()) << s;
    EXPECT_TRUE((*work)->is_completed());
    EXPECT_EQ(cudaStreamQuery(stream), cudaSuccess);
    EXPECT_EQ(recv.Read(), (std::vector<float>{1.5f, 2.5f}));

    DeviceBuffer<int64_t> gathered({0, 0, 0});
    DeviceBuffer<int64_t> mine({7, 8, 9});
    const std::vector<size_t> counts = {3};
    auto gather = comm.iall_gather_v(mine.data(), gathered.data(), counts,
                                     DataType::kInt64, options);
    ASSERT_TRUE(gather.ok()) << gather.status();
    ASSERT_TRUE((*gather)->wait(absl::Now() + absl::Seconds(60)).ok());
    EXPECT_EQ(gathered.Read(), (std::vector<int64_t>{7, 8, 9}));
  }
  // The blocking form waits as well (no stream synchronisation needed).
  DeviceBuffer<double> x({4.0});
  ASSERT_TRUE(comm.all_reduce(x.data(), x.data(), 1, DataType::kFloat64,
                              ReduceOp::kProd)
                  .ok());
  EXPECT_EQ(x.Read(), (std::vector<double>{4.0}));
  EXPECT_EQ(cudaStreamDestroy(stream), cudaSuccess);
}

// After abort() (here from another thread) an unfinished handle answers
// Aborted, later operations are refused, and the NCCL handle is gone.
TEST(NcclCommunicator, AbortEndsHandlesAndLaterOperations) {
  SKIP_WITHOUT_GPU();
  const int64_t before = LiveCommunicatorCount();
  {
    auto nccl = OneRankNccl();
    ASSERT_TRUE(nccl.ok()) << nccl.status();
    Communicator& comm = **nccl;
    DeviceBuffer<float> x({1.f, 2.f});
    auto work = comm.iall_reduce(x.data(), x.data(), 2, DataType::kFloat32,
                                 ReduceOp::kSum);
    ASSERT_TRUE(work.ok()) << work.status();
    std::thread aborter([&] { comm.abort("test aborts"); });
    aborter.join();
    EXPECT_TRUE(comm.aborted());
    absl::Status s = (*work)->wait(absl::Now() + absl::Seconds(60));
    EXPECT_TRUE(absl::IsAborted(s)) << s;
    EXPECT_THAT(s.message(), ::testing::HasSubstr("test aborts"));
    absl::Status later = comm.barrier();
    EXPECT_TRUE(absl::IsAborted(later)) << later;
    EXPECT_EQ(comm.native_handle().handle, nullptr);
    auto child = comm.split(0, 0);
    EXPECT_FALSE(child.ok());
  }
  EXPECT_EQ(LiveCommunicatorCount(), before);
}

// A receive from oneself that no send matches never completes: the wait
// ends at its deadline and the communicator is aborted (ncclCommAbort stops
// the kernel), instead of hanging.
TEST(NcclCommunicator, UnmatchedReceiveEndsAtTheDeadline) {
  SKIP_WITHOUT_GPU();
  auto nccl = OneRankNccl();
  ASSERT_TRUE(nccl.ok()) << nccl.status();
  Communicator& comm = **nccl;
  comm.set_timeout(absl::Seconds(5));
  DeviceBuffer<int32_t> x({0});
  const auto start = std::chrono::steady_clock::now();
  absl::Status s = comm.recv(x.data(), 1, DataType::kInt32, 0);
  const auto took = std::chrono::steady_clock::now() - start;
  EXPECT_FALSE(s.ok());
  EXPECT_LT(took, std::chrono::seconds(60));
  if (absl::IsDeadlineExceeded(s)) {
    EXPECT_TRUE(comm.aborted());
  }
  std::printf("unmatched recv from oneself: %s\n", s.ToString().c_str());
}

TEST(NcclCommunicator, CudaMeshOfThreeDimensionsWithAGlooDimension) {
  SKIP_WITHOUT_GPU();
  MeshOptions options;
  options.backend_override = {{"DP", "gloo"}};
  auto mesh = init_device_mesh("cuda", {1, 1, 1}, {"PP", "DP", "TP"}, options);
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  EXPECT_THAT(mesh->ToString(),
              ::testing::HasSubstr("backend=nccl [dim 1:gloo]"));
  EXPECT_EQ((*mesh->get_group("TP"))->backend(), "nccl");
  EXPECT_EQ((*mesh->get_group("PP"))->backend(), "nccl");
  EXPECT_EQ((*mesh->get_group("DP"))->backend(), "gloo");
  std::vector<float> host = {1.5f};
  ASSERT_TRUE((*mesh->get_group("DP"))
                  ->all_reduce(absl::MakeSpan(host), ReduceOp::kSum)
                  .ok());
  EXPECT_EQ(host[0], 1.5f);
}

#endif  // VEMESH_HAVE_NCCL

}  // namespace
}  // namespace vemesh
