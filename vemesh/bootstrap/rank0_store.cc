#include "vemesh/bootstrap/rank0_store.h"

#include <algorithm>
#include <cstdlib>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "vemesh/base/status_macros.h"
#include "vemesh/bootstrap/launch.h"
#include "vemesh/rendezvous/tcp/sha256.h"
#include "vemesh/rendezvous/tcp/tcp_store.h"
#include "vemesh/rendezvous/tcp/tcp_store_server.h"

namespace vemesh {
namespace {

// "MASTER_ADDR:MASTER_PORT = 10.0.0.1:29500", or "10.0.0.1:29500".
std::string AddressText(const Rank0StoreSpec& spec, const std::string& host,
                        int port) {
  return absl::StrCat(spec.address_name, spec.address_name.empty() ? "" : " = ",
                      host, ":", port);
}

absl::Status Wrapped(const absl::Status& status, absl::string_view context,
                     absl::string_view what) {
  return absl::Status(
      status.code(), absl::StrCat(context, ": ", what, ": ", status.message()));
}

// A positive integer variable, or `fallback` when unset.
absl::StatusOr<uint64_t> PositiveEnv(const char* name, uint64_t fallback) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return fallback;
  uint64_t parsed = 0;
  if (!absl::SimpleAtoi(value, &parsed) || parsed == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, "='", value, "': expected a positive integer"));
  }
  return parsed;
}

}  // namespace

absl::StatusOr<TcpStoreServerOptions> StoreServerOptionsFromEnv() {
  TcpStoreServerOptions options;
  VEMESH_ASSIGN_OR_RETURN(
      options.max_connections,
      PositiveEnv("VEMESH_STORE_MAX_CONNECTIONS", options.max_connections));
  VEMESH_ASSIGN_OR_RETURN(
      options.max_total_bytes,
      PositiveEnv("VEMESH_STORE_MAX_BYTES", options.max_total_bytes));
  if (const char* idle = std::getenv("VEMESH_STORE_IDLE_TIMEOUT");
      idle != nullptr && *idle != '\0') {
    double seconds = 0;
    absl::Duration parsed;
    if (absl::SimpleAtod(idle, &seconds) && seconds > 0 && seconds <= 86400) {
      options.idle_timeout = absl::Seconds(seconds);
    } else if (absl::ParseDuration(idle, &parsed) &&
               parsed > absl::ZeroDuration() && parsed <= absl::Hours(24)) {
      options.idle_timeout = parsed;
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          "VEMESH_STORE_IDLE_TIMEOUT='", idle,
          "': expected a positive number of seconds or a duration (90s, 5m), "
          "at most a day"));
    }
  }
  return options;
}

