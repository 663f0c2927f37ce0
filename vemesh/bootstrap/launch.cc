#include "vemesh/bootstrap/launch.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "vemesh/base/log.h"
#include "vemesh/base/status_macros.h"
#include "vemesh/bootstrap/rank0_store.h"
#include "vemesh/bootstrap/store_bootstrap.h"
#include "vemesh/rendezvous/store.h"
#include "vemesh/rendezvous/tcp/sha256.h"
#include "vemesh/rendezvous/tcp/tcp_store_server.h"
#ifndef VEMESH_NO_MPI
#include "vemesh/bootstrap/mpi/mpi_bootstrap.h"
#include "vemesh/comm/mpi/mpi_environment.h"
#endif

namespace vemesh {
namespace {

const char* Env(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr && *value != '\0' ? value : nullptr;
}

// An integer variable in [min, max]; InvalidArgument naming it otherwise.
absl::StatusOr<int> IntVar(const char* name, int min, int max) {
  const char* value = Env(name);
  if (value == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("env:// launch: ", name,
                                                   " is not set: expected an "
                                                   "integer in [",
                                                   min, ", ", max, "]"));
  }
  int parsed = 0;
  if (!absl::SimpleAtoi(value, &parsed) || parsed < min || parsed > max) {
    return absl::InvalidArgumentError(
        absl::StrCat("env:// launch: ", name, "='", value,
                     "': expected an integer in [", min, ", ", max, "]"));
  }
  return parsed;
}

bool HasMpiMarker(std::string* which) {
  for (const char* name : {"PMIX_RANK", "PMI_RANK"}) {
    if (Env(name) != nullptr) {
      *which = name;
      return true;
    }
  }
  return false;
}

// A MASTER_ADDR that no resolver knows is a typo, refused at once (not a
// timeout later). A temporary failure (EAI_AGAIN: DNS of a pod still
// starting) is let through: connecting retries until the deadline.
absl::Status CheckMasterAddr(const char* addr) {
  addrinfo hints = {};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int rc = getaddrinfo(addr, nullptr, &hints, &found);
  if (found != nullptr) freeaddrinfo(found);
  if (rc == EAI_NONAME || rc == EAI_FAIL || rc == EAI_SERVICE
#ifdef EAI_NODATA
      || rc == EAI_NODATA
#endif
#ifdef EAI_ADDRFAMILY
      || rc == EAI_ADDRFAMILY
#endif
  ) {
    return absl::InvalidArgumentError(absl::StrCat(
        "env:// launch: MASTER_ADDR='", addr, "' does not resolve (",
        gai_strerror(rc),
        "): expected the host name or address of rank 0, which hosts the "
        "store"));
  }
  return absl::OkStatus();
}

// "xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" in hex: what torchrun --standalone
// makes its run id (uuid4), as opposed to a name the user chose.
bool IsUuid(absl::string_view s) {
  if (s.size() != 36) return false;
  for (size_t i = 0; i < s.size(); ++i) {
    const bool dash = i == 8 || i == 13 || i == 18 || i == 23;
    if (dash ? s[i] != '-' : !absl::ascii_isxdigit(s[i])) return false;
  }
  return true;
}

// "6fa6ebddf7cca36b-63089d117ddc0d55": Open MPI's per-job random key.
bool IsTransportKey(absl::string_view s) {
  if (s.size() != 33 || s[16] != '-') return false;
  for (size_t i = 0; i < s.size(); ++i) {
    if (i != 16 && !absl::ascii_isxdigit(s[i])) return false;
  }
  return true;
}

// Without VEMESH_STORE_TOKEN, a secret the launcher already gives every
// rank alike and keeps in the ranks' environment only (another user cannot
// read /proc/<pid>/environ): the store token is an HMAC of it, so the
// secret itself never reaches the store. None found: "" (rank 0 warns).
void DeriveStoreToken(LaunchInfo* info) {
  const char* source = nullptr;
  const char* secret = nullptr;
  if (const char* run = Env("TORCHELASTIC_RUN_ID"); run && IsUuid(run)) {
    source = "TORCHELASTIC_RUN_ID";  // torchrun --standalone's random id
    secret = run;
  } else if (const char* key = Env("OMPI_MCA_orte_precondition_transports");
             key && IsTransportKey(key)) {
    source = "OMPI_MCA_orte_precondition_transports";  // Open MPI's mpirun
    secret = key;
  }
  if (source == nullptr) return;
  info->store_token = HexText(
      HmacSha256(secret, absl::StrCat("vemesh store token from ", source)));
  info->store_token_source = source;
}

absl::Status ReadEnvLaunch(LaunchInfo* info) {
  if (const char* agent = Env("TORCHELASTIC_USE_AGENT_STORE")) {
    if (absl::AsciiStrToLower(agent) == "true" || std::string(agent) == "1") {
      return absl::FailedPreconditionError(absl::StrCat(
          "env:// launch: TORCHELASTIC_USE_AGENT_STORE=", agent,
          " says the launcher's agent hosts the store at MASTER_ADDR:"
          "MASTER_PORT, but vemesh hosts its own store on rank 0 and cannot "
          "speak to the agent's. torchrun sets it with its default "
          "rendezvous (--rdzv_backend=static, what --master_addr/"
          "--master_port alone give) and leaves the store to rank 0 with "
          "--standalone or --rdzv_backend=c10d (e.g. --rdzv_backend c10d "
          "--rdzv_endpoint HOST:PORT); or set VEMESH_BOOTSTRAP=mpi under an "
          "MPI launcher"));
    }
  }
  // Rank 0 waits for every rank's key in one store call, which takes at
  // most kMaxStoreKeysPerCall keys: a larger world is refused here, named.
  VEMESH_ASSIGN_OR_RETURN(
      auto size,
      IntVar("WORLD_SIZE", 1, static_cast<int>(kMaxStoreKeysPerCall)));
  auto rank = IntVar("RANK", 0, size - 1);
  if (!rank.ok()) return rank.status();
  VEMESH_ASSIGN_OR_RETURN(auto port, IntVar("MASTER_PORT", 1, 65535));
  const char* addr = Env("MASTER_ADDR");
  if (addr == nullptr) {
    return absl::InvalidArgumentError(
        "env:// launch: MASTER_ADDR is not set: expected the host name or "
        "address of rank 0, which hosts the store");
  }
  info->world_size = size;
  info->rank = *rank;
  info->master_port = port;
  info->master_addr = addr;
  VEMESH_RETURN_IF_ERROR(CheckMasterAddr(addr));
  if (Env("LOCAL_WORLD_SIZE") != nullptr) {
    VEMESH_ASSIGN_OR_RETURN(auto local_size,
                            IntVar("LOCAL_WORLD_SIZE", 1, size));
    info->local_world_size = local_size;
    auto local_rank = IntVar("LOCAL_RANK", 0, local_size - 1);
    if (!local_rank.ok()) return local_rank.status();
    info->local_rank = *local_rank;
  } else if (Env("LOCAL_RANK") != nullptr) {
    // No LOCAL_WORLD_SIZE to bound it by: at least a rank of the world.
    auto local_rank = IntVar("LOCAL_RANK", 0, size - 1);
    if (!local_rank.ok()) return local_rank.status();
  }
  if (const char* run = Env("TORCHELASTIC_RUN_ID")) info->run_id = run;
  if (const char* job = Env("VEMESH_JOB_ID")) {
    info->job_id = job;
    info->job_source = "VEMESH_JOB_ID";
  } else if (!info->run_id.empty()) {
    info->job_id = info->run_id;
    info->job_source = "TORCHELASTIC_RUN_ID";
  } else if (const char* slurm = Env("SLURM_JOB_ID")) {
    info->job_id = slurm;
    info->job_source = "SLURM_JOB_ID";
    if (const char* step = Env("SLURM_STEP_ID")) {
      absl::StrAppend(&info->job_id, ".", step);
    }
  }
  if (info->job_id.size() > 256) {
    return absl::InvalidArgumentError(absl::StrCat(
        "env:// launch: ", info->job_source, "='", info->job_id.substr(0, 64),
        "...' has ", info->job_id.size(), " characters: expected at most 256"));
  }
  if (const char* token = Env("VEMESH_STORE_TOKEN")) {
    info->store_token = token;
    info->store_token_source = "VEMESH_STORE_TOKEN";
  } else if (const char* file = Env("VEMESH_STORE_TOKEN_FILE")) {
    info->store_token_source = "VEMESH_STORE_TOKEN_FILE";
    std::ifstream in(file);
    std::getline(in, info->store_token);
    if (!in && info->store_token.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "env:// launch: VEMESH_STORE_TOKEN_FILE='", file,
          "' cannot be read or is empty: expected a file whose first line "
          "is the job's store token"));
    }
  } else {
    DeriveStoreToken(info);
  }
  return absl::OkStatus();
}

