// libFuzzer target: the store handshake's field parser (ParseHelloFields,
// vemesh/rendezvous/tcp/wire.h), which reads HELLO/AUTH fields from any
// client before it is authenticated, SHA-256/HMAC on arbitrary bytes, the
// token proof of an authenticated session, and the write rules that apply
// to an authenticated connection's frames (rank keys and owner keys,
// vemesh/rendezvous/tcp/internal/rank_keys.h).
//
// The input is split at '\n' into fields. Invariants checked on every input
// (a violation aborts, which libFuzzer reports as a crash):
//   - a refusal says why; an accepted set of fields has hex-only, bounded
//     claim/nonce/proof/owner and a rank in [-1, 2^24];
//   - HelloFields of what was parsed parses back to the same fields (the
//     client's encoder and the server's parser agree);
//   - SHA-256 and HMAC give 32 bytes, the same twice, and a proof compares
//     equal to itself and unequal to itself with one bit flipped;
//   - the session proof (fields[3] the token): the server accepts the
//     client's proof made with its token, and not one made with another
//     token or for the other role; the AUTH fields carrying it parse back;
//   - rank keys (fields[0] a pattern, fields[1] a key, fields[2] a value): a
//     key made from a valid pattern and rank n belongs to n, and with an
//     extra component or a leading zero to nobody; a write frame of the key
//     survives the wire, and under the rules only the connection that proved
//     the key's rank writes it (owner or not), verdicts only the owner or
//     an open value; reads are never refused.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "fuzz_check.h"
#include "vemesh/rendezvous/tcp/internal/rank_keys.h"
#include "vemesh/rendezvous/tcp/sha256.h"
#include "vemesh/rendezvous/tcp/wire.h"

