// vemesh/mesh/device_mesh.h
//
// A DeviceMesh is a MeshLayout bound to this process: its global rank, its
// device type and one communicator per mesh dimension.
//
//   absl::StatusOr<DeviceMesh> mesh =
//       init_device_mesh("cpu", {2, 2, 2}, {"PP", "DP", "TP"});
//   mesh->get_coordinate();            // e.g. [1, 0, 1] on rank 5
//   mesh->get_local_rank("TP");        // 1: this rank's index along TP
//   mesh->get_group("TP");             // communicator of ranks [4, 5]
//   (*mesh)["TP"];                     // 1-D child mesh, same communicators
//   mesh->slice({"DP", "TP"});         // 2-D child mesh
//   mesh->flatten({"DP", "TP"}, "DPTP");  // collective; cached
//   mesh->flatten_mesh({"DP", "TP"}, "DPTP");  // the same, as a 1-D mesh
//   (*mesh)["DPTP"];                   // afterwards: a name like any other
//   mesh->slice({"PP", "DPTP"});       // 2-D child (PP, DPTP)
//
//   // A DP replica is lost, not elastic: stop everything, go on without it.
//   mesh->abort();                     // every group: Aborted at once
//   auto smaller = mesh->shrink("DP", {1});   // on the survivors only
//   smaller->shape();                  // [2, 1, 2]: DP coordinate 1 gone
//
// Flattened names. After `flatten(dims, name)` (on every rank), `name` is a
// dimension of every mesh of the same root that holds all of `dims`: the
// root, its children, the flattened 1-D mesh. It can be sliced
// (`mesh["DPTP"]`, a slice of {"PP", "DPTP"}), asked for its group, size
// and local rank, and flattened again (nested: flatten({"DPTP", "EP"})
// spans the root dimensions DP, TP, EP and is the same communicator as
// flatten({"DP", "TP", "EP"})). The flattened dimensions need not be
// adjacent (DP x TP of a PP x DP x CP x TP mesh). A mesh that lacks one of
// them answers NotFound naming the missing one.
//
// Creation is collective over the world: every rank calls it with the same
// arguments, and every rank checks that they all did (a mismatch is an error
// on every rank, not a hang). The communicators of all dimensions are made at
// construction by splitting the world, one split per dimension, in the same
// order on every rank; nothing is created lazily except `flatten`, which is
// an explicit collective call.
//
// A mesh smaller than the world is allowed: the ranks outside it take part in
// the splits, get no group, and `get_coordinate()` answers NotFound.
//
// DeviceMesh is a cheap handle (copies share state). A child mesh from
// `operator[]` or `slice` shares its parent's communicators: it creates none.
// The communicators are freed with the last mesh (or caller) holding them.
//
// What `Create` does, in this order, on every rank of the world, all of it
// through the bootstrap seam (vemesh/bootstrap/) and Communicator:
//   1. The bootstrap: MeshOptions::bootstrap, or one made from
//      MeshOptions::world, or the process's own from the launcher
//      (vemesh/bootstrap/launch.h: MPI under mpirun/srun, a TCP store hosted
//      by rank 0 under torchrun / env://).
//   2. Agreement and placement in one all-gather: a fingerprint of (device
//      type, shape, names, rank list, backends) and this rank's host
//      identity. A mismatch is InvalidArgument on every rank, naming the
//      first rank that differs from rank 0 and what each passed. A rank that
//      never arrives gives DeadlineExceeded on every rank.
//   3. The mesh must fit: size <= world size, every rank < world size.
//   4. Host placement from the gathered host identities (cross-checked with
//      OMPI_COMM_WORLD_LOCAL_RANK / LOCAL_RANK / SLURM_LOCALID of this
//      step: a mismatch is a warning through vemesh/base/log.h naming the
//      variable). Global rank 0 logs the placement warnings last.
//   5. A host world per backend used (a private MPI duplicate, or a Gloo
//      world through the store), and for "cuda" an NCCL world whose unique
//      id travels over the host world, on device N of "cuda:N", else device
//      0 when CUDA_VISIBLE_DEVICES leaves one device per task, else device
//      `host_local_rank()` (vemesh/comm/nccl/cuda_device.h).
//   6. The dimensions' groups: one Communicator::split_many per backend
//      world, over the dimensions on that backend (worlds in the order of
//      their first dimension), so every rank makes the same calls in the
//      same order. NCCL issues the splits of all its dimensions in one
//      group and names each communicator after its dimension. Ranks outside
//      the mesh take part with no color.
// A "meta" mesh skips all of it: no communication, global rank = the
// launcher's rank (RANK, OMPI_COMM_WORLD_RANK, ...), else 0.
//
// Backend is not device type: "cpu" uses MPI when an MPI launcher started
// the job and Gloo when env:// did; "cuda" uses NCCL. MeshOptions::backend
// picks one for every dimension, backend_override for some ("gloo" for DP
// under mpirun, say). ToString() names the backends and why.
//
// With `MeshOptions::world` set, that communicator is the world: the
// layout's ranks, `global_rank()` and the groups' `ranks()` are ranks in it.
//
// Threads: queries are safe from any thread; the collective calls
// (Create, flatten) must be made in the same order on every rank.

