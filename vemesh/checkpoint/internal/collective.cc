// vemesh/checkpoint/internal/collective.cc

#include "vemesh/checkpoint/internal/collective.h"

#include <cstdint>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "vemesh/base/status_macros.h"

namespace vemesh::checkpoint::internal {

absl::StatusOr<std::vector<std::string>> AllGatherStrings(
    Communicator& comm, const std::string& mine) {
  const int n = comm.size();
  // One byte more than the text, so that no rank sends nothing.
  std::string send = mine + '\n';
  std::vector<int64_t> lengths(n);
  const int64_t my_length = static_cast<int64_t>(send.size());
  VEMESH_RETURN_IF_ERROR(
      comm.all_gather(&my_length, lengths.data(), 1, DataType::kInt64));
  std::vector<size_t> counts(n);
  size_t total = 0;
  for (int r = 0; r < n; ++r) {
    if (lengths[r] < 1 || lengths[r] > (int64_t{1} << 40)) {
      return absl::InternalError(absl::StrCat(
          "checkpoint: rank ", r, " sent a length of ", lengths[r]));
    }
    counts[r] = static_cast<size_t>(lengths[r]);
    total += counts[r];
  }
  std::string all(total, '\0');
  VEMESH_RETURN_IF_ERROR(
      comm.all_gather_v(send.data(), all.data(), counts, DataType::kUInt8));
  std::vector<std::string> out;
  out.reserve(n);
  size_t at = 0;
  for (int r = 0; r < n; ++r) {
    out.push_back(all.substr(at, counts[r] - 1));
    at += counts[r];
  }
  return out;
}

absl::Status AgreeStatus(Communicator& comm, const absl::Status& local) {
  std::string mine;
  if (!local.ok()) {
    mine = absl::StrCat(static_cast<int>(local.code()), ":", local.message());
  }
  VEMESH_ASSIGN_OR_RETURN(std::vector<std::string> all,
                          AllGatherStrings(comm, mine));
  for (size_t r = 0; r < all.size(); ++r) {
    if (all[r].empty()) continue;
    size_t colon = all[r].find(':');
    int code = 0;
    if (colon == std::string::npos ||
        !absl::SimpleAtoi(all[r].substr(0, colon), &code) || code <= 0 ||
        code > 16) {
      code = static_cast<int>(absl::StatusCode::kInternal);
    }
    return absl::Status(
        static_cast<absl::StatusCode>(code),
        absl::StrCat(
            "rank ", r, ": ",
            colon == std::string::npos ? all[r] : all[r].substr(colon + 1)));
  }
  return absl::OkStatus();
}

}  // namespace vemesh::checkpoint::internal
