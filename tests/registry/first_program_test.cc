// The first program a PyTorch / veScale user writes, compiled as written
// (issue 30): DeviceMesh's PyTorch spellings (get_rank, get_local_rank /
// get_group / size without a dimension on a 1-D mesh), communicator
// operations on std::vector, std::span, std::array and absl::Span (const
// where they only read) with their asynchronous forms, coordinates compared
// with std::vector, and the registry's view of flattened names. On 4 and 8
// ranks, mesh PP=2 x DP=world/4 x TP=2; every expectation is row-major
// arithmetic done here.
#include <mpi.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <memory>
#include <numeric>
#include <span>
#include <string>
#include <vector>

#include "absl/types/span.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "job_world.h"
#include "vemesh/registry/ve_device_mesh.h"

namespace vemesh {
namespace {

using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

int64_t Me() { return vemesh::testing::JobRank(); }
int64_t World() { return vemesh::testing::JobSize(); }
int64_t D() { return World() / 4; }  // the DP size

// Coordinates of PP=2 x DP=D x TP=2.
int64_t Pp(int64_t r) { return r / (2 * D()); }
int64_t Dp(int64_t r) { return (r / 2) % D(); }
int64_t Tp(int64_t r) { return r % 2; }

std::vector<int64_t> Ranks(const std::shared_ptr<Communicator>& c) {
  return {c->ranks().begin(), c->ranks().end()};
}

// EP = flatten(DP, TP): the ranks of this rank's stage, in order.
std::vector<int64_t> EpGroup(int64_t r) {
  std::vector<int64_t> out;
  for (int64_t i = 0; i < 2 * D(); ++i) out.push_back(Pp(r) * 2 * D() + i);
  return out;
}
// PT = flatten(PP, TP), not adjacent: row-major over (PP, TP), DP fixed.
std::vector<int64_t> PtGroup(int64_t r) {
  std::vector<int64_t> out;
  for (int64_t pp = 0; pp < 2; ++pp) {
    for (int64_t tp = 0; tp < 2; ++tp) {
      out.push_back(pp * 2 * D() + Dp(r) * 2 + tp);
    }
  }
  return out;
}

class FirstProgram : public ::testing::Test {
 protected:
  void SetUp() override {
    auto mesh = VESCALE_DEVICE_MESH.init_device_mesh("cpu", {2, D(), 2},
                                                     {"PP", "DP", "TP"});
    ASSERT_TRUE(mesh.ok()) << mesh.status();
    mesh_ = *mesh;
  }
  void TearDown() override { VESCALE_DEVICE_MESH.reset(); }

  DeviceMesh mesh_ = DeviceMesh::Meta(*MeshLayout::Create({1}, {"X"}), 0);
};

TEST_F(FirstProgram, PyTorchSpellingsCompileAndAnswer) {
  const int64_t me = Me();
  EXPECT_EQ(mesh_.get_rank(), me);
  // Coordinates compare with the vectors the API returns, both ways round.
  const Coordinate coord = *mesh_.get_coordinate();
  const std::vector<int64_t> expected = {Pp(me), Dp(me), Tp(me)};
  EXPECT_EQ(coord, expected);
  EXPECT_TRUE(expected == coord);
  EXPECT_FALSE(coord != expected);
  EXPECT_EQ(coord.to_vector(), expected);
  EXPECT_EQ(*VESCALE_DEVICE_MESH.get_strategy_coordinate(), expected);
  EXPECT_EQ(Coordinate(mesh_.shape()), (Coordinate{2, D(), 2}));

  // A 1-D mesh: no dimension needed.
  auto tp = mesh_["TP"];
  ASSERT_TRUE(tp.ok()) << tp.status();
  EXPECT_EQ(*tp->get_local_rank(), Tp(me));
  EXPECT_EQ(tp->size(), 2);
  auto group = tp->get_group();
  ASSERT_TRUE(group.ok()) << group.status();
  EXPECT_EQ((*group)->size(), 2);
  // Not on a 3-D mesh: the error names the dimensions.
  absl::StatusOr<int64_t> bad = mesh_.get_local_rank();
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("3 dimensions"));
  EXPECT_THAT(bad.status().message(), HasSubstr("PP, DP, TP"));

