// vemesh/registry/ve_device_mesh.h
//
// VeDeviceMesh is the one device mesh of the process: the registry that every
// data-, tensor- and pipeline-parallel module asks. `VESCALE_DEVICE_MESH`
// names it, as in veScale.
//
// Start-up (collective: every rank calls it with the same arguments):
//
//   auto mesh = VESCALE_DEVICE_MESH.init_device_mesh("cpu", {2, 2, 2},
//                                                    {"PP", "DP", "TP"});
//   if (!mesh.ok()) return mesh.status();
//
// Then, from any module and any thread (rank 5 of PP=2, DP=2, TP=2):
//
//   VESCALE_DEVICE_MESH.get_strategy_size("TP");        // 2
//   VESCALE_DEVICE_MESH.get_strategy_coordinate();      // [1, 0, 1]
//   VESCALE_DEVICE_MESH.get_strategy_coordinate(3);     // [0, 1, 1], any rank
//   VESCALE_DEVICE_MESH.lookup_rank("DP");              // 0
//   VESCALE_DEVICE_MESH.get_tensor_parallel_mesh();     // ranks [4, 5]
//   VESCALE_DEVICE_MESH.get_data_parallel_dim_groups(); // communicator [5, 7]
//   VESCALE_DEVICE_MESH.get_prev_stage();               // stage 0, peer rank 1
//   VESCALE_DEVICE_MESH.is_last_stage();                // true
//
// Roles are found by name, not by position: "PP", "DP" and "TP", and any
// other name (EP, CP, SP, ...) through the by-name getters. A role matches
// the mesh's dimension whatever its case: on a mesh named ("dp", "tp"),
// get_tensor_parallel_rank() is the index along "tp" and get_role_size("TP")
// its size. An exact name wins; a role that two dimensions match only
// ignoring case ("tp" and "Tp", asked as "TP") is InvalidArgument naming
// them. Dimension queries (operator[], get_strategy_size, lookup_rank, ...)
// take names exactly, and an unknown one is NotFound listing the names. A mesh
// with no PP dimension is a one-stage pipeline (PP rank 0, first and last
// stage). A 1-D mesh named neither DP nor TP serves as both, as in veScale. A
// role the mesh lacks has size 1 and rank 0; asking for its mesh or group is
// NotFound.
//
// torchtitan's data-parallel dimensions: on a mesh without DP, the DP role is
// DP_REPLICATE x DP_SHARD flattened replicate-major (size R x S, DP rank =
// replicate rank x S + shard rank), so DataParallel and the distributed
// optimizer run over both unchanged; each remains a role of its own:
//
//   VESCALE_DEVICE_MESH.init_device_mesh("cpu", {2, 2, 2},
//                                        {"DP_REPLICATE", "DP_SHARD", "TP"});
//   VESCALE_DEVICE_MESH.get_role_size("DP");              // 4
//   VESCALE_DEVICE_MESH.get_data_parallel_dim_groups();   // rank 5: [1,3,5,7]
//   VESCALE_DEVICE_MESH.get_role_rank("DP_SHARD");        // rank 5: 0
//
// init_device_mesh makes that group once (a DeviceMesh::flatten of the two,
// named "DP_REPLICATE_DP_SHARD"), so the getters never communicate. One of
// them alone is DP itself; an explicit DP dimension wins over both. A meta
// (or elastic) mesh has the size and rank but no DP group (FailedPrecondition),
// and get_global_role_meshes("DP") is Unimplemented on such a mesh.
// Flattened names count as dimensions: after `mesh.flatten({"DP", "TP"},
// "EP")` on the registry's mesh (or any mesh sliced from it), every rank
// asking get_role_size("EP"), get_role_rank, get_role_mesh,
// get_role_dim_groups, get_global_role_meshes, registry["EP"],
// get_strategy_size("EP") or lookup_rank("EP") gets the flattened
// dimension's answer (its size, this rank's index along it, its group),
// never a group of one. Flatten names match exactly (not ignoring case).
// One precedence: on a mesh with DP_REPLICATE / DP_SHARD the role "DP" is
// always their flattening (above); a flattening the user names "DP" there
// answers only the dimension-name getters (operator[], get_strategy_size,
// lookup_rank). Name it otherwise to avoid the two meanings.
//
// Every query costs O(ndim) arithmetic on the layout: no scan of the world and
// no communication. Every method that can fail returns a Status; before
// `init_device_mesh` (or after `reset`) each one is FailedPrecondition, saying
// to call init_device_mesh first.
//
// Concurrency: queries are safe from any number of threads at any time, and
// each reads one snapshot of the registry: a query running during a re-init
// answers wholly from the old mesh or wholly from the new one, never a mix
// (is_last_stage compares a stage and a stage count of the same mesh).
// `init_device_mesh` and `reset` are serialised. The registry alone owns the
// current mesh (threads keep no copies), so a re-init or reset frees the old
// mesh's communicators on its own thread, once the queries in flight are
// done, never later on an idle thread. Meshes and communicators handed out
// stay valid after a re-init (they keep the old communicators alive, and
// whoever lets go of them last frees them); `is_current(mesh)` tells whether
// one is stale.
//
// MPI thread levels (vemesh/comm/mpi/mpi_environment.h): queries never call
// MPI and work from any thread. Under MPI_THREAD_FUNNELED or SINGLE,
// `init_device_mesh` of a cpu or cuda mesh from a thread other than the
// main one is FailedPrecondition naming the level; `reset` (or a meta init)
// from such a thread forgets the mesh at once but leaves its communicators
// to the next init_device_mesh or reset on a thread that may call MPI.
//
// Named meshes (issue 45). Beside the default mesh (veScale's, above, and
// unchanged), the registry holds meshes made under a name, over the same
// ranks with another factorisation: an MoE job's expert mesh beside its
// attention mesh, a vision encoder's mesh, an RL rollout mesh:
//
//   InitOptions experts;
//   experts.mesh_name = "experts";
//   VESCALE_DEVICE_MESH.init_device_mesh("cpu", {2, 1, 4},
//                                        {"PP", "EDP", "EP"}, experts);
//   VESCALE_DEVICE_MESH.get_role_dim_groups("EP", MeshName("experts"));
//   VESCALE_DEVICE_MESH.get_role_size("EP");  // FailedPrecondition: only
//                                             // mesh 'experts' has EP
//
// Every getter takes a MeshName last (the default mesh when omitted). A name
// no mesh has is NotFound naming the meshes that exist. A role (or
// dimension name) that the asked mesh lacks but another mesh has is
// FailedPrecondition naming that mesh: the registry never answers one
// mesh's role from another, nor with the "size 1, rank 0" of a missing role.
// A named mesh over the ranks of a mesh already here (same device type,
// same size, no rank list or backend of its own) is made as a
// DeviceMesh::view of it (bind_names false), so dimensions that span the
// same rank sets, whatever their names, share one communicator (the group
// cache, docs/ARCHITECTURE.md); otherwise it is a mesh of its own.
// reset(MeshName) forgets one mesh and leaves the others working (their
// communicators stay alive while a mesh uses them); reset() forgets the
// default mesh only, reset_all() every mesh. An elastic job keeps one mesh:
// a named init with InitOptions::elastic, a named init beside an elastic
// default mesh, or an elastic init beside named meshes is
// FailedPrecondition, since the replica dimension changes membership each
// epoch and a second mesh spanning it would keep groups of replicas that
// are gone.
//
// Where veScale disagrees with its own documentation, this follows the
// documentation; docs/VESCALE_COMPAT.md lists each case.