#ifndef VEMESH_MESH_DEVICE_MESH_H_
#define VEMESH_MESH_DEVICE_MESH_H_

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/hash/hash.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "vemesh/bootstrap/bootstrap.h"
#include "vemesh/comm/communicator.h"
#include "vemesh/comm/nccl_options.h"
#include "vemesh/layout/device_type.h"
#include "vemesh/layout/mesh_layout.h"
#include "vemesh/mesh/mesh_options.h"
#include "vemesh/placement/placement.h"

// `mesh["DP", "TP"]` is the comma operator: it reads as a 2-D slice but is
// `mesh["TP"]`. C++20 deprecates a comma at the top of a subscript and the
// compilers warn; code that includes this header gets that warning as an
// error, so the misleading spelling does not compile. Write
// `mesh[{"DP", "TP"}]` (or `mesh.slice({"DP", "TP"})`) for the 2-D slice.
// The compiler's own text says "comma" and "subscript"; the brace form is
// named here, and, under C++23 (where the comma is a second argument), by a
// static_assert on DeviceMesh::operator[] of several arguments.
#if defined(__clang__)
#pragma clang diagnostic error "-Wdeprecated-comma-subscript"
#elif defined(__GNUC__)
#pragma GCC diagnostic error "-Wcomma-subscript"
#endif

namespace vemesh {

class DeviceMesh {
 public:
  // Collective over the world. See the file comment.
  static absl::StatusOr<DeviceMesh> Create(DeviceType device_type,
                                           MeshLayout layout,
                                           const MeshOptions& options = {});
  // A mesh with a layout and a rank but no communicators (device "meta"):
  // every query works, `get_group` answers FailedPrecondition. Local only.
  static DeviceMesh Meta(MeshLayout layout, int64_t global_rank);
  // Adopts communicators the program already has, one per dimension of
  // `layout` (PyTorch's DeviceMesh.from_group): creates and communicates
  // nothing. Each group must be the one of `global_rank` along its
  // dimension: its size the dimension's size, its rank the coordinate, its
  // ranks() the layout's global ranks of that group in order; otherwise
  // InvalidArgument naming the dimension and what differs. Such a mesh
  // cannot flatten (FailedPrecondition): it has no world to split.
  static absl::StatusOr<DeviceMesh> FromGroups(
      DeviceType device_type, MeshLayout layout, int64_t global_rank,
      std::vector<std::shared_ptr<Communicator>> groups,
      int host_local_rank = 0, int host_size = 1);

  DeviceType device_type() const;
  const MeshLayout& layout() const;
  int64_t global_rank() const;
  // PyTorch's spelling of global_rank(): this process's rank in the world
  // (not in the mesh, not on the host).
  int64_t get_rank() const { return global_rank(); }
  // Whether this process is a member of the mesh.
  bool has_self() const;

  int64_t size() const;
  int64_t ndim() const;
  std::vector<int64_t> shape() const;
  std::vector<std::string> mesh_dim_names() const;
  // The size of one dimension, by name or by index. An integer (a literal 0
  // included) always reaches the index overload; a null name does not
  // reach the name overload.
  absl::StatusOr<int64_t> size(absl::string_view dim) const;
  absl::StatusOr<int64_t> size(int64_t dim) const;
  // The member global ranks, row-major.
  std::vector<int64_t> mesh() const;

