// VESCALE_DEVICE_MESH on real communicators with 4 or 8 ranks: MPI under
// mpiexec, Gloo under torchrun and the env:// spawner (tests/launch/). Every
// answer is compared with arithmetic done here (registry_expectations.h) and,
// for communicators, with real traffic.
#include <mpi.h>

#include <numeric>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "job_world.h"
#include "registry_expectations.h"
#include "vemesh/bootstrap/launch.h"
#include "vemesh/registry/ve_device_mesh.h"

namespace vemesh {
namespace {

using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;
using vemesh::testing::RowMajor;

int WorldRank() { return vemesh::testing::JobRank(); }
int WorldSize() { return vemesh::testing::JobSize(); }

std::vector<int64_t> V(const Coordinate& c) { return {c.begin(), c.end()}; }
std::vector<int64_t> V(absl::Span<const int> ranks) {
  return {ranks.begin(), ranks.end()};
}

struct Case {
  std::vector<int64_t> shape;
  std::vector<std::string> names;
};

// The meshes each world size is tested on (the list).
std::vector<Case> CasesFor(int world) {
  if (world == 8) {
    return {{{2, 2, 2}, {"PP", "DP", "TP"}},
            {{4, 1, 2}, {"PP", "DP", "TP"}},
            {{2, 1, 4}, {"PP", "DP", "TP"}},
            {{4, 2}, {"DP", "TP"}},
            {{2, 2, 1, 2}, {"PP", "DP", "EP", "TP"}},
            {{2, 2, 2}, {"PP", "EP", "TP"}}};
  }
  return {{{2, 2}, {"DP", "TP"}},
          {{4}, {"PP"}},
          {{4}, {"DP"}},
          {{4}, {"TP"}},
          {{4}, {"EP"}},
          {{2, 2}, {"PP", "TP"}},
          {{2, 1, 2, 1}, {"PP", "DP", "EP", "TP"}}};
}

// The communicator's members are `expected`, and real traffic agrees: an
// all_gather of the global ranks returns them in the same order.
void ExpectGroup(const std::shared_ptr<Communicator>& comm,
                 const std::vector<int64_t>& expected) {
  ASSERT_NE(comm, nullptr);
  EXPECT_EQ(V(comm->ranks()), expected);
  std::vector<int64_t> gathered(comm->size());
  const int64_t me = WorldRank();
  ASSERT_TRUE(
      comm->all_gather(absl::MakeConstSpan(&me, 1), absl::MakeSpan(gathered))
          .ok());
  EXPECT_EQ(gathered, expected);
}

// Role `role` as the registry should see it: the named dimension, or for a
// 1-D mesh named neither DP nor TP, that dimension for DP and TP.
int64_t RoleDim(const RowMajor& m, const std::string& role) {
  int64_t d = m.dim(role);
  if (d < 0 && m.names().size() == 1 && (role == "DP" || role == "TP") &&
      m.names()[0] != "PP" && m.names()[0] != "DP" && m.names()[0] != "TP") {
    d = 0;
  }
  return d;
}

void CheckEveryMethod(const Case& c) {
  SCOPED_TRACE(absl::StrCat("mesh [", absl::StrJoin(c.shape, ","), "] names [",
                            absl::StrJoin(c.names, ","), "]"));
  VeDeviceMesh& reg = VESCALE_DEVICE_MESH;
  auto mesh = reg.init_device_mesh("cpu", c.shape, c.names);
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  const RowMajor m(c.shape, c.names);
  const int64_t me = WorldRank();
  const std::vector<int64_t> my = m.coord(me);

  EXPECT_EQ(*reg.size(), m.size());
  EXPECT_EQ(*reg.ndim(), static_cast<int64_t>(c.shape.size()));
  EXPECT_EQ(*reg.shape(), c.shape);
  EXPECT_EQ(*reg.mesh_dim_names(), c.names);
  EXPECT_EQ(*reg.get_rank(), me);
  EXPECT_EQ(V(*reg.get_strategy_coordinate()), my);
  EXPECT_EQ(V(*reg.get_coordinate()), my);
  // The host-local rank is what the launcher says (mpirun, torchrun; also
  // across hosts, tests/multihost), else the world rank (one host).
  const int launcher_local = vemesh::LauncherLocalRank().rank;
  EXPECT_EQ(*reg.get_local_rank(), launcher_local >= 0 ? launcher_local : me);
  for (int64_t q = 0; q < m.size(); ++q) {
    EXPECT_EQ(V(*reg.get_strategy_coordinate(q)), m.coord(q)) << "rank " << q;
    EXPECT_EQ(*reg.get_global_rank(m.coord(q)), q);
  }
  for (size_t d = 0; d < c.shape.size(); ++d) {
    const std::string& name = c.names[d];
    SCOPED_TRACE(name);
    EXPECT_EQ(*reg.get_strategy_size(name), c.shape[d]);
    EXPECT_EQ(*reg.get_strategy_size(static_cast<int64_t>(d)), c.shape[d]);
    EXPECT_EQ(*reg.size(name), c.shape[d]);
    EXPECT_EQ(*reg.lookup_rank(name), my[d]);
    EXPECT_EQ(*reg.lookup_rank(static_cast<int64_t>(d)), my[d]);
    auto sub = reg[name];
    ASSERT_TRUE(sub.ok()) << sub.status();
    EXPECT_EQ(sub->mesh(), m.group(me, d));
    ExpectGroup(*sub->get_group(0), m.group(me, d));
  }

  for (const std::string role : {"PP", "DP", "TP", "EP"}) {
    SCOPED_TRACE(role);
    const int64_t d = RoleDim(m, role);
    if (d < 0) {
      EXPECT_EQ(*reg.get_role_size(role), 1);
      EXPECT_EQ(*reg.get_role_rank(role), 0);
      EXPECT_EQ(reg.get_role_mesh(role).status().code(),
                absl::StatusCode::kNotFound);
      EXPECT_THAT(std::string(reg.get_role_dim_groups(role).status().message()),
                  HasSubstr(role));
      continue;
    }
    EXPECT_EQ(*reg.get_role_size(role), c.shape[d]);
    EXPECT_EQ(*reg.get_role_rank(role), my[d]);
    EXPECT_EQ(reg.get_role_mesh(role)->mesh(), m.group(me, d));
    ExpectGroup(*reg.get_role_dim_groups(role), m.group(me, d));
    auto all = reg.get_global_role_meshes(role);
    ASSERT_TRUE(all.ok());
    const auto groups = m.all_groups(d);
    ASSERT_EQ(all->size(), groups.size());
    for (size_t g = 0; g < groups.size(); ++g) {
      EXPECT_EQ((*all)[g].mesh(), groups[g]);
    }
  }

  // veScale's role getters are the by-name ones.
  const int64_t pp = m.dim("PP"), dp = RoleDim(m, "DP"), tp = RoleDim(m, "TP");
  EXPECT_EQ(*reg.get_pipeline_parallel_rank(), pp < 0 ? 0 : my[pp]);
  EXPECT_EQ(*reg.get_data_parallel_rank(), dp < 0 ? 0 : my[dp]);
  EXPECT_EQ(*reg.get_tensor_parallel_rank(), tp < 0 ? 0 : my[tp]);
  if (pp >= 0) {
    EXPECT_EQ(reg.get_pipeline_parallel_mesh()->mesh(), m.group(me, pp));
    ExpectGroup(*reg.get_pipeline_parallel_dim_groups(), m.group(me, pp));
  }
  if (dp >= 0) {
    EXPECT_EQ(reg.get_data_parallel_mesh()->mesh(), m.group(me, dp));
    ExpectGroup(*reg.get_data_parallel_dim_groups(), m.group(me, dp));
  }
  if (tp >= 0) {
    EXPECT_EQ(reg.get_tensor_parallel_mesh()->mesh(), m.group(me, tp));
    ExpectGroup(*reg.get_tensor_parallel_dim_groups(), m.group(me, tp));
    auto rows = reg.get_global_tensor_parallel_meshes();
    ASSERT_TRUE(rows.ok());
    EXPECT_EQ(rows->size(), m.all_groups(tp).size());
  }

  // Pipeline: stages are the slabs along PP; neighbours hold my position.
  const int64_t stages = pp < 0 ? 1 : c.shape[pp];
  const int64_t stage = pp < 0 ? 0 : my[pp];
  EXPECT_EQ(*reg.is_first_stage(), stage == 0);
  EXPECT_EQ(*reg.is_last_stage(), stage == stages - 1);
  auto stage_meshes = reg.get_global_pipeline_parallel_meshes();
  ASSERT_TRUE(stage_meshes.ok()) << stage_meshes.status();
  ASSERT_EQ(static_cast<int64_t>(stage_meshes->size()), stages);
  for (int64_t s = 0; s < stages; ++s) {
    std::vector<int64_t> expected(m.size());
    std::iota(expected.begin(), expected.end(), 0);
    if (pp >= 0) expected = m.slab(pp, s);
    if (pp >= 0 && c.shape.size() == 1) continue;  // one-rank stage meshes
    EXPECT_EQ((*stage_meshes)[s].mesh(), expected) << "stage " << s;
  }
  for (int64_t shift : {-1, +1}) {
    auto peer =
        shift < 0 ? reg.get_prev_stage_peer() : reg.get_next_stage_peer();
    auto neighbour = shift < 0 ? reg.get_prev_stage() : reg.get_next_stage();
    ASSERT_TRUE(peer.ok() && neighbour.ok());
    const int64_t target = stage + shift;
    if (target < 0 || target >= stages) {
      EXPECT_FALSE(peer->has_value());
      EXPECT_FALSE(neighbour->has_value());
    } else {
      std::vector<int64_t> at = my;
      at[pp] = target;
      EXPECT_EQ(**peer, m.rank(at));
      EXPECT_EQ((*neighbour)->peer, m.rank(at));
      EXPECT_EQ((*neighbour)->stage, target);
      if (c.shape.size() > 1) {
        EXPECT_EQ((*neighbour)->mesh.mesh(), m.slab(pp, target));
      }
    }
    // Wrap-around always has a neighbour.
    auto wrapped = shift < 0 ? reg.get_prev_stage_peer(true)
                             : reg.get_next_stage_peer(true);
    ASSERT_TRUE(wrapped.ok() && wrapped->has_value());
    std::vector<int64_t> at = my;
    if (pp >= 0) at[pp] = ((stage + shift) % stages + stages) % stages;
    EXPECT_EQ(**wrapped, m.rank(at));
  }
}

TEST(RegistryMpiTest, EveryMethodOnEveryShape) {
  for (const Case& c : CasesFor(WorldSize())) {
    CheckEveryMethod(c);
    if (::testing::Test::HasFatalFailure()) return;
  }
  VESCALE_DEVICE_MESH.reset();
}

// Worked by hand. (2,2,2): rank r is at [r/4, (r/2)%2, r%2]. Rank 5 is at
// [1,0,1]; its TP mesh is [4,5], DP mesh [5,7], PP group [1,5]; it is on the
// last stage and its previous-stage peer is rank 1.
TEST(RegistryMpiTest, WorkedExample222) {
  if (WorldSize() != 8) {
    // (2,2) on 4 ranks: rank 3 is at [1,1]; TP [2,3], DP [1,3].
    auto mesh = VESCALE_DEVICE_MESH.init_device_mesh("cpu", {2, 2});
    ASSERT_TRUE(mesh.ok()) << mesh.status();
    if (WorldRank() == 3) {
      EXPECT_THAT(V(*VESCALE_DEVICE_MESH.get_strategy_coordinate()),
                  ElementsAre(1, 1));
      EXPECT_THAT(VESCALE_DEVICE_MESH.get_tensor_parallel_mesh()->mesh(),
                  ElementsAre(2, 3));
      EXPECT_THAT(VESCALE_DEVICE_MESH.get_data_parallel_mesh()->mesh(),
                  ElementsAre(1, 3));
      EXPECT_TRUE(*VESCALE_DEVICE_MESH.is_first_stage());
      EXPECT_TRUE(*VESCALE_DEVICE_MESH.is_last_stage());
    }
    return;
  }
  auto mesh = VESCALE_DEVICE_MESH.init_device_mesh("cpu", {2, 2, 2},
                                                   {"PP", "DP", "TP"});
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  EXPECT_THAT(V(*VESCALE_DEVICE_MESH.get_strategy_coordinate(5)),
              ElementsAre(1, 0, 1));
  EXPECT_EQ(*VESCALE_DEVICE_MESH.get_global_rank({1, 0, 1}), 5);
  if (WorldRank() != 5) return;
  EXPECT_THAT(V(*VESCALE_DEVICE_MESH.get_strategy_coordinate()),
              ElementsAre(1, 0, 1));
  EXPECT_THAT(VESCALE_DEVICE_MESH.get_tensor_parallel_mesh()->mesh(),
              ElementsAre(4, 5));
  EXPECT_THAT(VESCALE_DEVICE_MESH.get_data_parallel_mesh()->mesh(),
              ElementsAre(5, 7));
  EXPECT_THAT(
      V((*VESCALE_DEVICE_MESH.get_pipeline_parallel_dim_groups())->ranks()),
      ElementsAre(1, 5));
  EXPECT_THAT(
      V((*VESCALE_DEVICE_MESH.get_tensor_parallel_dim_groups())->ranks()),
      ElementsAre(4, 5));
  EXPECT_EQ(**VESCALE_DEVICE_MESH.get_prev_stage_peer(), 1);
  EXPECT_FALSE(VESCALE_DEVICE_MESH.get_next_stage_peer()->has_value());
  EXPECT_EQ(**VESCALE_DEVICE_MESH.get_next_stage_peer(/*wrap=*/true), 1);
  auto prev = VESCALE_DEVICE_MESH.get_prev_stage();
  ASSERT_TRUE(prev.ok() && prev->has_value());
  EXPECT_EQ((*prev)->stage, 0);
  EXPECT_THAT((*prev)->mesh.mesh(), ElementsAre(0, 1, 2, 3));
  EXPECT_FALSE(*VESCALE_DEVICE_MESH.is_first_stage());
  EXPECT_TRUE(*VESCALE_DEVICE_MESH.is_last_stage());
  EXPECT_EQ(*VESCALE_DEVICE_MESH.get_pipeline_parallel_rank(), 1);
  EXPECT_EQ(*VESCALE_DEVICE_MESH.get_data_parallel_rank(), 0);
  EXPECT_EQ(*VESCALE_DEVICE_MESH.get_tensor_parallel_rank(), 1);
}

// Lower-case names on real communicators: every role getter matches its
// dimension (before: TP rank 0 and size 1 on every rank, silently).
TEST(RegistryMpiTest, LowerCaseNamesPlayTheirRoles) {
  const int world = WorldSize();
  const int64_t me = WorldRank();
  VeDeviceMesh& reg = VESCALE_DEVICE_MESH;
  // 4 ranks: dp=2 x tp=2; 8 ranks: pp=2 x dp=2 x tp=2. Row-major by hand.
  const int64_t pp_size = world / 4, dp_size = 2, tp_size = 2;
  const std::vector<int64_t> shape =
      world == 8 ? std::vector<int64_t>{2, 2, 2} : std::vector<int64_t>{2, 2};
  const std::vector<std::string> names =
      world == 8 ? std::vector<std::string>{"pp", "dp", "tp"}
                 : std::vector<std::string>{"dp", "tp"};
  ASSERT_TRUE(reg.init_device_mesh("cpu", shape, names).ok());
  const int64_t tp = me % tp_size, dp = (me / tp_size) % dp_size,
                pp = me / (tp_size * dp_size);
  EXPECT_EQ(*reg.get_tensor_parallel_rank(), tp);
  EXPECT_EQ(*reg.get_data_parallel_rank(), dp);
  EXPECT_EQ(*reg.get_pipeline_parallel_rank(), pp);
  EXPECT_EQ(*reg.get_role_size("TP"), tp_size);
  EXPECT_EQ(*reg.get_role_size("tp"), tp_size);
  EXPECT_EQ(*reg.get_role_size("DP"), dp_size);
  EXPECT_EQ(*reg.get_role_size("PP"), pp_size);
  const int64_t base = me - tp;  // first rank of my TP row
  ExpectGroup(*reg.get_tensor_parallel_dim_groups(), {base, base + 1});
  const int64_t dp0 = me - dp * tp_size;
  ExpectGroup(*reg.get_data_parallel_dim_groups(), {dp0, dp0 + tp_size});
  EXPECT_EQ(*reg.is_last_stage(), pp == pp_size - 1);
  EXPECT_EQ(*reg.is_first_stage(), pp == 0);
  reg.reset();
}

TEST(RegistryMpiTest, ReinitReplacesAndOldMeshesStayUsable) {
  const int world = WorldSize();
  auto first =
      VESCALE_DEVICE_MESH.init_device_mesh("cpu", {2, world / 2}, {"DP", "TP"});
  ASSERT_TRUE(first.ok()) << first.status();
  auto old_tp = VESCALE_DEVICE_MESH.get_tensor_parallel_dim_groups();
  ASSERT_TRUE(old_tp.ok());
  auto second = VESCALE_DEVICE_MESH.init_device_mesh("cpu", {world}, {"TP"});
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(*VESCALE_DEVICE_MESH.get_strategy_size("TP"), world);
  EXPECT_FALSE(VESCALE_DEVICE_MESH.is_current(*first));
  EXPECT_TRUE(VESCALE_DEVICE_MESH.is_current(*second));
  EXPECT_EQ(VESCALE_DEVICE_MESH.check_current(*first).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(VESCALE_DEVICE_MESH.check_current(*first).message()),
              HasSubstr("stale"));
  // The old communicator is still alive and still talks.
  int64_t one = 1;
  ASSERT_TRUE(
      (*old_tp)->all_reduce(absl::MakeSpan(&one, 1), ReduceOp::kSum).ok());
  EXPECT_EQ(one, world / 2);
  // check_uniqueness refuses a second init and leaves the mesh alone.
  InitOptions unique;
  unique.check_uniqueness = true;
  auto third =
      VESCALE_DEVICE_MESH.init_device_mesh("cpu", {2, world / 2}, {}, unique);
  EXPECT_EQ(third.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(*VESCALE_DEVICE_MESH.get_strategy_size("TP"), world);
  VESCALE_DEVICE_MESH.reset();
  EXPECT_EQ(VESCALE_DEVICE_MESH.get_strategy_size("TP").status().code(),
            absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace vemesh