#ifndef VEMESH_REGISTRY_VE_DEVICE_MESH_H_
#define VEMESH_REGISTRY_VE_DEVICE_MESH_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "vemesh/comm/communicator.h"
#include "vemesh/elastic/elastic_mesh.h"
#include "vemesh/layout/mesh_layout.h"
#include "vemesh/mesh/device_mesh.h"
#include "vemesh/mesh/mesh_options.h"

namespace vemesh {

// How init_device_mesh builds the registry's mesh: the MeshOptions that
// DeviceMesh::Create takes (one home for them: rank list, timeout, world,
// bootstrap, backends, NCCL settings, latency-sensitive roles), plus what
// only the registry does.
//
//   InitOptions o;
//   o.mesh.timeout = absl::Seconds(10);
//   o.mesh.backend_override = {{"DP", "gloo"}};
//   o.check_uniqueness = true;
//   VESCALE_DEVICE_MESH.init_device_mesh("cpu", {2, 4}, {"DP", "TP"}, o);
//
// mesh.cuda_device is set from the device type ("cuda:N"), as
// vemesh::init_device_mesh sets it. (Until issue 25, InitOptions repeated six
// of these fields as its own; write o.mesh.timeout where o.timeout was.)
struct InitOptions {
  MeshOptions mesh;
  // veScale's check_uniqueness: a second init_device_mesh is an error
  // (AlreadyExists) instead of replacing the mesh.
  bool check_uniqueness = false;
  // An elastic job (vemesh/elastic/elastic_mesh.h, docs/ELASTIC.md): the
  // dimension `elastic->replica_dim` spans one launch per replica through
  // the control plane, and shrinks and grows with membership. The shape's
  // size for it is the number of replicas that start the job; the launch
  // that runs this process holds one replica (the product of the others).
  // mesh.ranks must then be empty.
  std::optional<ElasticOptions> elastic;
  // Empty: the default mesh (veScale's). Otherwise the mesh is made, or
  // replaced, under this name, and the default and other named meshes stay
  // as they are. "default" is reserved (InvalidArgument).
  std::string mesh_name;
};

// Which of the registry's meshes a getter answers from: the default one
// when empty (MeshName()), else the one made under this name. Explicit, so
// that a mesh name is never taken for a dimension name.
//   VESCALE_DEVICE_MESH.get_role_size("EP", MeshName("experts"));
struct MeshName {
  constexpr MeshName() = default;
  constexpr explicit MeshName(absl::string_view n) : name(n) {}
  bool is_default() const { return name.empty(); }
  absl::string_view name;
};

// A neighbouring pipeline stage: its sub-mesh (every dimension but PP), its
// stage index, and `peer`, the global rank in it that holds this rank's
// position (same coordinate on every other dimension): the rank to send
// activations to or receive them from.
// A mesh of PP alone has one-rank stages; their mesh is a one-rank meta mesh.
struct StageNeighbor {
  int64_t stage;
  int64_t peer;
  DeviceMesh mesh;
};

class VeDeviceMesh {
 public:
  // The process's registry; VESCALE_DEVICE_MESH expands to this.
  static VeDeviceMesh& Instance();

