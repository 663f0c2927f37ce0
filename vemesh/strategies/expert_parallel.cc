#include "vemesh/strategies/expert_parallel.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "vemesh/base/status_macros.h"

namespace vemesh::strategies {
namespace {

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

std::string Shape(const Matrix& m) {
  return absl::StrCat(m.rows(), "x", m.cols());
}

// The received rows (indices into d.received) for local expert `j`, in order.
std::vector<int64_t> RowsOfExpert(const MoeDispatch& d, int j) {
  std::vector<int64_t> rows;
  for (size_t k = 0; k < d.received_expert.size(); ++k) {
    if (d.received_expert[k] == j) rows.push_back(static_cast<int64_t>(k));
  }
  return rows;
}

}  // namespace

std::vector<int> RouteByHash(absl::Span<const int64_t> token_ids,
                             int num_experts, uint64_t seed) {
  std::vector<int> expert;
  expert.reserve(token_ids.size());
  const uint64_t salt = SplitMix64(seed);
  for (int64_t id : token_ids) {
    expert.push_back(
        static_cast<int>(SplitMix64(static_cast<uint64_t>(id) ^ salt) %
                         static_cast<uint64_t>(std::max(num_experts, 1))));
  }
  return expert;
}

absl::StatusOr<ExpertParallelMoe> ExpertParallelMoe::Create(
    const std::string& name, int num_experts, std::shared_ptr<Communicator> ep,
    const std::function<ExpertInit(int expert)>& init) {
  const int g = ep == nullptr ? 1 : ep->size();
  if (num_experts < 1 || num_experts % g != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "MoE layer '", name, "': ", num_experts,
        " experts cannot be spread evenly over an expert-parallel group of ", g,
        " ranks: expected a positive multiple of ", g));
  }
  ExpertParallelMoe moe;
  moe.name_ = name;
  moe.num_experts_ = num_experts;
  moe.ep_size_ = g;
  moe.ep_ = g > 1 ? std::move(ep) : nullptr;
  const int per_rank = num_experts / g;
  moe.first_expert_ = (moe.ep_ == nullptr ? 0 : moe.ep_->rank()) * per_rank;
  for (int e = moe.first_expert_; e < moe.first_expert_ + per_rank; ++e) {
    ExpertInit p = init(e);
    const std::string expert_name = absl::StrCat(name, ".expert", e);
    VEMESH_RETURN_IF_ERROR(CheckLinearShapes(expert_name, p.weight, p.bias));
    if (moe.experts_.empty()) {
      moe.in_ = p.weight.rows();
      moe.out_ = p.weight.cols();
    } else if (p.weight.rows() != moe.in_ || p.weight.cols() != moe.out_) {
      return absl::InvalidArgumentError(absl::StrCat(
          "MoE layer '", name, "': expert ", e, " has a ", Shape(p.weight),
          " weight but expert ", moe.first_expert_, " has ", moe.in_, "x",
          moe.out_, ": every expert must have the same shape"));
    }
    moe.experts_.emplace_back(expert_name, std::move(p.weight),
                              std::move(p.bias));
  }
  return moe;
}

std::vector<Parameter*> ExpertParallelMoe::parameters() {
  std::vector<Parameter*> params;
  for (Linear& e : experts_) {
    for (Parameter* p : e.parameters()) params.push_back(p);
  }
  return params;
}

absl::StatusOr<Matrix> ExpertParallelMoe::Exchange(
    const Matrix& rows, absl::Span<const size_t> send,
    absl::Span<const size_t> recv) const {
  const size_t cols = static_cast<size_t>(rows.cols());
  size_t total = 0;
  for (size_t n : recv) total += n;
  Matrix out(static_cast<int64_t>(total), rows.cols());
  if (ep_ == nullptr) return rows;
  std::vector<size_t> send_counts(send.begin(), send.end());
  std::vector<size_t> recv_counts(recv.begin(), recv.end());
  for (size_t& n : send_counts) n *= cols;
  for (size_t& n : recv_counts) n *= cols;
  VEMESH_RETURN_IF_ERROR(
      ep_->all_to_all_v(AsConstSpan(rows), absl::MakeConstSpan(send_counts),
                        AsSpan(out), absl::MakeConstSpan(recv_counts)));
  return out;
}

