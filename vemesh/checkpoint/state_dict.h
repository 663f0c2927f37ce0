// vemesh/checkpoint/state_dict.h
//
// A StateDict lists what one rank holds: pieces (boxes) of named global
// tensors, where their bytes are, and the job's metadata (step, data
// position, model name). Save reads the pieces; Load writes them.
//
//   std::vector<float> w_rows(4 * 16);   // rows 4..7 of a [16, 16] weight
//   StateDict state;
//   absl::Status s = state.Add("layer0.weight", DType::kF32, {16, 16},
//                              Box{{4, 0}, {4, 16}}, w_rows.data());
//   state.SetMetadata("data_position", "1234");
//   // Save(state, step, "/ckpt", *world) or Load(state, "/ckpt", *world):
//   // vemesh/checkpoint/checkpoint.h.

#ifndef VEMESH_CHECKPOINT_STATE_DICT_H_
#define VEMESH_CHECKPOINT_STATE_DICT_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "vemesh/checkpoint/box.h"
#include "vemesh/checkpoint/dtype.h"

namespace vemesh::checkpoint {

// What one rank holds of one tensor.
struct Piece {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> global_shape;
  Box box;
  // Row-major, box-local: BoxNumel(box) * DTypeSize(dtype) bytes.
  void* data = nullptr;
};

class StateDict {
 public:
  // A piece of tensor `name` (global shape, dtype) that this rank holds at
  // `box`, stored row-major (box-local) at `data`. Several ranks may add the
  // same box (replicas): Save writes it once, spread over the replicas. The
  // same name may get several boxes on one rank (they must not overlap).
  // Pointers must stay valid until Save/Load returns (AsyncSaver::Start
  // copies them). InvalidArgument, naming the tensor, for: an empty name or
  // one with bytes outside printable ASCII, a box outside the shape, a null
  // `data` for a non-empty box, a dtype or shape that differs from an
  // earlier piece of the same name, the same box added twice.
  absl::Status Add(std::string name, DType dtype,
                   std::vector<int64_t> global_shape, Box box, void* data);
  // The whole tensor (one box covering `shape`).
  absl::Status AddFull(std::string name, DType dtype,
                       std::vector<int64_t> shape, void* data);
  // Text carried in the manifest (step, data position, model name...).
  // Save refuses keys and values with bytes outside printable ASCII (tab
  // and newline allowed in values).
  void SetMetadata(std::string key, std::string value);

  const std::vector<Piece>& pieces() const { return pieces_; }
  const std::map<std::string, std::string>& metadata() const {
    return metadata_;
  }
  void Clear();

 private:
  std::vector<Piece> pieces_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace vemesh::checkpoint

#endif  // VEMESH_CHECKPOINT_STATE_DICT_H_
