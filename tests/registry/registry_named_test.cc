// Issue 45: several named meshes in one registry, over 8 and 16 ranks. An
// attention mesh (the default one) and an expert mesh of another
// factorisation over the same ranks: every getter on both against the
// row-major arithmetic (registry_expectations.h) and real traffic; a role
// only the other mesh has is an error, never the default's answer; shared
// communicators counted (LiveCommunicatorCount); one mesh reset or replaced
// while the other keeps working.
#include <mpi.h>

#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "job_world.h"
#include "registry_expectations.h"
#include "vemesh/registry/ve_device_mesh.h"

namespace vemesh {
namespace {

using ::testing::HasSubstr;
using vemesh::testing::RowMajor;

int WorldRank() { return vemesh::testing::JobRank(); }
int WorldSize() { return vemesh::testing::JobSize(); }

std::vector<int64_t> V(absl::Span<const int64_t> c) {
  return {c.begin(), c.end()};
}
std::vector<int64_t> V(absl::Span<const int> ranks) {
  return {ranks.begin(), ranks.end()};
}

struct Fold {
  std::vector<int64_t> attention;  // PP, DP, CP, TP
  std::vector<int64_t> experts;    // PP, EDP, EP, ETP
};
const std::vector<std::string> kAttention = {"PP", "DP", "CP", "TP"};
const std::vector<std::string> kExperts = {"PP", "EDP", "EP", "ETP"};

Fold FoldFor(int world) {
  if (world == 16) return {{2, 2, 2, 2}, {2, 2, 4, 1}};
  return {{2, 2, 1, 2}, {2, 1, 4, 1}};
}

// The members are `expected`, and an all_gather of the global ranks agrees.
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

// Every getter of mesh `name` against the arithmetic of `m`.
void CheckEveryGetter(const RowMajor& m, MeshName name) {
  SCOPED_TRACE(absl::StrCat("mesh '", name.name, "' [",
                            absl::StrJoin(m.shape(), ","), "]"));
  VeDeviceMesh& reg = VESCALE_DEVICE_MESH;
  const int64_t me = WorldRank();
  const std::vector<int64_t> my = m.coord(me);
  EXPECT_EQ(*reg.size(name), m.size());
  EXPECT_EQ(*reg.ndim(name), static_cast<int64_t>(m.shape().size()));
  EXPECT_EQ(*reg.shape(name), m.shape());
  EXPECT_EQ(*reg.mesh_dim_names(name), m.names());
  EXPECT_EQ(*reg.get_rank(name), me);
  EXPECT_EQ(V(*reg.get_strategy_coordinate(name)), my);
  EXPECT_EQ(V(*reg.get_coordinate(name)), my);
  EXPECT_EQ(*reg.device_type(name), DeviceType::kCpu);
  EXPECT_EQ(reg.get(name)->shape(), m.shape());
  for (int64_t q = 0; q < m.size(); ++q) {
    EXPECT_EQ(V(*reg.get_strategy_coordinate(q, name)), m.coord(q));
    EXPECT_EQ(*reg.get_global_rank(m.coord(q), name), q);
  }
  for (size_t d = 0; d < m.shape().size(); ++d) {
    const std::string& dim = m.names()[d];
    SCOPED_TRACE(dim);
    EXPECT_EQ(*reg.get_strategy_size(dim, name), m.shape()[d]);
    EXPECT_EQ(*reg.size(static_cast<int64_t>(d), name), m.shape()[d]);
    EXPECT_EQ(*reg.lookup_rank(dim, name), my[d]);
    EXPECT_EQ(*reg.get_role_size(dim, name), m.shape()[d]);
    EXPECT_EQ(*reg.get_role_rank(dim, name), my[d]);
    EXPECT_EQ(reg.get_role_mesh(dim, name)->mesh(), m.group(me, d));
    ExpectGroup(*reg.get_role_dim_groups(dim, name), m.group(me, d));
    auto all = reg.get_global_role_meshes(dim, name);
    ASSERT_TRUE(all.ok()) << all.status();
    std::vector<std::vector<int64_t>> got;
    for (const DeviceMesh& g : *all) got.push_back(g.mesh());
    EXPECT_EQ(got, m.all_groups(d));
    auto sub = reg.get_submesh({dim}, name);
    ASSERT_TRUE(sub.ok()) << sub.status();
    EXPECT_EQ(sub->mesh(), m.group(me, d));
  }
  // PP: ranks, stages and neighbours.
  const int64_t pp = my[0], stages = m.shape()[0];
  EXPECT_EQ(*reg.get_pipeline_parallel_rank(name), pp);
  EXPECT_EQ(*reg.is_first_stage(name), pp == 0);
  EXPECT_EQ(*reg.is_last_stage(name), pp == stages - 1);
  EXPECT_EQ(reg.get_global_pipeline_parallel_meshes(name)->size(),
            static_cast<size_t>(stages));
  std::vector<int64_t> next = my;
  next[0] = (pp + 1) % stages;
  EXPECT_EQ(*reg.get_next_stage_peer(/*wrap=*/true, name), m.rank(next));
  auto neighbour = reg.get_next_stage(/*wrap=*/true, name);
  ASSERT_TRUE(neighbour.ok() && neighbour->has_value());
  EXPECT_EQ((*neighbour)->stage, next[0]);
  EXPECT_EQ((*neighbour)->peer, m.rank(next));
  std::vector<int64_t> prev = my;
  prev[0] = (pp + stages - 1) % stages;
  EXPECT_EQ(*reg.get_prev_stage_peer(/*wrap=*/true, name), m.rank(prev));
}

// Distinct communicators of every dimension of both meshes.
size_t DistinctGroups() {
  std::set<const Communicator*> seen;
  for (MeshName name : {MeshName(), MeshName("experts")}) {
    auto groups = VESCALE_DEVICE_MESH.get(name)->get_all_groups();
    EXPECT_TRUE(groups.ok()) << groups.status();
    if (!groups.ok()) continue;
    for (const auto& g : *groups) seen.insert(g.get());
  }
  return seen.size();
}

class NamedMeshTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (WorldSize() != 8 && WorldSize() != 16) {
      GTEST_SKIP() << "runs on 8 or 16 ranks";
    }
    fold_ = FoldFor(WorldSize());
  }
  void TearDown() override { VESCALE_DEVICE_MESH.reset_all(); }
  absl::Status InitBoth() {
    auto a = VESCALE_DEVICE_MESH.init_device_mesh("cpu", fold_.attention,
                                                  kAttention);
    if (!a.ok()) return a.status();
    InitOptions o;
    o.mesh_name = "experts";
    return VESCALE_DEVICE_MESH
        .init_device_mesh("cpu", fold_.experts, kExperts, o)
        .status();
  }
  Fold fold_;
};

