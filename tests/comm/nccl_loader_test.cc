// libnccl and libcudart are loaded at the first use, and a missing one is a
// clear Unavailable, never a crash or a link error. ctest runs this binary
// once per library, with VEMESH_NCCL_LIBRARY or VEMESH_CUDART_LIBRARY
// naming a file that does not exist (tests/comm/CMakeLists.txt): the
// variable is read once, at the first use, so each case is its own process.
// Without either variable every test skips.

#include <cstdlib>
#include <memory>
#include <optional>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "vemesh/bootstrap/store_bootstrap.h"
#include "vemesh/comm/gloo/gloo_communicator.h"
#include "vemesh/comm/nccl/cuda_device.h"
#include "vemesh/comm/nccl/internal/nccl_api.h"
#include "vemesh/comm/nccl/nccl_communicator.h"
#include "vemesh/layout/mesh_layout.h"
#include "vemesh/mesh/device_mesh.h"
#include "vemesh/rendezvous/memory_store.h"

namespace vemesh {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

// The variable this run set and the path it names.
struct Missing {
  std::string variable;
  std::string path;
};

std::optional<Missing> MissingLibrary() {
  for (const char* variable :
       {"VEMESH_NCCL_LIBRARY", "VEMESH_CUDART_LIBRARY"}) {
    const char* path = std::getenv(variable);
    if (path != nullptr && *path != '\0') return Missing{variable, path};
  }
  return std::nullopt;
}

#define SKIP_UNLESS_MISSING(missing)                               \
  std::optional<Missing> missing = MissingLibrary();               \
  if (!missing.has_value()) {                                      \
    GTEST_SKIP() << "run by ctest with VEMESH_NCCL_LIBRARY or "    \
                    "VEMESH_CUDART_LIBRARY naming a missing file"; \
  }

// What every entry point answers: Unavailable naming the path, the
// variable, dlerror()'s text and what to do.
void ExpectNamesTheLibrary(const absl::Status& status, const Missing& missing) {
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_THAT(std::string(status.message()),
              AllOf(HasSubstr("dlopen(\"" + missing.path + "\") failed"),
                    HasSubstr("cannot open shared object file"),
                    HasSubstr(missing.variable + " is set"),
                    HasSubstr("or set " + missing.variable)));
}

TEST(NcclLoader, CudaDeviceCountNamesTheMissingLibrary) {
  SKIP_UNLESS_MISSING(missing);
  auto count = CudaDeviceCount();
  ExpectNamesTheLibrary(count.status(), *missing);
  std::printf("vemesh: %s\n", count.status().ToString().c_str());
  // Asked again, the same answer (loaded once, not retried).
  EXPECT_EQ(CudaDeviceCount().status(), count.status());
  EXPECT_EQ(LoadNccl().status(), count.status());
  ExpectNamesTheLibrary(ChooseCudaDeviceHere({}).status(), *missing);
}

TEST(NcclLoader, TheUnboundEntriesAnswerErrors) {
  SKIP_UNLESS_MISSING(missing);
  const NcclApi& real = NcclApi::Real();
  if (missing->variable == "VEMESH_NCCL_LIBRARY") {
    ncclUniqueId id;
    EXPECT_EQ(real.ncclGetUniqueId(&id), ncclSystemError);
    EXPECT_THAT(real.ncclGetErrorString(ncclSystemError),
                HasSubstr("could not load"));
  } else {
    int n = -1;
    EXPECT_EQ(real.cudaGetDeviceCount(&n), cudaErrorSharedObjectInitFailed);
  }
}

TEST(NcclLoader, CreateNcclCommunicatorNamesTheMissingLibrary) {
  SKIP_UNLESS_MISSING(missing);
  auto store = std::make_shared<MemoryStore>();
  auto twin =
      GlooCommunicator::Create(store, "loader", 0, 1, {0}, absl::Seconds(30));
  ASSERT_TRUE(twin.ok()) << twin.status();
  auto nccl = CreateNcclCommunicator(*twin, CudaDeviceRequest{});
  ExpectNamesTheLibrary(nccl.status(), *missing);
}

TEST(NcclLoader, ACudaMeshNamesTheMissingLibrary) {
  SKIP_UNLESS_MISSING(missing);
  auto layout = MeshLayout::Create({1}, {"DP"});
  ASSERT_TRUE(layout.ok()) << layout.status();
  MeshOptions options;
  options.timeout = absl::Seconds(30);
  options.bootstrap = std::make_shared<StoreBootstrap>(
      std::make_shared<MemoryStore>(), 0, 1, "loader");
  auto mesh = DeviceMesh::Create(DeviceType::kCuda, *layout, options);
  ExpectNamesTheLibrary(mesh.status(), *missing);
  std::printf("vemesh: %s\n", mesh.status().ToString().c_str());
}

// A test's own table needs no library at all: LoadNccl() answers it, and
// the backend goes through it.
TEST(NcclLoader, AnInstalledTableNeedsNoLibrary) {
  SKIP_UNLESS_MISSING(missing);
  NcclApi fake = NcclApi::Real();
  fake.cudaGetDeviceCount = [](int* n) {
    *n = 3;
    return cudaSuccess;
  };
  {
    ScopedNcclApi installed(fake);
    auto api = LoadNccl();
    ASSERT_TRUE(api.ok()) << api.status();
    EXPECT_EQ(*api, &fake);
    auto count = CudaDeviceCount();
    ASSERT_TRUE(count.ok()) << count.status();
    EXPECT_EQ(*count, 3);
  }
  EXPECT_EQ(LoadNccl().status().code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace vemesh
