// No-hang scenarios, run under mpiexec by expect_no_hang.cmake:
//
//   mpiexec -n 4 no_hang <scenario> <timeout_seconds>
//
// Each scenario makes the ranks misuse a collective call in one way. Every
// rank must come back from vemesh with an error (never a hang, never a
// silently wrong mesh) within the timeout plus a little. Each rank prints
//
//   no_hang[<scenario>] rank R/N: PASS|FAIL <code>: <message> (after S s)
//
// and the driver requires N PASS lines and a bounded wall time.
//
// Exit: a DeadlineExceeded leaves an MPI collective pending that can never
// complete (see vemesh/bootstrap/mpi/mpi_bootstrap.h), so MPI cannot be finalised
// safely. Scenarios that expect it wait until a common end time (so that
// mpiexec does not kill a rank before it has spoken) and leave with
// _exit(0); the others finalise MPI as usual.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "vemesh/api/ve_device_mesh.h"
#include "vemesh/bootstrap/launch.h"
#include "vemesh/comm/mpi/mpi_environment.h"

namespace {

using absl::StatusCode;
using vemesh::DeviceMesh;
using vemesh::InitOptions;

struct Outcome {
  absl::Status status;
  StatusCode expected;
  // Time the scenario slept on purpose (a late rank), not counted against
  // the bound.
  absl::Duration slept = absl::ZeroDuration();
};

struct Scenario {
  // Whether some rank is expected to leave a collective pending.
  bool leaves_pending;
  std::function<Outcome(int rank, absl::Duration timeout)> run;
  // Whether main leaves MPI to vemesh (started lazily by init) instead of
  // starting it itself.
  bool lazy_mpi = false;
  // Whether the ranks return from main normally after a deadline, once
  // every rank has spoken (the first to leave ends the job).
  bool returns_after_deadline = false;
};

InitOptions WithTimeout(absl::Duration timeout) {
  InitOptions o;
  o.timeout = timeout;
  return o;
}

absl::StatusOr<DeviceMesh> Init(std::vector<int64_t> shape,
                                std::vector<std::string> names,
                                absl::Duration timeout) {
  return VESCALE_DEVICE_MESH.init_device_mesh("cpu", std::move(shape),
                                              std::move(names),
                                              WithTimeout(timeout));
}

const std::map<std::string, Scenario>& Scenarios() {
  static const auto* scenarios = new std::map<std::string, Scenario>{
      // Rank 1 passes another shape: every rank learns it from the
      // agreement check before any split, and no mesh is built.
      {"disagree_shape",
       {false,
        [](int rank, absl::Duration t) {
          auto mesh = rank == 1 ? Init({4}, {"TP"}, t)
                                : Init({2, 2}, {"DP", "TP"}, t);
          return Outcome{mesh.status(), StatusCode::kInvalidArgument};
        }}},
      // The last rank calls a dimension by another name.
      {"disagree_names",
       {false,
        [](int rank, absl::Duration t) {
          int size = 0;
          MPI_Comm_size(MPI_COMM_WORLD, &size);
          auto mesh = rank == size - 1 ? Init({2, 2}, {"PP", "TP"}, t)
                                       : Init({2, 2}, {"DP", "TP"}, t);
          return Outcome{mesh.status(), StatusCode::kInvalidArgument};
        }}},
      // Rank 0 never calls init and asks the registry instead: it is told
      // to init first; the others give up waiting for it at the deadline.
      {"skip_init",
       {true,
        [](int rank, absl::Duration t) {
          if (rank == 0) {
            return Outcome{
                VESCALE_DEVICE_MESH.get_tensor_parallel_mesh().status(),
                StatusCode::kFailedPrecondition};
          }
          return Outcome{Init({2, 2}, {"DP", "TP"}, t).status(),
                         StatusCode::kDeadlineExceeded};
        }}},
      // Every rank flattens, but rank 0 asks for another group: the
      // agreement check inside flatten fails everywhere.
      {"flatten_mismatch",
       {false,
        [](int rank, absl::Duration t) {
          auto mesh = Init({1, 2, 2}, {"PP", "DP", "TP"}, t);
          if (!mesh.ok()) return Outcome{mesh.status(), StatusCode::kOk};
          auto group = rank == 0 ? mesh->flatten({"DP", "TP"})
                                 : mesh->flatten({"PP", "DP"});
          return Outcome{group.status(), StatusCode::kInvalidArgument};
        }}},
      // Only rank 0 asks for a flattened group; the others go on to their
      // next collective vemesh call (a re-init). Neither side can complete:
      // both reach their deadline.
      // The last rank arrives after the others gave up. It completes their
      // abandoned first step, but must learn that they gave up: every rank,
      // the late one too, ends with DeadlineExceeded (none hangs).
      {"late_rank",
       {true,
        [](int rank, absl::Duration t) {
          int size = 0;
          MPI_Comm_size(MPI_COMM_WORLD, &size);
          absl::Duration slept = absl::ZeroDuration();
          if (rank == size - 1) {
            slept = t + absl::Seconds(1);
            absl::SleepFor(slept);
          }
          return Outcome{Init({size}, {"DP"}, t).status(),
                         StatusCode::kDeadlineExceeded, slept};
        }}},
      // After a DeadlineExceeded, a second init is refused without entering
      // MPI (it used to crash in MPI_Comm_dup), and the ranks that timed out
      // return from main normally: vemesh skips the exit-time MPI_Finalize
      // that would wait for the missing rank, so they end, and the launcher
      // ends the job around the missing rank (which would sleep for 120 s,
      // past the driver's limit).
      {"reinit_after_timeout",
       {false,
        [](int rank, absl::Duration t) {
          if (rank == 0) {
            // The missing rank: it never inits, and stays away (stopped)
            // until the job is ended around it.
            Outcome skipped{
                VESCALE_DEVICE_MESH.get_tensor_parallel_mesh().status(),
                StatusCode::kFailedPrecondition};
            std::fprintf(stdout, "no_hang[reinit_after_timeout] rank 0/%d: %s %s\n",
                         4, skipped.status.code() == skipped.expected ? "PASS" : "FAIL",
                         skipped.status.ToString().c_str());
            std::fflush(stdout);
            absl::SleepFor(absl::Seconds(120));  // past the driver's limit
            _exit(0);
          }
          auto first = Init({2, 2}, {"DP", "TP"}, t);
          if (!absl::IsDeadlineExceeded(first.status())) {
            return Outcome{first.status(), StatusCode::kDeadlineExceeded};
          }
          return Outcome{Init({2, 2}, {"DP", "TP"}, t).status(),
                         StatusCode::kFailedPrecondition};
        },
        /*lazy_mpi=*/false, /*returns_after_deadline=*/true}},
      // Rank 0 never starts MPI at all (a process stuck before MPI_Init);
      // the others start it lazily through init, whose deadline covers
      // MPI's own start-up: they get DeadlineExceeded instead of waiting in
      // MPI_Init_thread for ever.
      {"never_starts_mpi",
       {true,
        [](int rank, absl::Duration t) {
          if (rank == 0) {
            return Outcome{
                VESCALE_DEVICE_MESH.get_tensor_parallel_mesh().status(),
                StatusCode::kFailedPrecondition};
          }
          return Outcome{Init({2, 2}, {"DP", "TP"}, t).status(),
                         StatusCode::kDeadlineExceeded};
        },
        /*lazy_mpi=*/true}},
      // Rank 0 flattens while the others re-init: both calls agree through
      // the same bootstrap, so every rank is told the operations differ.
      {"flatten_alone",
       {false,
        [](int rank, absl::Duration t) {
          auto mesh = Init({2, 2}, {"DP", "TP"}, t);
          if (!mesh.ok()) return Outcome{mesh.status(), StatusCode::kOk};
          if (rank == 0) {
            return Outcome{mesh->flatten({"DP", "TP"}).status(),
                           StatusCode::kInvalidArgument};
          }
          return Outcome{Init({4}, {"TP"}, t).status(),
                         StatusCode::kInvalidArgument};
        }}},
  };
  return *scenarios;
}

}  // namespace

