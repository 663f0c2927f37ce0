// python/vemesh_py/checkpoint_py.h
//
// vemesh._C._checkpoint: the C++ checkpoint (vemesh/checkpoint/) on Python
// arrays, in place and without a copy. python/vemesh/checkpoint.py turns a
// state dict (torch tensors, numpy arrays, vemesh.checkpoint.Shard and
// FlatShard) into the entry lists these functions take:
//
//   entries = [("w", rows, [16, 12], [4, 0], [4, 12], None),  # a box
//              ("b", bias, [12], [0], [12], None),           # whole
//              ("v", flat, [16, 12], None, None, 10)]        # flat run
//   _checkpoint.save(entries, "/ckpt", group, step=3, keep_last=2,
//                    metadata={"k": "v"}, error=None)
//   info = _checkpoint.load(entries, "/ckpt", group, step=None, error=None)
//   # info == {"step": 3, "path": "/ckpt/step-3", "metadata": {"k": "v"}}
//   m = _checkpoint.read_manifest("/ckpt", step=None)
//
// An entry is (name, array, global_shape, offsets, lengths, flat_offset):
// either the box offsets/lengths (the array holds the box row-major) or
// flat_offset (the array holds elements [flat_offset, +count) of the
// row-major global tensor, cut into boxes by FlatRangeToBoxes). save and
// load are collective over `group`: a bad entry on one rank (or `error`,
// what the Python side found wrong) is the same exception on every rank,
// its message prefixed "rank R: ", before anything is written or read.

#ifndef VEMESH_PYTHON_CHECKPOINT_PY_H_
#define VEMESH_PYTHON_CHECKPOINT_PY_H_

#include <pybind11/pybind11.h>

namespace vemesh::python {

// Defines the submodule `_checkpoint` of `m`.
void RegisterCheckpoint(pybind11::module_& m);

}  // namespace vemesh::python

#endif  // VEMESH_PYTHON_CHECKPOINT_PY_H_
