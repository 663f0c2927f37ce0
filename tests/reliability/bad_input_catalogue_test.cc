// The bad-input catalogue, in-process half: every public library entry point
// (MeshLayout, the mesh spec parser, DeviceMesh, the VeDeviceMesh registry)
// fed a bad input or called out of order. Each entry asserts the status code
// and that the message names the bad value (or, for misuse, the call to make
// instead). The CLI and the training example's flags are in
// cli_catalogue_test.cc. Runs under mpiexec with one rank, so DeviceMesh and
// the registry can create real "cpu" meshes over a one-rank world.
//
// Adding an entry: append to kCatalogue below; docs/RELIABILITY.md counts
// them.
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gtest/gtest.h"
#include "vemesh/comm/communicator.h"
#include "vemesh/layout/mesh_layout.h"
#include "vemesh/layout/mesh_spec.h"
#include "vemesh/mesh/device_mesh.h"
#include "vemesh/registry/ve_device_mesh.h"

namespace vemesh {
namespace {

using absl::StatusCode;

struct Entry {
  std::string name;                   // the gtest parameter name
  std::string area;                   // layout, spec, device_mesh, registry
  StatusCode code;                    // expected code
  std::vector<std::string> mentions;  // substrings the message must hold
  std::function<absl::Status()> call;
};

template <typename T>
absl::Status StatusOf(const absl::StatusOr<T>& r) {
  return r.status();
}
#define ST(expr) [=]() { return StatusOf(expr); }

const std::vector<std::string> kPDT = {"PP", "DP", "TP"};

MeshLayout L222() { return *MeshLayout::Create({2, 2, 2}, kPDT); }

// A one-rank "cpu" mesh over the (one-rank) world.
DeviceMesh Cpu1(std::vector<std::string> names = {"PP", "DP", "TP"}) {
  auto mesh = init_device_mesh("cpu", {1, 1, 1}, names);
  EXPECT_TRUE(mesh.ok()) << mesh.status();
  return *mesh;
}

// A communicator of another backend: DeviceMesh must refuse to build on it.
class FakeCommunicator : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  absl::Span<const int> ranks() const override { return ranks_; }
  absl::string_view backend() const override { return "fake"; }
  absl::StatusOr<std::shared_ptr<Communicator>> split(int, int) override {
    return absl::UnimplementedError("fake");
  }
  NativeHandle native_handle() const override { return {"fake", nullptr}; }

 protected:
  WorkOr Start(const Operation&) override {
    return absl::UnimplementedError("fake");
  }

