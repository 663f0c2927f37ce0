// TcpStoreServer's handshake: HELLO and AUTH (the token, the owner
// secret), the requests a connection may make, and each rank's claim.

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "vemesh/rendezvous/tcp/internal/rank_keys.h"
#include "vemesh/rendezvous/tcp/internal/store_server_loop.h"
#include "vemesh/rendezvous/tcp/sha256.h"
#include "vemesh/rendezvous/tcp/wire.h"

namespace vemesh {

absl::Status TcpStoreServer::Loop::Refusal(const Connection& c,
                                           const StoreRequest& r) const {
  if (r.op == StoreOp::kHello || r.op == StoreOp::kAuth) {
    return absl::OkStatus();
  }
  if (!options_.token.empty() && !c.authenticated) {
    return absl::UnauthenticatedError(absl::StrCat(
        "store ", StoreOpName(r.op),
        " refused: this store needs the job's token (VEMESH_STORE_TOKEN) "
        "proved in a HELLO/AUTH handshake first"));
  }
  KeyWriter writer;
  writer.owner = c.owner;
  if (c.rank >= 0 && ProvedRank(c, c.rank)) writer.proved_rank = c.rank;
  WriteRules rules;
  rules.owner_key_suffixes = options_.owner_key_suffixes;
  rules.open_value_prefixes = options_.open_value_prefixes;
  rules.rank_key_patterns = options_.rank_key_patterns;
  return WriteRefusal(rules, writer, r.op,
                      r.keys.empty() ? absl::string_view() : r.keys[0],
                      r.value);
}

void TcpStoreServer::Loop::Hello(Connection& c, const StoreRequest& r) {
  absl::StatusOr<StoreHello> hello = ParseHelloFields(r.keys);
  if (!hello.ok()) {
    ReplyStatus(c, hello.status());
    return;
  }
  if (!hello->job.empty() && !options_.job.empty() &&
      hello->job != options_.job) {
    ReplyStatus(c, absl::FailedPreconditionError(absl::StrCat(
                       "this store belongs to job '", options_.job,
                       "' but the client is of job '", hello->job,
                       "': two jobs on one MASTER_ADDR:MASTER_PORT; give "
                       "each job its own port")));
    return;
  }
  // A new handshake: what the connection proved before no longer holds.
  c.authenticated = false;
  c.owner = false;
  c.rank = hello->rank;
  c.claim = hello->claim;
  c.refused = hello->refused;
  // With a token, a rank is claimed (or a refusal elsewhere reported)
  // only once the claimer proved it.
  if (options_.token.empty()) {
    if (ReportRefusal(c)) return;
    if (absl::Status claimed = ClaimRank(c); !claimed.ok()) {
      RefuseClaim(c, claimed);
      return;
    }
  }
  c.client_nonce = hello->nonce;
  c.server_nonce = HexText(RandomBytes(16));
  StoreReply reply;
  reply.values.push_back(c.server_nonce);
  reply.values.push_back(
      options_.token.empty()
          ? std::string()
          : HexText(HmacSha256(
                options_.token,
                HelloProofText("server", c.server_nonce, c.client_nonce))));
  reply.values.push_back(options_.job);
  Reply(c, std::move(reply));
}

absl::Status TcpStoreServer::Loop::ClaimRank(const Connection& c) {
  if (c.rank < 0) return absl::OkStatus();
  if (!options_.conflict_key.empty()) {
    // After a conflict, only the claims made before it stand: a late rank
    // of either job hears of the conflict instead of waiting.
    auto conflict = table_.find(options_.conflict_key);
    auto held = claims_.find(c.rank);
    if (conflict != table_.end() &&
        (held == claims_.end() || held->second.claim != c.claim)) {
      return absl::AlreadyExistsError(conflict->second);
    }
  }
  auto [it, fresh] = claims_.try_emplace(c.rank, Claim{c.claim, c.id});
  if ((fresh || it->second.claim == c.claim) &&
      !refused_claims_.contains(c.claim)) {
    return absl::OkStatus();
  }
  const std::string text = absl::StrCat(
      "rank ", c.rank,
      " was claimed twice on this store (two processes say they are rank ",
      c.rank,
      "): two jobs on one MASTER_ADDR:MASTER_PORT, or a rank started twice; "
      "every rank involved fails");
  RecordConflict(text);
  return absl::AlreadyExistsError(text);
}

bool TcpStoreServer::Loop::ReportRefusal(Connection& c) {
  if (!c.refused || c.rank < 0) return false;
  if (refused_claims_.contains(c.claim)) {
    // The store that refused it: no news.
    RefuseClaim(c, ClaimRank(c));
    return true;
  }
  const std::string text = absl::StrCat(
      "rank ", c.rank,
      " was refused by another job's store on this port (the rank was "
      "claimed twice there): two jobs on one MASTER_ADDR:MASTER_PORT; "
      "every rank involved fails");
  RecordConflict(text);
  RefuseClaim(c, absl::AlreadyExistsError(text));
  return true;
}

void TcpStoreServer::Loop::RefuseClaim(Connection& c,
                                       const absl::Status& status) {
  // The refused claim is remembered: the same claimer is refused again.
  refused_claims_.insert(c.claim);
  StoreReply reply;
  reply.code = status.code();
  reply.message = std::string(status.message());
  reply.values.push_back(options_.job);  // which store refused it
  Reply(c, std::move(reply));
}

void TcpStoreServer::Loop::Auth(Connection& c, const StoreRequest& r) {
  absl::StatusOr<StoreHello> auth = ParseHelloFields(r.keys);
  if (!auth.ok()) {
    ReplyStatus(c, auth.status());
    return;
  }
  if (c.server_nonce.empty()) {
    ReplyStatus(c, absl::FailedPreconditionError(
                       "store AUTH before HELLO: expected HELLO first"));
    return;
  }
  if (!options_.token.empty()) {
    const std::string expected = HexText(
        HmacSha256(options_.token,
                   HelloProofText("client", c.server_nonce, c.client_nonce)));
    if (!ConstantTimeEquals(expected, auth->proof)) {
      c.server_nonce.clear();  // a new HELLO for another try
      if (c.rank >= 0 && !options_.conflict_key.empty()) {
        RefuseProof(c, auth->proof.empty()
                           ? "it has no token and this store needs one"
                           : "it does not match this store's token");
        return;
      }
      ReplyStatus(c, absl::UnauthenticatedError(
                         "store AUTH refused: the proof does not match this "
                         "store's token (VEMESH_STORE_TOKEN differs between "
                         "ranks, or this is another job's store)"));
      return;
    }
  } else if (!auth->proof.empty() && c.rank >= 0 &&
             !options_.conflict_key.empty()) {
    c.server_nonce.clear();
    RefuseProof(c, "it proves a token and this store has none");
    return;
  }
  if (!auth->owner.empty()) {
    const std::string expected = HexText(
        HmacSha256(owner_secret_,
                   HelloProofText("owner", c.server_nonce, c.client_nonce)));
    if (!ConstantTimeEquals(expected, auth->owner)) {
      ReplyStatus(c, absl::PermissionDeniedError(
                         "store AUTH refused: the owner proof does not match"));
      return;
    }
    c.owner = true;
  }
  if (!options_.token.empty()) {
    if (ReportRefusal(c)) return;
    if (absl::Status claimed = ClaimRank(c); !claimed.ok()) {
      RefuseClaim(c, claimed);
      return;
    }
  }
  c.authenticated = true;
  unproven_.erase({c.accepted, c.id});
  c.server_nonce.clear();  // a nonce proves one AUTH only
  Reply(c, StoreReply());
}

bool TcpStoreServer::Loop::ProvedRank(const Connection& c, int64_t rank) const {
  if (!c.authenticated || c.rank != rank) return false;
  auto it = claims_.find(rank);
  return it != claims_.end() && it->second.claim == c.claim &&
         !refused_claims_.contains(c.claim);
}

void TcpStoreServer::Loop::RefuseProof(Connection& c, absl::string_view why) {
  const std::string text = absl::StrCat(
      "rank ", c.rank,
      "'s proof of the job's store token was refused by rank 0's store (", why,
      "): VEMESH_STORE_TOKEN (or VEMESH_STORE_TOKEN_FILE, or the launcher's "
      "secret it is derived from) differs between the ranks, or a rank of "
      "another job came to this MASTER_ADDR:MASTER_PORT; every rank fails");
  RecordConflict(text);
  ReplyStatus(c, absl::PermissionDeniedError(text));
}

void TcpStoreServer::Loop::RecordConflict(const std::string& text) {
  if (options_.conflict_key.empty() || table_.contains(options_.conflict_key))
    return;
  Put(options_.conflict_key, text);
  Notify(options_.conflict_key);
  FailWaits(text);
}

const std::string* TcpStoreServer::Loop::Conflict() const {
  if (options_.conflict_key.empty()) return nullptr;
  auto it = table_.find(options_.conflict_key);
  return it == table_.end() ? nullptr : &it->second;
}

bool TcpStoreServer::Loop::JobKey(const std::string& key) const {
  for (const std::string& suffix : options_.owner_key_suffixes) {
    if (absl::EndsWith(key, suffix)) return true;
  }
  return RankOfKey(key, options_.rank_key_patterns).has_value();
}

void TcpStoreServer::Loop::FailWaits(const std::string& text) {
  // Only the rounds' waits: a Gloo rendezvous of a job that formed before
  // the conflict is left alone (its ranks decided together already).
  std::vector<uint64_t> ids;
  for (const auto& [key, waiting] : parked_) {
    if (JobKey(key)) ids.insert(ids.end(), waiting.begin(), waiting.end());
  }
  for (uint64_t id : ids) {
    Connection* c = Find(id);
    if (c == nullptr || !c->waiter) continue;
    Unpark(*c);
    ReplyStatus(*c, absl::AlreadyExistsError(text));
    MakeReady(*c);
  }
}

}  // namespace vemesh
