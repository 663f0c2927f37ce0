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
// complete (see vemesh/bootstrap/mpi/mpi_bootstrap.h), so MPI cannot be
// finalised safely. Scenarios that expect it wait until a common end time (so
// that mpiexec does not kill a rank before it has spoken) and leave with
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
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "vemesh/bootstrap/launch.h"
#include "vemesh/comm/mpi/mpi_environment.h"
#include "vemesh/registry/ve_device_mesh.h"

namespace {

using absl::StatusCode;
using vemesh::DeviceMesh;
using vemesh::InitOptions;

struct Outcome {
  Outcome(absl::Status s, StatusCode e,
          absl::Duration slept_for = absl::ZeroDuration(),
          std::string says = "")
      : status(std::move(s)),
        expected(e),
        slept(slept_for),
        must_say(std::move(says)) {}

  absl::Status status;
  StatusCode expected;
  // Time the scenario slept on purpose (a late rank), not counted against
  // the bound.
  absl::Duration slept = absl::ZeroDuration();
  // Text the status's message must hold (empty: anything).
  std::string must_say;
};

// Two calls in a row: the first must be DeadlineExceeded saying
// `first_says`; then `second` (a re-init, a flatten) must be refused with
// FailedPrecondition naming the earlier deadline and what it said, without
// entering MPI. The first status is printed on its own line.
Outcome DeadlineThenRefused(const char* scenario, int rank,
                            const absl::Status& first,
                            const std::string& first_says,
                            const std::function<absl::Status()>& second,
                            absl::Duration slept) {
  std::fprintf(stdout, "no_hang[%s] rank %d first call: %s\n", scenario, rank,
               first.ToString().c_str());
  std::fflush(stdout);
  if (!absl::IsDeadlineExceeded(first) ||
      first.message().find(first_says) == absl::string_view::npos) {
    return Outcome{first, StatusCode::kDeadlineExceeded, slept, first_says};
  }
  return Outcome{
      second(), StatusCode::kFailedPrecondition, slept,
      "MPI was abandoned at an earlier deadline in this process (at "};
}

// A fixed pause for a late rank: past the others' deadline, their report
// grace (1 s for a 3 s timeout) and their refused re-init.
constexpr absl::Duration kLateBy = absl::Seconds(4);

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
  // How long after the start they wait before returning (a late rank must
  // have spoken by then); zero: the timeout plus 2 s.
  absl::Duration returns_after = absl::ZeroDuration();
};

InitOptions WithTimeout(absl::Duration timeout) {
  InitOptions o;
  o.mesh.timeout = timeout;
  return o;
}

absl::StatusOr<DeviceMesh> Init(std::vector<int64_t> shape,
                                std::vector<std::string> names,
                                absl::Duration timeout) {
  return VESCALE_DEVICE_MESH.init_device_mesh(
      "cpu", std::move(shape), std::move(names), WithTimeout(timeout));
}

