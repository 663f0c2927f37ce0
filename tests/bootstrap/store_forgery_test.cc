// A rogue local client of rank 0's store (issue 29): it reads rank 0's key
// and writes the round's verdict first, with made-up values for every rank.
// Without a token the server keeps verdict keys to rank 0's own connection
// (a forged OK verdict is refused; only an error one is open to all); with
// VEMESH_STORE_TOKEN the rogue is not served at all. Either way the ranks
// gather their own values, never the forged ones. Loopback only, bounded.

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "vemesh/bootstrap/rank0_store.h"
#include "vemesh/rendezvous/tcp/tcp_store.h"
#include "vemesh/rendezvous/tcp/tcp_store_server.h"

namespace vemesh {
namespace {

using ::testing::ElementsAre;

constexpr char kPrefix[] = "vemesh";

// A verdict in StoreBootstrap's format: 'O', the count, each value.
std::string OkVerdict(const std::vector<std::string>& values) {
  std::string out = "O";
  const uint64_t count = values.size();
  out.append(reinterpret_cast<const char*>(&count), sizeof(count));
  for (const std::string& v : values) {
    const uint64_t n = v.size();
    out.append(reinterpret_cast<const char*>(&n), sizeof(n));
    out.append(v);
  }
  return out;
}

int FreePort() {
  auto server = TcpStoreServer::Start("127.0.0.1", 0);
  return server.ok() ? (*server)->port() : 0;
}

struct Outcome {
  absl::Status status;
  std::vector<std::string> values;
};

// Ranks 0 and 1 gather "host-<rank>"; rank 1 starts only once the rogue
// has tried its forgery. Returns what each rank gathered and the status of
// the rogue's write.
void RunWithRogue(const std::string& token, Outcome out[2],
                  absl::Status* forgery) {
  const int port = FreePort();
  ASSERT_NE(port, 0);
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  std::atomic<bool> forged{false};
  auto rank = [&](int r) {
    if (r == 1) {
      while (!forged.load()) absl::SleepFor(absl::Milliseconds(5));
    }
    Rank0StoreSpec spec;
    spec.rank = r;
    spec.size = 2;
    spec.bind = "127.0.0.1";
    spec.host = "127.0.0.1";
    spec.port = port;
    spec.prefix = kPrefix;
    spec.context = "forgery test";
    spec.token = token;
    auto store = StartRank0Store(spec, deadline);
    if (!store.ok()) {
      out[r].status = store.status();
      forged = true;
      return;
    }
    auto values =
        store->bootstrap->all_gather(absl::StrCat("host-", r), deadline);
    out[r].status = values.status();
    if (values.ok()) out[r].values = *values;
    // Rank 0 keeps its store until rank 1 is done.
    if (r == 0) absl::SleepFor(absl::Milliseconds(300));
  };
  std::thread zero(rank, 0), one(rank, 1);
  // The rogue: no token; it waits for rank 0's value, then writes the
  // verdict of round 0 before rank 1 has even started.
  TcpStoreOptions rogue_options;
  rogue_options.timeout = absl::Seconds(5);
  auto rogue = TcpStore::Connect("127.0.0.1", port, deadline, rogue_options);
  if (rogue.ok()) {
    const std::string round = absl::StrCat(kPrefix, "/ag/0");
    absl::Status seen = (*rogue)->wait({absl::StrCat(round, "/0")},
                                       absl::Now() + absl::Seconds(5));
    *forgery = seen.ok()
                   ? (*rogue)
                         ->compare_set(absl::StrCat(round, "/verdict"), "",
                                       OkVerdict({"forged-0", "forged-1"}))
                         .status()
                   : seen;
  } else {
    *forgery = rogue.status();
  }
  forged = true;
  zero.join();
  one.join();
}

TEST(StoreForgery, AForgedVerdictIsRefusedWithoutAToken) {
  Outcome out[2];
  absl::Status forgery;
  RunWithRogue("", out, &forgery);
  EXPECT_EQ(forgery.code(), absl::StatusCode::kPermissionDenied) << forgery;
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(out[r].status.ok()) << "rank " << r << ": " << out[r].status;
    EXPECT_THAT(out[r].values, ElementsAre("host-0", "host-1")) << "rank " << r;
  }
}

TEST(StoreForgery, ARogueWithoutTheTokenIsNotServed) {
  Outcome out[2];
  absl::Status forgery;
  RunWithRogue("job-secret", out, &forgery);
  EXPECT_EQ(forgery.code(), absl::StatusCode::kUnauthenticated) << forgery;
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(out[r].status.ok()) << "rank " << r << ": " << out[r].status;
    EXPECT_THAT(out[r].values, ElementsAre("host-0", "host-1")) << "rank " << r;
  }
}

}  // namespace
}  // namespace vemesh
