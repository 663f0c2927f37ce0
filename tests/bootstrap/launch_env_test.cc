// DetectLaunch: which launcher started the process, from its variables, and
// a clear error naming a bad variable. LauncherLocalRank: the host-local rank
// the launcher gave, the variable that said it, and SLURM_LOCALID trusted only
// for a task of its own step; the cross-check's warning through the log sink.

#include "vemesh/bootstrap/launch.h"

#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "vemesh/base/log.h"
#include "vemesh/bootstrap/rank0_store.h"
#include "vemesh/bootstrap/store_bootstrap.h"
#include "vemesh/mesh/device_mesh.h"
#include "vemesh/rendezvous/memory_store.h"

namespace vemesh {
namespace {

using ::testing::HasSubstr;

// Clears every variable DetectLaunch reads, then sets the given ones.
class LaunchEnv : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* name : {"OMPI_COMM_WORLD_SIZE",
                             "OMPI_COMM_WORLD_RANK",
                             "PMIX_RANK",
                             "PMI_RANK",
                             "RANK",
                             "WORLD_SIZE",
                             "LOCAL_RANK",
                             "LOCAL_WORLD_SIZE",
                             "MASTER_ADDR",
                             "MASTER_PORT",
                             "TORCHELASTIC_USE_AGENT_STORE",
                             "TORCHELASTIC_RUN_ID",
                             "VEMESH_BOOTSTRAP",
                             "SLURM_LOCALID",
                             "OMPI_COMM_WORLD_LOCAL_RANK",
                             "SLURM_PROCID",
                             "VEMESH_STORE_TOKEN",
                             "VEMESH_STORE_TOKEN_FILE",
                             "OMPI_MCA_orte_precondition_transports",
                             "VEMESH_JOB_ID",
                             "SLURM_JOB_ID"}) {
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
  EXPECT_EQ(LauncherLocalRank().rank, -1);
  EXPECT_EQ(LauncherLocalRank().variable, nullptr);
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
  EXPECT_EQ(LauncherLocalRank().rank, 3);
  EXPECT_STREQ(LauncherLocalRank().variable, "LOCAL_RANK");
}

TEST_F(LaunchEnv, TheStoreTokenComesFromTheLaunchersPerRunSecret) {
  Torchrun("1", "2");
  // No secret anywhere: no token (rank 0 warns when it hosts the store).
  auto info = DetectLaunch();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->store_token, "");
  // A run id the user chose ("none", a job name) is no secret.
  setenv("TORCHELASTIC_RUN_ID", "my-job", 1);
  EXPECT_EQ(DetectLaunch()->store_token, "");
  // torchrun --standalone's random run id: a token derived from it, the
  // same on every rank, not the id itself.
  setenv("TORCHELASTIC_RUN_ID", "0f8fad5b-d9cb-469f-a165-70867728950e", 1);
  info = DetectLaunch();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->store_token_source, "TORCHELASTIC_RUN_ID");
  EXPECT_EQ(info->store_token.size(), 64u);
  EXPECT_THAT(info->store_token, ::testing::Not(HasSubstr("0f8fad5b")));
  EXPECT_EQ(DetectLaunch()->store_token, info->store_token);
  // Open MPI's per-job key, when torchrun's id is not there.
  unsetenv("TORCHELASTIC_RUN_ID");
  setenv("OMPI_MCA_orte_precondition_transports",
         "6fa6ebddf7cca36b-63089d117ddc0d55", 1);
  info = DetectLaunch();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->store_token_source, "OMPI_MCA_orte_precondition_transports");
  EXPECT_EQ(info->store_token.size(), 64u);
  // An explicit token wins.
  setenv("VEMESH_STORE_TOKEN", "chosen", 1);
  info = DetectLaunch();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->store_token, "chosen");
  EXPECT_EQ(info->store_token_source, "VEMESH_STORE_TOKEN");
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
      {"VEMESH_BOOTSTRAP", "ssh",
       "VEMESH_BOOTSTRAP='ssh': expected 'mpi' or 'env'"},
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

