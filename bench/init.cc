// bench/init.cc
//
// Time to have every per-dimension communicator of a mesh ready, four ways,
// alternated in one mpirun job:
//
//   vemesh      VESCALE_DEVICE_MESH.init_device_mesh("cpu", shape, names)
//   split       the floor: one MPI_Comm_split per dimension, by hand
//   cart        MPI's topology route: MPI_Cart_create, MPI_Cart_sub per dim
//   every-group the pattern of PyTorch new_group, Megatron and veScale: every
//               rank takes part in creating every sub-group of every
//               dimension (MPI_Comm_create once per sub-group)
//
//   mpirun --oversubscribe -n 16 build/bench/init --reps=21
//   mpirun ... -n 8 build/bench/init --shapes=2x4,2x2x2 --reps=21
//
// Repetition r runs the four methods in an order rotated by r, so that none
// always goes first (or last) after the barrier. A sample is the slowest
// rank's time; the table gives medians over the repetitions, the ratio of
// each median to the floor's, and the collective MPI calls one rank made
// (counted through the MPI profiling interface, bench/call_count.h). The
// communicators are freed after each sample, outside the timing.
//
//   mpirun ... -n 8 build/bench/init --shapes=2x2x2 --counts
// prints instead, per rank, what one vemesh creation used: collective MPI
// calls by kind, sockets held (/proc/self/fd) and store operations (none
// under MPI), for bench/cost_model.py --worlds to be compared with.

#include <dirent.h>
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "bench/call_count.h"
#include "bench/mpi_bench.h"
#include "vemesh/registry/ve_device_mesh.h"

ABSL_FLAG(int, reps, 21, "timed repetitions of every method (alternated)");
ABSL_FLAG(int, warmup, 2, "untimed repetitions first (connections, caches)");
ABSL_FLAG(std::vector<std::string>, shapes, {},
          "mesh shapes, e.g. 2x4,2x2x2; default: a 2-D and a 3-D mesh of "
          "the world");
ABSL_FLAG(bool, counts, false,
          "print what one vemesh creation uses per rank (calls, sockets, "
          "store operations) instead of timing");
ABSL_FLAG(bool, calls, false,
          "also print, for vemesh and its calls by hand, every MPI call per "
          "creation (local calls and waits included) and the time in each, "
          "averaged over ranks and repetitions");
ABSL_FLAG(bool, smoke, false,
          "one repetition, no warm-up: proves the program works (ctest)");