namespace {

bool IsHex(absl::string_view s) {
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return s.size() <= 128;
}

bool Same(const vemesh::StoreHello& a, const vemesh::StoreHello& b) {
  return a.job == b.job && a.rank == b.rank && a.claim == b.claim &&
         a.nonce == b.nonce && a.proof == b.proof && a.owner == b.owner &&
         a.refused == b.refused;
}

void CheckSessionProof(const std::vector<std::string>& fields) {
  const std::string token = fields.size() > 3 ? fields[3] : "t";
  const std::string server_nonce =
      vemesh::HexText(vemesh::Sha256(fields.empty() ? "" : fields[0]));
  const std::string client_nonce = vemesh::HexText(vemesh::Sha256(token));
  const std::string text =
      vemesh::HelloProofText("client", server_nonce, client_nonce);
  const std::string proof = vemesh::HexText(vemesh::HmacSha256(token, text));
  FUZZ_CHECK(vemesh::ConstantTimeEquals(
      vemesh::HexText(vemesh::HmacSha256(token, text)), proof));
  FUZZ_CHECK(!vemesh::ConstantTimeEquals(
      vemesh::HexText(vemesh::HmacSha256(token + "x", text)), proof));
  FUZZ_CHECK(!vemesh::ConstantTimeEquals(
      vemesh::HexText(vemesh::HmacSha256(
          token, vemesh::HelloProofText("server", server_nonce, client_nonce))),
      proof));
  vemesh::StoreHello auth;
  auth.proof = proof;
  const auto parsed = vemesh::ParseHelloFields(vemesh::HelloFields(auth));
  FUZZ_CHECK(parsed.ok() && parsed->proof == proof);
}

// `pattern` with every "*" as "w" and the {rank} component as `rank`.
std::string KeyOf(absl::string_view pattern, absl::string_view rank) {
  std::vector<std::string> parts = absl::StrSplit(pattern, '/');
  for (std::string& part : parts) {
    if (part == "*") part = "w";
    if (part == "{rank}") part = std::string(rank);
  }
  return absl::StrJoin(parts, "/");
}

void CheckRankKeys(const std::vector<std::string>& fields, size_t size) {
  const std::string pattern = fields.empty() ? "" : fields[0];
  const std::string key = fields.size() > 1 ? fields[1] : "";
  const std::string value = fields.size() > 2 ? fields[2] : "";
  const bool valid = vemesh::CheckRankKeyPattern(pattern).ok();
  std::vector<std::string> patterns;
  if (valid) {
    patterns.push_back(pattern);
    const int64_t n = static_cast<int64_t>(size % 100000);
    FUZZ_CHECK(vemesh::RankOfKey(KeyOf(pattern, absl::StrCat(n)), patterns) ==
               std::optional<int64_t>(n));
    FUZZ_CHECK(
        !vemesh::RankOfKey(KeyOf(pattern, absl::StrCat(n)) + "/x", patterns));
    FUZZ_CHECK(
        !vemesh::RankOfKey(KeyOf(pattern, absl::StrCat("0", n + 1)), patterns));
  }
  const std::optional<int64_t> owner_rank = vemesh::RankOfKey(key, patterns);
  if (owner_rank) FUZZ_CHECK(*owner_rank >= 0 && *owner_rank < 1000000000);

  // A write frame of the key, through the wire and the rules.
  static constexpr vemesh::StoreOp kWrites[] = {
      vemesh::StoreOp::kSet, vemesh::StoreOp::kAdd,
      vemesh::StoreOp::kCompareSet, vemesh::StoreOp::kRemove};
  vemesh::StoreRequest request;
  request.op = kWrites[size % 4];
  request.keys = {key};
  if (request.op == vemesh::StoreOp::kSet ||
      request.op == vemesh::StoreOp::kCompareSet) {
    request.value = value;
  }
  const auto frame = vemesh::EncodeRequest(request);
  if (!frame.ok()) return;  // a key the wire refuses never reaches the rules
  const vemesh::ParsedRequest p = vemesh::ParseRequest(*frame);
  FUZZ_CHECK(p.outcome == vemesh::ParsedRequest::kComplete);
  FUZZ_CHECK(p.consumed == frame->size());
  FUZZ_CHECK(p.message.op == request.op && p.message.keys == request.keys &&
             p.message.value == request.value);
  const std::vector<std::string> owner_suffixes = {"/verdict"};
  const std::vector<std::string> open_prefixes = {"E", "C"};
  vemesh::WriteRules rules;
  rules.owner_key_suffixes = owner_suffixes;
  rules.open_value_prefixes = open_prefixes;
  rules.rank_key_patterns = patterns;
  const std::string& k = p.message.keys[0];
  const std::string& v = p.message.value;
  const bool owner_key = absl::EndsWith(k, "/verdict");
  const bool open_value =
      (p.message.op == vemesh::StoreOp::kSet ||
       p.message.op == vemesh::StoreOp::kCompareSet) &&
      (absl::StartsWith(v, "E") || absl::StartsWith(v, "C"));
  auto refusal = [&](bool owner, int64_t rank) {
    vemesh::KeyWriter writer;
    writer.owner = owner;
    writer.proved_rank = rank;
    const absl::Status s =
        vemesh::WriteRefusal(rules, writer, p.message.op, k, v);
    if (!s.ok()) {
      FUZZ_CHECK(s.code() == absl::StatusCode::kPermissionDenied);
      FUZZ_CHECK(!s.message().empty());
    }
    return s.ok();
  };
  const bool anonymous = refusal(false, -1);
  const bool owner = refusal(true, -1);
  if (owner_rank) {
    // Only the connection that proved the rank, owner or not.
    FUZZ_CHECK(!anonymous && !owner);
    FUZZ_CHECK(!refusal(false, *owner_rank + 1));
    FUZZ_CHECK(refusal(true, *owner_rank));
    FUZZ_CHECK(refusal(false, *owner_rank) == (!owner_key || open_value));
  } else {
    FUZZ_CHECK(owner);
    FUZZ_CHECK(anonymous == (!owner_key || open_value));
  }
  // Reads are never refused.
  vemesh::KeyWriter nobody;
  FUZZ_CHECK(
      vemesh::WriteRefusal(rules, nobody, vemesh::StoreOp::kGet, k, v).ok());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view bytes(reinterpret_cast<const char*>(data), size);
  const std::vector<std::string> fields = absl::StrSplit(bytes, '\n');
  const auto parsed = vemesh::ParseHelloFields(fields);
  if (!parsed.ok()) {
    FUZZ_CHECK(!parsed.status().message().empty());
  } else {
    FUZZ_CHECK(IsHex(parsed->claim) && IsHex(parsed->nonce) &&
               IsHex(parsed->proof) && IsHex(parsed->owner));
    FUZZ_CHECK(parsed->rank >= -1 && parsed->rank <= (int64_t{1} << 24));
    const auto again = vemesh::ParseHelloFields(vemesh::HelloFields(*parsed));
    FUZZ_CHECK(again.ok());
    FUZZ_CHECK(Same(*parsed, *again));
  }
  const absl::string_view key = bytes.substr(0, bytes.size() / 2);
  const absl::string_view message = bytes.substr(bytes.size() / 2);
  const std::string digest = vemesh::Sha256(bytes);
  FUZZ_CHECK(digest.size() == vemesh::kSha256Bytes);
  FUZZ_CHECK(digest == vemesh::Sha256(bytes));
  std::string mac = vemesh::HmacSha256(key, message);
  FUZZ_CHECK(mac.size() == vemesh::kSha256Bytes);
  FUZZ_CHECK(vemesh::ConstantTimeEquals(mac, vemesh::HmacSha256(key, message)));
  const std::string same = mac;
  mac[size % mac.size()] ^= 1;
  FUZZ_CHECK(!vemesh::ConstantTimeEquals(mac, same));
  CheckSessionProof(fields);
  CheckRankKeys(fields, size);
  return 0;
}