  // This rank's coordinate; NotFound outside the mesh.
  absl::StatusOr<Coordinate> get_coordinate() const;
  // This rank's index along one dimension (PyTorch's get_local_rank: a
  // mesh coordinate, not the device index on the host, which is
  // host_local_rank() here and on the registry).
  absl::StatusOr<int64_t> get_local_rank(absl::string_view dim) const;
  absl::StatusOr<int64_t> get_local_rank(int64_t dim) const;
  // The same on a 1-D mesh, without naming the dimension; InvalidArgument
  // naming the dimensions for any other (PyTorch's get_local_rank() without
  // mesh_dim). NotFound outside the mesh.
  absl::StatusOr<int64_t> get_local_rank() const;
  // The communicator of one dimension; a name given to `flatten` also finds
  // its group (when this mesh holds all the flattened dimensions; see
  // "Flattened names" above).
  // FailedPrecondition for a meta mesh or a rank outside the mesh; NotFound
  // for an unknown name.
  absl::StatusOr<std::shared_ptr<Communicator>> get_group(
      absl::string_view dim) const;
  absl::StatusOr<std::shared_ptr<Communicator>> get_group(int64_t dim) const;
  // The group of a 1-D mesh; InvalidArgument naming the dimensions for any
  // other (PyTorch's get_group() without mesh_dim).
  absl::StatusOr<std::shared_ptr<Communicator>> get_group() const;
  // One communicator per dimension, in dimension order (PyTorch's
  // get_all_groups). The errors of get_group.
  absl::StatusOr<std::vector<std::shared_ptr<Communicator>>> get_all_groups()
      const;

  // Child meshes that contain this rank, sharing this mesh's communicators.
  absl::StatusOr<DeviceMesh> operator[](absl::string_view dim) const;
  // The 1-D child along dimension `dim` (an index: `mesh[0]` is never a
  // name lookup).
  absl::StatusOr<DeviceMesh> operator[](int64_t dim) const;
  // `mesh[{"DP", "TP"}]`: the same as slice({"DP", "TP"}).
  absl::StatusOr<DeviceMesh> operator[](
      std::initializer_list<absl::string_view> dims) const;
#if defined(__cpp_multidimensional_subscript) && \
    __cpp_multidimensional_subscript >= 202110L
  // C++23 reads `mesh["DP", "TP"]` as a subscript of two arguments: refuse
  // it with a message naming the brace form. (Under C++20 it is the comma
  // operator, which the pragma at the top of this file makes an error.)
  template <typename First, typename Second, typename... Rest>
  absl::StatusOr<DeviceMesh> operator[](First&&, Second&&, Rest&&...) const {
    static_assert(sizeof(First) == 0,
                  "mesh[\"DP\", \"TP\"] is not a 2-D slice: write "
                  "mesh[{\"DP\", \"TP\"}] or mesh.slice({\"DP\", \"TP\"})");
    return absl::UnimplementedError("unreachable");
  }
#endif
  absl::StatusOr<DeviceMesh> slice(absl::Span<const std::string> dims) const;
  // The child along `dims` that contains `global_rank`, any member of this
  // mesh: it shares this mesh's communicators when this process is in it,
  // and has none otherwise (get_group is then FailedPrecondition). Local.
  absl::StatusOr<DeviceMesh> submesh_at(absl::Span<const std::string> dims,
                                        int64_t global_rank) const;
  // Whether both meshes come from the same creation (one root mesh and its
  // children), and so share communicators.
  bool same_root(const DeviceMesh& other) const;
  // The mesh this one was sliced or flattened from, as created (itself for a
  // root). Local.
  DeviceMesh root_mesh() const;

  // Equal when both come from the same creation (same_root) and have the
  // same layout: the same names, shape and ranks in the same places (so the
  // same communicators). Meshes from two creations with the same arguments
  // are not equal: their communicators differ (PyTorch compares the layout
  // and device only). Hashable with absl::Hash, consistently with ==, so a
  // mesh can key an absl::flat_hash_map. O(ndim) for meshes derived the
  // same way.
  friend bool operator==(const DeviceMesh& a, const DeviceMesh& b);
  friend bool operator!=(const DeviceMesh& a, const DeviceMesh& b) {
    return !(a == b);
  }
  template <typename H>
  friend H AbslHashValue(H h, const DeviceMesh& mesh) {
    return H::combine(std::move(h), mesh.hash_value());
  }

  // Collective over the world (every rank, members or not, must call it with
  // the same arguments): the communicator of `dims` flattened into one
  // dimension, ordered row-major over `dims` in the order given. Cached in
  // the shared state by the root dimensions spanned: the same dims (from
  // this mesh or any child) return the same communicator without
  // communicating. `name` defaults to the dims joined by '_'; it must not
  // be a dimension's name or another flattening's. One dimension is that
  // dimension's group (no split), and a new name for it is registered, so
  // get_group(name) finds it too. Ranks outside the mesh take part in the
  // split, then get FailedPrecondition. Flattens of one mesh run one at a
  // time; get_group never waits for one (no lock is held across the split).
  absl::StatusOr<std::shared_ptr<Communicator>> flatten(
      absl::Span<const std::string> dims, absl::string_view name = "") const;
  // flatten(dims, name), then the 1-D mesh along `name` that holds this rank
  // (PyTorch's DeviceMesh._flatten): its group is the communicator flatten
  // returns. Collective like flatten; a rank outside the mesh takes part,
  // then gets FailedPrecondition.
  absl::StatusOr<DeviceMesh> flatten_mesh(absl::Span<const std::string> dims,
                                          absl::string_view name = "") const;