// Issue 29: WORLD_SIZE past the store's bound passed the launch check and
// failed later about store keys; LOCAL_RANK=-3 or abc passed silently when
// LOCAL_WORLD_SIZE was unset (promise 17); an unresolvable MASTER_ADDR
// waited the whole timeout.
TEST_F(LaunchEnv, TheLaunchCheckNamesWorldSizeLocalRankAndMasterAddr) {
  Torchrun("0", "4");
  setenv("WORLD_SIZE", "65537", 1);
  auto info = DetectLaunch();
  EXPECT_TRUE(absl::IsInvalidArgument(info.status())) << info.status();
  EXPECT_THAT(std::string(info.status().message()),
              HasSubstr("WORLD_SIZE='65537': expected an integer in [1, "
                        "65536]"));
  setenv("WORLD_SIZE", "65536", 1);
  EXPECT_TRUE(DetectLaunch().ok());

  for (const char* bad : {"-3", "abc", "4"}) {
    SetUp();
    Torchrun("0", "4");
    unsetenv("LOCAL_WORLD_SIZE");
    setenv("LOCAL_RANK", bad, 1);
    info = DetectLaunch();
    EXPECT_TRUE(absl::IsInvalidArgument(info.status())) << bad;
    EXPECT_THAT(std::string(info.status().message()),
                HasSubstr(absl::StrCat("LOCAL_RANK='", bad, "'")));
  }

  SetUp();
  Torchrun("0", "4");
  setenv("MASTER_ADDR", "no-such-host.invalid", 1);
  const absl::Time start = absl::Now();
  info = DetectLaunch();
  EXPECT_TRUE(absl::IsInvalidArgument(info.status())) << info.status();
  EXPECT_THAT(std::string(info.status().message()),
              HasSubstr("MASTER_ADDR='no-such-host.invalid' does not resolve"));
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));

  SetUp();
  Torchrun("0", "4");
  setenv("MASTER_ADDR", "::1", 1);
  info = DetectLaunch();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->master_addr, "::1");
  auto towards = LocalAddressTowards("::1");
  ASSERT_TRUE(towards.ok()) << towards.status();
  EXPECT_EQ(*towards, "::1");
  EXPECT_TRUE(IsLoopback("::1"));
}

TEST(StoreLimits, ReadFromTheEnvironmentAndBadOnesNamed) {
  setenv("VEMESH_STORE_MAX_CONNECTIONS", "300", 1);
  setenv("VEMESH_STORE_IDLE_TIMEOUT", "90s", 1);
  setenv("VEMESH_STORE_MAX_BYTES", "1048576", 1);
  auto options = StoreServerOptionsFromEnv();
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->max_connections, 300u);
  EXPECT_EQ(options->idle_timeout, absl::Seconds(90));
  EXPECT_EQ(options->max_total_bytes, 1048576u);
  setenv("VEMESH_STORE_MAX_BYTES", "-1", 1);
  EXPECT_THAT(std::string(StoreServerOptionsFromEnv().status().message()),
              HasSubstr("VEMESH_STORE_MAX_BYTES='-1'"));
  unsetenv("VEMESH_STORE_MAX_BYTES");
  setenv("VEMESH_STORE_IDLE_TIMEOUT", "inf", 1);
  EXPECT_THAT(std::string(StoreServerOptionsFromEnv().status().message()),
              HasSubstr("VEMESH_STORE_IDLE_TIMEOUT='inf'"));
  for (const char* name :
       {"VEMESH_STORE_MAX_CONNECTIONS", "VEMESH_STORE_IDLE_TIMEOUT"}) {
    unsetenv(name);
  }
  options = StoreServerOptionsFromEnv();
  ASSERT_TRUE(options.ok());
  EXPECT_EQ(options->max_total_bytes, TcpStoreServerOptions().max_total_bytes);
}

TEST_F(LaunchEnv, AnAgentHostedStoreIsRefusedSayingSo) {
  Torchrun("0", "2");
  setenv("TORCHELASTIC_USE_AGENT_STORE", "True", 1);
  auto info = DetectLaunch();
  EXPECT_TRUE(absl::IsFailedPrecondition(info.status())) << info.status();
  EXPECT_THAT(std::string(info.status().message()),
              HasSubstr("TORCHELASTIC_USE_AGENT_STORE=True"));
  // It says exactly when torchrun leaves the store to rank 0.
  EXPECT_THAT(std::string(info.status().message()),
              HasSubstr("--standalone or --rdzv_backend=c10d"));
}

// -- LauncherLocalRank
// ----------------------------------------------------------

TEST_F(LaunchEnv, MpirunsLocalRankWinsOverTheDaemonsSlurmStep) {
  // salloc + mpirun: Open MPI's daemons are one srun step, one task per
  // host, so its ranks inherit SLURM_LOCALID=0 and the host's SLURM_PROCID.
  setenv("OMPI_COMM_WORLD_SIZE", "8", 1);
  setenv("OMPI_COMM_WORLD_RANK", "5", 1);
  setenv("OMPI_COMM_WORLD_LOCAL_RANK", "1", 1);
  setenv("PMIX_RANK", "5", 1);
  setenv("SLURM_PROCID", "1", 1);
  setenv("SLURM_LOCALID", "0", 1);
  EXPECT_EQ(LauncherLocalRank().rank, 1);
  EXPECT_STREQ(LauncherLocalRank().variable, "OMPI_COMM_WORLD_LOCAL_RANK");
  // An Open MPI that set no local rank: the daemon's SLURM_LOCALID is still
  // not this rank's, even where SLURM_PROCID happens to equal the rank.
  unsetenv("OMPI_COMM_WORLD_LOCAL_RANK");
  setenv("SLURM_PROCID", "5", 1);
  EXPECT_EQ(LauncherLocalRank().rank, -1);
  EXPECT_EQ(LauncherLocalRank().variable, nullptr);
}

