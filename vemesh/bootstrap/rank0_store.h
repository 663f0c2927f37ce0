// vemesh/bootstrap/rank0_store.h
//
// "Rank 0 hosts a store": rank 0 starts a TcpStoreServer, every rank (rank 0
// too) connects a TcpStore to it, and a StoreBootstrap runs over that store.
// Two launches do this:
//   env:// (torchrun)       every rank knows MASTER_ADDR:MASTER_PORT
//   Gloo under mpirun       rank 0 takes an ephemeral port and announces
//                           "<host> <port>" over the MPI bootstrap
//
//   Rank0StoreSpec spec;
//   spec.rank = info.rank;
//   spec.size = info.world_size;
//   spec.bind = "0.0.0.0";                 // rank 0's server: every interface
//   spec.host = info.master_addr;          // where every rank connects
//   spec.port = info.master_port;
//   spec.prefix = "vemesh";
//   spec.reason = info.reason;
//   spec.context = "env:// launch";
//   spec.address_name = "MASTER_ADDR:MASTER_PORT";
//   VEMESH_ASSIGN_OR_RETURN(Rank0Store store, StartRank0Store(spec, deadline));
//   kept_server = std::move(store.server);  // rank 0: outlives the users
//   std::shared_ptr<Bootstrap> boot = store.bootstrap;
//
// Collective over the job. Each store call is bounded by the time left to
// `deadline` (at least a second), so that a port answered by something that
// is not rank 0's store cannot stall a rank. The StoreBootstrap's Gloo
// address is VEMESH_GLOO_HOST when set, else this host's interface towards
// rank 0's. Errors keep their code and say which rank failed at what:
// "<context>: rank 0 could not host the store at <address_name> = host:port:
// ..." or "<context>: rank 3 could not reach the store of rank 0 at ...".

#ifndef VEMESH_BOOTSTRAP_RANK0_STORE_H_
#define VEMESH_BOOTSTRAP_RANK0_STORE_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "vemesh/bootstrap/bootstrap.h"
#include "vemesh/bootstrap/store_bootstrap.h"
#include "vemesh/rendezvous/tcp/tcp_store_server.h"

namespace vemesh {

struct Rank0StoreSpec {
  int rank = 0;
  int size = 1;
  // Rank 0's server: the address it binds ("0.0.0.0": every interface).
  std::string bind;
  // Rank 0's address and port, where every rank connects. Port 0: rank 0
  // takes an ephemeral one and sends its `host` and port to the others over
  // `announce` (the others' `host` is then not read).
  std::string host;
  int port = 0;
  Bootstrap* announce = nullptr;
  // The StoreBootstrap's key prefix, and its reason (Bootstrap::reason).
  std::string prefix;
  std::string reason;
  // How errors name the launch ("env:// launch") and, when not empty, the
  // address ("MASTER_ADDR:MASTER_PORT").
  std::string context;
  std::string address_name;
  // The job's identity ("": rank 0 makes one) and the store's shared secret
  // ("": none; the fallback then still keeps verdicts to rank 0's own
  // connection). A client of another job, a rank claimed twice and a wrong
  // token are refused (tcp_store_server.h).
  std::string job;
  std::string token;
  // Rank 0 waits this long in the first round for a second claim of a rank
  // (a second job started at the same moment) before its verdict.
  absl::Duration settle = absl::ZeroDuration();
};

struct Rank0Store {
  // Rank 0 only (null elsewhere): keep it until every user of the store,
  // on every rank, is done.
  std::unique_ptr<TcpStoreServer> server;
  std::shared_ptr<StoreBootstrap> bootstrap;
};

// Collective: see the file comment. InvalidArgument for a spec that cannot
// work (port 0 without `announce`, a rank outside [0, size)).
// Rank 0's store limits from the environment, over TcpStoreServerOptions'
// defaults: VEMESH_STORE_MAX_CONNECTIONS (a count), VEMESH_STORE_IDLE_TIMEOUT
// (seconds, or a duration such as 90s or 5m), VEMESH_STORE_MAX_BYTES (bytes
// of values and buffers together). InvalidArgument naming a bad one.
absl::StatusOr<TcpStoreServerOptions> StoreServerOptionsFromEnv();

absl::StatusOr<Rank0Store> StartRank0Store(const Rank0StoreSpec& spec,
                                           absl::Time deadline);

}  // namespace vemesh

#endif  // VEMESH_BOOTSTRAP_RANK0_STORE_H_
