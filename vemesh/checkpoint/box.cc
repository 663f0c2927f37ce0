// vemesh/checkpoint/box.cc

#include "vemesh/checkpoint/box.h"

#include <algorithm>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace vemesh::checkpoint {

int64_t BoxNumel(const Box& box) {
  int64_t n = 1;
  for (int64_t l : box.lengths) n *= l;
  return n;
}

std::string BoxToString(const Box& box) {
  std::string out = "[";
  for (size_t d = 0; d < box.offsets.size() && d < box.lengths.size(); ++d) {
    absl::StrAppend(&out, d ? ", " : "", box.offsets[d], ":",
                    box.offsets[d] + box.lengths[d]);
  }
  return out + "]";
}

absl::Status CheckBox(const Box& box, absl::Span<const int64_t> shape) {
  const std::string shape_text =
      absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
  if (box.offsets.size() != shape.size() ||
      box.lengths.size() != shape.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("box with ", box.offsets.size(), " offsets and ",
                     box.lengths.size(), " lengths for a tensor of shape ",
                     shape_text, ": expected ", shape.size(), " of each"));
  }
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "shape ", shape_text, " has a negative size in dimension ", d));
    }
    if (box.offsets[d] < 0 || box.lengths[d] < 0 || box.lengths[d] > shape[d] ||
        box.offsets[d] > shape[d] - box.lengths[d]) {
      return absl::InvalidArgumentError(absl::StrCat(
          "box offsets [", absl::StrJoin(box.offsets, ", "), "] lengths [",
          absl::StrJoin(box.lengths, ", "), "] is not inside shape ",
          shape_text, " (dimension ", d, ")"));
    }
  }
  return absl::OkStatus();
}

std::optional<Box> Intersect(const Box& a, const Box& b) {
  if (a.offsets.size() != b.offsets.size()) return std::nullopt;
  Box out;
  for (size_t d = 0; d < a.offsets.size(); ++d) {
    int64_t lo = std::max(a.offsets[d], b.offsets[d]);
    int64_t hi =
        std::min(a.offsets[d] + a.lengths[d], b.offsets[d] + b.lengths[d]);
    if (hi <= lo) return std::nullopt;
    out.offsets.push_back(lo);
    out.lengths.push_back(hi - lo);
  }
  return out;
}

absl::Status CheckTiling(const std::vector<Box>& boxes,
                         absl::Span<const int64_t> shape) {
  const size_t nd = shape.size();
  // Sum in 128 bits: each box is inside the shape, but their sum is not.
  unsigned __int128 total = 1, covered = 0;
  for (int64_t s : shape) total *= static_cast<uint64_t>(s);
  std::vector<size_t> order;
  for (size_t i = 0; i < boxes.size(); ++i) {
    const int64_t n = BoxNumel(boxes[i]);
    if (n == 0) continue;
    covered += static_cast<uint64_t>(n);
    order.push_back(i);
  }
  // The sweep dimension: the one with the most distinct offsets.
  size_t sweep = 0;
  size_t most = 0;
  for (size_t d = 0; d < nd; ++d) {
    std::set<int64_t> offsets;
    for (size_t i : order) offsets.insert(boxes[i].offsets[d]);
    if (offsets.size() > most) {
      most = offsets.size();
      sweep = d;
    }
  }
  auto overlap = [&](size_t a, size_t b) {
    return absl::InvalidArgumentError(
        absl::StrCat("pieces ", BoxToString(boxes[a]), " and ",
                     BoxToString(boxes[b]), " overlap"));
  };
  if (nd == 0) {
    if (order.size() > 1) return overlap(order[0], order[1]);
  } else {
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      return boxes[a].offsets[sweep] < boxes[b].offsets[sweep];
    });
    // Boxes whose extent in the sweep dimension reaches past the current
    // box's start: the only ones it can meet.
    std::vector<size_t> active;
    for (size_t i : order) {
      const int64_t start = boxes[i].offsets[sweep];
      active.erase(std::remove_if(active.begin(), active.end(),
                                  [&](size_t a) {
                                    return boxes[a].offsets[sweep] +
                                               boxes[a].lengths[sweep] <=
                                           start;
                                  }),
                   active.end());
      for (size_t a : active) {
        if (Intersect(boxes[a], boxes[i])) return overlap(a, i);
      }
      active.push_back(i);
    }
  }
  // Disjoint, inside the shape: they tile it when they cover every element.
  if (covered != total) {
    return absl::InvalidArgumentError(absl::StrCat(
        "pieces cover ", static_cast<uint64_t>(covered), " of the ",
        static_cast<uint64_t>(total), " elements of shape [",
        absl::StrJoin(shape, ", "), "] (a gap)"));
  }
  return absl::OkStatus();
}

std::vector<Box> FlatRangeToBoxes(absl::Span<const int64_t> shape,
                                  int64_t begin, int64_t end) {
  std::vector<Box> out;
  const size_t nd = shape.size();
  int64_t numel = 1;
  for (int64_t s : shape) numel *= std::max<int64_t>(s, 0);
  begin = std::clamp<int64_t>(begin, 0, numel);
  end = std::clamp<int64_t>(end, 0, numel);
  if (begin >= end) return out;
  if (nd == 0) {
    out.push_back(Box{});
    return out;
  }
  // stride[d]: elements in one step of dimension d.
  std::vector<int64_t> stride(nd, 1);
  for (size_t d = nd - 1; d > 0; --d) stride[d - 1] = stride[d] * shape[d];
  // Greedy: from `pos`, take the largest aligned block that fits: a run of
  // whole sub-blocks of some dimension d, from pos's index in d up to the
  // end of that dimension or as far as `end` allows. Going up (finishing
  // partial dimensions) then down (the tail) gives at most 2*nd-1 boxes.
  int64_t pos = begin;
  while (pos < end) {
    // The innermost-first search for the coarsest dimension d at which pos
    // is aligned (pos % stride[d] == 0).
    size_t d = nd - 1;
    while (d > 0 && pos % stride[d - 1] == 0) --d;
    // pos is aligned to stride[d]; take k whole blocks of stride[d] without
    // passing the end of dimension d (or of the tensor) or `end`.
    int64_t index = (pos / stride[d]) % shape[d];
    int64_t k = std::min(shape[d] - index, (end - pos) / stride[d]);
    while (k == 0) {
      ++d;  // too coarse: use a finer dimension (d < nd - 1 here)
      index = (pos / stride[d]) % shape[d];
      k = std::min(shape[d] - index, (end - pos) / stride[d]);
    }
    Box box;
    int64_t rem = pos;
    for (size_t e = 0; e < nd; ++e) {
      int64_t i = (rem / stride[e]) % shape[e];
      if (e < d) {
        box.offsets.push_back(i);
        box.lengths.push_back(1);
      } else if (e == d) {
        box.offsets.push_back(i);
        box.lengths.push_back(k);
      } else {
        box.offsets.push_back(0);
        box.lengths.push_back(shape[e]);
      }
    }
    out.push_back(std::move(box));
    pos += k * stride[d];
  }
  return out;
}

}  // namespace vemesh::checkpoint
