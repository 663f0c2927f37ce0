#include "vemesh/bootstrap/rank0_store.h"

#include <algorithm>
#include <cstdlib>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "vemesh/base/status_macros.h"
#include "vemesh/bootstrap/launch.h"
#include "vemesh/rendezvous/tcp/tcp_store.h"

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
  if (spec.rank == 0) {
    VEMESH_ASSIGN_OR_RETURN(TcpStoreServerOptions limits,
                            StoreServerOptionsFromEnv());
    auto server = TcpStoreServer::Start(spec.bind, spec.port, limits);
    if (!server.ok()) {
      return Wrapped(server.status(), spec.context,
                     absl::StrCat("rank 0 could not host the store at ",
                                  AddressText(spec, host, port)));
    }
    out.server = *std::move(server);
  }
  if (spec.port == 0) {
    const std::string mine =
        spec.rank == 0 ? absl::StrCat(host, " ", out.server->port()) : "";
    VEMESH_ASSIGN_OR_RETURN(auto all,
                            spec.announce->all_gather(mine, deadline));
    const std::string& zero = all[0];
    const size_t space = zero.find(' ');
    if (space == std::string::npos ||
        !absl::SimpleAtoi(zero.substr(space + 1), &port)) {
      return absl::InternalError(
          absl::StrCat("rank 0 sent a malformed store address '", zero, "'"));
    }
    host = zero.substr(0, space);
  }
  TcpStoreOptions store_options;
  store_options.timeout = std::max(deadline - absl::Now(), absl::Seconds(1));
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
  return out;
}

}  // namespace vemesh