  // Dimension `dim` split into `names` of `sizes` (PyTorch's
  // DeviceMesh._unflatten): the same ranks in the same row-major places,
  // `dim` replaced by several dimensions. Collective over the world (every
  // rank, members or not, with the same arguments): one agreement check,
  // then one split per new dimension on the backend of `dim`, nothing per
  // sub-group; the other dimensions reuse their communicators. The result
  // is this mesh's view of a new root (root_mesh() is the unflattened root,
  // not this mesh's root; == tells them apart), in which `dim` stays a name:
  // the flattening of its parts, with its old communicator. Flattenings
  // made before carry over. `dim` must be a dimension of the root mesh (not
  // a flattened one). Errors (InvalidArgument, naming the value): sizes
  // whose product is not dim's size, a size < 1, a count of names that
  // differs, a name already used; FailedPrecondition for an adopted mesh
  // (FromGroups) and, after the splits, for a rank outside a child mesh.
  // A meta mesh unflattens its layout without communicating.
  absl::StatusOr<DeviceMesh> unflatten(
      absl::string_view dim, absl::Span<const int64_t> sizes,
      absl::Span<const std::string> names) const;
  absl::StatusOr<DeviceMesh> unflatten(
      int64_t dim, absl::Span<const int64_t> sizes,
      absl::Span<const std::string> names) const;

  // Another named factorisation of this mesh's root (Megatron's
  // HyperCommGrid views: dense PP x DP x CP x TP and experts PP x EDP x EP x
  // ETP over the same ranks): `shape` over the root's ranks in the same
  // row-major order, one name per dimension. A dimension whose name the
  // root or an earlier view of it already has must enumerate the same
  // groups, and then is the same communicator; otherwise InvalidArgument
  // naming the dimension and a group that differs (the same error on every
  // rank, before any communication). Collective over the world: one
  // agreement check, then one split per new dimension. The view is a root
  // of its own (root_mesh() is the view); later views of it or of the root
  // share the same names. A sizes product other than the root's size is
  // InvalidArgument.
  absl::StatusOr<DeviceMesh> view(absl::Span<const int64_t> shape,
                                  absl::Span<const std::string> names) const;
  // The same, with names bound or not. Every view shares communicators by
  // rank set as well as by name: a dimension whose groups (the sets of
  // ranks it enumerates) equal those of any dimension or flattening made
  // before in the family, whatever its name, reuses that communicator (the
  // group cache, docs/ARCHITECTURE.md). With `bind_names` false (the
  // registry's named meshes: a trainer's DP and a rollout mesh's DP may
  // differ), a name is not tied to groups: this view's names neither
  // check against nor register in the family's names, only its rank sets.
  struct ViewOptions {
    bool bind_names = true;
  };
  absl::StatusOr<DeviceMesh> view(absl::Span<const int64_t> shape,
                                  absl::Span<const std::string> names,
                                  const ViewOptions& options) const;

  // PyTorch's DeviceMesh._concatenate: one mesh whose dimensions are those
  // of `meshes`, in order (their names and sizes concatenated), over the
  // same ranks: FSDP over DP x CP joined with TP apart,
  //   concatenate({mesh["DP"], mesh["CP"]})  ==  mesh[{"DP", "CP"}]
  //   concatenate({mesh["DPCP"], mesh["TP"]})   // a flattened name too
  // Local: no communication, no new communicator (the result is a slice of
  // the common root and shares its groups). Every mesh must come from one
  // root (same_root; InvalidArgument naming the two roots otherwise, as
  // PyTorch refuses meshes "derived from different device meshes"), their
  // dimensions must not overlap (a root dimension spanned twice, as by
  // mesh["DP"] and mesh["DPCP"], is InvalidArgument naming it: PyTorch's
  // "Cannot concatenate overlapping meshes"), and every mesh must lie in
  // the result (their ranks one block of the root: the sub-meshes this rank
  // holds always do; InvalidArgument naming the mesh otherwise). An empty
  // list is InvalidArgument. The result holds the first mesh's first rank.
  static absl::StatusOr<DeviceMesh> concatenate(
      absl::Span<const DeviceMesh> meshes);