TEST_F(LaunchEnv, SlurmLocalIdOfThisProcessStepCounts) {
  // srun --mpi=pmix: each rank is a task of the step.
  setenv("PMIX_RANK", "6", 1);
  setenv("SLURM_PROCID", "6", 1);
  setenv("SLURM_LOCALID", "2", 1);
  EXPECT_EQ(LauncherLocalRank().rank, 2);
  EXPECT_STREQ(LauncherLocalRank().variable, "SLURM_LOCALID");
  // srun --mpi=pmi2.
  unsetenv("PMIX_RANK");
  setenv("PMI_RANK", "6", 1);
  EXPECT_EQ(LauncherLocalRank().rank, 2);
  // An env:// job started by srun with RANK from SLURM_PROCID.
  unsetenv("PMI_RANK");
  setenv("RANK", "6", 1);
  EXPECT_EQ(LauncherLocalRank().rank, 2);
}

TEST_F(LaunchEnv, SlurmLocalIdOfAnotherStepIsIgnored) {
  // A launcher that starts its ranks from its own srun step (another MPI's
  // mpirun under salloc): the step's task is the daemon, not this rank.
  setenv("PMI_RANK", "5", 1);
  setenv("SLURM_PROCID", "1", 1);
  setenv("SLURM_LOCALID", "0", 1);
  EXPECT_EQ(LauncherLocalRank().rank, -1);
  // No launcher rank to check the step against.
  unsetenv("PMI_RANK");
  EXPECT_EQ(LauncherLocalRank().rank, -1);
  // No SLURM_PROCID at all.
  setenv("PMIX_RANK", "0", 1);
  unsetenv("SLURM_PROCID");
  EXPECT_EQ(LauncherLocalRank().rank, -1);
}

TEST_F(LaunchEnv, TorchrunsLocalRankWinsOverTheSrunStepAroundIt) {
  setenv("SLURM_PROCID", "0", 1);
  setenv("SLURM_LOCALID", "0", 1);
  setenv("LOCAL_RANK", "3", 1);
  setenv("RANK", "0", 1);
  EXPECT_EQ(LauncherLocalRank().rank, 3);
  EXPECT_STREQ(LauncherLocalRank().variable, "LOCAL_RANK");
}

// The cross-check at mesh creation: one rank over an in-process store, so
// its host identities say host-local rank 0; the launcher says otherwise.
std::vector<std::string> CreationWarnings() {
  std::vector<std::string> warnings;
  set_log_sink([&](LogLevel level, absl::string_view text) {
    if (level == LogLevel::kWarning) warnings.emplace_back(text);
  });
  MeshOptions options;
  options.timeout = absl::Seconds(30);
  options.bootstrap = std::make_shared<StoreBootstrap>(
      std::make_shared<MemoryStore>(), 0, 1, "job");
  auto mesh = init_device_mesh("cpu", {1}, {"DP"}, options);
  set_log_sink(nullptr);
  EXPECT_TRUE(mesh.ok()) << mesh.status();
  return warnings;
}

TEST_F(LaunchEnv, TheCrossCheckWarningNamesTheVariableThroughTheLogSink) {
  setenv("OMPI_COMM_WORLD_LOCAL_RANK", "2", 1);
  EXPECT_THAT(CreationWarnings(),
              ::testing::ElementsAre(HasSubstr(
                  "rank 0: OMPI_COMM_WORLD_LOCAL_RANK=2 says local rank 2 but "
                  "the host identities say 0; using 0")));
  unsetenv("OMPI_COMM_WORLD_LOCAL_RANK");
  setenv("PMIX_RANK", "0", 1);
  setenv("SLURM_PROCID", "0", 1);
  setenv("SLURM_LOCALID", "3", 1);
  EXPECT_THAT(CreationWarnings(),
              ::testing::ElementsAre(HasSubstr(
                  "SLURM_LOCALID=3 says local rank 3 but the host identities "
                  "say 0")));
  // The daemon step's SLURM_LOCALID (another SLURM_PROCID): no warning.
  setenv("SLURM_PROCID", "1", 1);
  EXPECT_THAT(CreationWarnings(), ::testing::IsEmpty());
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