  // A separate registry (tests, tools). Most programs use Instance().
  VeDeviceMesh();
  ~VeDeviceMesh();
  VeDeviceMesh(const VeDeviceMesh&) = delete;
  VeDeviceMesh& operator=(const VeDeviceMesh&) = delete;

  // -- Life cycle
  // --------------------------------------------------------------- Collective.
  // Builds the global mesh and makes it current, replacing any earlier one (or
  // failing with AlreadyExists under check_uniqueness). device_type: "cpu",
  // "cuda", "cuda:N" (device N on this rank) or "meta" (layout only, no
  // communicators, no communication). On error the registry is unchanged.
  absl::StatusOr<DeviceMesh> init_device_mesh(
      absl::string_view device_type, std::vector<int64_t> mesh_shape,
      std::vector<std::string> mesh_dim_names = {}, InitOptions options = {});
  // Forgets the mesh; queries are FailedPrecondition until the next init.
  // An elastic mesh stops its heartbeat (its replica is then lost to the
  // others after one TTL).
  void reset();
  // Forgets one mesh (the default one for MeshName()); the others keep
  // working, their communicators included (a communicator two meshes share
  // lives while either holds it). Collective only as far as freeing
  // communicators is.
  void reset(MeshName mesh);
  // Forgets every mesh, the default one and the named ones.
  void reset_all();
  // The names of the named meshes initialised now, in name order (the
  // default mesh is not among them: is_initialized() tells).
  std::vector<std::string> mesh_names() const;
  // The elastic mesh of an init with InitOptions::elastic, else null. Valid
  // until the next init_device_mesh or reset: do not reset from another
  // thread while end_step or recover runs.
  // Each epoch replaces the registry's mesh: queries follow the membership.
  ElasticMesh* elastic() const;
  bool is_initialized() const;
  bool is_initialized(MeshName mesh) const;
  // Whether `mesh` (or the mesh it was sliced from) is the current global
  // mesh; false for meshes from a replaced or reset init.
  bool is_current(const DeviceMesh& mesh, MeshName name = {}) const;
  // FailedPrecondition naming the mesh when !is_current(mesh).
  absl::Status check_current(const DeviceMesh& mesh, MeshName name = {}) const;