constexpr absl::Duration kClaimSettle = absl::Milliseconds(100);

// Once per process: a store without a token trusts whoever comes first.
void WarnNoToken(const LaunchInfo& info) {
  static std::atomic<bool> warned{false};
  if (warned.exchange(true)) return;
  LogWarning(absl::StrCat(
      "env:// launch: rank 0's store at MASTER_ADDR:MASTER_PORT = ",
      info.master_addr, ":", info.master_port,
      " has no token: any local process can connect to it and take the "
      "place of a rank that has not connected yet (that rank then fails "
      "with 'claimed twice'). Set VEMESH_STORE_TOKEN (or "
      "VEMESH_STORE_TOKEN_FILE) to one secret on every rank, or launch with "
      "torchrun --standalone or Open MPI's mpirun, from whose per-run secret "
      "vemesh derives one (docs/USER_GUIDE.md, 'The store's token')"));
}

// What the env:// bootstrap needs to keep alive: rank 0's server.
struct EnvLaunch {
  std::unique_ptr<TcpStoreServer> server;
  std::shared_ptr<Bootstrap> bootstrap;
};

std::mutex& PolicyMutex() {
  static auto* mu = new std::mutex();
  return *mu;
}
EnvLaunchPolicy& Policy() {
  static auto* policy = new EnvLaunchPolicy();
  return *policy;
}