  // Which get_local_rank is which: the registry's is the host's device index.
  EXPECT_EQ(*VESCALE_DEVICE_MESH.host_local_rank(), mesh_.host_local_rank());
  EXPECT_EQ(*VESCALE_DEVICE_MESH.get_local_rank(),
            *VESCALE_DEVICE_MESH.host_local_rank());
  EXPECT_EQ(*VESCALE_DEVICE_MESH.lookup_rank("TP"), *tp->get_local_rank());
}

TEST_F(FirstProgram, CommunicatorTakesAnyContiguousRange) {
  const int64_t me = Me();
  std::shared_ptr<Communicator> tp = *mesh_.get_group("TP");
  const int peer = 1 - tp->rank();
  const int64_t partner = tp->ranks()[peer];

  // all_reduce on std::vector, std::span and absl::Span, sync and async.
  std::vector<double> v = {1.0, double(me)};
  ASSERT_TRUE(tp->all_reduce(v, ReduceOp::kSum).ok());
  EXPECT_EQ(v, (std::vector<double>{2.0, double(me + partner)}));
  std::vector<double> w = {1.0};
  ASSERT_TRUE(tp->all_reduce(std::span<double>(w), ReduceOp::kSum).ok());
  EXPECT_EQ(w[0], 2.0);
  auto work = tp->iall_reduce(absl::MakeSpan(w), ReduceOp::kMax);
  ASSERT_TRUE(work.ok()) << work.status();
  ASSERT_TRUE((*work)->wait().ok());

  // all_gather: a mutable span as the send buffer, a const vector, an array.
  std::vector<int64_t> a = {me};
  std::vector<int64_t> b(2);
  ASSERT_TRUE(tp->all_gather(absl::MakeSpan(a), absl::MakeSpan(b)).ok());
  EXPECT_THAT(b, ElementsAreArray(Ranks(tp)));
  const std::vector<int64_t> ca = {me};
  std::array<int64_t, 2> arr{};
  ASSERT_TRUE(tp->all_gather(ca, arr).ok());
  EXPECT_THAT(arr, ElementsAreArray(Ranks(tp)));
  std::vector<int64_t> c(2);
  auto gathered = tp->iall_gather(std::span<const int64_t>(ca), c);
  ASSERT_TRUE(gathered.ok()) << gathered.status();
  ASSERT_TRUE((*gathered)->wait().ok());
  EXPECT_THAT(c, ElementsAreArray(Ranks(tp)));
  // A length that does not match is refused before anything is sent.
  std::vector<int64_t> short_recv(1);
  EXPECT_EQ(tp->all_gather(ca, short_recv).code(),
            absl::StatusCode::kInvalidArgument);

  // broadcast / ibroadcast.
  std::vector<float> f = {float(me)};
  ASSERT_TRUE(tp->broadcast(f, 0).ok());
  EXPECT_EQ(f[0], float(tp->ranks()[0]));
  f[0] = float(me);
  auto bw = tp->ibroadcast(f, 1);
  ASSERT_TRUE(bw.ok() && (*bw)->wait().ok());
  EXPECT_EQ(f[0], float(tp->ranks()[1]));

  // reduce_scatter / ireduce_scatter, all_to_all / iall_to_all.
  const std::vector<int32_t> two = {1, 2};
  std::vector<int32_t> one(1);
  ASSERT_TRUE(tp->reduce_scatter(two, one, ReduceOp::kSum).ok());
  EXPECT_EQ(one[0], 2 * (tp->rank() + 1));
  auto rs = tp->ireduce_scatter(two, one, ReduceOp::kSum);
  ASSERT_TRUE(rs.ok() && (*rs)->wait().ok());
  std::vector<int32_t> swapped(2);
  const std::vector<int32_t> mine = {int32_t(me), int32_t(me)};
  ASSERT_TRUE(tp->all_to_all(mine, swapped).ok());
  EXPECT_EQ(swapped[peer], partner);
  auto aa = tp->iall_to_all(mine, swapped);
  ASSERT_TRUE(aa.ok() && (*aa)->wait().ok());

  // reduce / gather / scatter: the root-only buffer may be empty elsewhere.
  std::vector<int64_t> at_root(tp->rank() == 0 ? 2 : 0);
  ASSERT_TRUE(tp->gather(ca, at_root, 0).ok());
  if (tp->rank() == 0) {
    EXPECT_THAT(at_root, ElementsAreArray(Ranks(tp)));
  }
  std::vector<int64_t> piece(1);
  ASSERT_TRUE(tp->scatter(at_root, piece, 0).ok());
  EXPECT_EQ(piece[0], me);
  std::vector<int64_t> sum(tp->rank() == 0 ? 1 : 0);
  ASSERT_TRUE(tp->reduce(ca, sum, ReduceOp::kSum, 0).ok());
  if (tp->rank() == 0) {
    EXPECT_EQ(sum[0], me + partner);
  }
  auto ig = tp->igather(ca, at_root, 0);
  ASSERT_TRUE(ig.ok() && (*ig)->wait().ok());

  // The V forms.
  const std::vector<size_t> counts = {1, 2};
  std::vector<int64_t> own(counts[tp->rank()], me);
  std::vector<int64_t> all(3);
  ASSERT_TRUE(tp->all_gather_v(own, all, counts).ok());
  std::vector<int64_t> expected_all;
  for (int r = 0; r < 2; ++r) {
    expected_all.insert(expected_all.end(), counts[r], tp->ranks()[r]);
  }
  EXPECT_EQ(all, expected_all);
  std::vector<int64_t> part(counts[tp->rank()]);
  ASSERT_TRUE(tp->reduce_scatter_v(all, part, counts, ReduceOp::kSum).ok());
  auto agv = tp->iall_gather_v(own, all, counts);
  ASSERT_TRUE(agv.ok() && (*agv)->wait().ok());
  auto a2av = tp->iall_to_all_v(two, std::vector<size_t>{1, 1}, swapped,
                                std::vector<size_t>{1, 1});
  ASSERT_TRUE(a2av.ok() && (*a2av)->wait().ok());

  // Point to point: typed async forms by group rank and by global rank.
  std::vector<int64_t> got(1, -1);
  if (tp->rank() == 0) {
    auto s = tp->isend(ca, peer);
    auto r = tp->irecv(got, GlobalRank(partner));
    ASSERT_TRUE(s.ok() && r.ok());
    ASSERT_TRUE((*s)->wait().ok() && (*r)->wait().ok());
  } else {
    auto r = tp->irecv(got, peer);
    auto s = tp->isend(ca, GlobalRank(partner));
    ASSERT_TRUE(s.ok() && r.ok());
    ASSERT_TRUE((*r)->wait().ok() && (*s)->wait().ok());
  }
  EXPECT_EQ(got[0], partner);
  auto sr = tp->isend_recv(ca, peer, got, peer);
  ASSERT_TRUE(sr.ok() && (*sr)->wait().ok());
  EXPECT_EQ(got[0], partner);
  std::vector<P2POp> ops = {P2POp::Send(ca, peer), P2POp::Recv(got, peer)};
  ASSERT_TRUE(tp->batch_send_recv(ops).ok());
}

// The registry sees a name flattened on its mesh (issue 30's silent 1).
TEST_F(FirstProgram, RegistrySeesFlattenedNames) {
  const int64_t me = Me();
  // Before the flatten EP is a role the mesh lacks: veScale's answer.
  EXPECT_EQ(*VESCALE_DEVICE_MESH.get_role_size("EP"), 1);
  EXPECT_EQ(*VESCALE_DEVICE_MESH.get_role_rank("EP"), 0);
  EXPECT_EQ(VESCALE_DEVICE_MESH.get_role_dim_groups("EP").status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(VESCALE_DEVICE_MESH["EP"].status().code(),
            absl::StatusCode::kNotFound);

  ASSERT_TRUE(mesh_.flatten({"DP", "TP"}, "EP").ok());
  // From the registry's own mesh handle too (a copy of the same root).
  DeviceMesh reg = *VESCALE_DEVICE_MESH.get();
  ASSERT_TRUE(reg.flatten({"PP", "TP"}, "PT").ok());

  for (const auto& [name, group] :
       {std::pair<std::string, std::vector<int64_t>>{"EP", EpGroup(me)},
        {"PT", PtGroup(me)}}) {
    SCOPED_TRACE(name);
    const int64_t size = static_cast<int64_t>(group.size());
    const int64_t index =
        std::find(group.begin(), group.end(), me) - group.begin();
    EXPECT_EQ(*VESCALE_DEVICE_MESH.get_role_size(name), size);
    EXPECT_EQ(*VESCALE_DEVICE_MESH.get_role_rank(name), index);
    EXPECT_EQ(*VESCALE_DEVICE_MESH.get_strategy_size(name), size);
    EXPECT_EQ(*VESCALE_DEVICE_MESH.size(name), size);
    EXPECT_EQ(*VESCALE_DEVICE_MESH.lookup_rank(name), index);
    auto comm = VESCALE_DEVICE_MESH.get_role_dim_groups(name);
    ASSERT_TRUE(comm.ok()) << comm.status();
    EXPECT_EQ(Ranks(*comm), group);
    EXPECT_EQ(*comm, *mesh_.get_group(name));  // the same communicator
    // Real traffic over it.
    std::vector<int64_t> everyone(size);
    ASSERT_TRUE((*comm)->all_gather(std::vector<int64_t>{me}, everyone).ok());
    EXPECT_EQ(everyone, group);
    auto sub = VESCALE_DEVICE_MESH[name];
    ASSERT_TRUE(sub.ok()) << sub.status();
    EXPECT_EQ(sub->mesh(), group);
    EXPECT_EQ(*sub->get_local_rank(), index);
    EXPECT_EQ(*VESCALE_DEVICE_MESH.get_role_mesh(name), *sub);
    auto all = VESCALE_DEVICE_MESH.get_global_role_meshes(name);
    ASSERT_TRUE(all.ok()) << all.status();
    ASSERT_EQ(static_cast<int64_t>(all->size()), World() / size);
    int64_t found = 0;
    std::vector<int64_t> covered;
    for (const DeviceMesh& m : *all) {
      found += m.mesh() == group;
      for (int64_t r : m.mesh()) covered.push_back(r);
    }
    EXPECT_EQ(found, 1);
    std::sort(covered.begin(), covered.end());
    std::vector<int64_t> world(World());
    std::iota(world.begin(), world.end(), 0);
    EXPECT_EQ(covered, world);  // the groups partition the world
  }
  // A role that truly does not exist keeps its documented answer.
  EXPECT_EQ(*VESCALE_DEVICE_MESH.get_role_size("CP"), 1);
  EXPECT_EQ(*VESCALE_DEVICE_MESH.get_role_rank("CP"), 0);
  EXPECT_EQ(VESCALE_DEVICE_MESH.get_role_mesh("CP").status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(VESCALE_DEVICE_MESH.get_role_dim_groups("CP").status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(VESCALE_DEVICE_MESH["CP"].status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(VESCALE_DEVICE_MESH.get_strategy_size("CP").status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(VESCALE_DEVICE_MESH.get_global_role_meshes("CP").status().code(),
            absl::StatusCode::kNotFound);
  // A re-init forgets the flattened names with the mesh.
  ASSERT_TRUE(VESCALE_DEVICE_MESH
                  .init_device_mesh("cpu", {2, D(), 2}, {"PP", "DP", "TP"})
                  .ok());
  EXPECT_EQ(*VESCALE_DEVICE_MESH.get_role_size("EP"), 1);
}

}  // namespace
}  // namespace vemesh