int main(int argc, char** argv) {
  double seconds = 0;
  if (argc != 3 || !Scenarios().count(argv[1]) ||
      !absl::SimpleAtod(argv[2], &seconds) || seconds <= 0) {
    std::fprintf(stderr, "usage: no_hang <scenario> <timeout_seconds>\n");
    return 2;
  }
  const std::string name = argv[1];
  const Scenario& scenario = Scenarios().at(name);
  const absl::Duration timeout = absl::Seconds(seconds);

  std::optional<vemesh::MpiSession> mpi;
  int rank = vemesh::LauncherRank();
  int size = 0;
  if (const char* n = std::getenv("OMPI_COMM_WORLD_SIZE")) size = std::atoi(n);
  if (!scenario.lazy_mpi) {
    mpi.emplace(&argc, &argv);
    if (!mpi->status().ok()) {
      std::fprintf(stderr, "MPI failed to start: %s\n",
                   std::string(mpi->status().message()).c_str());
      return 1;
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    // Start together, so the timeout measures the scenario, not start-up.
    MPI_Barrier(MPI_COMM_WORLD);
  }
  const absl::Time start = absl::Now();

  const Outcome outcome = scenario.run(rank, timeout);
  const absl::Duration took = absl::Now() - start - outcome.slept;
  // Bounded: the deadline plus slack for a loaded 2-core machine.
  const bool bounded = took <= timeout + absl::Seconds(5);
  const bool pass = !outcome.status.ok() &&
                    outcome.status.code() == outcome.expected && bounded;
  std::fprintf(stdout, "no_hang[%s] rank %d/%d: %s %s (after %.2f s)\n",
               name.c_str(), rank, size, pass ? "PASS" : "FAIL",
               outcome.status.ToString().c_str(), absl::ToDoubleSeconds(took));
  if (!pass) {
    std::fprintf(stdout, "no_hang[%s] rank %d: expected %s within %.1f s\n",
                 name.c_str(), rank,
                 absl::StatusCodeToString(outcome.expected).c_str(),
                 absl::ToDoubleSeconds(timeout + absl::Seconds(5)));
  }
  std::fflush(stdout);

  if (scenario.leaves_pending) {
    // Wait for every rank to have spoken (a late rank too), then leave
    // without MPI_Finalize.
    const absl::Time end = start + 2 * timeout + absl::Seconds(5);
    if (absl::Now() < end) absl::SleepFor(end - absl::Now());
    std::fflush(nullptr);
    _exit(0);
  }
  if (scenario.returns_after_deadline) {
    // Let every rank speak before the first one leaves: the launcher ends
    // the job when a rank exits without MPI_Finalize.
    const absl::Time end = start + timeout + absl::Seconds(2);
    if (absl::Now() < end) absl::SleepFor(end - absl::Now());
  }
  VESCALE_DEVICE_MESH.reset();
  return 0;
}