const std::map<std::string, Scenario>& Scenarios() {
  static const auto* scenarios = new std::map<std::string, Scenario>{
      // Rank 1 passes another shape: every rank learns it from the
      // agreement check before any split, and no mesh is built.
      {"disagree_shape",
       {false,
        [](int rank, absl::Duration t) {
          auto mesh =
              rank == 1 ? Init({4}, {"TP"}, t) : Init({2, 2}, {"DP", "TP"}, t);
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
          // Rank 1 collects the reports in place of the missing rank 0.
          return Outcome{Init({2, 2}, {"DP", "TP"}, t).status(),
                         StatusCode::kDeadlineExceeded, absl::ZeroDuration(),
                         "rank 0 never arrived (the ranks that did: "};
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
          // The on-time ranks learn which rank never came (their first
          // collective: the bootstrap's MPI_Comm_idup over MPI_COMM_WORLD).
          return Outcome{Init({size}, {"DP"}, t).status(),
                         StatusCode::kDeadlineExceeded, slept,
                         rank == size - 1 ? ""
                                          : absl::StrCat("rank ", size - 1,
                                                         " never arrived")};
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
            std::fprintf(
                stdout, "no_hang[reinit_after_timeout] rank 0/%d: %s %s\n", 4,
                skipped.status.code() == skipped.expected ? "PASS" : "FAIL",
                skipped.status.ToString().c_str());
            std::fflush(stdout);
            absl::SleepFor(absl::Seconds(120));  // past the driver's limit
            _exit(0);
          }
          return DeadlineThenRefused(
              "reinit_after_timeout", rank,
              Init({2, 2}, {"DP", "TP"}, t).status(), "rank 0 never arrived",
              [t] {
                return Init({2, 2}, {"DP", "TP"}, t).status();
              },
              absl::ZeroDuration());
        },
        /*lazy_mpi=*/false, /*returns_after_deadline=*/true,
        // After the others' deadline and their report grace.
        /*returns_after=*/absl::Seconds(3) + absl::Seconds(5)}},
      // Issue 17: a re-init after a timeout, then the late rank comes. Rank
      // 1 arrives after the others' deadline and after their re-init: they
      // name it as missing (rank 0 collects the reports, rank 1 is the
      // missing collector), their re-init is refused naming that deadline,
      // and when rank 1 comes it times out too and is refused the same way;
      // every rank returns from main normally (no MPI_Finalize, no crash in
      // MPI_Comm_dup).
      {"late_rank_after_reinit",
       {false,
        [](int rank, absl::Duration t) {
          absl::Duration slept = absl::ZeroDuration();
          if (rank == 1) {
            slept = t + kLateBy;
            absl::SleepFor(slept);
          }
          const absl::Status first = Init({2, 2}, {"DP", "TP"}, t).status();
          return DeadlineThenRefused(
              "late_rank_after_reinit", rank, first,
              rank == 1 ? "" : "rank 1 never arrived (the ranks that did: ",
              [t] {
                return Init({2, 2}, {"DP", "TP"}, t).status();
              },
              slept);
        },
        /*lazy_mpi=*/false, /*returns_after_deadline=*/true,
        /*returns_after=*/absl::Seconds(3) * 3 + kLateBy + absl::Seconds(6)}},
      // The same after a first mesh was made, so the deadline falls in the
      // bootstrap's own all-gather (MPI_Iallgather on its private
      // communicator): the ranks that came name the missing last rank, and
      // both a re-init and a flatten of the first mesh are refused. The last
      // rank comes after that and fails alike.
      {"missing_after_init",
       {false,
        [](int rank, absl::Duration t) {
          int size = 0;
          MPI_Comm_size(MPI_COMM_WORLD, &size);
          auto mesh = Init({2, 2}, {"DP", "TP"}, t);
          if (!mesh.ok()) return Outcome{mesh.status(), StatusCode::kOk};
          absl::Duration slept = absl::ZeroDuration();
          if (rank == size - 1) {
            slept = t + kLateBy;
            absl::SleepFor(slept);
          }
          const absl::Status first = Init({4}, {"DP"}, t).status();
          const DeviceMesh kept = *mesh;
          return DeadlineThenRefused(
              "missing_after_init", rank, first,
              rank == size - 1
                  ? ""
                  : absl::StrCat("rank ", size - 1,
                                 " never arrived (the ranks that did: "),
              [t, kept] {
                absl::Status again = Init({4}, {"DP"}, t).status();
                if (!absl::IsFailedPrecondition(again)) return again;
                return kept.flatten({"DP", "TP"}).status();
              },
              slept);
        },
        /*lazy_mpi=*/false, /*returns_after_deadline=*/true,
        /*returns_after=*/absl::Seconds(3) * 3 + kLateBy + absl::Seconds(6)}},
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
  const bool says = outcome.must_say.empty() ||
                    outcome.status.message().find(outcome.must_say) !=
                        absl::string_view::npos;
  const bool pass = !outcome.status.ok() &&
                    outcome.status.code() == outcome.expected && says &&
                    bounded;
  std::fprintf(stdout, "no_hang[%s] rank %d/%d: %s %s (after %.2f s)\n",
               name.c_str(), rank, size, pass ? "PASS" : "FAIL",
               outcome.status.ToString().c_str(), absl::ToDoubleSeconds(took));
  if (!pass) {
    std::fprintf(
        stdout, "no_hang[%s] rank %d: expected %s saying '%s' within %.1f s\n",
        name.c_str(), rank, absl::StatusCodeToString(outcome.expected).c_str(),
        outcome.must_say.c_str(),
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
    const absl::Time end =
        start + (scenario.returns_after > absl::ZeroDuration()
                     ? scenario.returns_after
                     : timeout + absl::Seconds(2));
    if (absl::Now() < end) absl::SleepFor(end - absl::Now());
  }
  VESCALE_DEVICE_MESH.reset();
  return 0;
}
