// vemesh/bootstrap/launch.h
//
// How this process was started, read from the launcher's environment, and
// the one Bootstrap of this process that follows from it.
//
//   mpirun / srun --mpi=pmix  OMPI_COMM_WORLD_SIZE, PMIX_RANK or PMI_RANK
//                             -> MpiBootstrap over MPI_COMM_WORLD
//   torchrun / env://         RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
//                             (LOCAL_RANK, LOCAL_WORLD_SIZE when given)
//                             -> rank 0 hosts a TcpStore at
//                                MASTER_ADDR:MASTER_PORT; StoreBootstrap
//                                (beside torch.distributed: EnvLaunchPolicy)
//   nothing                   -> one process: MpiBootstrap (an MPI singleton)
//
// VEMESH_BOOTSTRAP=mpi|env forces a choice. When both kinds of variable are
// set, OMPI_COMM_WORLD_SIZE wins over RANK/WORLD_SIZE, which win over
// PMIX_RANK/PMI_RANK (a torchrun inside an srun step sees both).
//
//   absl::StatusOr<std::shared_ptr<Bootstrap>> boot =
//       LaunchBootstrap(absl::Now() + absl::Seconds(60));
//
// Bad variables are InvalidArgument naming the variable, its value and what
// was expected; a launcher whose agent hosts the store
// (TORCHELASTIC_USE_AGENT_STORE=True) is FailedPrecondition saying so.

#ifndef VEMESH_BOOTSTRAP_LAUNCH_H_
#define VEMESH_BOOTSTRAP_LAUNCH_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "vemesh/bootstrap/bootstrap.h"
#include "vemesh/rendezvous/store.h"

namespace vemesh {

enum class LaunchKind { kMpi, kEnv, kNone };

struct LaunchInfo {
  LaunchKind kind = LaunchKind::kNone;
  std::string reason;  // "OMPI_COMM_WORLD_SIZE is set (an MPI launcher)"
  // env:// only (-1 / empty otherwise).
  int rank = -1;
  int world_size = -1;
  int local_rank = -1;
  int local_world_size = -1;
  std::string master_addr;
  int master_port = -1;
  std::string run_id;  // TORCHELASTIC_RUN_ID, namespaces the store's keys
  // The job's identity, every rank's alike: VEMESH_JOB_ID, else
  // TORCHELASTIC_RUN_ID, else SLURM_JOB_ID[.SLURM_STEP_ID]; "" when the
  // launcher gives none (rank 0's store then makes one, and a rank claimed
  // twice is what tells two jobs apart). job_source names the variable.
  std::string job_id;
  std::string job_source;
  // The store's shared secret: VEMESH_STORE_TOKEN, or the first line of the
  // file VEMESH_STORE_TOKEN_FILE names, else one derived from the launcher's
  // per-run secret: TORCHELASTIC_RUN_ID when it is a UUID (torchrun
  // --standalone makes one at random), or Open MPI's
  // OMPI_MCA_orte_precondition_transports (a random key mpirun gives every
  // rank). "": none (rank 0 warns once). store_token_source names where it
  // came from.
  std::string store_token;
  std::string store_token_source;
};

// Reads the environment; no communication.
absl::StatusOr<LaunchInfo> DetectLaunch();

// How an env:// launch shares the job with another library of the same
// process that reads the same variables: torch.distributed's env://, whose
// rank 0 hosts its own store at MASTER_ADDR:MASTER_PORT for as long as the
// job lives. The Python module sets it at import (python/vemesh_py); C++
// programs keep the defaults, under which rank 0 hosts vemesh's store at
// MASTER_ADDR:MASTER_PORT until the process ends.
//
//   torch first   `meeting_store` gives torch's store: the ranks meet there
//                 and rank 0 announces its own store's port through it;
//                 MASTER_PORT is never touched.
//   vemesh first  `release_master_port`: the ranks meet at MASTER_PORT as
//                 usual (the job-id, token and rank-claimed-twice checks
//                 included), rank 0 moves its store to a port of its own
//                 (an ephemeral one, announced at the meeting), and
//                 LaunchBootstrap returns on no rank before rank 0 closed
//                 MASTER_PORT, so torch binds it after.
struct ExternalStore {
  std::shared_ptr<Store> store;  // null: none
  std::string description;       // "torch.distributed's default store"
};
struct EnvLaunchPolicy {
  bool release_master_port = false;
  // Asked once per attempt of LaunchBootstrap under env://, before meeting
  // at MASTER_PORT; its error fails the attempt.
  std::function<absl::StatusOr<ExternalStore>(const LaunchInfo&)> meeting_store;
};
// Replaces the policy; takes effect at the next LaunchBootstrap that makes
// the bootstrap (not once it is made).
void SetEnvLaunchPolicy(EnvLaunchPolicy policy);

// The process-wide bootstrap, made on first call (collective: every rank of
// the job calls it) and kept for the life of the process, since under
// env:// rank 0's store must outlive every mesh. A failed attempt is not
// kept: the next call tries again.
absl::StatusOr<std::shared_ptr<Bootstrap>> LaunchBootstrap(absl::Time deadline);

// The global rank the launcher gave this process, without communicating
// (for meta meshes): RANK, OMPI_COMM_WORLD_RANK, PMIX_RANK or PMI_RANK; 0
// when none is set.
int LauncherRank();

// The host-local rank the launcher gave this process, and the variable that
// said so: OMPI_COMM_WORLD_LOCAL_RANK (mpirun), LOCAL_RANK (torchrun), or
// SLURM_LOCALID (srun) when this process is a task of the Slurm step that
// set it. Under `salloc` + `mpirun`, Open MPI starts its daemons with srun
// and the ranks inherit the daemon step's SLURM_LOCALID (0 on every host)
// and SLURM_PROCID (the host's index), so SLURM_LOCALID counts only when no
// OMPI_COMM_WORLD_* variable is set and SLURM_PROCID equals the rank the
// launcher gave this process (PMIX_RANK, PMI_RANK or RANK).
//   {2, "OMPI_COMM_WORLD_LOCAL_RANK"}; {-1, nullptr} when none says.
struct LauncherLocal {
  int rank = -1;
  const char* variable = nullptr;
};
LauncherLocal LauncherLocalRank();

// The address of this machine's interface that reaches `host` (no packet is
// sent): what Gloo peers connect to. "127.0.0.1" (or "::1" for an IPv6
// host) for loopback targets.
absl::StatusOr<std::string> LocalAddressTowards(const std::string& host);

// Whether every address (IPv4 or IPv6) `host` resolves to is a loopback
// one (false when it does not resolve).
bool IsLoopback(const std::string& host);

// An address of this machine that other hosts can reach, for a server that
// vemesh starts itself (Gloo under mpirun): VEMESH_GLOO_HOST when set, the
// address of the interface towards this host's name unless that is a
// loopback alias, else the first IPv4 address of an interface that is up.
std::string AdvertisedAddress();

}  // namespace vemesh

#endif  // VEMESH_BOOTSTRAP_LAUNCH_H_