  // -- The mesh and its sub-meshes
  // ---------------------------------------------
  absl::StatusOr<DeviceMesh> get(MeshName mesh = {}) const;
  // The 1-D sub-mesh along `dim` that contains this rank.
  absl::StatusOr<DeviceMesh> operator[](absl::string_view dim) const;
  // The 1-D sub-mesh along dimension `dim` (an index, never a name).
  absl::StatusOr<DeviceMesh> operator[](int64_t dim) const;
  // `registry[{"DP", "TP"}]`: the same as get_submesh({"DP", "TP"}).
  absl::StatusOr<DeviceMesh> operator[](
      std::initializer_list<absl::string_view> dims) const;
  // The sub-mesh along `dims` (in that order) that contains this rank.
  absl::StatusOr<DeviceMesh> get_submesh(absl::Span<const std::string> dims,
                                         MeshName mesh = {}) const;

  // -- Shape and coordinates
  // ---------------------------------------------------
  absl::StatusOr<int64_t> get_strategy_size(absl::string_view dim,
                                            MeshName mesh = {}) const;
  absl::StatusOr<int64_t> get_strategy_size(int64_t dim,
                                            MeshName mesh = {}) const;
  // This rank's coordinate / any global rank's coordinate (O(ndim)).
  absl::StatusOr<Coordinate> get_strategy_coordinate(MeshName mesh = {}) const;
  absl::StatusOr<Coordinate> get_strategy_coordinate(int64_t global_rank,
                                                     MeshName mesh = {}) const;
  // The same written into the caller's `out` (ndim() entries, else
  // InvalidArgument): the form for hot loops, no coordinate returned.
  //   int64_t coord[3];
  //   VESCALE_DEVICE_MESH.get_strategy_coordinate(rank, absl::MakeSpan(coord));
  absl::Status get_strategy_coordinate(int64_t global_rank,
                                       absl::Span<int64_t> out,
                                       MeshName mesh = {}) const;
  // This rank's index along one dimension.
  absl::StatusOr<int64_t> lookup_rank(absl::string_view dim,
                                      MeshName mesh = {}) const;
  absl::StatusOr<int64_t> lookup_rank(int64_t dim, MeshName mesh = {}) const;
  // The global rank at a coordinate.
  absl::StatusOr<int64_t> get_global_rank(absl::Span<const int64_t> coordinate,
                                          MeshName mesh = {}) const;
  // This process's global rank.
  absl::StatusOr<int64_t> get_rank(MeshName mesh = {}) const;
  // The device index on this host (host-local rank), not a mesh coordinate:
  // the GPU this process drives. veScale's get_local_rank(), kept under
  // that name; it is NOT DeviceMesh::get_local_rank(dim), PyTorch's index
  // along a dimension (lookup_rank(dim) here). host_local_rank() is the
  // same value under a name that cannot be mistaken, as DeviceMesh spells it.
  absl::StatusOr<int64_t> get_local_rank(MeshName mesh = {}) const;
  absl::StatusOr<int64_t> host_local_rank(MeshName mesh = {}) const;
  // Each rank's host and, per dimension, how many groups cross hosts
  // (vemesh/placement/placement.h; ToJson() is what `vemesh plan --check`
  // reads).
  absl::StatusOr<Placement> get_placement(MeshName mesh = {}) const;
  absl::StatusOr<Coordinate> get_coordinate(MeshName mesh = {}) const;
  absl::StatusOr<int64_t> size(MeshName mesh = {}) const;
  // By name or by index; an integer (a literal 0 too) is an index.
  absl::StatusOr<int64_t> size(absl::string_view dim, MeshName mesh = {}) const;
  absl::StatusOr<int64_t> size(int64_t dim, MeshName mesh = {}) const;
  absl::StatusOr<int64_t> ndim(MeshName mesh = {}) const;
  absl::StatusOr<std::vector<int64_t>> shape(MeshName mesh = {}) const;
  absl::StatusOr<std::vector<std::string>> mesh_dim_names(
      MeshName mesh = {}) const;
  absl::StatusOr<DeviceType> device_type(MeshName mesh = {}) const;

