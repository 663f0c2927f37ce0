#include "vemesh/bootstrap/rank0_store.h"

#include <algorithm>
#include <cstdlib>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
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

}  // namespace

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
    auto server = TcpStoreServer::Start(spec.bind, spec.port);
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