  // -- Abort and shrink (jobs that are not elastic; vemesh/elastic/ grows
  // and shrinks a dimension in place) --------------------------------------
  // Any thread, local, idempotent: aborts every communicator of this mesh's
  // root (its dimensions, every flattening, the views sharing them), so
  // every child mesh and caller holding one sees it: blocked and later
  // operations return Aborted ("... communicator ... was aborted
  // (DeviceMesh::abort() was called)") at once, and flatten is
  // FailedPrecondition. All are aborted in one call (AbortCommunicators):
  // NCCL: one ncclGroupStart/ncclGroupEnd of ncclCommAbort, and the mesh's
  // NCCL communicators are released with ncclCommAbort, never
  // ncclCommDestroy, from then on. MPI: MPI cannot abort one communicator;
  // they are marked (operations fail at once, a blocked one is abandoned)
  // and freed by the last holder with MPI_Comm_free, which is local. Gloo:
  // the connections are closed (peers fail at once), waits on this rank's
  // messages are interrupted, and a collective blocked inside Gloo returns
  // Aborted at the latest at the Gloo timeout (MeshOptions::timeout).
  // The backend worlds the mesh was split from are not aborted. OK for a
  // meta mesh (nothing to abort).
  absl::Status abort() const;

  // Collective over the ranks that stay (the excluded ranks do not call):
  // this mesh without the coordinates `exclude` of dimension `dim`
  // (PyTorch's RFC shrink(exclude=...), given as coordinates along one
  // dimension so that the result is a mesh: DP=4 x TP=2 without DP
  // coordinate 1 is DP=3 x TP=2, ranks keep their global numbers). Only the
  // groups along `dim` change: each is shrunk from its communicator
  // (Communicator::shrink: NCCL ncclCommShrink, NCCL_SHRINK_ABORT when
  // `options` or unfinished operations say so; MPI MPI_Comm_create_group
  // over the survivors, which needs the excluded ranks alive, e.g. a
  // planned removal; Gloo a new rendezvous over the store). The other
  // dimensions' groups are the same communicators (a group along another
  // dimension lies at one coordinate of `dim`, so it lost no one), unless
  // the mesh was aborted: then every dimension is rebuilt among the
  // survivors (call abort() on every survivor first). The result is a
  // mesh of its own (FromGroups): it cannot flatten (FailedPrecondition).
  // Errors: InvalidArgument naming the value for an unknown dim, a
  // coordinate out of range or given twice, excluding every coordinate, or
  // this rank's own coordinate; FailedPrecondition outside the mesh or when
  // a kept group was aborted without abort() of the mesh. A meta mesh
  // shrinks its layout locally.
  absl::StatusOr<DeviceMesh> shrink(absl::string_view dim,
                                    absl::Span<const int64_t> exclude,
                                    const ShrinkOptions& options = {}) const;

  // This process's device index on its host and the number of ranks there,
  // from the host identities gathered at creation, cross-checked with the
  // launcher's variables. 0 and 1 for a meta mesh.
  int host_local_rank() const;
  int host_size() const;

  // Each rank's host and, per dimension of this mesh, how many groups cross
  // hosts (vemesh/placement/placement.h), from the host identities gathered at
  // creation; no communication. FailedPrecondition for a meta mesh and for
  // one made from groups (FromGroups), which gathered none.
  absl::StatusOr<Placement> get_placement() const;

  // The backend of one dimension ("mpi", "gloo", "nccl"); empty for meta.
  absl::StatusOr<std::string> backend(absl::string_view dim) const;

  // "DeviceMesh(cpu, PP=2, DP=2, TP=2, rank=5, backend=gloo (RANK/WORLD_SIZE
  // are set (torchrun or env://)))".
  std::string ToString() const;

 private:
  struct Shared;  // communicators of the root mesh, flatten cache
  // A mesh is one pointer, so that handing one out (the registry does on
  // every sub-mesh query) is one reference-count increment.
  struct View;
  DeviceMesh(std::shared_ptr<Shared> shared, MeshLayout layout);
  size_t hash_value() const;

  std::shared_ptr<const View> view_;
};

// The PyTorch / veScale spelling. `device_type` is "cpu", "cuda" (or "cuda:N")
// or "meta"; `names` empty means the default names.
absl::StatusOr<DeviceMesh> init_device_mesh(
    absl::string_view device_type, absl::Span<const int64_t> mesh_shape,
    absl::Span<const std::string> mesh_dim_names = {},
    const MeshOptions& options = {});

}  // namespace vemesh

#endif  // VEMESH_MESH_DEVICE_MESH_H_