  // -- Roles by name (PP, DP, TP, EP, CP, ...)
  // --------------------------------- Size and this rank's index: 1 and 0 for a
  // role the mesh lacks.
  absl::StatusOr<int64_t> get_role_size(absl::string_view role,
                                        MeshName mesh = {}) const;
  absl::StatusOr<int64_t> get_role_rank(absl::string_view role,
                                        MeshName mesh = {}) const;
  // The 1-D sub-mesh / communicator of a role; NotFound if the mesh lacks it.
  absl::StatusOr<DeviceMesh> get_role_mesh(absl::string_view role,
                                           MeshName mesh = {}) const;
  absl::StatusOr<std::shared_ptr<Communicator>> get_role_dim_groups(
      absl::string_view role, MeshName mesh = {}) const;
  // Every 1-D mesh along a role, row-major over the other dimensions.
  // The get_global_* lists build at most 65536 meshes: a longer list (a
  // huge meta mesh) is ResourceExhausted naming the count, before anything
  // is allocated.
  absl::StatusOr<std::vector<DeviceMesh>> get_global_role_meshes(
      absl::string_view role, MeshName mesh = {}) const;

  // -- The veScale role getters
  // -------------------------------------------------
  absl::StatusOr<int64_t> get_pipeline_parallel_rank(MeshName mesh = {}) const;
  absl::StatusOr<int64_t> get_data_parallel_rank(MeshName mesh = {}) const;
  absl::StatusOr<int64_t> get_tensor_parallel_rank(MeshName mesh = {}) const;
  absl::StatusOr<DeviceMesh> get_pipeline_parallel_mesh(
      MeshName mesh = {}) const;
  absl::StatusOr<DeviceMesh> get_data_parallel_mesh(MeshName mesh = {}) const;
  absl::StatusOr<DeviceMesh> get_tensor_parallel_mesh(MeshName mesh = {}) const;
  absl::StatusOr<std::shared_ptr<Communicator>>
  get_pipeline_parallel_dim_groups(MeshName mesh = {}) const;
  absl::StatusOr<std::shared_ptr<Communicator>> get_data_parallel_dim_groups(
      MeshName mesh = {}) const;
  absl::StatusOr<std::shared_ptr<Communicator>> get_tensor_parallel_dim_groups(
      MeshName mesh = {}) const;
  // Every TP row, row-major.
  absl::StatusOr<std::vector<DeviceMesh>> get_global_tensor_parallel_meshes(
      MeshName mesh = {}) const;
  // One mesh per pipeline stage (every dimension but PP), in stage order.
  absl::StatusOr<std::vector<DeviceMesh>> get_global_pipeline_parallel_meshes(
      MeshName mesh = {}) const;
  absl::StatusOr<bool> is_first_stage(MeshName mesh = {}) const;
  absl::StatusOr<bool> is_last_stage(MeshName mesh = {}) const;

  // -- Pipeline neighbours (beyond veScale)
  // ------------------------------------- The previous / next stage and this
  // rank's peer in it. std::nullopt at the first / last stage unless `wrap`
  // (virtual, interleaved pipelines).
  absl::StatusOr<std::optional<StageNeighbor>> get_prev_stage(
      bool wrap = false, MeshName mesh = {}) const;
  absl::StatusOr<std::optional<StageNeighbor>> get_next_stage(
      bool wrap = false, MeshName mesh = {}) const;
  // Only the peer's global rank: the cheap form for send/recv.
  absl::StatusOr<std::optional<int64_t>> get_prev_stage_peer(
      bool wrap = false, MeshName mesh = {}) const;
  absl::StatusOr<std::optional<int64_t>> get_next_stage_peer(
      bool wrap = false, MeshName mesh = {}) const;