// Every rank reached the store and agrees on WORLD_SIZE before any mesh is
// made: a rank with another WORLD_SIZE is named here.
absl::Status AgreeOnWorldSize(Bootstrap& bootstrap, const LaunchInfo& info,
                              absl::Time deadline) {
  auto sizes = bootstrap.all_gather(absl::StrCat(info.world_size), deadline);
  if (!sizes.ok()) {
    return absl::Status(
        sizes.status().code(),
        absl::StrCat("env:// launch: ", sizes.status().message()));
  }
  for (size_t r = 0; r < sizes->size(); ++r) {
    if ((*sizes)[r] != (*sizes)[0]) {
      return absl::InvalidArgumentError(absl::StrCat(
          "env:// launch: rank ", r, " has WORLD_SIZE=", (*sizes)[r],
          " but rank 0 has WORLD_SIZE=", (*sizes)[0],
          ": every rank must be started with the same WORLD_SIZE"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<Bootstrap>> MakeEnvBootstrap(
    const LaunchInfo& info, absl::Time deadline, EnvLaunch* keep) {
  std::string prefix = "vemesh";
  if (!info.run_id.empty()) {
    absl::StrAppend(&prefix, "/", info.run_id);
    if (const char* restart = Env("TORCHELASTIC_RESTART_COUNT")) {
      absl::StrAppend(&prefix, "/restart", restart);
    }
  } else if (!info.job_id.empty()) {
    absl::StrAppend(&prefix, "/", info.job_id);
  }
  Rank0StoreSpec spec;
  spec.rank = info.rank;
  spec.size = info.world_size;
  // Rank 0 listens only on the address it advertises, MASTER_ADDR (IPv4 or
  // IPv6), never on every interface unless asked to with VEMESH_STORE_BIND
  // (e.g. 0.0.0.0 when MASTER_ADDR is a host name that resolves to a
  // loopback alias such as Debian's 127.0.1.1 on rank 0's own host).
  const char* bind = Env("VEMESH_STORE_BIND");
  spec.bind = bind != nullptr ? std::string(bind) : info.master_addr;
  spec.host = info.master_addr;
  spec.port = info.master_port;
  spec.prefix = prefix;
  spec.reason = info.reason;
  spec.context = "env:// launch";
  spec.address_name = "MASTER_ADDR:MASTER_PORT";
  spec.job = info.job_id;
  spec.token = info.store_token;
  // Without a job id, two jobs are told apart by a rank claimed twice:
  // rank 0 gives a second job starting at the same moment a little time
  // to show itself before the first verdict.
  if (info.job_id.empty()) spec.settle = kClaimSettle;
  if (spec.token.empty() && info.rank == 0) WarnNoToken(info);

  EnvLaunchPolicy policy;
  {
    std::lock_guard<std::mutex> lock(PolicyMutex());
    policy = Policy();
  }
  ExternalStore meeting;
  if (policy.meeting_store) {
    VEMESH_ASSIGN_OR_RETURN(meeting, policy.meeting_store(info));
  }
  if (meeting.store == nullptr && !policy.release_master_port) {
    // The store stays at MASTER_ADDR:MASTER_PORT for the life of the job.
    VEMESH_ASSIGN_OR_RETURN(Rank0Store store, StartRank0Store(spec, deadline));
    keep->server = std::move(store.server);
    VEMESH_RETURN_IF_ERROR(AgreeOnWorldSize(*store.bootstrap, info, deadline));
    return std::shared_ptr<Bootstrap>(std::move(store.bootstrap));
  }

  // The meeting: through the other library's store, or at MASTER_PORT for
  // as long as it takes rank 0 to announce a port of its own.
  std::shared_ptr<Bootstrap> meet;
  std::unique_ptr<TcpStoreServer> meet_server;
  if (meeting.store != nullptr) {
    meet = std::make_shared<StoreBootstrap>(
        meeting.store, info.rank, info.world_size,
        absl::StrCat(prefix, "/meet"),
        absl::StrCat(info.reason, ", met through ", meeting.description));
  } else {
    VEMESH_ASSIGN_OR_RETURN(Rank0Store met, StartRank0Store(spec, deadline));
    meet_server = std::move(met.server);
    meet = std::move(met.bootstrap);
  }
  Rank0StoreSpec own = spec;
  own.port = 0;  // ephemeral, announced over the meeting
  own.announce = meet.get();
  own.address_name.clear();
  own.settle = absl::ZeroDuration();  // a second job was caught at the meeting
  if (meeting.store != nullptr) {
    own.reason =
        absl::StrCat(info.reason, "; met through ", meeting.description);
  }
  auto store = StartRank0Store(own, deadline);
  if (!store.ok()) {
    return absl::Status(
        store.status().code(),
        absl::StrCat(
            store.status().message(),
            meeting.store != nullptr
                ? absl::StrCat(" (announced through ", meeting.description, ")")
                : std::string(" (announced at MASTER_ADDR:"
                              "MASTER_PORT)")));
  }
  // This rank is done with the meeting: its connection to MASTER_PORT
  // closes first (the client side keeps any TIME_WAIT, not the port).
  meet.reset();
  keep->server = std::move(store->server);
  std::shared_ptr<StoreBootstrap> bootstrap = std::move(store->bootstrap);
  // Every rank has left the meeting once this round completes.
  VEMESH_RETURN_IF_ERROR(AgreeOnWorldSize(*bootstrap, info, deadline));
  if (meeting.store == nullptr) {
    meet_server.reset();  // rank 0: MASTER_PORT is free again
    // No rank goes on (to torch.distributed's init, which binds
    // MASTER_PORT on rank 0 and connects to it elsewhere) before it is.
    absl::Status s = bootstrap->barrier(deadline);
    if (!s.ok()) {
      return absl::Status(s.code(),
                          absl::StrCat("env:// launch: giving MASTER_PORT "
                                       "back: ",
                                       s.message()));
    }
  }
  return std::shared_ptr<Bootstrap>(std::move(bootstrap));
}

}  // namespace

bool IsLoopback(const std::string& host) {
  addrinfo hints = {};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), nullptr, &hints, &found) != 0) return false;
  bool loopback = true;
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    if (a->ai_family == AF_INET6) {
      const auto* in6 = reinterpret_cast<const sockaddr_in6*>(a->ai_addr);
      loopback = loopback && IN6_IS_ADDR_LOOPBACK(&in6->sin6_addr);
    } else {
      const auto* in = reinterpret_cast<const sockaddr_in*>(a->ai_addr);
      loopback = loopback && (ntohl(in->sin_addr.s_addr) >> 24) == 127;
    }
  }
  freeaddrinfo(found);
  return loopback;
}

