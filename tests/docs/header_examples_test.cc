// The usage examples from the top comments of vemesh's public headers, copied
// here so that the compiler checks them: an example that calls something
// that does not exist (or no longer exists) fails this build. Examples that
// need a job (other ranks, a launcher, Redis) are compiled in functions that
// are never called; examples that need nothing are also run, and the values
// their comments promise are checked. When a header's example changes, change
// its copy here.

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "gtest/gtest.h"
#include "vemesh/base/log.h"
#include "vemesh/base/status_codes.h"
#include "vemesh/base/status_macros.h"
#include "vemesh/bootstrap/agreement.h"
#include "vemesh/bootstrap/bootstrap.h"
#include "vemesh/bootstrap/bootstrap_over.h"
#include "vemesh/bootstrap/init_timeout.h"
#include "vemesh/bootstrap/launch.h"
#include "vemesh/bootstrap/launch_session.h"
#include "vemesh/bootstrap/store_bootstrap.h"
#include "vemesh/comm/buffer.h"
#include "vemesh/comm/communicator.h"
#include "vemesh/comm/gloo/gloo_communicator.h"
#include "vemesh/comm/mpi/mpi_environment.h"
#include "vemesh/comm/work.h"
#include "vemesh/elastic/elastic_mesh.h"
#include "vemesh/layout/mesh_layout.h"
#include "vemesh/layout/mesh_spec.h"
#include "vemesh/mesh/device_mesh.h"
#include "vemesh/mesh/mesh_options.h"
#include "vemesh/placement/placement.h"
#include "vemesh/registry/ve_device_mesh.h"
#include "vemesh/rendezvous/memory_store.h"
#include "vemesh/rendezvous/prefix_store.h"
#include "vemesh/rendezvous/store.h"
#include "vemesh/rendezvous/tcp/tcp_store.h"
#include "vemesh/rendezvous/tcp/tcp_store_server.h"

