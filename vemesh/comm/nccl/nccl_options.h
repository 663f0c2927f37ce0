// vemesh/comm/nccl/nccl_options.h
//
// NcclOptions, kept here for code that includes it from the NCCL backend's
// folder: the struct lives in vemesh/comm/nccl_options.h (it needs no NCCL,
// and the mesh's options take it without naming a backend folder).
//
//   NcclOptions options;
//   options.split_share = true;   // children share the parent's resources

#ifndef VEMESH_COMM_NCCL_NCCL_OPTIONS_H_
#define VEMESH_COMM_NCCL_NCCL_OPTIONS_H_

#include "vemesh/comm/nccl_options.h"

#endif  // VEMESH_COMM_NCCL_NCCL_OPTIONS_H_