std::string AdvertisedAddress() {
  if (const char* host = Env("VEMESH_GLOO_HOST")) return host;
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) return "127.0.0.1";
  // The interface this host uses towards its own name, unless that is a
  // loopback alias: then the first address of an interface that is up.
  auto towards = LocalAddressTowards(name);
  if (towards.ok() && towards->rfind("127.", 0) != 0) return *towards;
  ifaddrs* all = nullptr;
  std::string out = "127.0.0.1";
  if (getifaddrs(&all) == 0) {
    for (ifaddrs* i = all; i != nullptr; i = i->ifa_next) {
      if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET ||
          (i->ifa_flags & IFF_LOOPBACK) || !(i->ifa_flags & IFF_UP)) {
        continue;
      }
      char text[INET_ADDRSTRLEN] = {};
      const auto* in = reinterpret_cast<const sockaddr_in*>(i->ifa_addr);
      if (inet_ntop(AF_INET, &in->sin_addr, text, sizeof(text)) != nullptr) {
        out = text;
        break;
      }
    }
    freeifaddrs(all);
  }
  return out;
}

absl::StatusOr<LaunchInfo> DetectLaunch() {
  LaunchInfo info;
  std::string forced;
  if (const char* choice = Env("VEMESH_BOOTSTRAP")) {
    forced = absl::AsciiStrToLower(choice);
    if (forced != "mpi" && forced != "env") {
      return absl::InvalidArgumentError(absl::StrCat(
          "VEMESH_BOOTSTRAP='", choice, "': expected 'mpi' or 'env'"));
    }
  }
  std::string marker;
  const bool env_vars = Env("RANK") != nullptr || Env("WORLD_SIZE") != nullptr;
  if (forced == "mpi" || (forced.empty() && Env("OMPI_COMM_WORLD_SIZE"))) {
    info.kind = LaunchKind::kMpi;
    info.reason = forced == "mpi" ? "VEMESH_BOOTSTRAP=mpi"
                                  : "OMPI_COMM_WORLD_SIZE is set (mpirun)";
    return info;
  }
  if (forced == "env" || env_vars) {
    info.kind = LaunchKind::kEnv;
    info.reason = forced == "env"
                      ? "VEMESH_BOOTSTRAP=env"
                      : "RANK/WORLD_SIZE are set (torchrun or env://)";
    VEMESH_RETURN_IF_ERROR(ReadEnvLaunch(&info));
    return info;
  }
  if (HasMpiMarker(&marker)) {
    info.kind = LaunchKind::kMpi;
    info.reason = absl::StrCat(marker, " is set (an MPI/PMI launcher)");
    return info;
  }
  info.kind = LaunchKind::kNone;
  info.reason = "no launcher variables: one process (MPI singleton)";
  return info;
}

