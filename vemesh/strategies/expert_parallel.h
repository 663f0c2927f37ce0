// vemesh/strategies/expert_parallel.h
//
// A mixture-of-experts (MoE) layer with expert parallelism: E experts (each
// an affine map in -> out) spread over an expert-parallel (EP) group of G
// ranks, E / G consecutive experts per rank. Each token (a row of the input)
// goes to one expert chosen by the caller's router; tokens travel to the
// rank holding their expert and their results travel back.
//
//   // EP over DP x TP of a PP,DP,TP mesh: one flattened communicator.
//   auto ep = *VESCALE_DEVICE_MESH.get()->flatten({"DP", "TP"}, "EP");
//   auto moe = *ExpertParallelMoe::Create("moe", /*num_experts=*/8, ep,
//       [](int e) { return ExpertInit{Weight(e), Bias(e)}; });
//   std::vector<int> expert = RouteByHash(token_ids, 8);  // deterministic
//   MoeDispatch d;
//   Matrix y = *moe.Forward(x, expert, &d);   // y_i = x_i W_e(i) + b_e(i)
//   Matrix dx = *moe.Backward(d, dy);         // and the experts' grads
//
// One Forward is three exchanges over the EP group: the token counts per
// destination (all_to_all: every rank learns how many rows it receives from
// each peer, which differ from call to call), the tokens themselves with
// their expert id (all_to_all_v), and the results back (all_to_all_v).
// Backward sends the output gradients the same way and the input gradients
// back, reusing the counts. Rows keep their order: within a destination,
// tokens go in row order, so the layer is deterministic and a serial
// computation of x_i W_e(i) + b_e(i) is its reference.
//
// Routing is the caller's (a deterministic rule, so a serial reference can
// reproduce it): there is no learned gate, no capacity limit and no token
// dropping. Expert parameters live on one EP rank each, so they are not
// averaged over data parallelism: their gradient already sums the tokens of
// every EP member.
//
// Collective over the EP group: every member calls Forward (and Backward)
// the same number of times, in the same order, with any number of rows
// (zero too). A null communicator, or a group of one, holds every expert and
// communicates nothing.

#ifndef VEMESH_STRATEGIES_EXPERT_PARALLEL_H_
#define VEMESH_STRATEGIES_EXPERT_PARALLEL_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "vemesh/comm/communicator.h"
#include "vemesh/strategies/dense.h"
#include "vemesh/strategies/linear.h"
#include "vemesh/strategies/parameter.h"

namespace vemesh::strategies {

// Expert e's initial parameters: weight in x out, bias 1 x out.
struct ExpertInit {
  Matrix weight;
  Matrix bias;
};

// What one Forward sent where, for its Backward (one per micro-batch in
// flight).
struct MoeDispatch {
  // order[k] is the input row sent k-th (rows grouped by destination rank,
  // in row order within one).
  std::vector<int64_t> order;
  std::vector<size_t> send_tokens;  // rows to each EP rank
  std::vector<size_t> recv_tokens;  // rows from each EP rank
  // The rows this rank's experts computed, and which local expert each.
  Matrix received;
  std::vector<int> received_expert;
};

// expert_of_row[i] = hash(token_ids[i], seed) mod num_experts: a routing
// that any process reproduces from the token ids alone (splitmix64).
std::vector<int> RouteByHash(absl::Span<const int64_t> token_ids,
                             int num_experts, uint64_t seed = 0);

class ExpertParallelMoe {
 public:
  // `init(e)` is called for this rank's experts only. InvalidArgument when
  // num_experts < 1 or not a multiple of the EP size, or when the experts'
  // shapes differ (naming the expert and both shapes).
  static absl::StatusOr<ExpertParallelMoe> Create(
      const std::string& name, int num_experts,
      std::shared_ptr<Communicator> ep,
      const std::function<ExpertInit(int expert)>& init);

  // The EP rank holding expert `expert`.
  static int OwnerOf(int expert, int num_experts, int ep_size) {
    return expert / (num_experts / ep_size);
  }

  // y (rows x out), row i computed by expert expert_of_row[i]. `dispatch`
  // receives what Backward needs. InvalidArgument (naming the value) for a
  // wrong column count, a routing of the wrong length or an expert outside
  // [0, num_experts), before any communication: a bad routing on one rank
  // fails there, and its peers then wait on the counts (as for any
  // collective with a mismatched call).
  absl::StatusOr<Matrix> Forward(const Matrix& x,
                                 absl::Span<const int> expert_of_row,
                                 MoeDispatch* dispatch) const;
  // Adds this rank's experts' gradients for the tokens of `dispatch` and
  // returns dL/dx (rows x in). `grad_y` must be Forward's rows x out.
  absl::StatusOr<Matrix> Backward(const MoeDispatch& dispatch,
                                  const Matrix& grad_y);

  int num_experts() const { return num_experts_; }
  int ep_size() const { return ep_size_; }
  int first_expert() const { return first_expert_; }
  int local_experts() const { return static_cast<int>(experts_.size()); }
  int64_t in_features() const { return in_; }
  int64_t out_features() const { return out_; }
  // This rank's experts' weights and biases, expert by expert.
  std::vector<Parameter*> parameters();

 private:
  ExpertParallelMoe() = default;
  // Sends `rows` rows (of `cols` values each) grouped by peer as `send`
  // counts say, receiving `recv` counts' rows.
  absl::StatusOr<Matrix> Exchange(const Matrix& rows,
                                  absl::Span<const size_t> send,
                                  absl::Span<const size_t> recv) const;

  std::string name_;
  int num_experts_ = 0;
  int ep_size_ = 1;
  int first_expert_ = 0;
  int64_t in_ = 0;
  int64_t out_ = 0;
  std::shared_ptr<Communicator> ep_;  // null when the group is this rank
  std::vector<Linear> experts_;
};

}  // namespace vemesh::strategies

#endif  // VEMESH_STRATEGIES_EXPERT_PARALLEL_H_
