#include "vemesh/elastic/replica_state.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "vemesh/base/fnv1a.h"
#include "vemesh/base/status_macros.h"
#include "vemesh/comm/agreement.h"

namespace vemesh {
namespace {

// The largest piece of one broadcast (Gloo counts are ints).
constexpr size_t kChunk = size_t{1} << 28;

// Every rank learns whether any rank of `group` failed (`local_error`
// non-empty): Aborted everywhere, naming this rank's error or `elsewhere`.
absl::Status AgreeNoneFailed(Communicator& group, int root,
                             const std::string& local_error,
                             absl::string_view elsewhere) {
  int64_t bad = local_error.empty() ? 0 : 1;
  VEMESH_RETURN_IF_ERROR(
      group.all_reduce(&bad, &bad, 1, DataType::kInt64, ReduceOp::kMax));
  if (bad == 0) return absl::OkStatus();
  return absl::AbortedError(
      absl::StrCat("state transfer from DP rank ", root,
                   " failed: ", local_error.empty() ? elsewhere : local_error));
}

}  // namespace

uint64_t Fingerprint64(absl::string_view bytes, uint64_t seed) {
  // Four independent lanes so that the multiplies overlap; each word is
  // folded in and mixed (xor-shift after the multiply), the tail and the
  // length go through FNV-1a, and a final avalanche spreads every bit.
  constexpr uint64_t kMul = 0x9e3779b97f4a7c15ULL;
  uint64_t lane[4] = {
      seed ^ 0x243f6a8885a308d3ULL, seed ^ 0x13198a2e03707344ULL,
      seed ^ 0xa4093822299f31d0ULL, seed ^ 0x082efa98ec4e6c89ULL};
  const char* p = bytes.data();
  const size_t n = bytes.size();
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    for (int k = 0; k < 4; ++k) {
      uint64_t w;
      std::memcpy(&w, p + i + 8 * k, sizeof(w));
      lane[k] = (lane[k] ^ w) * kMul;
      lane[k] ^= lane[k] >> 29;
    }
  }
  uint64_t h = Fnv1aWord(n, kFnv1aOffset ^ seed);
  for (uint64_t l : lane) h = (h ^ l) * kMul;
  h = Fnv1a(bytes.substr(i), h);
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdULL;
  h ^= h >> 33;
  return h;
}

absl::Status ReplicaState::Register(const std::string& name,
                                    StateDictFn state_dict,
                                    LoadStateDictFn load_state_dict) {
  if (name.empty() || !state_dict || !load_state_dict) {
    return absl::InvalidArgumentError(
        absl::StrCat("register_state_dict_fn('", name,
                     "'): expected a non-empty name and both callbacks set"));
  }
  entries_[name] =
      Entry{std::move(state_dict), std::move(load_state_dict), nullptr};
  return absl::OkStatus();
}

absl::Status ReplicaState::RegisterBytes(const std::string& name,
                                         BytesFn bytes) {
  if (name.empty() || !bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "register_state_bytes('", name,
        "'): expected a non-empty name and the bytes callback set"));
  }
  Entry e;
  e.bytes = bytes;
  e.state_dict = [bytes]() -> absl::StatusOr<std::string> {
    absl::Span<char> b = bytes();
    return std::string(b.data(), b.size());
  };
  e.load_state_dict = [name, bytes](absl::string_view in) {
    absl::Span<char> b = bytes();
    if (in.size() != b.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "'", name, "': ", in.size(), " bytes, expected ", b.size()));
    }
    if (!in.empty()) std::memcpy(b.data(), in.data(), in.size());
    return absl::OkStatus();
  };
  entries_[name] = std::move(e);
  return absl::OkStatus();
}

std::vector<std::string> ReplicaState::names() const {
  std::vector<std::string> out;
  for (const auto& [name, entry] : entries_) out.push_back(name);
  return out;
}

absl::StatusOr<uint64_t> ReplicaState::Fingerprint() const {
  uint64_t h = Fingerprint64("");
  for (const auto& [name, entry] : entries_) {
    if (entry.bytes) {  // hashed in place
      absl::Span<char> b = entry.bytes();
      h = Fingerprint64(name, h);
      h = Fingerprint64(absl::string_view(b.data(), b.size()), h);
      continue;
    }
    absl::StatusOr<std::string> bytes = entry.state_dict();
    if (!bytes.ok()) {
      return absl::Status(bytes.status().code(),
                          absl::StrCat("state_dict of '", name,
                                       "': ", bytes.status().message()));
    }
    h = Fingerprint64(name, h);
    h = Fingerprint64(*bytes, h);
  }
  return h;
}