absl::StatusOr<Matrix> ExpertParallelMoe::Forward(
    const Matrix& x, absl::Span<const int> expert_of_row,
    MoeDispatch* dispatch) const {
  if (x.cols() != in_) {
    return absl::InvalidArgumentError(
        absl::StrCat("MoE layer '", name_, "' forward: input is ", Shape(x),
                     "; expected ", in_, " columns"));
  }
  if (expert_of_row.size() != static_cast<size_t>(x.rows())) {
    return absl::InvalidArgumentError(
        absl::StrCat("MoE layer '", name_, "' forward: ", expert_of_row.size(),
                     " routing entries for ", x.rows(), " input rows"));
  }
  for (size_t i = 0; i < expert_of_row.size(); ++i) {
    if (expert_of_row[i] < 0 || expert_of_row[i] >= num_experts_) {
      return absl::InvalidArgumentError(absl::StrCat(
          "MoE layer '", name_, "' forward: row ", i, " is routed to expert ",
          expert_of_row[i], "; expected one in [0, ", num_experts_, ")"));
    }
  }
  MoeDispatch& d = *dispatch;
  const int g = ep_size_;
  // Group the rows by destination, in row order within one (counting sort).
  d.send_tokens.assign(g, 0);
  for (int e : expert_of_row) ++d.send_tokens[OwnerOf(e, num_experts_, g)];
  std::vector<size_t> at(g, 0);
  for (int r = 1; r < g; ++r) at[r] = at[r - 1] + d.send_tokens[r - 1];
  d.order.assign(expert_of_row.size(), 0);
  // The expert id travels as one more column (small integers are exact in
  // double).
  Matrix send(x.rows(), in_ + 1);
  for (size_t i = 0; i < expert_of_row.size(); ++i) {
    const size_t k = at[OwnerOf(expert_of_row[i], num_experts_, g)]++;
    d.order[k] = static_cast<int64_t>(i);
    send.row(k).head(in_) = x.row(i);
    send(k, in_) = expert_of_row[i];
  }

  // Every rank learns how many rows each peer sends it.
  if (ep_ == nullptr) {
    d.recv_tokens = d.send_tokens;
  } else {
    std::vector<int64_t> counts_out(d.send_tokens.begin(), d.send_tokens.end());
    std::vector<int64_t> counts_in(g);
    VEMESH_RETURN_IF_ERROR(ep_->all_to_all(absl::MakeConstSpan(counts_out),
                                           absl::MakeSpan(counts_in)));
    d.recv_tokens.assign(counts_in.begin(), counts_in.end());
  }
  VEMESH_ASSIGN_OR_RETURN(Matrix got,
                          Exchange(send, d.send_tokens, d.recv_tokens));
  d.received = got.leftCols(in_);
  d.received_expert.resize(got.rows());
  for (int64_t k = 0; k < got.rows(); ++k) {
    const int local = static_cast<int>(got(k, in_)) - first_expert_;
    if (local < 0 || local >= local_experts()) {
      return absl::InternalError(absl::StrCat(
          "MoE layer '", name_, "': received a token for expert ", got(k, in_),
          ", which this rank (experts ", first_expert_, " to ",
          first_expert_ + local_experts() - 1, ") does not hold"));
    }
    d.received_expert[k] = local;
  }

  // Each local expert on its rows, as one matrix product.
  Matrix computed(got.rows(), out_);
  for (int j = 0; j < local_experts(); ++j) {
    const std::vector<int64_t> rows = RowsOfExpert(d, j);
    if (rows.empty()) continue;
    Matrix in(static_cast<int64_t>(rows.size()), in_);
    for (size_t r = 0; r < rows.size(); ++r)
      in.row(r) = d.received.row(rows[r]);
    const Matrix y = experts_[j].Forward(in);
    for (size_t r = 0; r < rows.size(); ++r) computed.row(rows[r]) = y.row(r);
  }

  // Results go back the way the tokens came.
  VEMESH_ASSIGN_OR_RETURN(Matrix back,
                          Exchange(computed, d.recv_tokens, d.send_tokens));
  Matrix y(x.rows(), out_);
  for (size_t k = 0; k < d.order.size(); ++k) y.row(d.order[k]) = back.row(k);
  return y;
}

absl::StatusOr<Matrix> ExpertParallelMoe::Backward(const MoeDispatch& d,
                                                   const Matrix& grad_y) {
  const int64_t rows = static_cast<int64_t>(d.order.size());
  if (grad_y.rows() != rows || grad_y.cols() != out_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "MoE layer '", name_, "' backward: output gradient is ", Shape(grad_y),
        "; expected ", rows, "x", out_, " (the forward's output)"));
  }
  Matrix send(rows, out_);
  for (int64_t k = 0; k < rows; ++k) send.row(k) = grad_y.row(d.order[k]);
  VEMESH_ASSIGN_OR_RETURN(Matrix got,
                          Exchange(send, d.send_tokens, d.recv_tokens));

  Matrix grad_in(got.rows(), in_);
  for (int j = 0; j < local_experts(); ++j) {
    const std::vector<int64_t> idx = RowsOfExpert(d, j);
    if (idx.empty()) continue;
    Matrix in(static_cast<int64_t>(idx.size()), in_);
    Matrix g(static_cast<int64_t>(idx.size()), out_);
    for (size_t r = 0; r < idx.size(); ++r) {
      in.row(r) = d.received.row(idx[r]);
      g.row(r) = got.row(idx[r]);
    }
    const Matrix dx = experts_[j].Backward(in, g);
    for (size_t r = 0; r < idx.size(); ++r) grad_in.row(idx[r]) = dx.row(r);
  }

  VEMESH_ASSIGN_OR_RETURN(Matrix back,
                          Exchange(grad_in, d.recv_tokens, d.send_tokens));
  Matrix dx(rows, in_);
  for (int64_t k = 0; k < rows; ++k) dx.row(d.order[k]) = back.row(k);
  return dx;
}

}  // namespace vemesh::strategies