void SetEnvLaunchPolicy(EnvLaunchPolicy policy) {
  std::lock_guard<std::mutex> lock(PolicyMutex());
  Policy() = std::move(policy);
}

absl::StatusOr<std::shared_ptr<Bootstrap>> LaunchBootstrap(
    absl::Time deadline) {
  static std::mutex mu;
  static EnvLaunch* kept = nullptr;  // lives until exit: rank 0's store
  std::lock_guard<std::mutex> lock(mu);
  if (kept != nullptr) return kept->bootstrap;
  VEMESH_ASSIGN_OR_RETURN(auto info, DetectLaunch());
  auto holder = std::make_unique<EnvLaunch>();
  if (info.kind == LaunchKind::kEnv) {
    VEMESH_ASSIGN_OR_RETURN(auto boot,
                            MakeEnvBootstrap(info, deadline, holder.get()));
    holder->bootstrap = std::move(boot);
  } else {
#ifndef VEMESH_NO_MPI
    VEMESH_ASSIGN_OR_RETURN(
        auto boot, MpiBootstrap::Create(MPI_COMM_WORLD, info.reason, deadline));
    holder->bootstrap = std::move(boot);
#else
    return absl::UnimplementedError(absl::StrCat(
        "an MPI bootstrap (", info.reason,
        "): vemesh was built with VEMESH_WITH_MPI=OFF (rebuild with it ON and "
        "an MPI installed, or launch the env:// way: RANK, WORLD_SIZE, "
        "MASTER_ADDR, MASTER_PORT)"));
#endif
  }
  kept = holder.release();
  return kept->bootstrap;
}