absl::Status ReplicaState::Transfer(Communicator& group, int root,
                                    bool receive) const {
  const bool sender = group.rank() == root;
  // The root's entries, and what every rank expects (the same names).
  std::string local_error;
  std::vector<int64_t> sizes;
  // The sender's serialised entries, each broadcast from the string that
  // state_dict returned (no concatenation into one buffer).
  std::vector<std::string> sent;
  if (sender) {
    for (const auto& [name, entry] : entries_) {
      if (entry.bytes) {  // sent in place
        sizes.push_back(static_cast<int64_t>(entry.bytes().size()));
        sent.emplace_back();
        continue;
      }
      absl::StatusOr<std::string> b = entry.state_dict();
      if (!b.ok()) {
        local_error =
            absl::StrCat("state_dict of '", name, "': ", b.status().message());
        break;
      }
      sizes.push_back(static_cast<int64_t>(b->size()));
      sent.push_back(*std::move(b));
    }
  }
  const uint64_t names_hash = Fingerprint64(absl::StrJoin(names(), "\n"));
  int64_t head[2] = {static_cast<int64_t>(names_hash >> 1),
                     static_cast<int64_t>(entries_.size())};
  int64_t root_head[2] = {head[0], head[1]};
  if (absl::Status s = group.broadcast(root_head, 2, DataType::kInt64, root);
      !s.ok()) {
    return s;
  }
  if (local_error.empty() &&
      (root_head[0] != head[0] || root_head[1] != head[1])) {
    local_error = absl::StrCat(
        "the sender registered other state entries than this rank's [",
        absl::StrJoin(names(), ", "), "]");
  }
  // Agree before the sizes: a rank that cannot go on must not leave the
  // others in a broadcast of another length.
  VEMESH_RETURN_IF_ERROR(
      AgreeNoneFailed(group, root, local_error, "on another rank"));
  sizes.resize(entries_.size(), 0);
  if (!sizes.empty()) {
    absl::Status s =
        group.broadcast(sizes.data(), sizes.size(), DataType::kInt64, root);
    if (!s.ok()) return s;
  }
  int64_t largest = 0;
  for (int64_t n : sizes) {
    if (n < 0) return absl::InternalError("state transfer: negative size");
    largest = std::max(largest, n);
  }
  // A receiver's one buffer for every entry in turn, left uninitialised
  // (the broadcast writes all of it: no zero-filling pass over the state).
  std::unique_ptr<char[]> received;
  if (!sender && largest > 0) {
    received.reset(new char[static_cast<size_t>(largest)]);
  }
  size_t i = 0;
  for (const auto& [name, entry] : entries_) {
    const size_t n = static_cast<size_t>(sizes[i]);
    char* data = sender ? sent[i].data() : received.get();
    ++i;
    bool in_place = false;
    if (entry.bytes && sender) data = entry.bytes().data();
    if (entry.bytes && !sender && receive && local_error.empty()) {
      // Received straight into the live bytes when the sizes agree.
      absl::Span<char> live = entry.bytes();
      if (live.size() == n) {
        data = live.data();
        in_place = true;
      } else {
        local_error =
            absl::StrCat("load of '", name, "': ", n,
                         " bytes sent, this rank holds ", live.size());
      }
    }
    for (size_t at = 0; at < n; at += kChunk) {
      absl::Status s = group.broadcast(data + at, std::min(kChunk, n - at),
                                       DataType::kUInt8, root);
      if (!s.ok()) return s;
    }
    if (receive && !sender && local_error.empty() && !in_place) {
      // Loaded before the next entry reuses the buffer.
      absl::Status s = entry.load_state_dict(absl::string_view(data, n));
      if (!s.ok()) {
        local_error =
            absl::StrCat("load_state_dict of '", name, "': ", s.message());
      }
    }
  }
  // The receivers' confirmation.
  return AgreeNoneFailed(group, root, local_error,
                         "a receiver could not load it");
}

absl::Status ReplicaState::CompareFingerprints(
    Communicator& group, const std::vector<int>& replicas,
    absl::string_view where, std::pair<int, int>* named) const {
  if (named != nullptr) *named = {-1, -1};
  absl::StatusOr<uint64_t> mine = Fingerprint();
  // A rank whose state_dict failed sends 0 with a flag.
  int64_t word[2] = {mine.ok() ? static_cast<int64_t>(*mine) : 0,
                     mine.ok() ? 0 : 1};
  std::vector<int64_t> all(2 * static_cast<size_t>(group.size()), 0);
  if (absl::Status s = group.all_gather(word, all.data(), 2, DataType::kInt64);
      !s.ok()) {
    return s;
  }
  bool failed = false;
  std::vector<AgreementSummary> summaries(static_cast<size_t>(group.size()));
  for (int j = 0; j < group.size(); ++j) {
    failed = failed || all[2 * j + 1] != 0;
    const auto fingerprint = static_cast<uint64_t>(all[2 * j]);
    summaries[j] = {fingerprint, absl::StrFormat("%016x", fingerprint)};
  }
  if (failed) {
    return absl::InternalError(absl::StrCat(
        "state fingerprint ", where, ": a state_dict failed",
        mine.ok() ? "" : ": ", mine.ok() ? "" : mine.status().message()));
  }
  // The one verdict of comm/agreement.h on the words already gathered:
  // the first replica that differs from the group's first, and both.
  absl::Status verdict = AgreementVerdict(
      absl::StrCat("the replicas' states differ ", where), summaries,
      {.code = absl::StatusCode::kDataLoss,
       .member = "replica",
       .ids = replicas});
  if (verdict.ok()) return verdict;
  for (size_t j = 1; named != nullptr && j < summaries.size(); ++j) {
    if (summaries[j].hash != summaries[0].hash) {
      const bool known = j < replicas.size();
      *named = {known ? replicas[j] : static_cast<int>(j),
                replicas.empty() ? 0 : replicas[0]};
      break;
    }
  }
  return absl::DataLossError(absl::StrCat(
      verdict.message(),
      " (registered state fingerprints along the replicate dimension)"));
}

}  // namespace vemesh