namespace vemesh::bench {
namespace {

// What a method made, to be freed once the sample is taken.
struct Made {
  std::vector<MPI_Comm> comms;
  bool registry = false;
  // World ranks of this rank's group along each dimension (checks).
  std::vector<std::vector<int>> members;
};

struct Method {
  const char* name;
  std::function<Made(const HandMesh&)> make;
};

int WorldRank() {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

Made ByVemesh(const HandMesh& hand) {
  auto mesh = VESCALE_DEVICE_MESH.init_device_mesh(
      "cpu", hand.shape, RoleNames(hand.shape.size()));
  if (!mesh.ok())
    Die(absl::StrCat("init_device_mesh: ", mesh.status().ToString()));
  Made made;
  made.registry = true;
  return made;
}

Made BySplit(const HandMesh& hand) {
  const int rank = WorldRank();
  Made made;
  for (size_t d = 0; d < hand.shape.size(); ++d) {
    MPI_Comm comm;
    MPI_Comm_split(MPI_COMM_WORLD, hand.color(rank, d), hand.key(rank, d),
                   &comm);
    made.comms.push_back(comm);
  }
  return made;
}

Made ByCart(const HandMesh& hand) {
  const int ndim = static_cast<int>(hand.shape.size());
  std::vector<int> dims(hand.shape.begin(), hand.shape.end());
  std::vector<int> periods(ndim, 0);
  Made made;
  MPI_Comm cart;
  MPI_Cart_create(MPI_COMM_WORLD, ndim, dims.data(), periods.data(),
                  /*reorder=*/0, &cart);
  for (int d = 0; d < ndim; ++d) {
    std::vector<int> remain(ndim, 0);
    remain[d] = 1;
    MPI_Comm sub;
    MPI_Cart_sub(cart, remain.data(), &sub);
    made.comms.push_back(sub);
  }
  made.comms.push_back(cart);  // freed too, after the sub-communicators
  return made;
}

// Waits as vemesh's bootstrap does (WaitForMpiRequest in
// vemesh/bootstrap/mpi/mpi_bootstrap.cc): test back to back for the first
// 100 ms, then test and sleep 20 us, doubling up to 1 ms (a sleeping rank
// does not drive MPI's progress).
void WaitPolling(MPI_Request* request) {
  const auto spin_until =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(100);
  auto pause = std::chrono::microseconds(20);
  for (int done = 0;;) {
    MPI_Test(request, &done, MPI_STATUS_IGNORE);
    if (done) return;
    if (std::chrono::steady_clock::now() < spin_until) continue;
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(1000));
  }
}

// Not baselines: diagnostics that split vemesh's cost over the floor into
// the extra collectives, the polling and the rest (vemesh's own work).
//
// "vemesh's MPI calls by hand": the calls an init makes since issue 32, in
// its order: the agreement all-gather (fingerprint + host identity, one
// 256-byte block per rank), the private world as MPI_Comm_idup (which is
// also the gather's outcome step), one MPI_Comm_create_group of it per
// dimension (collective over the group only). Waited on plainly (MPI_Wait),
// then as vemesh waits (MPI_Test back to back, then sleeps). "Issue 18's
// calls" are the same with one MPI_Comm_split of the world per dimension
// instead, which vemesh made until issue 32.
void Await(MPI_Request* request, bool poll) {
  if (poll) {
    WaitPolling(request);
  } else {
    MPI_Wait(request, MPI_STATUS_IGNORE);
  }
}

// The agreement all-gather and the world's idup, as vemesh makes them.
MPI_Comm GatherAndDup(bool poll) {
  int world_size = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  std::vector<char> block(256, 1);
  std::vector<char> blocks(256 * static_cast<size_t>(world_size));
  MPI_Request request;
  MPI_Iallgather(block.data(), 256, MPI_CHAR, blocks.data(), 256, MPI_CHAR,
                 MPI_COMM_WORLD, &request);
  Await(&request, poll);
  MPI_Comm world;
  MPI_Comm_idup(MPI_COMM_WORLD, &world, &request);
  Await(&request, poll);
  return world;
}

Made SameCalls(const HandMesh& hand, bool poll) {
  const int rank = WorldRank();
  Made made;
  MPI_Comm world = GatherAndDup(poll);
  for (size_t d = 0; d < hand.shape.size(); ++d) {
    MPI_Comm comm;
    MPI_Comm_split(world, hand.color(rank, d), hand.key(rank, d), &comm);
    made.comms.push_back(comm);
  }
  made.comms.push_back(world);
  return made;
}
Made BySplitCalls(const HandMesh& hand) { return SameCalls(hand, false); }

// The agreement and world, then each group by MPI_Comm_create_group, which
// is collective over the group only (every rank knows every group once the
// arguments agree), as MpiCommunicator::split_many makes a mesh's groups.
Made CreateGroupCalls(const HandMesh& hand, bool poll) {
  const int rank = WorldRank();
  Made made;
  MPI_Comm world = GatherAndDup(poll);
  MPI_Group all;
  MPI_Comm_group(world, &all);
  for (size_t d = 0; d < hand.shape.size(); ++d) {
    const std::vector<std::vector<int>> groups = hand.groups(d);
    const std::vector<int>& ranks =
        groups[static_cast<size_t>(hand.color(rank, d))];
    MPI_Group group;
    MPI_Group_incl(all, static_cast<int>(ranks.size()), ranks.data(), &group);
    MPI_Comm comm;
    MPI_Comm_create_group(world, group, static_cast<int>(d), &comm);
    MPI_Group_free(&group);
    made.comms.push_back(comm);
  }
  MPI_Group_free(&all);
  made.comms.push_back(world);
  return made;
}
Made BySameCalls(const HandMesh& hand) { return CreateGroupCalls(hand, false); }
Made BySameCallsPolling(const HandMesh& hand) {
  return CreateGroupCalls(hand, true);
}

// The frameworks' loop: for each dimension, for each of its groups, every
// rank builds the group's rank list and calls a creation that is collective
// over the whole world; a rank keeps the one group it belongs to.
Made ByEveryGroup(const HandMesh& hand) {
  MPI_Group world;
  MPI_Comm_group(MPI_COMM_WORLD, &world);
  Made made;
  for (size_t d = 0; d < hand.shape.size(); ++d) {
    MPI_Comm mine = MPI_COMM_NULL;
    for (const std::vector<int>& ranks : hand.groups(d)) {
      MPI_Group group;
      MPI_Group_incl(world, static_cast<int>(ranks.size()), ranks.data(),
                     &group);
      MPI_Comm comm;
      MPI_Comm_create(MPI_COMM_WORLD, group, &comm);
      MPI_Group_free(&group);
      if (comm != MPI_COMM_NULL) mine = comm;
    }
    made.comms.push_back(mine);
  }
  MPI_Group_free(&world);
  return made;
}

void Release(Made& made) {
  if (made.registry) VESCALE_DEVICE_MESH.reset();
  for (MPI_Comm& c : made.comms) {
    if (c != MPI_COMM_NULL) MPI_Comm_free(&c);
  }
}

// Every method must give each rank the same groups: check once, untimed.
void CheckSameGroups(const std::vector<Method>& methods, const HandMesh& hand) {
  std::vector<std::vector<int>> expected;
  for (size_t m = 0; m < methods.size(); ++m) {
    Made made = methods[m].make(hand);
    std::vector<std::vector<int>> got;
    if (made.registry) {
      auto mesh = VESCALE_DEVICE_MESH.get();
      if (!mesh.ok()) Die(absl::StrCat("registry: ", mesh.status().ToString()));
      for (size_t d = 0; d < hand.shape.size(); ++d) {
        auto group = mesh->get_group(static_cast<int64_t>(d));
        if (!group.ok())
          Die(absl::StrCat("get_group: ", group.status().ToString()));
        auto ranks = (*group)->ranks();
        got.emplace_back(ranks.begin(), ranks.end());
      }
    } else {
      for (size_t d = 0; d < hand.shape.size(); ++d) {
        got.push_back(WorldRanksOf(made.comms[d]));
      }
    }
    Release(made);
    if (m == 0) {
      expected = got;
    } else if (got != expected) {
      Die(absl::StrCat(methods[m].name, " made other groups than ",
                       methods[0].name, " for mesh ", ShapeText(hand.shape)));
    }
  }
}

struct Result {
  std::vector<double> seconds;
  CallCounts calls;  // one repetition's, on this rank
  CallCounts all;    // every MPI call, summed over the timed repetitions
  double own = 0;    // this rank's own time, summed likewise
  std::vector<double> outside;  // per repetition: own time outside MPI
};

// --calls: per creation, averaged over ranks and repetitions, each kind of
// MPI call (count and microseconds inside it) and the time outside MPI.
void PrintAllCalls(const std::vector<const char*>& names,
                   const std::vector<const Result*>& results, int reps) {
  int world = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  const size_t kinds = static_cast<size_t>(Call::kCount);
  std::vector<std::vector<double>> sums;
  for (const Result* r : results) {
    std::vector<double> mine(2 * kinds + 1);
    for (size_t k = 0; k < kinds; ++k) {
      mine[k] = static_cast<double>(r->all.n[k]);
      mine[kinds + k] = r->all.seconds[k];
    }
    mine[2 * kinds] = r->own;
    std::vector<double> sum(mine.size());
    MPI_Reduce(mine.data(), sum.data(), static_cast<int>(mine.size()),
               MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD);
    sums.push_back(sum);
  }
  if (WorldRank() != 0) return;
  const double per = 1.0 / (static_cast<double>(world) * reps);
  std::printf(
      "\nevery MPI call per creation (mean over ranks and %d reps): "
      "calls, us inside\n\n| call |",
      reps);
  for (const char* n : names) std::printf(" %s |", n);
  std::printf("\n|---|");
  for (size_t i = 0; i < names.size(); ++i) std::printf("---:|");
  std::printf("\n");
  for (size_t k = 0; k < kinds; ++k) {
    bool any = false;
    for (const auto& s : sums) any = any || s[k] != 0;
    if (!any) continue;
    std::printf("| %s |", CallName(k));
    for (const auto& s : sums) {
      std::printf(" %.2f, %.1f |", s[k] * per, s[kinds + k] * per * 1e6);
    }
    std::printf("\n");
  }
  std::printf("| whole creation, us |");
  for (const auto& s : sums) std::printf(" %.1f |", s[2 * kinds] * per * 1e6);
  std::printf("\n| outside MPI, us |");
  for (const auto& s : sums) {
    double in = 0;
    for (size_t k = 0; k < kinds; ++k) in += s[kinds + k];
    std::printf(" %.1f |", (s[2 * kinds] - in) * per * 1e6);
  }
  // Means carry the outliers of a shared machine; rank 0's median and
  // minimum over its repetitions read the code's own cost.
  std::printf("\n| outside MPI, rank 0: median / min, us |");
  for (const Result* r : results) {
    std::vector<double> v = r->outside;
    std::sort(v.begin(), v.end());
    std::printf(" %.1f / %.1f |", v.empty() ? 0 : v[v.size() / 2] * 1e6,
                v.empty() ? 0 : v[0] * 1e6);
  }
  std::printf("\n");
}

// Collective calls one rank makes to create every per-dimension group of a
// mesh, as a formula of the shape (what the table projects to big worlds).
int64_t EveryGroupCalls(const std::vector<int64_t>& shape) {
  int64_t world = 1;
  for (int64_t n : shape) world *= n;
  int64_t calls = 0;
  for (int64_t n : shape) calls += world / n;  // one creation per group
  return calls;
}

void RunShape(const std::vector<int64_t>& shape, int reps, int warmup) {
  const HandMesh hand(shape);
  int world = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  if (hand.size() != world) {
    Die(absl::StrCat("mesh ", ShapeText(shape), " has ", hand.size(),
                     " ranks but the world has ", world));
  }
  const std::vector<Method> methods = {
      {"split (floor)", BySplit},
      {"vemesh", ByVemesh},
      {"cart", ByCart},
      {"every-group", ByEveryGroup},
      {"vemesh's MPI calls by hand", BySameCalls},
      {"same, polled like vemesh", BySameCallsPolling},
      {"issue 18's calls by hand (a world split per dim)", BySplitCalls}};
  CheckSameGroups(methods, hand);

  std::vector<Result> results(methods.size());
  for (int r = 0; r < warmup + reps; ++r) {
    for (size_t i = 0; i < methods.size(); ++i) {
      const size_t m = (i + static_cast<size_t>(r)) % methods.size();
      MPI_Barrier(MPI_COMM_WORLD);
      const CallCounts before = CollectiveCalls();
      const CallCounts all_before = AllCalls();
      const double start = MPI_Wtime();
      Made made = methods[m].make(hand);
      const double took = MPI_Wtime() - start;
      const CallCounts used = CollectiveCalls() - before;
      const CallCounts all_used = AllCalls() - all_before;
      Release(made);
      const double slowest = MaxOverRanks(took);
      if (r >= warmup) {
        results[m].seconds.push_back(slowest);
        results[m].calls = used;
        for (size_t k = 0; k < all_used.n.size(); ++k) {
          results[m].all.n[k] += all_used.n[k];
          results[m].all.seconds[k] += all_used.seconds[k];
        }
        results[m].own += took;
        double inside = 0;
        for (double x : all_used.seconds) inside += x;
        results[m].outside.push_back(took - inside);
      }
    }
  }

  if (absl::GetFlag(FLAGS_calls)) {
    PrintAllCalls({methods[1].name, methods[4].name, methods[5].name},
                  {&results[1], &results[4], &results[5]}, reps);
  }
  if (WorldRank() != 0) return;
  const double floor = Median(results[0].seconds);
  std::printf("\nworld %d, mesh %s (%s), %d repetitions\n\n", world,
              ShapeText(shape).c_str(),
              absl::StrJoin(RoleNames(shape.size()), ",").c_str(), reps);
  std::printf(
      "| method | median ms | min ms | / floor | collective calls per rank "
      "|\n");
  std::printf("|---|---:|---:|---:|---|\n");
  for (size_t m = 0; m < methods.size(); ++m) {
    const double median = Median(results[m].seconds);
    std::printf("| %s | %.3f | %.3f | %.2f | %s |\n", methods[m].name,
                median * 1e3, Min(results[m].seconds) * 1e3,
                floor > 0 ? median / floor : 0,
                absl::StrCat(results[m].calls.total(), " (",
                             results[m].calls.ToString(), ")")
                    .c_str());
  }
  const double vemesh = Median(results[1].seconds);
  const double every = Median(results[3].seconds);
  std::printf(
      "\nevery-group / vemesh: %.2fx; every-group makes %lld "
      "world-collective creations per rank for this mesh\n",
      vemesh > 0 ? every / vemesh : 0,
      static_cast<long long>(EveryGroupCalls(shape)));
}

// Sockets this process holds now (entries of /proc/self/fd that are
// sockets); -1 where /proc cannot be read.
int SocketsHeld() {
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return -1;
  int sockets = 0;
  while (const dirent* entry = readdir(dir)) {
    char target[64] = {};
    const std::string path = absl::StrCat("/proc/self/fd/", entry->d_name);
    const ssize_t n = readlink(path.c_str(), target, sizeof(target) - 1);
    if (n > 0 && std::string(target, n).rfind("socket:", 0) == 0) ++sockets;
  }
  closedir(dir);
  return sockets;
}

// --counts: one vemesh creation (after one untimed, as in the timed runs),
// and what it used on each rank, printed by rank 0 as a table row per rank
// class (ranks that used the same are one row).
void PrintCounts(const std::vector<int64_t>& shape) {
  const HandMesh hand(shape);
  Made warm = ByVemesh(hand);
  Release(warm);
  const int sockets_before = SocketsHeld();
  const CallCounts before = CollectiveCalls();
  Made made = ByVemesh(hand);
  const CallCounts used = CollectiveCalls() - before;
  const int sockets = SocketsHeld();
  Release(made);
  // Every rank's line to rank 0 (fixed width: a small table, not data).
  char line[256] = {};
  std::snprintf(line, sizeof(line), "| %s | %lld | %s | %d (%+d) | 0 |",
                ShapeText(shape).c_str(), static_cast<long long>(used.total()),
                used.ToString().c_str(), sockets, sockets - sockets_before);
  int world = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  std::vector<char> all(sizeof(line) * static_cast<size_t>(world));
  MPI_Gather(line, sizeof(line), MPI_CHAR, all.data(), sizeof(line), MPI_CHAR,
             0, MPI_COMM_WORLD);
  if (WorldRank() != 0) return;
  std::printf(
      "\nworld %d: one vemesh creation, per rank (ranks with the same counts "
      "on one row)\n\n| ranks | mesh | collective calls | by kind | sockets "
      "held (change) | store operations |\n|---|---|---:|---|---:|---:|\n",
      world);
  std::vector<std::pair<std::string, std::vector<int>>> rows;
  for (int r = 0; r < world; ++r) {
    std::string text(all.data() + sizeof(line) * r);
    auto it = std::find_if(rows.begin(), rows.end(),
                           [&](const auto& row) { return row.first == text; });
    if (it == rows.end()) {
      rows.push_back({text, {r}});
    } else {
      it->second.push_back(r);
    }
  }
  for (const auto& [text, ranks] : rows) {
    std::printf("| %zu of %d %s\n", ranks.size(), world, text.c_str());
  }
}

std::vector<std::vector<int64_t>> DefaultShapes(int world) {
  switch (world) {
    case 4:
      return {{2, 2}, {1, 2, 2}};
    case 8:
      return {{2, 4}, {2, 2, 2}};
    case 16:
      return {{4, 4}, {2, 4, 2}};
    default:
      if (world % 2 == 0) return {{world / 2, 2}, {1, world / 2, 2}};
      return {{world, 1}, {1, world, 1}};
  }
}

}  // namespace
}  // namespace vemesh::bench

int main(int argc, char** argv) {
  using namespace vemesh::bench;
  // This program owns MPI; vemesh adopts it.
  MPI_Init(&argc, &argv);
  absl::ParseCommandLine(argc, argv);
  const bool smoke = absl::GetFlag(FLAGS_smoke);
  const int reps = smoke ? 1 : absl::GetFlag(FLAGS_reps);
  const int warmup = smoke ? 0 : absl::GetFlag(FLAGS_warmup);
  int world = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);

  std::vector<std::vector<int64_t>> shapes;
  for (const std::string& text : absl::GetFlag(FLAGS_shapes)) {
    auto shape = ParseShape(text);
    if (!shape.ok()) Die(std::string(shape.status().message()));
    shapes.push_back(*shape);
  }
  if (shapes.empty()) shapes = DefaultShapes(world);
  for (const auto& shape : shapes) {
    if (absl::GetFlag(FLAGS_counts)) {
      PrintCounts(shape);
    } else {
      RunShape(shape, reps, warmup);
    }
  }
  MPI_Finalize();
  return 0;
}
