// bench/store_rendezvous.cc
//
// The env:// control plane under load: one TcpStoreServer on 127.0.0.1 and
// --clients client threads, each with its own TcpStore connection (as each
// rank of a job has), against the same patterns on a MemoryStore shared by
// the same threads, the in-process floor, in the same process:
//
//   all-gather       every client sets its key, then wait_get of all keys
//                    (the N^2 pattern: each reply carries N values)
//   rank 0 combines  every client sets its key; client 0 wait_gets them all
//                    and sets one combined value; the others wait_get that
//                    (the O(N) pattern)
//
// then one client's round trips (set, get, add in a loop), TcpStore vs
// MemoryStore, each op's time and the ratio; then (--auth) the rendezvous
// of an env:// job, connect + rank 0 combines, with the store's token
// (VEMESH_STORE_TOKEN: a HELLO/AUTH HMAC handshake per connection) against
// without it (HELLO with the rank claim only), alternated, in one run;
// then (--rank_key_runs) the bootstrap's round as StoreBootstrap makes it
// (each rank sets <job>/ag/R/<rank>, rank 0 gathers and sets the verdict,
// every rank reads it and sets its ack <job>/ag/R/ack/<rank>, rank 0 waits
// for the acks), token on, with the server's per-rank key rule
// (rank_key_patterns, issue 44) on against off, alternated.
//
//   build/bench/store_rendezvous                       # 1024 clients
//   build/bench/store_rendezvous --clients=16 --round_trips=200 --reps=1
//
// Repetitions use fresh keys; the table gives medians. Each client holds one
// socket and the server one per client, so the soft RLIMIT_NOFILE is raised
// to the hard one first.

#include <sys/resource.h>

#include <algorithm>
#include <barrier>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "vemesh/rendezvous/memory_store.h"
#include "vemesh/rendezvous/store.h"
#include "vemesh/rendezvous/tcp/tcp_store.h"
#include "vemesh/rendezvous/tcp/tcp_store_server.h"

ABSL_FLAG(int, clients, 1024, "client threads, one TcpStore connection each");
ABSL_FLAG(int, reps, 5, "repetitions of each rendezvous pattern (median)");
ABSL_FLAG(int, round_trips, 20000,
          "iterations of each op in the round-trip loop");
ABSL_FLAG(int, value_bytes, 64, "bytes each client sets in a rendezvous");
ABSL_FLAG(int, rank_key_runs, 5,
          "bootstrap rounds with the per-rank key rule on and off, "
          "alternated (0: skip)");
ABSL_FLAG(int, auth_runs, 3,
          "rendezvous runs with the token and without it, alternated "
          "(0: skip)");

namespace vemesh::bench {
namespace {

constexpr absl::Duration kDeadline = absl::Minutes(2);

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "store_rendezvous: %s\n", what.c_str());
  std::exit(1);
}

void Check(const absl::Status& status, absl::string_view what) {
  if (!status.ok()) Die(absl::StrCat(what, ": ", status.ToString()));
}

// Each client needs a descriptor and the server another.
void RaiseFdLimit(int clients) {
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0) return;
  limit.rlim_cur = limit.rlim_max;
  ::setrlimit(RLIMIT_NOFILE, &limit);
  ::getrlimit(RLIMIT_NOFILE, &limit);
  const rlim_t needed = 2 * static_cast<rlim_t>(clients) + 64;
  if (limit.rlim_cur < needed) {
    Die(absl::StrCat(clients, " clients need about ", needed,
                     " descriptors; RLIMIT_NOFILE allows ", limit.rlim_cur,
                     ": raise it (ulimit -n) or pass fewer --clients"));
  }
}

std::vector<std::string> Keys(absl::string_view prefix, int n) {
  std::vector<std::string> keys;
  keys.reserve(n);
  for (int i = 0; i < n; ++i) keys.push_back(absl::StrCat(prefix, i));
  return keys;
}

// One repetition of both patterns by client `rank`, timed by the caller's
// barriers.
void AllGather(Store& store, int rank, int n, absl::string_view tag,
               const std::string& value) {
  const std::vector<std::string> keys = Keys(absl::StrCat(tag, "/ag/"), n);
  Check(store.set(keys[rank], value), "set");
  absl::StatusOr<std::vector<std::string>> all =
      store.wait_get(keys, absl::Now() + kDeadline);
  Check(all.status(), "all-gather wait_get");
  if (all->size() != static_cast<size_t>(n)) Die("all-gather: wrong count");
}