 private:
  struct State;
  // One reading of `published_` or of a named mesh's slot (a
  // SnapshotGuard): the state a query answers from, alive until the query
  // returns. Lock-free for the default mesh.
  class Snapshot;
  // A named mesh: its state, owned here, and the pointer queries read.
  // Slots are made once per name and kept until the registry dies, so a
  // query may hold one's address without a lock.
  struct Slot {
    std::unique_ptr<const State> owner;
    std::atomic<const void*> published{nullptr};
  };
  // Publishes `next` (null: none) in (owner, published), waits out the
  // queries reading the old state and frees it here, or keeps it in
  // `retired_` when this thread may not call MPI. Under init_mu_.
  void replace(std::unique_ptr<const State> next);
  void replace(std::unique_ptr<const State>& owner,
               std::atomic<const void*>& published,
               std::unique_ptr<const State> next);
  // What a query of `mesh` reads: &published_ for the default mesh, the
  // slot's for a named one, null for a name never initialised.
  const std::atomic<const void*>* published_for(MeshName mesh) const;
  // NotFound for a named mesh not initialised now, naming those that are.
  absl::Status MissingMesh(MeshName mesh) const;
  // OK unless a mesh other than `asked` has `role` (a dimension, a role or
  // a flattened name): then FailedPrecondition naming that mesh. Called
  // only where `asked` lacks the role.
  absl::Status role_elsewhere(absl::string_view role, MeshName asked) const;
  // init_device_mesh under a name (init_mu_ held).
  absl::StatusOr<DeviceMesh> init_named(absl::string_view device_type,
                                        std::vector<int64_t> mesh_shape,
                                        std::vector<std::string> mesh_dim_names,
                                        InitOptions options);
  absl::StatusOr<std::optional<StageNeighbor>> stage_neighbor(
      int64_t shift, bool wrap, MeshName mesh) const;
  absl::StatusOr<std::optional<int64_t>> stage_peer(int64_t shift, bool wrap,
                                                    MeshName mesh) const;
  // The registry's state for `mesh`: its sub-meshes and stage peers.
  // `collective` (init_device_mesh: every rank calls it) also flattens
  // DP_REPLICATE x DP_SHARD into the DP group.
  static absl::StatusOr<std::unique_ptr<const State>> MakeState(
      const DeviceMesh& mesh, bool collective = false);
  static bool IsFlatDp(const State& s, absl::string_view role);
  static absl::Status NoFlatDp(const State& s);
  // Makes an elastic epoch's mesh current (from the elastic mesh).
  absl::Status publish_epoch(const DeviceMesh& mesh);

  // std::mutex rather than absl::Mutex: Debian's Abseil is not built with
  // TSan, which would then not see the locking and report false races.
  // Serialises init and reset (long, collective) without blocking queries.
  std::mutex init_mu_;
  // The current state, owned here alone; null before init. Under init_mu_.
  std::unique_ptr<const State> owner_;
  // Replaced states that a thread forbidden to call MPI let go of; freed by
  // the next replace() on a thread that may. Under init_mu_.
  std::vector<std::unique_ptr<const State>> retired_;
  // The elastic mesh of the current init, if any. Under init_mu_.
  std::unique_ptr<ElasticMesh> elastic_;
  std::atomic<ElasticMesh*> elastic_view_{nullptr};
  // owner_.get(), for queries (vemesh/registry/internal/snapshot_guard.h).
  std::atomic<const void*> published_{nullptr};
  // The named meshes' slots. named_mu_ guards the map (inserts, look-ups);
  // a slot's contents follow init_mu_ and the snapshot protocol.
  mutable std::mutex named_mu_;
  std::map<std::string, std::unique_ptr<Slot>, std::less<>> named_;
};

}  // namespace vemesh

// The process's registry, as veScale spells it.
#define VESCALE_DEVICE_MESH (::vemesh::VeDeviceMesh::Instance())

#endif  // VEMESH_REGISTRY_VE_DEVICE_MESH_H_
