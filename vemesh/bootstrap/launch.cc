#include "vemesh/bootstrap/launch.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "vemesh/base/status_macros.h"
#include "vemesh/bootstrap/rank0_store.h"
#include "vemesh/bootstrap/store_bootstrap.h"
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

absl::Status ReadEnvLaunch(LaunchInfo* info) {
  if (const char* agent = Env("TORCHELASTIC_USE_AGENT_STORE")) {
    if (absl::AsciiStrToLower(agent) == "true" || std::string(agent) == "1") {
      return absl::FailedPreconditionError(absl::StrCat(
          "env:// launch: TORCHELASTIC_USE_AGENT_STORE=", agent,
          " says the launcher's agent hosts the store at MASTER_ADDR:"
          "MASTER_PORT, but vemesh hosts its own store on rank 0 and cannot "
          "speak to the agent's: launch with TORCHELASTIC_USE_AGENT_STORE="
          "False (Debian's torchrun 1.13 does), or set VEMESH_BOOTSTRAP=mpi "
          "under an MPI launcher"));
    }
  }
  VEMESH_ASSIGN_OR_RETURN(auto size, IntVar("WORLD_SIZE", 1, 1 << 24));
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
  if (Env("LOCAL_WORLD_SIZE") != nullptr) {
    VEMESH_ASSIGN_OR_RETURN(auto local_size,
                            IntVar("LOCAL_WORLD_SIZE", 1, size));
    info->local_world_size = local_size;
    auto local_rank = IntVar("LOCAL_RANK", 0, local_size - 1);
    if (!local_rank.ok()) return local_rank.status();
    info->local_rank = *local_rank;
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
  } else if (const char* file = Env("VEMESH_STORE_TOKEN_FILE")) {
    std::ifstream in(file);
    std::getline(in, info->store_token);
    if (!in && info->store_token.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "env:// launch: VEMESH_STORE_TOKEN_FILE='", file,
          "' cannot be read or is empty: expected a file whose first line "
          "is the job's store token"));
    }
  }
  return absl::OkStatus();
}

constexpr absl::Duration kClaimSettle = absl::Milliseconds(100);

// What the env:// bootstrap needs to keep alive: rank 0's server.
struct EnvLaunch {
  std::unique_ptr<TcpStoreServer> server;
  std::shared_ptr<Bootstrap> bootstrap;
};

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
  // Rank 0 binds MASTER_ADDR itself when it is a loopback name (a one-host
  // job: nothing outside this machine can reach the store), else every
  // interface, as PyTorch's TCPStore does: a hostname often resolves to a
  // loopback address on its own host (Debian's 127.0.1.1) that the other
  // hosts could not reach.
  spec.bind =
      IsLoopback(info.master_addr) ? info.master_addr : std::string("0.0.0.0");
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
  VEMESH_ASSIGN_OR_RETURN(Rank0Store store, StartRank0Store(spec, deadline));
  keep->server = std::move(store.server);
  std::shared_ptr<StoreBootstrap> bootstrap = std::move(store.bootstrap);
  // Every rank reached the store and agrees on WORLD_SIZE before any mesh
  // is made: a rank with another WORLD_SIZE is named here.
  auto sizes = bootstrap->all_gather(absl::StrCat(info.world_size), deadline);
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
  return std::shared_ptr<Bootstrap>(std::move(bootstrap));
}

}  // namespace

bool IsLoopback(const std::string& host) {
  addrinfo hints = {};
  hints.ai_family = AF_INET;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), nullptr, &hints, &found) != 0) return false;
  bool loopback = true;
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(a->ai_addr);
    loopback = loopback && (ntohl(in->sin_addr.s_addr) >> 24) == 127;
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
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (int rc = getaddrinfo(host.c_str(), "9", &hints, &found); rc != 0) {
    return absl::UnavailableError(absl::StrCat(
        "cannot resolve '", host, "' (MASTER_ADDR): ", gai_strerror(rc)));
  }
  std::string out = "127.0.0.1";
  const int fd = socket(AF_INET, SOCK_DGRAM, 0);
  // A datagram socket's connect() only picks the route: nothing is sent.
  if (fd >= 0 && connect(fd, found->ai_addr, found->ai_addrlen) == 0) {
    sockaddr_in local = {};
    socklen_t length = sizeof(local);
    char text[INET_ADDRSTRLEN] = {};
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &length) == 0 &&
        inet_ntop(AF_INET, &local.sin_addr, text, sizeof(text)) != nullptr) {
      out = text;
    }
  }
  if (fd >= 0) close(fd);
  freeaddrinfo(found);
  return out;
}

}  // namespace vemesh
