// VEMESH_INIT_TIMEOUT: what it accepts (seconds or a duration), what it
// refuses (with the variable, the value and what was expected), and
// LaunchSession under env:// (no MPI) checking it up front.

#include <cstdlib>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "vemesh/bootstrap/init_timeout.h"
#include "vemesh/bootstrap/launch_session.h"

namespace vemesh {
namespace {

using ::testing::HasSubstr;

TEST(InitTimeout, SecondsOrADuration) {
  EXPECT_EQ(*ParseInitTimeout("10"), absl::Seconds(10));
  EXPECT_EQ(*ParseInitTimeout("2.5"), absl::Milliseconds(2500));
  EXPECT_EQ(*ParseInitTimeout(" 90s "), absl::Seconds(90));
  EXPECT_EQ(*ParseInitTimeout("2m"), absl::Minutes(2));
  EXPECT_EQ(*ParseInitTimeout("86400"), absl::Hours(24));
}

TEST(InitTimeout, BadValuesNameTheVariable) {
  for (const char* bad : {"abc", "0", "-5", "0s", "nan", "inf", "86401", "25h",
                          "10 s", "", "1e400"}) {
    auto t = ParseInitTimeout(bad);
    ASSERT_FALSE(t.ok()) << bad;
    EXPECT_TRUE(absl::IsInvalidArgument(t.status())) << bad;
    EXPECT_THAT(std::string(t.status().message()),
                HasSubstr(absl::StrCat("VEMESH_INIT_TIMEOUT='", bad,
                                       "': expected a positive number of "
                                       "seconds")));
  }
}

TEST(InitTimeout, TheVariableOrTheBuiltinMinute) {
  unsetenv("VEMESH_INIT_TIMEOUT");
  EXPECT_EQ(*DefaultInitTimeout(), absl::Seconds(60));
  setenv("VEMESH_INIT_TIMEOUT", "", 1);  // empty: unset, as launch.h reads
  EXPECT_EQ(*DefaultInitTimeout(), absl::Seconds(60));
  setenv("VEMESH_INIT_TIMEOUT", "7", 1);
  EXPECT_EQ(*DefaultInitTimeout(), absl::Seconds(7));
  setenv("VEMESH_INIT_TIMEOUT", "soon", 1);
  EXPECT_THAT(std::string(DefaultInitTimeout().status().message()),
              HasSubstr("VEMESH_INIT_TIMEOUT='soon'"));
  unsetenv("VEMESH_INIT_TIMEOUT");
}

// Under env:// the session starts nothing MPI; a bad variable stops it
// before any communication, naming the variable.
TEST(LaunchSessionEnv, NoMpiUnderEnvAndBadTimeoutRefused) {
  setenv("RANK", "0", 1);
  setenv("WORLD_SIZE", "1", 1);
  setenv("MASTER_ADDR", "127.0.0.1", 1);
  setenv("MASTER_PORT", "29999", 1);
  setenv("VEMESH_INIT_TIMEOUT", "3", 1);
  {
    LaunchSession launch;
    EXPECT_TRUE(launch.status().ok()) << launch.status();
    EXPECT_EQ(launch.launch().kind, LaunchKind::kEnv);
    EXPECT_FALSE(launch.uses_mpi());
    EXPECT_EQ(launch.init_timeout(), absl::Seconds(3));
  }
  setenv("VEMESH_INIT_TIMEOUT", "3x", 1);
  {
    LaunchSession launch;
    EXPECT_TRUE(absl::IsInvalidArgument(launch.status()));
    EXPECT_THAT(std::string(launch.status().message()),
                HasSubstr("VEMESH_INIT_TIMEOUT='3x'"));
    EXPECT_FALSE(launch.uses_mpi());
  }
  setenv("VEMESH_INIT_TIMEOUT", "3", 1);
  setenv("WORLD_SIZE", "zero", 1);
  {
    LaunchSession launch;
    EXPECT_THAT(std::string(launch.status().message()),
                HasSubstr("WORLD_SIZE='zero'"));
  }
  for (const char* v : {"RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                        "VEMESH_INIT_TIMEOUT"}) {
    unsetenv(v);
  }
}

}  // namespace
}  // namespace vemesh