TEST_F(NamedMeshTest, EveryGetterOnBothMeshes) {
  ASSERT_TRUE(InitBoth().ok());
  CheckEveryGetter(RowMajor(fold_.attention, kAttention), MeshName());
  CheckEveryGetter(RowMajor(fold_.experts, kExperts), MeshName("experts"));
  EXPECT_EQ(VESCALE_DEVICE_MESH.mesh_names(),
            std::vector<std::string>{"experts"});
}

TEST_F(NamedMeshTest, ARoleOfTheOtherMeshIsAnError) {
  ASSERT_TRUE(InitBoth().ok());
  VeDeviceMesh& reg = VESCALE_DEVICE_MESH;
  // EP only in 'experts': no getter answers it from the default mesh
  // (before issue 45 get_role_size was 1 and get_role_rank 0).
  for (const absl::Status& s :
       {reg.get_role_size("EP").status(), reg.get_role_rank("EP").status(),
        reg.get_role_mesh("EDP").status(),
        reg.get_role_dim_groups("EP").status(),
        reg.get_global_role_meshes("ETP").status(),
        reg.get_strategy_size("EP").status(), reg.lookup_rank("EP").status(),
        reg["EP"].status()}) {
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
    EXPECT_THAT(s.message(), HasSubstr("'experts'"));
  }
  // And the other way: DP, TP and CP only in the default mesh.
  const MeshName experts("experts");
  for (const absl::Status& s :
       {reg.get_data_parallel_rank(experts).status(),
        reg.get_tensor_parallel_dim_groups(experts).status(),
        reg.get_role_size("CP", experts).status()}) {
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
    EXPECT_THAT(s.message(), HasSubstr("default mesh"));
  }
  // A role neither has keeps veScale's answer: size 1, rank 0.
  EXPECT_EQ(*reg.get_role_size("SP"), 1);
  EXPECT_EQ(*reg.get_role_rank("SP", experts), 0);
  // A name no mesh has names those that exist.
  auto missing = reg.get_role_size("EP", MeshName("expert"));
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("[default, experts]"));
  InitOptions o;
  o.mesh_name = "default";
  EXPECT_EQ(
      reg.init_device_mesh("cpu", fold_.experts, kExperts, o).status().code(),
      absl::StatusCode::kInvalidArgument);
}

TEST_F(NamedMeshTest, SharedCommunicatorsAreCounted) {
  auto a =
      VESCALE_DEVICE_MESH.init_device_mesh("cpu", fold_.attention, kAttention);
  ASSERT_TRUE(a.ok()) << a.status();
  const int64_t before = LiveCommunicatorCount();
  InitOptions o;
  o.mesh_name = "experts";
  ASSERT_TRUE(
      VESCALE_DEVICE_MESH.init_device_mesh("cpu", fold_.experts, kExperts, o)
          .ok());
  // 8 ranks: PP is shared by rank set, EDP and ETP (groups of one) are
  // CP's rank sets; only EP (DP x CP x TP of a stage) is new. 16 ranks:
  // PP and EDP (= DP) shared; EP (CP x TP) and ETP (singletons) new.
  const int64_t made = WorldSize() == 16 ? 2 : 1;
  EXPECT_EQ(LiveCommunicatorCount() - before, made);
  EXPECT_EQ(DistinctGroups(), 4 + static_cast<size_t>(made));
  EXPECT_EQ(VESCALE_DEVICE_MESH.get_role_dim_groups("PP")->get(),
            VESCALE_DEVICE_MESH.get_role_dim_groups("PP", MeshName("experts"))
                ->get());
  if (WorldSize() == 16) {
    EXPECT_EQ(
        VESCALE_DEVICE_MESH.get_data_parallel_dim_groups()->get(),
        VESCALE_DEVICE_MESH.get_role_dim_groups("EDP", MeshName("experts"))
            ->get());
  }
}

