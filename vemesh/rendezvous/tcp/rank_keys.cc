// Keys tied to a rank: the pattern matcher (internal/rank_keys.h).

#include "vemesh/rendezvous/tcp/internal/rank_keys.h"

#include <cstddef>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace vemesh {
namespace {

constexpr absl::string_view kRank = "{rank}";
constexpr size_t kMaxRankDigits = 9;

// The next '/'-separated component of `s` from `*pos` (moved past it and
// its '/'); false when there is none left.
bool NextComponent(absl::string_view s, size_t* pos, absl::string_view* out) {
  if (*pos > s.size()) return false;
  size_t end = s.find('/', *pos);
  if (end == absl::string_view::npos) end = s.size();
  *out = s.substr(*pos, end - *pos);
  *pos = end + 1;
  return true;
}

std::optional<int64_t> ParseRank(absl::string_view c) {
  if (c.empty() || c.size() > kMaxRankDigits) return std::nullopt;
  if (c.size() > 1 && c[0] == '0') return std::nullopt;  // one spelling only
  int64_t rank = 0;
  for (char ch : c) {
    if (ch < '0' || ch > '9') return std::nullopt;
    rank = rank * 10 + (ch - '0');
  }
  return rank;
}

std::optional<int64_t> Match(absl::string_view key, absl::string_view pattern) {
  size_t k = 0, p = 0;
  absl::string_view kc, pc;
  std::optional<int64_t> rank;
  for (;;) {
    const bool more_key = NextComponent(key, &k, &kc);
    const bool more_pattern = NextComponent(pattern, &p, &pc);
    if (!more_key || !more_pattern) {
      return more_key == more_pattern ? rank : std::nullopt;
    }
    if (pc == kRank) {
      rank = ParseRank(kc);
      if (!rank) return std::nullopt;
    } else if (pc != "*" && pc != kc) {
      return std::nullopt;
    }
  }
}

}  // namespace

absl::Status CheckRankKeyPattern(absl::string_view pattern) {
  size_t pos = 0;
  absl::string_view c;
  int ranks = 0;
  bool any = false;
  while (NextComponent(pattern, &pos, &c)) {
    any = true;
    if (c.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("rank key pattern '", pattern,
                       "' has an empty component: expected components "
                       "separated by single '/'"));
    }
    if (c == kRank) ++ranks;
  }
  if (!any || ranks != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank key pattern '", pattern, "' has ", ranks,
                     " {rank} components: expected exactly one (e.g. "
                     "'vemesh/ag/*/{rank}')"));
  }
  return absl::OkStatus();
}

std::optional<int64_t> RankOfKey(absl::string_view key,
                                 absl::Span<const std::string> patterns) {
  for (const std::string& pattern : patterns) {
    if (std::optional<int64_t> rank = Match(key, pattern)) return rank;
  }
  return std::nullopt;
}

absl::Status WriteRefusal(const WriteRules& rules, const KeyWriter& writer,
                          StoreOp op, absl::string_view key,
                          absl::string_view value) {
  const bool writes = op == StoreOp::kSet || op == StoreOp::kAdd ||
                      op == StoreOp::kCompareSet || op == StoreOp::kRemove;
  if (!writes) return absl::OkStatus();
  if (const std::optional<int64_t> rank =
          RankOfKey(key, rules.rank_key_patterns);
      rank && writer.proved_rank != *rank) {
    return absl::PermissionDeniedError(
        absl::StrCat("store ", StoreOpName(op), " of '", key.substr(0, 128),
                     "' refused: the key belongs to rank ", *rank,
                     " and only the connection that proved rank ", *rank,
                     " may write it (this one ",
                     writer.proved_rank < 0
                         ? std::string("proved no rank")
                         : absl::StrCat("proved rank ", writer.proved_rank),
                     ")"));
  }
  if (writer.owner) return absl::OkStatus();
  for (const std::string& suffix : rules.owner_key_suffixes) {
    if (!absl::EndsWith(key, suffix)) continue;
    if (op == StoreOp::kSet || op == StoreOp::kCompareSet) {
      for (const std::string& prefix : rules.open_value_prefixes) {
        if (!prefix.empty() && absl::StartsWith(value, prefix)) {
          return absl::OkStatus();
        }
      }
    }
    return absl::PermissionDeniedError(absl::StrCat(
        "store ", StoreOpName(op), " of '", key.substr(0, 128),
        "' refused: only rank 0's own connection may write it (a verdict "
        "made by anybody else is ignored)"));
  }
  return absl::OkStatus();
}

}  // namespace vemesh