absl::StatusOr<Rank0Store> StartRank0Store(const Rank0StoreSpec& spec,
                                           absl::Time deadline) {
  if (spec.rank < 0 || spec.rank >= spec.size) {
    return absl::InvalidArgumentError(
        absl::StrCat(spec.context, ": rank ", spec.rank, " of ", spec.size,
                     ": expected 0 <= rank < size"));
  }
  if (spec.port == 0 && spec.announce == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(spec.context,
                     ": rank 0's store takes an ephemeral port, and nothing "
                     "announces it to the other ranks"));
  }
  Rank0Store out;
  std::string host = spec.host;
  int port = spec.port;
  const std::string conflict_key = absl::StrCat(spec.prefix, "/conflict");
  // Announced over MPI (Gloo under mpirun), the address travels where no
  // local process can read it: rank 0 makes a token and sends it along, so
  // that this store is never without one.
  const bool announce_token = spec.port == 0 && spec.announce != nullptr &&
                              spec.token.empty() &&
                              spec.announce->kind() == "mpi";
  TcpStoreOptions store_options;
  store_options.timeout = std::max(deadline - absl::Now(), absl::Seconds(1));
  store_options.token = spec.token;
  if (announce_token && spec.rank == 0) {
    store_options.token = HexText(RandomBytes(32));
  }
  store_options.job = spec.job;
  store_options.rank = spec.rank;
  if (spec.rank == 0) {
    VEMESH_ASSIGN_OR_RETURN(TcpStoreServerOptions server_options,
                            StoreServerOptionsFromEnv());
    server_options.token = store_options.token;
    server_options.job = spec.job;
    if (server_options.job.empty()) {
      // Made by rank 0: no client names it, but it names this store in a
      // refusal to a client of a job that has an id.
      server_options.job = "made-by-rank-0-";
      server_options.job += HexText(RandomBytes(8));
    }
    server_options.conflict_key = conflict_key;
    server_options.owner_key_suffixes = {"/verdict", "/conflict"};
    // Each rank's round contribution and ack only from the connection that
    // claimed that rank (issue 44).
    server_options.rank_key_patterns = {
        absl::StrCat(spec.prefix, "/ag/*/{rank}"),
        absl::StrCat(spec.prefix, "/ag/*/ack/{rank}")};
    // An error verdict, or a conflict a rank heard of from the store.
    server_options.open_value_prefixes = {"E", "C"};
    auto server = TcpStoreServer::Start(spec.bind, spec.port, server_options);
    if (!server.ok()) {
      absl::Status status = server.status();
      if (absl::IsAlreadyExists(status) && spec.port != 0) {
        // Somebody holds the port: if it is a store, claim rank 0 there too,
        // so that a job forming there with our ranks fails (a rank claimed
        // twice), and say whose it is. Bounded: a silent listener is not
        // waited for.
        TcpStoreOptions probe = store_options;
        probe.timeout = absl::Milliseconds(500);
        auto other = TcpStore::Connect(
            host, port,
            std::min(deadline, absl::Now() + absl::Milliseconds(500)), probe);
        if (!other.ok() && !absl::IsUnavailable(other.status()) &&
            !absl::IsDeadlineExceeded(other.status())) {
          status = absl::Status(
              status.code(),
              absl::StrCat(status.message(), "; ", other.status().message()));
        } else if (other.ok()) {
          status = absl::Status(
              status.code(),
              absl::StrCat(status.message(),
                           "; a store of another job with no rank 0 answers "
                           "there"));
        }
      }
      return Wrapped(status, spec.context,
                     absl::StrCat("rank 0 could not host the store at ",
                                  AddressText(spec, host, port)));
    }
    out.server = *std::move(server);
    store_options.owner_secret = out.server->owner_secret();
  }
  if (spec.port == 0) {
    // "host port", or "host port token".
    const std::string mine =
        spec.rank == 0 ? absl::StrCat(host, " ", out.server->port(),
                                      announce_token ? " " : "",
                                      announce_token ? store_options.token : "")
                       : "";
    VEMESH_ASSIGN_OR_RETURN(auto all,
                            spec.announce->all_gather(mine, deadline));
    const std::vector<std::string> fields =
        absl::StrSplit(all[0], ' ', absl::SkipEmpty());
    if (fields.size() != (announce_token ? 3u : 2u) ||
        !absl::SimpleAtoi(fields[1], &port)) {
      return absl::InternalError(absl::StrCat(
          "rank 0 sent a malformed store address '",
          all[0].substr(0, all[0].find(' ', all[0].find(' ') + 1)),
          "': expected its host, port", announce_token ? " and token" : ""));
    }
    host = fields[0];
    if (announce_token) store_options.token = fields[2];
  }
  auto store = TcpStore::Connect(host, port, deadline, store_options);
  if (!store.ok()) {
    return Wrapped(store.status(), spec.context,
                   absl::StrCat("rank ", spec.rank,
                                " could not reach the store of rank 0 at ",
                                AddressText(spec, host, port)));
  }
  std::string gloo_host;
  if (const char* forced = std::getenv("VEMESH_GLOO_HOST"); forced && *forced) {
    gloo_host = forced;
  } else {
    VEMESH_ASSIGN_OR_RETURN(gloo_host, LocalAddressTowards(host));
  }
  out.bootstrap = std::make_shared<StoreBootstrap>(
      std::shared_ptr<Store>(*std::move(store)), spec.rank, spec.size,
      spec.prefix, spec.reason, gloo_host);
  out.bootstrap->set_conflict_key(conflict_key, spec.settle);
  return out;
}

}  // namespace vemesh