namespace vemesh {
namespace header_examples {

// Compiled, never called: each needs a job around it.

// vemesh/base/status_codes.h
void StatusCodesExample(std::shared_ptr<Communicator> comm,
                        std::vector<float> grad) {
  absl::Status s = comm->all_reduce(absl::MakeSpan(grad), ReduceOp::kSum);
  if (absl::IsUnavailable(s)) {
    // A peer is gone: this communicator is finished; make a new group.
  }
}

// vemesh/base/status_macros.h
// The caller's own functions that the example calls.
absl::StatusOr<DeviceMesh> Build() { return absl::UnimplementedError("stub"); }
absl::Status Connect() { return absl::OkStatus(); }
absl::Status StatusMacrosExample() {
  VEMESH_RETURN_IF_ERROR(Connect());
  VEMESH_ASSIGN_OR_RETURN(auto mesh, Build());
  VEMESH_ASSIGN_OR_RETURN(int64_t n, mesh.size("TP"));
  (void)n;
  return absl::OkStatus();
}

// vemesh/base/log.h
void LogExample() {
  vemesh::set_log_sink([](vemesh::LogLevel level, absl::string_view text) {
    (void)(level == vemesh::LogLevel::kWarning);
  });
  vemesh::set_log_sink(nullptr);
}

// vemesh/comm/communicator.h
absl::Status CommunicatorExample(std::shared_ptr<Communicator> tp,
                                 std::shared_ptr<Communicator> dp,
                                 std::shared_ptr<Communicator> pp,
                                 std::vector<float> bucket,
                                 std::vector<float> act) {
  std::vector<float> grad(1024, 1.0f);
  absl::Status s = tp->all_reduce(absl::MakeSpan(grad), ReduceOp::kSum);
  std::vector<int64_t> who(tp->size());
  int64_t me = tp->global_rank();
  s = tp->all_gather(absl::MakeConstSpan(&me, 1), absl::MakeSpan(who));

  auto w = dp->iall_reduce(absl::MakeSpan(bucket), ReduceOp::kAvg);
  s = (*w)->wait();

  std::optional<int64_t> next = *VESCALE_DEVICE_MESH.get_next_stage_peer();
  if (next) s = pp->send(absl::MakeConstSpan(act), GlobalRank(*next));
  return s;
}

// vemesh/comm/buffer.h
absl::Status BufferExample(std::shared_ptr<Communicator> comm) {
  std::vector<double> grad(1024, 1.0);
  absl::Status s = comm->all_reduce(grad, ReduceOp::kSum);
  s = comm->all_reduce(std::span<double>(grad), ReduceOp::kSum);
  const std::vector<float> mine = {1.5f};
  std::vector<float> all(comm->size());
  s = comm->all_gather(mine, all);
  std::vector<float> scratch = {2.5f};
  s = comm->all_gather(absl::MakeSpan(scratch), absl::MakeSpan(all));
  return s;
}

// vemesh/comm/work.h
absl::Status WorkExample(std::shared_ptr<Communicator> dp,
                         std::vector<float> bucket) {
  VEMESH_ASSIGN_OR_RETURN(
      std::shared_ptr<Work> w,
      dp->iall_reduce(absl::MakeSpan(bucket), ReduceOp::kAvg));
  VEMESH_RETURN_IF_ERROR(w->wait(absl::Now() + absl::Seconds(30)));
  return absl::OkStatus();
}

// vemesh/comm/gloo/gloo_communicator.h
absl::Status GlooExample(std::shared_ptr<Store> store, int rank, int size,
                         std::vector<int> global_ranks) {
  auto world = GlooCommunicator::Create(store, "job7/world", rank, size,
                                        global_ranks, absl::Seconds(30));
  if (!world.ok()) return world.status();
  std::vector<float> grad(1024, 1.0f);
  absl::Status s = (*world)->all_reduce(absl::MakeSpan(grad), ReduceOp::kSum);
  auto row = (*world)->split(rank / 4, rank % 4);
  return row.status();
}

// vemesh/comm/mpi/mpi_environment.h
int MpiSessionExample(int argc, char** argv) {
  vemesh::MpiSession mpi(&argc, &argv);
  if (!mpi.status().ok()) return 1;
  return init_device_mesh("cpu", {2, 2, 2}).ok() ? 0 : 1;
}

// vemesh/bootstrap/bootstrap.h
void BootstrapExample() {
  absl::StatusOr<std::shared_ptr<Bootstrap>> boot =
      LaunchBootstrap(absl::Now() + absl::Seconds(60));
  auto all = (*boot)->all_gather("hello", absl::Now() + absl::Seconds(30));
  (void)all;
}

// vemesh/bootstrap/launch.h
void LaunchExample() {
  absl::StatusOr<std::shared_ptr<Bootstrap>> boot =
      LaunchBootstrap(absl::Now() + absl::Seconds(60));
  (void)boot;
}

// vemesh/bootstrap/bootstrap_over.h
void BootstrapOverExample(std::shared_ptr<Communicator> half) {
  auto boot = MakeBootstrapOver(*half, absl::Now() + absl::Seconds(30));
  (void)boot;
}

// vemesh/bootstrap/store_bootstrap.h
void StoreBootstrapExample(std::shared_ptr<Store> store, int rank, int size) {
  auto boot = std::make_shared<StoreBootstrap>(store, rank, size, "job");
  auto all = boot->all_gather("x", absl::Now() + absl::Seconds(5));
  (void)all;
}

// vemesh/bootstrap/agreement.h
void AgreementExample(Bootstrap& boot, absl::Time deadline) {
  auto hosts = AgreeAndGather(boot, "init_device_mesh",
                              {{"device type", "cpu"}, {"shape", "(2, 2, 2)"}},
                              /*payload=*/HostIdentity(), deadline);
  (void)hosts;
}

// vemesh/rendezvous/store.h
void StoreExample(std::shared_ptr<Store> store) {
  absl::Status s = store->set("rank/3/addr", "10.0.0.7:4242");
  s = store->wait({"rank/0/addr", "rank/1/addr"},
                  absl::Now() + absl::Seconds(30));
  absl::StatusOr<std::string> addr = store->get("rank/0/addr");
  absl::StatusOr<int64_t> n = store->add("arrived", 1);
  auto prev = store->compare_set("epoch", "7", "8");
  s = store->set_lease("alive/3", "1", absl::Seconds(10));
}

// vemesh/rendezvous/tcp/tcp_store.h
absl::Status TcpStoreExample(const std::string& master_addr, int master_port,
                             const std::vector<std::string>& keys) {
  absl::StatusOr<std::unique_ptr<TcpStore>> store = TcpStore::Connect(
      master_addr, master_port, absl::Now() + absl::Minutes(5));
  if (!store.ok()) return store.status();
  VEMESH_RETURN_IF_ERROR((*store)->set("rank/3/addr", "10.0.0.7:4242"));
  auto all = (*store)->wait_get(keys, absl::Now() + absl::Seconds(30));
  return all.status();
}

// vemesh/rendezvous/tcp/tcp_store_server.h
absl::Status TcpStoreServerExample() {
  absl::StatusOr<std::unique_ptr<TcpStoreServer>> server =
      TcpStoreServer::Start("0.0.0.0", 29500);
  if (!server.ok()) return server.status();
  int port = (*server)->port();
  (void)port;
  (*server)->Stop();
  return absl::OkStatus();
}

// vemesh/mesh/device_mesh.h
void DeviceMeshExample() {
  absl::StatusOr<DeviceMesh> mesh =
      init_device_mesh("cpu", {2, 2, 2}, {"PP", "DP", "TP"});
  (void)mesh->get_coordinate();
  (void)mesh->get_local_rank("TP");
  (void)mesh->get_group("TP");
  (void)(*mesh)["TP"];
  (void)mesh->slice({"DP", "TP"});
  (void)mesh->flatten({"DP", "TP"}, "DPTP");
  (void)mesh->flatten_mesh({"DP", "TP"}, "DPTP");
  (void)(*mesh)["DPTP"];
  (void)mesh->slice({"PP", "DPTP"});
}

// vemesh/mesh/mesh_options.h
void MeshOptionsExample(const absl::StatusOr<MeshLayout>& layout) {
  MeshOptions options;
  options.timeout = absl::Seconds(10);
  options.backend_override = {{"DP", "gloo"}};
  auto mesh = DeviceMesh::Create(DeviceType::kCpu, *layout, options);
  (void)mesh;
}

// vemesh/registry/ve_device_mesh.h
absl::Status RegistryExample() {
  auto mesh = VESCALE_DEVICE_MESH.init_device_mesh("cpu", {2, 2, 2},
                                                   {"PP", "DP", "TP"});
  if (!mesh.ok()) return mesh.status();
  (void)VESCALE_DEVICE_MESH.get_strategy_size("TP");
  (void)VESCALE_DEVICE_MESH.get_strategy_coordinate();
  (void)VESCALE_DEVICE_MESH.get_strategy_coordinate(3);
  (void)VESCALE_DEVICE_MESH.lookup_rank("DP");
  (void)VESCALE_DEVICE_MESH.get_tensor_parallel_mesh();
  (void)VESCALE_DEVICE_MESH.get_data_parallel_dim_groups();
  (void)VESCALE_DEVICE_MESH.get_prev_stage();
  (void)VESCALE_DEVICE_MESH.is_last_stage();
  return absl::OkStatus();
}

// vemesh/placement/placement.h
void PlacementExample() {
  absl::StatusOr<Placement> p = VESCALE_DEVICE_MESH.get_placement();
  (void)p->hosts;
  p->host_of(5);
  (void)p->dim("TP")->crossing_groups;
  p->ToJson();
}

// vemesh/elastic/elastic_mesh.h
// The training loop's own functions that the example calls.
absl::Status TrainStep(int64_t step) { return absl::OkStatus(); }
void RestoreStartOfStep() {}
ReplicaState::StateDictFn SaveStep(int64_t* step) {
  return [step]() -> absl::StatusOr<std::string> {
    return std::string(reinterpret_cast<const char*>(step), sizeof(*step));
  };
}
ReplicaState::LoadStateDictFn LoadStep(int64_t* step) {
  return [step](absl::string_view b) {
    if (b.size() == sizeof(*step)) std::memcpy(step, b.data(), b.size());
    return absl::OkStatus();
  };
}
ReplicaState::StateDictFn SaveModel() {
  return []() -> absl::StatusOr<std::string> { return std::string(); };
}
ReplicaState::LoadStateDictFn LoadModel() {
  return [](absl::string_view) { return absl::OkStatus(); };
}
absl::Status ElasticExample(int k, int64_t steps) {
  InitOptions o;
  // GCC 12 warns (-Wmissing-field-initializers) about the fields a C++20
  // designated initializer leaves to their defaults; that is the point here.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"
  o.elastic = ElasticOptions{.store = "redis://127.0.0.1:6379", .replica = k};
#pragma GCC diagnostic pop
  auto mesh = VESCALE_DEVICE_MESH.init_device_mesh("cpu", {2, 3, 2},
                                                   {"PP", "DP", "TP"}, o);
  if (!mesh.ok()) return mesh.status();
  ElasticMesh& el = *VESCALE_DEVICE_MESH.elastic();
  int64_t step = el.last_recovery().resume_step;
  (void)el.register_state_dict_fn("step", SaveStep(&step), LoadStep(&step));
  (void)el.register_state_dict_fn("model", SaveModel(), LoadModel());
  absl::Status s = el.sync_state();
  while (step < steps) {
    if (s.ok()) s = TrainStep(step);
    absl::StatusOr<StepVerdict> v = el.end_step(s);
    if (!v.ok()) return v.status();
    if (v->committed)
      ++step;
    else
      RestoreStartOfStep();
    s = absl::OkStatus();
    if (v->recover) {
      absl::StatusOr<Recovery> r = el.recover(step);
      if (!r.ok()) return r.status();
      if (r->evicted) return absl::OkStatus();
    }
  }
  return absl::OkStatus();
}

}  // namespace header_examples

namespace {

// Run: the examples that need no other rank, with the values their comments
// promise.

// vemesh/layout/mesh_layout.h
TEST(HeaderExamples, MeshLayout) {
  absl::StatusOr<MeshLayout> layout =
      MeshLayout::Create({2, 2, 2}, {"PP", "DP", "TP"});
  ASSERT_TRUE(layout.ok()) << layout.status();
  EXPECT_EQ(*layout->coordinate_of(5), (Coordinate{1, 0, 1}));
  EXPECT_EQ(*layout->rank_at({1, 0, 1}), 5);
  EXPECT_EQ(layout->submesh({"TP"}, 5)->ranks(), (std::vector<int64_t>{4, 5}));
  EXPECT_EQ(*layout->groups({"DP"}), (std::vector<std::vector<int64_t>>{
                                         {0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(*layout->neighbor("PP", 5, -1), std::optional<int64_t>(1));
  EXPECT_TRUE(layout->flatten({"DP", "TP"}, "DPTP").ok());
}

// vemesh/layout/mesh_spec.h
TEST(HeaderExamples, MeshSpec) {
  absl::StatusOr<MeshSpec> spec = ParseMeshSpec("PP=2,DP=2,TP=2");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->shape, (std::vector<int64_t>{2, 2, 2}));
  EXPECT_EQ(spec->names, (std::vector<std::string>{"PP", "DP", "TP"}));
}

// vemesh/rendezvous/memory_store.h
TEST(HeaderExamples, MemoryStore) {
  auto store = std::make_shared<MemoryStore>();
  std::thread t([&] { ASSERT_TRUE(store->set("ready", "1").ok()); });
  EXPECT_TRUE(store->wait({"ready"}, absl::Now() + absl::Seconds(1)).ok());
  t.join();
}

// vemesh/rendezvous/prefix_store.h
TEST(HeaderExamples, PrefixStore) {
  auto store = std::make_shared<MemoryStore>();
  PrefixStore init(store, "vemesh/init/3");
  ASSERT_TRUE(init.set("host/0", "node7").ok());
  EXPECT_EQ(*store->get("vemesh/init/3/host/0"), "node7");
}

// vemesh/bootstrap/init_timeout.h
TEST(HeaderExamples, InitTimeout) {
  unsetenv("VEMESH_INIT_TIMEOUT");
  absl::StatusOr<absl::Duration> t = DefaultInitTimeout();
  EXPECT_EQ(*t, absl::Seconds(60));
}

// vemesh/bootstrap/launch_session.h (needs a launch: compiled, not run; the
// same code runs as examples/first_program under tests/launch).
[[maybe_unused]] int LaunchSessionExample(int argc, char** argv) {
  vemesh::LaunchSession launch(&argc, &argv);
  if (!launch.status().ok()) {
    std::fprintf(stderr, "%s\n", launch.status().ToString().c_str());
    return 1;
  }
  auto mesh = VESCALE_DEVICE_MESH.init_device_mesh("cpu", {2, 2, 2});
  if (!mesh.ok()) return 1;
  VESCALE_DEVICE_MESH.reset();
  return 0;
}

}  // namespace
}  // namespace vemesh