TEST_F(NamedMeshTest, AFlatteningIsSharedByRankSet) {
  // The attention mesh's flattening of everything but PP spans the ranks
  // of the expert mesh's EP (and, on 16 ranks, CP x TP those of EP): the
  // expert mesh makes no communicator for it.
  auto a =
      VESCALE_DEVICE_MESH.init_device_mesh("cpu", fold_.attention, kAttention);
  ASSERT_TRUE(a.ok());
  const std::vector<std::string> dims =
      WorldSize() == 16 ? std::vector<std::string>{"CP", "TP"}
                        : std::vector<std::string>{"DP", "CP", "TP"};
  auto flat = a->flatten(dims, "EP_LIKE");
  ASSERT_TRUE(flat.ok()) << flat.status();
  const int64_t before = LiveCommunicatorCount();
  InitOptions o;
  o.mesh_name = "experts";
  ASSERT_TRUE(
      VESCALE_DEVICE_MESH.init_device_mesh("cpu", fold_.experts, kExperts, o)
          .ok());
  EXPECT_EQ(LiveCommunicatorCount() - before, WorldSize() == 16 ? 1 : 0);
  EXPECT_EQ(
      VESCALE_DEVICE_MESH.get_role_dim_groups("EP", MeshName("experts"))->get(),
      flat->get());
}

TEST_F(NamedMeshTest, ResetOrReplaceOneMeshLeavesTheOther) {
  ASSERT_TRUE(InitBoth().ok());
  VeDeviceMesh& reg = VESCALE_DEVICE_MESH;
  const RowMajor attention(fold_.attention, kAttention);
  const RowMajor experts(fold_.experts, kExperts);
  const int64_t me = WorldRank();
  reg.reset(MeshName("experts"));
  EXPECT_FALSE(reg.is_initialized(MeshName("experts")));
  EXPECT_EQ(reg.get_role_size("EP", MeshName("experts")).status().code(),
            absl::StatusCode::kNotFound);
  // The default mesh's groups, PP shared with the experts', still work.
  ExpectGroup(*reg.get_pipeline_parallel_dim_groups(), attention.group(me, 0));
  ExpectGroup(*reg.get_tensor_parallel_dim_groups(), attention.group(me, 3));
  // Again, then the default mesh reset: the experts' groups still work.
  InitOptions o;
  o.mesh_name = "experts";
  ASSERT_TRUE(reg.init_device_mesh("cpu", fold_.experts, kExperts, o).ok());
  reg.reset();
  EXPECT_FALSE(reg.is_initialized());
  ExpectGroup(*reg.get_role_dim_groups("EP", MeshName("experts")),
              experts.group(me, 2));
  ExpectGroup(*reg.get_pipeline_parallel_dim_groups(MeshName("experts")),
              experts.group(me, 0));
  // Replaced under its name by another factorisation (PP x EP): the
  // getters follow it; check_uniqueness refuses a second one.
  const std::vector<int64_t> flat = {2, WorldSize() / 2};
  ASSERT_TRUE(reg.init_device_mesh("cpu", flat, {"PP", "EP"}, o).ok());
  const RowMajor replaced(flat, {"PP", "EP"});
  ExpectGroup(*reg.get_role_dim_groups("EP", MeshName("experts")),
              replaced.group(me, 1));
  o.check_uniqueness = true;
  EXPECT_EQ(reg.init_device_mesh("cpu", flat, {"PP", "EP"}, o).status().code(),
            absl::StatusCode::kAlreadyExists);
}

TEST_F(NamedMeshTest, ANamedMeshIsNeverElastic) {
  InitOptions o;
  o.mesh_name = "experts";
  o.elastic = ElasticOptions{};
  auto r =
      VESCALE_DEVICE_MESH.init_device_mesh("cpu", fold_.experts, kExperts, o);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("changes membership"));
  // Nor is the default mesh, beside a named one: refused before anything
  // starts, and both meshes stay.
  ASSERT_TRUE(InitBoth().ok());
  InitOptions elastic;
  elastic.elastic = ElasticOptions{};
  auto e = VESCALE_DEVICE_MESH.init_device_mesh("cpu", fold_.attention,
                                                kAttention, elastic);
  EXPECT_EQ(e.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(e.status().message(), HasSubstr("[experts]"));
  EXPECT_TRUE(VESCALE_DEVICE_MESH.is_initialized());
  EXPECT_TRUE(VESCALE_DEVICE_MESH.is_initialized(MeshName("experts")));
}

}  // namespace
}  // namespace vemesh
