// get_placement() and the placement warning on real MPI worlds of 4 and 8
// ranks. Each rank names its host through VEMESH_HOST_ID (what the host
// identity reads before the hostname), so one machine plays block and
// cyclic placements over 2 hosts; the answers are checked against counts
// done here from the same names. The emulated-host tests (tests/multihost/)
// check the same on real network namespaces.
#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "job_world.h"
#include "vemesh/base/log.h"
#include "vemesh/registry/ve_device_mesh.h"

namespace vemesh {
namespace {

using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::SizeIs;

int WorldRank() { return vemesh::testing::JobRank(); }
int WorldSize() { return vemesh::testing::JobSize(); }

std::string HostName(int rank, bool cyclic) {
  const int n = WorldSize();
  return "host" + std::to_string(cyclic ? rank % 2 : rank / (n / 2));
}

// Collects what vemesh logs while alive.
class CapturedLog {
 public:
  CapturedLog() {
    set_log_sink([this](LogLevel, absl::string_view text) {
      std::lock_guard<std::mutex> lock(mu_);
      lines_.emplace_back(text);
    });
  }
  ~CapturedLog() { set_log_sink(nullptr); }
  std::vector<std::string> lines() {
    std::lock_guard<std::mutex> lock(mu_);
    return lines_;
  }

 private:
  std::mutex mu_;
  std::vector<std::string> lines_;
};

std::vector<std::string> WithSubstr(const std::vector<std::string>& lines,
                                    absl::string_view part) {
  std::vector<std::string> out;
  for (const std::string& l : lines) {
    if (absl::StrContains(l, part)) out.push_back(l);
  }
  return out;
}

class PlacementMpiTest : public ::testing::TestWithParam<bool> {
 protected:
  void TearDown() override {
    VESCALE_DEVICE_MESH.reset();
    unsetenv("VEMESH_HOST_ID");
  }
};

TEST_P(PlacementMpiTest, PlacementAndWarningFollowTheHosts) {
  const bool cyclic = GetParam();
  const int n = WorldSize();
  const int me = WorldRank();
  ASSERT_EQ(setenv("VEMESH_HOST_ID", HostName(me, cyclic).c_str(), 1), 0);
  CapturedLog log;
  const std::vector<int64_t> shape = {2, n / 4, 2};
  auto mesh =
      VESCALE_DEVICE_MESH.init_device_mesh("cpu", shape, {"PP", "DP", "TP"});
  ASSERT_TRUE(mesh.ok()) << mesh.status();

  auto p = VESCALE_DEVICE_MESH.get_placement();
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_EQ(p->world_size, n);
  ASSERT_THAT(p->hosts, SizeIs(2));
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(p->hosts[p->host_of(r)], HostName(r, cyclic)) << "rank " << r;
  }
  // Host-local rank and host size from the same names.
  int local = 0;
  for (int r = 0; r < me; ++r)
    local += HostName(r, cyclic) == HostName(me, cyclic);
  EXPECT_EQ(*VESCALE_DEVICE_MESH.get_local_rank(), local);
  EXPECT_EQ(mesh->host_size(), n / 2);
  // Crossing groups counted from the groups' members.
  for (const std::string dim : {"PP", "DP", "TP"}) {
    auto groups = mesh->layout().groups({dim});
    ASSERT_TRUE(groups.ok());
    int64_t crossing = 0;
    for (const auto& g : *groups) {
      bool crosses = false;
      for (int64_t r : g)
        crosses |= HostName(r, cyclic) != HostName(g[0], cyclic);
      crossing += crosses;
    }
    EXPECT_EQ(p->dim(dim)->crossing_groups, crossing) << dim;
  }
  EXPECT_EQ(p->dim("TP")->crossing_groups, cyclic ? n / 2 : 0);

  // Rank 0 alone warns, once, and only when TP crosses hosts.
  const auto warnings = WithSubstr(log.lines(), "latency-sensitive");
  if (cyclic && me == 0) {
    ASSERT_THAT(warnings, SizeIs(1));
    EXPECT_THAT(warnings[0], HasSubstr("TP is latency-sensitive"));
  } else {
    EXPECT_THAT(warnings, IsEmpty());
  }
}

INSTANTIATE_TEST_SUITE_P(BlockAndCyclic, PlacementMpiTest, ::testing::Bool(),
                         [](const auto& info) {
                           return std::string(info.param ? "Cyclic" : "Block");
                         });

TEST(PlacementRolesMpiTest, TheRoleListChoosesWhatWarns) {
  const int n = WorldSize();
  const int me = WorldRank();
  // Block placement over 2 hosts with DP innermost and TP outermost: every
  // TP group crosses, DP stays inside.
  ASSERT_EQ(setenv("VEMESH_HOST_ID", HostName(me, false).c_str(), 1), 0);
  for (const bool tp_listed : {false, true}) {
    CapturedLog log;
    InitOptions options;
    options.mesh.latency_sensitive_dims =
        tp_listed ? std::vector<std::string>{"dp", "tp"}
                  : std::vector<std::string>{"DP"};
    auto mesh = VESCALE_DEVICE_MESH.init_device_mesh("cpu", {2, n / 2},
                                                     {"TP", "DP"}, options);
    ASSERT_TRUE(mesh.ok()) << mesh.status();
    const auto warnings = WithSubstr(log.lines(), "latency-sensitive");
    if (tp_listed && me == 0) {
      ASSERT_THAT(warnings, SizeIs(1));
      EXPECT_THAT(warnings[0],
                  HasSubstr("make TP the innermost (last) dimension"));
    } else {
      EXPECT_THAT(warnings, IsEmpty());
    }
  }
  VESCALE_DEVICE_MESH.reset();
  unsetenv("VEMESH_HOST_ID");
}

TEST(PlacementStateMpiTest, BeforeInitAndOnMetaMeshesIsFailedPrecondition) {
  VESCALE_DEVICE_MESH.reset();
  EXPECT_EQ(VESCALE_DEVICE_MESH.get_placement().status().code(),
            absl::StatusCode::kFailedPrecondition);
  auto meta =
      VESCALE_DEVICE_MESH.init_device_mesh("meta", {WorldSize()}, {"DP"});
  ASSERT_TRUE(meta.ok());
  auto p = VESCALE_DEVICE_MESH.get_placement();
  EXPECT_EQ(p.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(p.status().message(), HasSubstr("meta mesh runs nowhere"));
  VESCALE_DEVICE_MESH.reset();
}

}  // namespace
}  // namespace vemesh
