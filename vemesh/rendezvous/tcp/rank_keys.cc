// Keys tied to a rank: the pattern matcher (internal/rank_keys.h).

#include "vemesh/rendezvous/tcp/internal/rank_keys.h"

#include <cstddef>

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

}  // namespace vemesh