void RankZeroCombines(Store& store, int rank, int n, absl::string_view tag,
                      const std::string& value) {
  const std::vector<std::string> keys = Keys(absl::StrCat(tag, "/c/"), n);
  const std::string combined_key = absl::StrCat(tag, "/combined");
  Check(store.set(keys[rank], value), "set");
  if (rank == 0) {
    absl::StatusOr<std::vector<std::string>> all =
        store.wait_get(keys, absl::Now() + kDeadline);
    Check(all.status(), "rank 0 wait_get");
    std::string combined;
    for (const std::string& v : *all) combined += v;
    Check(store.set(combined_key, combined), "set combined");
  } else {
    absl::StatusOr<std::vector<std::string>> got =
        store.wait_get({combined_key}, absl::Now() + kDeadline);
    Check(got.status(), "wait_get combined");
  }
}

struct PatternTimes {
  std::vector<double> all_gather_ms;
  std::vector<double> combine_ms;
};

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Runs both patterns `reps` times with `n` threads; client(rank) gives the
// store each thread uses. Returns the times of each repetition.
template <typename ClientFn>
PatternTimes RunPatterns(int n, int reps, const std::string& value,
                         ClientFn client, double* connect_ms) {
  PatternTimes times;
  absl::Time mark = absl::Now();
  const absl::Time start = mark;
  int phase = 0;  // 0: connecting; then alternating patterns
  auto on_barrier = [&]() noexcept {
    const absl::Time now = absl::Now();
    const double ms = absl::ToDoubleMilliseconds(now - mark);
    if (phase == 0) {
      if (connect_ms != nullptr)
        *connect_ms = absl::ToDoubleMilliseconds(now - start);
    } else if (phase % 2 == 1) {
      times.all_gather_ms.push_back(ms);
    } else {
      times.combine_ms.push_back(ms);
    }
    ++phase;
    mark = absl::Now();
  };
  std::barrier sync(n, on_barrier);
  std::vector<std::thread> threads;
  threads.reserve(n);
  for (int rank = 0; rank < n; ++rank) {
    threads.emplace_back([&, rank] {
      std::shared_ptr<Store> store = client(rank);
      sync.arrive_and_wait();
      for (int r = 0; r < reps; ++r) {
        const std::string tag = absl::StrCat("rep", r);
        AllGather(*store, rank, n, tag, value);
        sync.arrive_and_wait();
        RankZeroCombines(*store, rank, n, tag, value);
        sync.arrive_and_wait();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  return times;
}

struct OpTimes {
  double set_us = 0, get_us = 0, add_us = 0;
};

OpTimes RoundTrips(Store& store, int iterations) {
  const std::string value(16, 'v');
  OpTimes t;
  absl::Time start = absl::Now();
  for (int i = 0; i < iterations; ++i) Check(store.set("rt/key", value), "set");
  t.set_us = absl::ToDoubleMicroseconds(absl::Now() - start) / iterations;
  start = absl::Now();
  for (int i = 0; i < iterations; ++i)
    Check(store.get("rt/key").status(), "get");
  t.get_us = absl::ToDoubleMicroseconds(absl::Now() - start) / iterations;
  start = absl::Now();
  for (int i = 0; i < iterations; ++i)
    Check(store.add("rt/n", 1).status(), "add");
  t.add_us = absl::ToDoubleMicroseconds(absl::Now() - start) / iterations;
  return t;
}

void AuthRuns(int n, int auth_runs, const std::string& value) {
  // Each run: a fresh server, every client connects (with its handshake)
  // and one rank-0-combines round; the time of both together.
  auto rendezvous = [&](const std::string& token, bool claim) {
    TcpStoreServerOptions server_options;
    server_options.token = token;
    auto auth_server = TcpStoreServer::Start("127.0.0.1", 0, server_options);
    Check(auth_server.status(), "start server");
    const int auth_port = (*auth_server)->port();
    double connect = 0;
    const PatternTimes t = RunPatterns(
        n, 1, value,
        [&](int rank) -> std::shared_ptr<Store> {
          TcpStoreOptions options;
          options.token = token;
          options.rank = claim ? rank : -1;
          auto store = TcpStore::Connect("127.0.0.1", auth_port,
                                         absl::Now() + kDeadline, options);
          Check(store.status(), "connect");
          return std::shared_ptr<Store>(*std::move(store));
        },
        &connect);
    return std::make_pair(connect, t.combine_ms.at(0));
  };
  std::vector<double> off_total, on_total, off_connect, on_connect;
  std::vector<double> bare_total, bare_connect;
  for (int r = 0; r < auth_runs; ++r) {
    for (bool on : {false, true}) {
      const auto [connect, combine] = rendezvous(on ? "bench-token-29" : "",
                                                 /*claim=*/true);
      (on ? on_total : off_total).push_back(connect + combine);
      (on ? on_connect : off_connect).push_back(connect);
    }
    const auto [connect, combine] = rendezvous("", /*claim=*/false);
    bare_total.push_back(connect + combine);
    bare_connect.push_back(connect);
  }
  const double off = Median(off_total), on = Median(on_total);
  std::printf(
      "\nrendezvous with the store token (HMAC handshake) vs without: %d "
      "clients, connect + rank 0 combines, median of %d runs each, "
      "alternated\n",
      n, auth_runs);
  std::printf("  %-28s %12s %12s\n", "", "connect ms", "total ms");
  std::printf("  %-28s %12.2f %12.2f\n", "no handshake (a bare client)",
              Median(bare_connect), Median(bare_total));
  std::printf("  %-28s %12.2f %12.2f\n", "no token (rank claim only)",
              Median(off_connect), off);
  std::printf("  %-28s %12.2f %12.2f\n", "token (HELLO + AUTH)",
              Median(on_connect), on);
  std::printf("  %-28s %25.1f %%\n", "token overhead",
              off > 0 ? 100.0 * (on - off) / off : 0.0);
}

// One bootstrap round R by `rank`, as StoreBootstrap::Round does it.
void BootstrapRound(Store& store, int rank, int n, int round,
                    const std::string& value) {
  const std::string prefix = absl::StrCat("job/ag/", round);
  const std::string verdict = absl::StrCat(prefix, "/verdict");
  Check(store.set(absl::StrCat(prefix, "/", rank), value), "set contribution");
  if (rank == 0) {
    const std::vector<std::string> keys = Keys(absl::StrCat(prefix, "/"), n);
    auto all = store.wait_get(keys, absl::Now() + kDeadline);
    Check(all.status(), "rank 0 wait_get");
    std::string combined;
    for (const std::string& v : *all) combined += v;
    Check(store.set(verdict, combined), "set verdict");
    std::vector<std::string> acks;
    for (int r = 1; r < n; ++r)
      acks.push_back(absl::StrCat(prefix, "/ack/", r));
    Check(store.wait(acks, absl::Now() + kDeadline), "wait acks");
  } else {
    Check(store.wait_get({verdict}, absl::Now() + kDeadline).status(),
          "wait_get verdict");
    Check(store.set(absl::StrCat(prefix, "/ack/", rank), ""), "set ack");
  }
}

// Fresh server per run; every client connects with the token and its rank
// claim, then `rounds` bootstrap rounds; the rounds' time (connect apart).
double RankKeyRun(int n, bool rule, int rounds, const std::string& value) {
  TcpStoreServerOptions server_options;
  server_options.token = "bench-token-44";
  if (rule) {
    server_options.rank_key_patterns = {"job/ag/*/{rank}",
                                        "job/ag/*/ack/{rank}"};
  }
  auto server = TcpStoreServer::Start("127.0.0.1", 0, server_options);
  Check(server.status(), "start server");
  const int port = (*server)->port();
  absl::Time mark;
  double rounds_ms = 0;
  int phase = 0;
  auto on_barrier = [&]() noexcept {
    if (phase == 0) mark = absl::Now();  // connected: the rounds start
    if (phase == 1) rounds_ms = absl::ToDoubleMilliseconds(absl::Now() - mark);
    ++phase;
  };
  std::barrier sync(n, on_barrier);
  std::vector<std::thread> threads;
  threads.reserve(n);
  for (int rank = 0; rank < n; ++rank) {
    threads.emplace_back([&, rank] {
      TcpStoreOptions options;
      options.token = "bench-token-44";
      options.rank = rank;
      auto store = TcpStore::Connect("127.0.0.1", port, absl::Now() + kDeadline,
                                     options);
      Check(store.status(), "connect");
      sync.arrive_and_wait();
      for (int r = 0; r < rounds; ++r) {
        BootstrapRound(**store, rank, n, r, value);
      }
      sync.arrive_and_wait();
    });
  }
  for (std::thread& t : threads) t.join();
  return rounds_ms / rounds;
}

void RankKeyRuns(int n, int runs, const std::string& value) {
  constexpr int kRounds = 3;
  std::vector<double> on, off, ratio;
  for (int r = 0; r < runs; ++r) {
    // Alternate which goes first, so that neither always runs colder.
    const bool first = r % 2 == 0;
    const double a = RankKeyRun(n, first, kRounds, value);
    const double b = RankKeyRun(n, !first, kRounds, value);
    const double with = first ? a : b, without = first ? b : a;
    on.push_back(with);
    off.push_back(without);
    ratio.push_back(without > 0 ? with / without : 0.0);
  }
  auto spread = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return absl::StrFormat("%.3f..%.3f", v.front(), v.back());
  };
  std::printf(
      "\nbootstrap round with the per-rank key rule on vs off: %d clients, "
      "token on, %d rounds per run, ms per round, median (min..max) of %d "
      "runs each, alternated\n",
      n, kRounds, runs);
  std::printf("  %-26s %10s  %s\n", "", "median", "min..max");
  std::printf("  %-26s %10.2f  %s\n", "rule off", Median(off),
              spread(off).c_str());
  std::printf("  %-26s %10.2f  %s\n", "rule on (rank_key_patterns)", Median(on),
              spread(on).c_str());
  std::printf("  %-26s %10.3f  %s\n", "ratio on/off (per run)", Median(ratio),
              spread(ratio).c_str());
}

int Main() {
  const int n = std::max(1, absl::GetFlag(FLAGS_clients));
  const int reps = std::max(1, absl::GetFlag(FLAGS_reps));
  const int iterations = std::max(1, absl::GetFlag(FLAGS_round_trips));
  const std::string value(std::max(0, absl::GetFlag(FLAGS_value_bytes)), 'x');
  RaiseFdLimit(n);

  absl::StatusOr<std::unique_ptr<TcpStoreServer>> server =
      TcpStoreServer::Start("127.0.0.1", 0);
  Check(server.status(), "start server");
  const int port = (*server)->port();

  double connect_ms = 0;
  const PatternTimes tcp = RunPatterns(
      n, reps, value,
      [port](int) -> std::shared_ptr<Store> {
        auto store =
            TcpStore::Connect("127.0.0.1", port, absl::Now() + kDeadline);
        Check(store.status(), "connect");
        return std::shared_ptr<Store>(*std::move(store));
      },
      &connect_ms);
  auto memory = std::make_shared<MemoryStore>();
  const PatternTimes mem = RunPatterns(
      n, reps, value, [&](int) -> std::shared_ptr<Store> { return memory; },
      nullptr);

  absl::StatusOr<std::unique_ptr<TcpStore>> one =
      TcpStore::Connect("127.0.0.1", port, absl::Now() + kDeadline);
  Check(one.status(), "connect");
  MemoryStore floor_store;
  // Alternate, so that neither always runs on a colder machine.
  OpTimes tcp_ops = RoundTrips(**one, iterations);
  OpTimes mem_ops = RoundTrips(floor_store, iterations);
  const OpTimes tcp_ops2 = RoundTrips(**one, iterations);
  const OpTimes mem_ops2 = RoundTrips(floor_store, iterations);
  tcp_ops = {std::min(tcp_ops.set_us, tcp_ops2.set_us),
             std::min(tcp_ops.get_us, tcp_ops2.get_us),
             std::min(tcp_ops.add_us, tcp_ops2.add_us)};
  mem_ops = {std::min(mem_ops.set_us, mem_ops2.set_us),
             std::min(mem_ops.get_us, mem_ops2.get_us),
             std::min(mem_ops.add_us, mem_ops2.add_us)};

  std::printf(
      "store rendezvous: %d clients (threads), one TcpStoreServer thread, "
      "127.0.0.1, %d-byte values, median of %d\n",
      n, static_cast<int>(value.size()), reps);
  std::printf("  %-34s %12s %14s %8s\n", "pattern", "TcpStore ms",
              "MemoryStore ms", "ratio");
  std::printf("  %-34s %12.2f %14s %8s\n", "connect all clients", connect_ms,
              "-", "-");
  const double tag = Median(tcp.all_gather_ms), mag = Median(mem.all_gather_ms);
  const double tc = Median(tcp.combine_ms), mc = Median(mem.combine_ms);
  std::printf("  %-34s %12.2f %14.2f %8.1f\n",
              "all-gather (set + wait_get all)", tag, mag,
              mag > 0 ? tag / mag : 0.0);
  std::printf("  %-34s %12.2f %14.2f %8.1f\n", "rank 0 combines", tc, mc,
              mc > 0 ? tc / mc : 0.0);
  std::printf("\nround trips: one client, %d of each op, best of 2\n",
              iterations);
  std::printf("  %-6s %12s %12s %14s %8s\n", "op", "TcpStore us", "ops/s",
              "MemoryStore us", "ratio");
  auto row = [](const char* op, double tcp_us, double mem_us) {
    std::printf("  %-6s %12.2f %12.0f %14.3f %8.0f\n", op, tcp_us,
                tcp_us > 0 ? 1e6 / tcp_us : 0.0, mem_us,
                mem_us > 0 ? tcp_us / mem_us : 0.0);
  };
  row("set", tcp_ops.set_us, mem_ops.set_us);
  row("get", tcp_ops.get_us, mem_ops.get_us);
  row("add", tcp_ops.add_us, mem_ops.add_us);

  const int auth_runs = absl::GetFlag(FLAGS_auth_runs);
  if (auth_runs > 0) AuthRuns(n, auth_runs, value);
  const int rank_key_runs = absl::GetFlag(FLAGS_rank_key_runs);
  if (rank_key_runs > 0) RankKeyRuns(n, rank_key_runs, value);
  return 0;
}

}  // namespace
}  // namespace vemesh::bench

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return vemesh::bench::Main();
}
