// What a mesh's creation says at start-up: one warning (through the log
// sink, from world rank 0) when the mesh covers part of the world, none
// when it covers all of it; VEMESH_INIT_TIMEOUT read when MeshOptions
// leaves the timeout unset, a bad value refused on every rank before any
// communication, a timeout set in code preferred. Runs under mpiexec (2, 4).

#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "job_world.h"
#include "vemesh/base/log.h"
#include "vemesh/mesh/device_mesh.h"

namespace vemesh {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using vemesh::testing::JobRank;
using vemesh::testing::JobSize;

std::vector<std::string> WarningsOfCreating(std::vector<int64_t> shape,
                                            std::vector<std::string> names) {
  std::vector<std::string> warnings;
  set_log_sink([&](LogLevel level, absl::string_view text) {
    if (level == LogLevel::kWarning) warnings.emplace_back(text);
  });
  auto mesh = init_device_mesh("cpu", shape, names);
  set_log_sink(nullptr);
  EXPECT_TRUE(mesh.ok()) << mesh.status();
  return warnings;
}

TEST(MeshStart, PartOfTheWorldWarnsOnceOnRankZero) {
  const int n = JobSize();
  // {n/2, 1}: a {2, 2} typed for {2, 4}, in small.
  const auto warnings = WarningsOfCreating({n / 2, 1}, {"DP", "TP"});
  if (JobRank() == 0) {
    EXPECT_THAT(warnings, ElementsAre(HasSubstr(absl::StrCat(
                              "covers ", n / 2, " of the world's ", n,
                              " ranks; the other ", n - n / 2,
                              " are outside it (was the shape meant to "
                              "multiply to ",
                              n, "?)"))));
  } else {
    EXPECT_THAT(warnings, IsEmpty());
  }
  EXPECT_THAT(WarningsOfCreating({n}, {"DP"}), IsEmpty());
}

TEST(MeshStart, InitTimeoutVariableIsReadWhenTheTimeoutIsUnset) {
  setenv("VEMESH_INIT_TIMEOUT", "later", 1);
  auto refused = init_device_mesh("cpu", {JobSize()}, {"DP"});
  EXPECT_TRUE(absl::IsInvalidArgument(refused.status())) << refused.status();
  EXPECT_THAT(std::string(refused.status().message()),
              HasSubstr("VEMESH_INIT_TIMEOUT='later'"));
  // Set in code: the variable is not read.
  MeshOptions options;
  options.timeout = absl::Seconds(30);
  auto mesh = init_device_mesh("cpu", {JobSize()}, {"DP"}, options);
  EXPECT_TRUE(mesh.ok()) << mesh.status();
  setenv("VEMESH_INIT_TIMEOUT", "20", 1);
  auto by_variable = init_device_mesh("cpu", {JobSize()}, {"DP"});
  EXPECT_TRUE(by_variable.ok()) << by_variable.status();
  unsetenv("VEMESH_INIT_TIMEOUT");
}

}  // namespace
}  // namespace vemesh
