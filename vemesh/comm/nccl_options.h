// vemesh/comm/nccl_options.h
//
// How the NCCL backend makes its communicators. A mesh takes them in
// MeshOptions::nccl; a communicator keeps them and hands them to every
// communicator split from it. A plain struct that needs no NCCL, so it
// lives beside the backend-neutral headers: the mesh's options take it
// without including a backend folder (vemesh/comm/nccl/nccl_options.h
// forwards here).
//
//   MeshOptions options;
//   options.nccl.split_share = true;   // children share the world's resources
//   auto mesh = DeviceMesh::Create(DeviceType::kCuda, layout, options);

#ifndef VEMESH_COMM_NCCL_OPTIONS_H_
#define VEMESH_COMM_NCCL_OPTIONS_H_

namespace vemesh {

struct NcclOptions {
  // ncclConfig_t::splitShare of every ncclCommSplit: the children share the
  // parent's NCCL resources instead of allocating their own, which saves
  // device memory and set-up time but ties the children to the parent
  // (NCCL's ncclCommSplit documentation says what sharing implies). Off by
  // default: each communicator owns its resources, as before this option.
  // vemesh sets the field either way, so NCCL_COMM_SPLIT_SHARE_RESOURCES in
  // the environment does not change a mesh. Needs NCCL >= 2.18.
  bool split_share = false;

  // Whether split_many (a mesh's per-dimension communicators) issues all its
  // ncclCommSplit calls in one ncclGroupStart/ncclGroupEnd, so that NCCL
  // builds the communicators concurrently, or one at a time, each waited
  // for before the next. Off by default: on an H200 with NCCL 2.28.9,
  // grouped splits of a one-rank parent intermittently never finished
  // (DeadlineExceeded in hsdp and bench/nccl_init, two runs of two
  // sessions), while one at a time never failed (bench/gpu/logs/). Grouping
  // needs NCCL >= 2.27, in the headers vemesh was built with and in the
  // library loaded; with an older one, or with split_share (grouped
  // children are built on concurrent threads, which race on a shared
  // parent's stream), the splits go one at a time whatever this says.
  bool group_splits = false;
};

}  // namespace vemesh

#endif  // VEMESH_COMM_NCCL_OPTIONS_H_