int LauncherRank() {
  for (const char* name :
       {"OMPI_COMM_WORLD_RANK", "RANK", "PMIX_RANK", "PMI_RANK"}) {
    int rank = 0;
    if (const char* v = Env(name); v != nullptr && absl::SimpleAtoi(v, &rank)) {
      return rank;
    }
  }
#ifndef VEMESH_NO_MPI
  if (MpiIsUsable()) {
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    return rank;
  }
#endif
  return 0;
}

namespace {

bool IntEnv(const char* name, int* out) {
  const char* v = Env(name);
  return v != nullptr && absl::SimpleAtoi(v, out);
}

// Whether SLURM_LOCALID describes this process (see LauncherLocalRank).
bool SlurmStepIsOurs() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK",
                           "OMPI_COMM_WORLD_LOCAL_RANK"}) {
    if (Env(name) != nullptr) return false;  // mpirun's ranks, srun's daemons
  }
  int procid = 0;
  if (!IntEnv("SLURM_PROCID", &procid)) return false;
  for (const char* name : {"PMIX_RANK", "PMI_RANK", "RANK"}) {
    int rank = 0;
    if (IntEnv(name, &rank)) return rank == procid;
  }
  return false;  // no launcher rank to check the step against
}

}  // namespace

LauncherLocal LauncherLocalRank() {
  for (const char* name : {"OMPI_COMM_WORLD_LOCAL_RANK", "LOCAL_RANK"}) {
    int rank = 0;
    if (IntEnv(name, &rank)) return {rank, name};
  }
  int rank = 0;
  if (IntEnv("SLURM_LOCALID", &rank) && SlurmStepIsOurs()) {
    return {rank, "SLURM_LOCALID"};
  }
  return {};
}

absl::StatusOr<std::string> LocalAddressTowards(const std::string& host) {
  addrinfo hints = {};
  hints.ai_family = AF_UNSPEC;  // an IPv6 MASTER_ADDR routes over IPv6
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (int rc = getaddrinfo(host.c_str(), "9", &hints, &found); rc != 0) {
    return absl::UnavailableError(absl::StrCat(
        "cannot resolve '", host, "' (MASTER_ADDR): ", gai_strerror(rc)));
  }
  const int family = found->ai_family;
  std::string out = family == AF_INET6 ? "::1" : "127.0.0.1";
  const int fd = socket(family, SOCK_DGRAM, 0);
  // A datagram socket's connect() only picks the route: nothing is sent.
  if (fd >= 0 && connect(fd, found->ai_addr, found->ai_addrlen) == 0) {
    sockaddr_storage local = {};
    socklen_t length = sizeof(local);
    char text[INET6_ADDRSTRLEN] = {};
    const void* where =
        family == AF_INET6
            ? static_cast<const void*>(
                  &reinterpret_cast<const sockaddr_in6*>(&local)->sin6_addr)
            : static_cast<const void*>(
                  &reinterpret_cast<const sockaddr_in*>(&local)->sin_addr);
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &length) == 0 &&
        inet_ntop(family, where, text, sizeof(text)) != nullptr) {
      out = text;
    }
  }
  if (fd >= 0) close(fd);
  freeaddrinfo(found);
  return out;
}

}  // namespace vemesh
