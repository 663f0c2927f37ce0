// DetectLaunch: which launcher started the process, from its variables, and
// a clear error naming a bad variable.

#include "vemesh/bootstrap/launch.h"

#include <cstdlib>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace vemesh {
namespace {

using ::testing::HasSubstr;

// Clears every variable DetectLaunch reads, then sets the given ones.
class LaunchEnv : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* name :
         {"OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "PMIX_RANK",
          "PMI_RANK", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
          "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_USE_AGENT_STORE",
          "TORCHELASTIC_RUN_ID", "VEMESH_BOOTSTRAP", "SLURM_LOCALID",
          "OMPI_COMM_WORLD_LOCAL_RANK"}) {
      unsetenv(name);
    }
  }
  void Torchrun(const char* rank, const char* size) {
    setenv("RANK", rank, 1);
    setenv("WORLD_SIZE", size, 1);
    setenv("LOCAL_RANK", rank, 1);
    setenv("LOCAL_WORLD_SIZE", size, 1);
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    setenv("MASTER_PORT", "29500", 1);
  }
};

TEST_F(LaunchEnv, NothingSetIsOneProcess) {
  auto info = DetectLaunch();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->kind, LaunchKind::kNone);
  EXPECT_EQ(LauncherRank(), 0);
  EXPECT_EQ(LauncherLocalRank(), -1);
}

TEST_F(LaunchEnv, TorchrunVariablesAreEnv) {
  Torchrun("3", "4");
  setenv("TORCHELASTIC_USE_AGENT_STORE", "False", 1);
  auto info = DetectLaunch();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->kind, LaunchKind::kEnv);
  EXPECT_EQ(info->rank, 3);
  EXPECT_EQ(info->world_size, 4);
  EXPECT_EQ(info->local_rank, 3);
  EXPECT_EQ(info->master_addr, "127.0.0.1");
  EXPECT_EQ(info->master_port, 29500);
  EXPECT_THAT(info->reason, HasSubstr("RANK/WORLD_SIZE"));
  EXPECT_EQ(LauncherRank(), 3);
  EXPECT_EQ(LauncherLocalRank(), 3);
}

TEST_F(LaunchEnv, MpirunWinsOverEnvVariables) {
  Torchrun("1", "2");
  setenv("OMPI_COMM_WORLD_SIZE", "2", 1);
  auto info = DetectLaunch();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->kind, LaunchKind::kMpi);
  EXPECT_THAT(info->reason, HasSubstr("OMPI_COMM_WORLD_SIZE"));
}

TEST_F(LaunchEnv, SrunPmixIsMpiAndForcingEnvOverridesIt) {
  setenv("PMIX_RANK", "0", 1);
  auto info = DetectLaunch();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->kind, LaunchKind::kMpi);
  Torchrun("0", "1");
  setenv("VEMESH_BOOTSTRAP", "env", 1);
  info = DetectLaunch();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->kind, LaunchKind::kEnv);
}

TEST_F(LaunchEnv, BadVariablesAreNamed) {
  struct Case {
    const char* name;
    const char* value;
    const char* expect;
  };
  const std::vector<Case> cases = {
      {"RANK", "4", "RANK='4': expected an integer in [0, 3]"},
      {"RANK", "x", "RANK='x'"},
      {"WORLD_SIZE", "0", "WORLD_SIZE='0': expected an integer in [1, "},
      {"MASTER_PORT", "70000", "MASTER_PORT='70000'"},
      {"LOCAL_RANK", "9", "LOCAL_RANK='9'"},
      {"VEMESH_BOOTSTRAP", "ssh", "VEMESH_BOOTSTRAP='ssh': expected 'mpi' or 'env'"},
  };
  for (const Case& c : cases) {
    SetUp();
    Torchrun("0", "4");
    setenv(c.name, c.value, 1);
    auto info = DetectLaunch();
    EXPECT_TRUE(absl::IsInvalidArgument(info.status())) << c.name;
    EXPECT_THAT(std::string(info.status().message()), HasSubstr(c.expect));
  }
  SetUp();
  Torchrun("0", "4");
  unsetenv("MASTER_ADDR");
  auto info = DetectLaunch();
  EXPECT_THAT(std::string(info.status().message()),
              HasSubstr("MASTER_ADDR is not set"));
}

TEST_F(LaunchEnv, AnAgentHostedStoreIsRefusedSayingSo) {
  Torchrun("0", "2");
  setenv("TORCHELASTIC_USE_AGENT_STORE", "True", 1);
  auto info = DetectLaunch();
  EXPECT_TRUE(absl::IsFailedPrecondition(info.status())) << info.status();
  EXPECT_THAT(std::string(info.status().message()),
              HasSubstr("TORCHELASTIC_USE_AGENT_STORE=True"));
}

TEST(LocalAddress, LoopbackReachesLoopback) {
  auto address = LocalAddressTowards("127.0.0.1");
  ASSERT_TRUE(address.ok()) << address.status();
  EXPECT_EQ(*address, "127.0.0.1");
  // (No unresolvable-name case: resolving one would send a DNS query off
  // this machine.)
  EXPECT_TRUE(IsLoopback("127.0.0.1"));
  EXPECT_TRUE(IsLoopback("localhost"));
  EXPECT_FALSE(IsLoopback("10.0.0.1"));  // numeric: no lookup, no packet
}

}  // namespace
}  // namespace vemesh