 private:
  std::vector<int> ranks_ = {0};
};

// A registry holding a one-rank meta mesh PP=1, DP=1, TP=1 (no MPI).
std::unique_ptr<VeDeviceMesh> MetaRegistry() {
  auto r = std::make_unique<VeDeviceMesh>();
  auto mesh = r->init_device_mesh("meta", {1, 1, 1}, kPDT);
  EXPECT_TRUE(mesh.ok()) << mesh.status();
  return r;
}

std::vector<Entry> Catalogue() {
  std::vector<Entry> c;
  auto add = [&c](std::string name, std::string area, StatusCode code,
                  std::vector<std::string> mentions,
                  std::function<absl::Status()> call) {
    c.push_back({std::move(name), std::move(area), code, std::move(mentions),
                 std::move(call)});
  };
  const StatusCode kArg = StatusCode::kInvalidArgument;
  const StatusCode kRange = StatusCode::kOutOfRange;
  const StatusCode kNotFound = StatusCode::kNotFound;
  const StatusCode kPrecond = StatusCode::kFailedPrecondition;

  // -- MeshLayout ------------------------------------------------------------
  add("layout_empty_shape", "layout", kArg, {"empty"},
      ST(MeshLayout::Create({})));
  add("layout_zero_size", "layout", kArg, {"size 0", "'DP'"},
      ST(MeshLayout::Create({2, 0, 2}, kPDT)));
  add("layout_negative_size", "layout", kArg, {"size -3"},
      ST(MeshLayout::Create({-3}, {"TP"})));
  add("layout_product_overflow", "layout", kArg, {"4294967296", "int64"},
      ST(MeshLayout::Create({int64_t{1} << 32, int64_t{1} << 32},
                            {"DP", "TP"})));
  add("layout_too_many_dims", "layout", kArg, {"33 dimensions"}, [] {
    std::vector<int64_t> shape(33, 1);
    std::vector<std::string> names;
    for (int i = 0; i < 33; ++i) names.push_back(absl::StrCat("D", i));
    return MeshLayout::Create(shape, names).status();
  });
  add("layout_name_count", "layout", kArg, {"3 names", "2 dimensions"},
      ST(MeshLayout::Create({2, 2}, kPDT)));
  add("layout_no_default_names_4d", "layout", kArg, {"4-D"},
      ST(MeshLayout::Create({2, 2, 2, 2})));
  add("layout_duplicate_name", "layout", kArg, {"'TP'", "twice"},
      ST(MeshLayout::Create({2, 2}, {"TP", "TP"})));
  add("layout_empty_name", "layout", kArg, {"dimension 1", "empty name"},
      ST(MeshLayout::Create({2, 2}, {"DP", ""})));
  add("layout_rank_list_length", "layout", kArg, {"3 entries", "4 ranks"},
      ST(MeshLayout::Create({2, 2}, {"DP", "TP"}, {0, 1, 2})));
  add("layout_negative_rank", "layout", kArg, {"rank -1"},
      ST(MeshLayout::Create({2}, {"TP"}, {0, -1})));
  add("layout_duplicate_rank", "layout", kArg, {"rank 3 twice"},
      ST(MeshLayout::Create({2}, {"TP"}, {3, 3})));
  add("layout_coordinate_of_out_of_range", "layout", kRange, {"rank 8"},
      ST(L222().coordinate_of(8)));
  add("layout_coordinate_of_negative", "layout", kRange, {"rank -1"},
      ST(L222().coordinate_of(-1)));
  add("layout_rank_not_in_rank_list", "layout", kRange, {"rank 1"},
      ST(MeshLayout::Create({2}, {"TP"}, {4, 6})->coordinate_of(1)));
  add("layout_rank_at_wrong_length", "layout", kArg, {"[1, 0]", "2 entries"},
      ST(L222().rank_at({1, 0})));
  add("layout_rank_at_index_out_of_range", "layout", kRange,
      {"index 2", "'DP'"}, ST(L222().rank_at({0, 2, 0})));
  add("layout_submesh_unknown_dim", "layout", kNotFound, {"'EP'"},
      ST(L222().submesh({"EP"}, 0)));
  add("layout_submesh_no_dims", "layout", kArg, {"at least one"},
      ST(L222().submesh({}, 0)));
  add("layout_submesh_rank_not_held", "layout", kNotFound, {"rank 2"},
      ST(L222().submesh({"TP"}, 0)->submesh({"TP"}, 2)));
  add("layout_groups_duplicate_dim", "layout", kArg, {"'DP' twice"},
      ST(L222().groups({"DP", "DP"})));
  add("layout_flatten_empty_name", "layout", kArg, {"non-empty name"},
      ST(L222().flatten({"DP", "TP"}, "")));
  add("layout_flatten_name_clash", "layout", kArg, {"'PP'"},
      ST(L222().flatten({"DP", "TP"}, "PP")));
  add("layout_neighbor_shift_overflow", "layout", kRange,
      {"9223372036854775807"},
      ST(L222().neighbor("TP", 1, std::numeric_limits<int64_t>::max())));
  add("layout_dim_size_index", "layout", kRange, {"index 3"},
      ST(L222().dim_size(int64_t{3})));

  // -- Mesh spec parser ------------------------------------------------------
  add("spec_empty", "spec", kArg, {"empty"}, ST(ParseMeshSpec("  ")));
  add("spec_missing_equals", "spec", kArg, {"'DP'", "without '='"},
      ST(ParseMeshSpec("PP=2,DP,TP=2")));
  add("spec_empty_part", "spec", kArg, {"PP=2,,TP=2", "''"},
      ST(ParseMeshSpec("PP=2,,TP=2")));
  add("spec_bad_name", "spec", kArg, {"'1X'"}, ST(ParseMeshSpec("1X=2")));
  add("spec_zero_size", "spec", kArg, {"'PP'", "'0'"},
      ST(ParseMeshSpec("PP=0")));
  add("spec_size_not_a_number", "spec", kArg, {"'two'"},
      ST(ParseMeshSpec("TP=two")));
  add("spec_size_too_big", "spec", kArg, {"'99999999999999999999'"},
      ST(ParseMeshSpec("TP=99999999999999999999")));

  // -- DeviceMesh ------------------------------------------------------------
  add("device_mesh_unknown_device", "device_mesh", kArg, {"'tpu'"},
      ST(init_device_mesh("tpu", {1})));
  add("device_mesh_bad_shape", "device_mesh", kArg, {"size 0"},
      ST(init_device_mesh("cpu", {1, 0})));
  add("device_mesh_bigger_than_world", "device_mesh", kArg,
      {"4 ranks", "only 1"}, ST(init_device_mesh("cpu", {2, 2})));
  add("device_mesh_rank_outside_world", "device_mesh", kArg, {"rank 5"}, [] {
    MeshOptions o;
    o.ranks = {5};
    return init_device_mesh("cpu", {1}, {"TP"}, o).status();
  });
  add("device_mesh_world_not_mpi", "device_mesh", kArg, {"'fake'"}, [] {
    MeshOptions o;
    o.world = std::make_shared<FakeCommunicator>();
    return init_device_mesh("cpu", {1}, {"TP"}, o).status();
  });
  add("device_mesh_group_unknown_dim", "device_mesh", kNotFound, {"'EP'"},
      [] { return Cpu1().get_group("EP").status(); });
  add("device_mesh_local_rank_index", "device_mesh", kRange, {"dimension 3"},
      [] { return Cpu1().get_local_rank(int64_t{3}).status(); });
  add("device_mesh_slice_twice", "device_mesh", kArg, {"'TP' twice"}, [] {
    return Cpu1().slice({"TP", "TP"}).status();
  });
  add("device_mesh_flatten_unknown_dim", "device_mesh", kNotFound, {"'XX'"},
      [] {
        return Cpu1().flatten({"DP", "XX"}).status();
      });
  add("device_mesh_flatten_name_clash", "device_mesh", kArg, {"'PP'"}, [] {
    return Cpu1().flatten({"DP", "TP"}, "PP").status();
  });
  add("device_mesh_child_unknown_dim", "device_mesh", kNotFound, {"'EP'"},
      [] { return Cpu1()["EP"].status(); });
  add("device_mesh_meta_has_no_group", "device_mesh", kPrecond,
      {"meta", "'TP'"},
      [] { return DeviceMesh::Meta(L222(), 0).get_group("TP").status(); });
  add("device_mesh_meta_cannot_flatten", "device_mesh", kPrecond,
      {"meta", "DP, TP"}, [] {
        return DeviceMesh::Meta(L222(), 0).flatten({"DP", "TP"}).status();
      });

  // -- Registry: misuse ------------------------------------------------------
  add("registry_query_before_init", "registry", kPrecond, {"init_device_mesh"},
      ST(VESCALE_DEVICE_MESH.get_strategy_size("TP")));
  add("registry_coordinate_before_init", "registry", kPrecond,
      {"init_device_mesh"}, [] {
        VeDeviceMesh r;
        return r.get_strategy_coordinate().status();
      });
  add("registry_group_before_init", "registry", kPrecond, {"init_device_mesh"},
      [] {
        VeDeviceMesh r;
        return r.get_tensor_parallel_dim_groups().status();
      });
  add("registry_stage_before_init", "registry", kPrecond, {"init_device_mesh"},
      [] {
        VeDeviceMesh r;
        return r.get_next_stage().status();
      });
  add("registry_query_after_reset", "registry", kPrecond, {"init_device_mesh"},
      [] {
        auto r = MetaRegistry();
        r->reset();
        return r->lookup_rank("DP").status();
      });
  add("registry_mesh_after_reset", "registry", kPrecond, {"init_device_mesh"},
      [] {
        auto r = MetaRegistry();
        r->reset();
        return r->get_data_parallel_mesh().status();
      });
  add("registry_stale_submesh_after_reinit", "registry", kPrecond,
      {"stale", "TP=1"}, [] {
        auto r = MetaRegistry();
        auto tp = r->get_tensor_parallel_mesh();
        if (!tp.ok()) return tp.status();
        auto again = r->init_device_mesh("meta", {1, 1}, {"DP", "TP"});
        if (!again.ok()) return again.status();
        return r->check_current(*tp);
      });
  // After reset there is no current mesh: the answer says to init first.
  add("registry_stale_mesh_after_reset", "registry", kPrecond,
      {"init_device_mesh"}, [] {
        auto r = MetaRegistry();
        auto mesh = r->get();
        if (!mesh.ok()) return mesh.status();
        r->reset();
        return r->check_current(*mesh);
      });
  add("registry_mesh_from_elsewhere", "registry", kPrecond, {"stale"}, [] {
    auto r = MetaRegistry();
    return r->check_current(DeviceMesh::Meta(L222(), 0));
  });
  add("registry_second_init_unique", "registry", StatusCode::kAlreadyExists,
      {"check_uniqueness"}, [] {
        auto r = MetaRegistry();
        InitOptions o;
        o.check_uniqueness = true;
        return r->init_device_mesh("meta", {1}, {"TP"}, o).status();
      });

  // -- Registry: bad input ---------------------------------------------------
  add("registry_init_bad_device", "registry", kArg, {"'gpu'"}, [] {
    VeDeviceMesh r;
    absl::Status s = r.init_device_mesh("gpu", {1}).status();
    // A failed init leaves the registry as it was: still uninitialised.
    if (r.is_initialized()) return absl::InternalError("registry changed");
    return s;
  });
  add("registry_init_name_count", "registry", kArg, {"[PP, DP]"}, [] {
    VeDeviceMesh r;
    return r.init_device_mesh("cpu", {1}, {"PP", "DP"}).status();
  });
  add("registry_init_too_big", "registry", kArg, {"8 ranks", "only 1"}, [] {
    VeDeviceMesh r;
    return r.init_device_mesh("cpu", {2, 2, 2}).status();
  });
  add("registry_unknown_dim_size", "registry", kNotFound, {"'EP'"},
      [] { return MetaRegistry()->get_strategy_size("EP").status(); });
  add("registry_dim_index_out_of_range", "registry", kRange, {"index 3"},
      [] { return MetaRegistry()->get_strategy_size(int64_t{3}).status(); });
  add("registry_coordinate_of_rank", "registry", kRange, {"rank 99"},
      [] { return MetaRegistry()->get_strategy_coordinate(99).status(); });
  add("registry_global_rank_of_coordinate", "registry", kRange,
      {"index 5", "'DP'"}, [] {
        return MetaRegistry()->get_global_rank({0, 5, 0}).status();
      });
  add("registry_lookup_rank_index", "registry", kRange, {"index 7"},
      [] { return MetaRegistry()->lookup_rank(int64_t{7}).status(); });
  add("registry_role_mesh_missing", "registry", kNotFound, {"'EP'"},
      [] { return MetaRegistry()->get_role_mesh("EP").status(); });
  add("registry_submesh_unknown_dim", "registry", kNotFound, {"'XX'"}, [] {
    return MetaRegistry()->get_submesh({"DP", "XX"}).status();
  });
  // get_global_* lists of a huge meta mesh: refused before allocating
  // (this aborted with bad_alloc: 2^20 lists of 2^20 ranks).
  add("registry_global_tp_meshes_too_many", "registry",
      StatusCode::kResourceExhausted, {"1048576 meshes", "at most 65536"}, [] {
        VeDeviceMesh r;
        auto mesh = r.init_device_mesh(
            "meta", {int64_t{1} << 20, int64_t{1} << 20}, {"DP", "TP"});
        if (!mesh.ok()) return mesh.status();
        return r.get_global_tensor_parallel_meshes().status();
      });
  add("registry_global_pp_meshes_too_many", "registry",
      StatusCode::kResourceExhausted, {"1048576 meshes", "at most 65536"}, [] {
        VeDeviceMesh r;
        auto mesh = r.init_device_mesh(
            "meta", {int64_t{1} << 20, int64_t{1} << 20}, {"PP", "TP"});
        if (!mesh.ok()) return mesh.status();
        return r.get_global_pipeline_parallel_meshes().status();
      });
  return c;
}

// gtest prints a parameter by its name, not as bytes.
void PrintTo(const Entry& e, std::ostream* os) { *os << e.name; }

class BadInputCatalogue : public ::testing::TestWithParam<Entry> {};

TEST_P(BadInputCatalogue, FailsWithCodeNamingTheValue) {
  const Entry& e = GetParam();
  const absl::Status s = e.call();
  ASSERT_FALSE(s.ok()) << e.name << " was accepted";
  EXPECT_EQ(s.code(), e.code) << e.name << ": " << s;
  for (const std::string& m : e.mentions) {
    EXPECT_NE(s.message().find(m), absl::string_view::npos)
        << e.name << ": the message does not mention \"" << m << "\": " << s;
  }
}

INSTANTIATE_TEST_SUITE_P(Catalogue, BadInputCatalogue,
                         ::testing::ValuesIn(Catalogue()),
                         [](const ::testing::TestParamInfo<Entry>& info) {
                           return info.param.name;
                         });

// The catalogue covers every library entry point, and is as big as the
// reliability promise says (docs/RELIABILITY.md).
TEST(BadInputCatalogueSize, CoversEveryArea) {
  const std::vector<Entry> c = Catalogue();
  std::vector<std::string> names;
  for (const char* area : {"layout", "spec", "device_mesh", "registry"}) {
    int n = 0;
    for (const Entry& e : c) n += e.area == area;
    EXPECT_GE(n, 5) << area;
  }
  EXPECT_GE(c.size(), 40u);
}

}  // namespace
}  // namespace vemesh
