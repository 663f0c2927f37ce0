// The quorum round's parts (issue 28): the liveness port tells a process
// that is gone from one that lives, and the round decides only once every
// member has posted or is gone.

#include "vemesh/elastic/internal/quorum_round.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "vemesh/elastic/internal/control_plane.h"
#include "vemesh/elastic/internal/epoch_gate.h"
#include "vemesh/elastic/internal/liveness_probe.h"
#include "vemesh/rendezvous/memory_store.h"

namespace vemesh {
namespace {

using ::testing::ElementsAre;

TEST(LivenessProbeTest, ListeningWhileTheListenerLivesGoneAfter) {
  auto l = LivenessListener::Start("127.0.0.1");
  ASSERT_TRUE(l.ok()) << l.status();
  const std::string where = (*l)->address();
  // More probes than the backlog (128): the listener drains them. They
  // come in batches of 100 with a pause between: probes back to back
  // outran the draining thread on 2 busy cores, and a full backlog made
  // the kernel refuse a probe (2-4% of runs).
  for (int i = 0; i < 300; ++i) {
    if (i > 0 && i % 100 == 0) absl::SleepFor(absl::Milliseconds(50));
    ASSERT_EQ(ProbeLiveness(where, absl::Milliseconds(200)),
              Liveness::kListening)
        << "probe " << i << " of " << where;
  }
  l->reset();
  EXPECT_EQ(ProbeLiveness(where, absl::Milliseconds(200)), Liveness::kGone);
}

// The port carries one short message to a live listener; a probe (which
// sends nothing) is no message, and a message past the bound is refused by
// the sender.
TEST(LivenessProbeTest, AMessageReachesTheListenersCallback) {
  std::mutex mu;
  std::vector<std::string> got;
  auto l = LivenessListener::Start("127.0.0.1", [&](absl::string_view text) {
    std::lock_guard<std::mutex> lock(mu);
    got.emplace_back(text);
  });
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(ProbeLiveness((*l)->address(), absl::Milliseconds(200)),
            Liveness::kListening);
  EXPECT_TRUE(
      SendToListener((*l)->address(), "abort 1f 3", absl::Milliseconds(200)));
  EXPECT_FALSE(SendToListener((*l)->address(),
                              std::string(kMaxListenerMessage + 1, 'x'),
                              absl::Milliseconds(200)));
  // Handled on the listener's thread: waited for, within a bound.
  const absl::Time until = absl::Now() + absl::Seconds(5);
  while (absl::Now() < until) {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (!got.empty()) break;
    }
    absl::SleepFor(absl::Milliseconds(5));
  }
  const std::string where = (*l)->address();
  l->reset();
  {
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_THAT(got, ElementsAre("abort 1f 3"));
  }
  EXPECT_FALSE(SendToListener(where, "abort 1f 3", absl::Milliseconds(200)));
}

TEST(LivenessProbeTest, BadAddressesAreUnknown) {
  EXPECT_EQ(ProbeLiveness("no-port", absl::Milliseconds(10)),
            Liveness::kUnknown);
  EXPECT_EQ(ProbeLiveness("127.0.0.1:99999", absl::Milliseconds(10)),
            Liveness::kUnknown);
  EXPECT_FALSE(LivenessListener::Start("not an address!").ok());
}

class QuorumRoundTest : public ::testing::Test {
 protected:
  QuorumRoundTest() : cp_(store_, "job", 1) {
    rec_.epoch = 4;
    rec_.members = {0, 1, 2};
    rec_.incarnations = {{0, 0xa}, {1, 0xb}, {2, 0xc}};
  }
  // Replica `id` listens and advertises its port.
  std::unique_ptr<LivenessListener> Listen(int id) {
    auto l = LivenessListener::Start("127.0.0.1");
    EXPECT_TRUE(l.ok()) << l.status();
    EXPECT_TRUE(
        store_->set(cp_.ProbeKey(id, rec_.incarnation_of(id)), (*l)->address())
            .ok());
    return *std::move(l);
  }
  std::shared_ptr<MemoryStore> store_ = std::make_shared<MemoryStore>();
  ControlPlane cp_;
  MembershipRecord rec_;
};

TEST_F(QuorumRoundTest, DecidesOnceEveryMemberPostedOrIsGone) {
  auto l2 = Listen(2);
  QuorumRound r0(cp_, rec_, 0, 0xa, absl::Milliseconds(50), {0xa, 0xb, 0xc});
  QuorumRound r1(cp_, rec_, 1, 0xb, absl::Milliseconds(50), {0xa, 0xb, 0xc});
  ASSERT_TRUE(r0.Post().ok());
  // Replica 1 has no port advertised and has not posted: silent.
  auto p = r0.Poll();
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_FALSE(p->has_value());
  ASSERT_TRUE(r1.Post().ok());
  // Replica 2 is silent but alive (stopped, slow): waited for.
  p = r0.Poll();
  ASSERT_TRUE(p.ok());
  EXPECT_FALSE(p->has_value());
  // Killed: its port refuses; the round is decided without it.
  l2.reset();
  absl::SleepFor(absl::Milliseconds(30));  // past the re-probe period
  p = r0.Poll();
  ASSERT_TRUE(p.ok());
  ASSERT_TRUE(p->has_value());
  EXPECT_THAT(**p, ElementsAre(0, 1));
  EXPECT_THAT(r0.gone(), ElementsAre(2));
}

TEST_F(QuorumRoundTest, ARefusedPortThatNeverAnsweredIsNotGone) {
  { auto l2 = Listen(2); }  // advertised, never seen answering, now closed
  QuorumRound r0(cp_, rec_, 0, 0xa, absl::Milliseconds(50), {0xb});
  ASSERT_TRUE(r0.Post().ok());
  QuorumRound r1(cp_, rec_, 1, 0xb, absl::Milliseconds(50), {});
  ASSERT_TRUE(r1.Post().ok());
  auto p = r0.Poll();
  ASSERT_TRUE(p.ok());
  EXPECT_FALSE(p->has_value());  // the lease decides for replica 2
}

TEST_F(QuorumRoundTest, EveryMemberPostedKeepsThemAll) {
  for (int id : {0, 1, 2}) {
    QuorumRound r(cp_, rec_, id, rec_.incarnation_of(id),
                  absl::Milliseconds(50), {0xa, 0xb, 0xc});
    ASSERT_TRUE(r.Post().ok());
  }
  QuorumRound r(cp_, rec_, 0, 0xa, absl::Milliseconds(50), {0xa, 0xb, 0xc});
  auto p = r.Poll();
  ASSERT_TRUE(p.ok());
  ASSERT_TRUE(p->has_value());
  EXPECT_THAT(**p, ElementsAre(0, 1, 2));
}

TEST_F(QuorumRoundTest, APostOfAnotherIncarnationDoesNotCount) {
  auto l1 = Listen(1);
  auto l2 = Listen(2);
  QuorumRound r0(cp_, rec_, 0, 0xa, absl::Milliseconds(50), {0xa, 0xb, 0xc});
  ASSERT_TRUE(r0.Post().ok());
  QuorumRound old1(cp_, rec_, 1, 0xbad, absl::Milliseconds(50),
                   {0xa, 0xb, 0xc});
  ASSERT_TRUE(old1.Post().ok());  // a relaunch of replica 1, not the member
  QuorumRound r2(cp_, rec_, 2, 0xc, absl::Milliseconds(50), {0xa, 0xb, 0xc});
  ASSERT_TRUE(r2.Post().ok());
  auto p = r0.Poll();
  ASSERT_TRUE(p.ok());
  EXPECT_FALSE(p->has_value());  // member 1 (0xb) is silent and listening
}

// A joiner killed as it was admitted: its port never answered this leader,
// but its host did (another replica's port there): its refusal is trusted.
TEST_F(QuorumRoundTest, ARefusedPortOnAHostThatAnsweredIsGone) {
  { auto l2 = Listen(2); }  // the joiner: advertised, then killed
  QuorumRound r0(cp_, rec_, 0, 0xa, absl::Milliseconds(50), {0xb},
                 {"127.0.0.1"});
  ASSERT_TRUE(r0.Post().ok());
  QuorumRound r1(cp_, rec_, 1, 0xb, absl::Milliseconds(50), {});
  ASSERT_TRUE(r1.Post().ok());
  auto p = r0.Poll();
  ASSERT_TRUE(p.ok());
  ASSERT_TRUE(p->has_value());
  EXPECT_THAT(**p, ElementsAre(0, 1));
  EXPECT_THAT(r0.gone(), ElementsAre(2));
}

// A port seen answering during the round is trusted when it refuses later.
TEST_F(QuorumRoundTest, APortThatAnsweredInTheRoundIsTrusted) {
  auto l2 = Listen(2);
  QuorumRound r0(cp_, rec_, 0, 0xa, absl::Milliseconds(50), {});
  ASSERT_TRUE(r0.Post().ok());
  QuorumRound r1(cp_, rec_, 1, 0xb, absl::Milliseconds(50), {});
  ASSERT_TRUE(r1.Post().ok());
  auto p = r0.Poll();
  ASSERT_TRUE(p.ok());
  EXPECT_FALSE(p->has_value());
  l2.reset();
  absl::SleepFor(absl::Milliseconds(30));  // past the re-probe period
  p = r0.Poll();
  ASSERT_TRUE(p.ok());
  ASSERT_TRUE(p->has_value());
  EXPECT_THAT(**p, ElementsAre(0, 1));
}

// One GPU failing is the common case: one rank of a two-rank replica is
// killed while its leader lives on (stuck in the replica's own collective
// until its launcher ends it). Its refused port ends the round at once;
// the leader's answering port does not keep the replica in.
TEST_F(QuorumRoundTest, OneDeadRankOfAMultiRankReplicaIsGone) {
  ControlPlane cp2(store_, "job2", 2);
  std::vector<std::unique_ptr<LivenessListener>> ports;
  for (int id : {0, 1, 2}) {
    for (int rank : {0, 1}) {
      auto l = LivenessListener::Start("127.0.0.1");
      ASSERT_TRUE(l.ok()) << l.status();
      ASSERT_TRUE(store_
                      ->set(cp2.ProbeKey(id, rec_.incarnation_of(id), rank),
                            (*l)->address())
                      .ok());
      ports.push_back(*std::move(l));
    }
  }
  auto all = cp2.Probe(2, 0xc, absl::Milliseconds(50));
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ(all->liveness, Liveness::kListening);
  EXPECT_EQ(all->address, ports[4]->address());  // rank 0's
  QuorumRound r0(cp2, rec_, 0, 0xa, absl::Milliseconds(50), {0xa, 0xb, 0xc});
  QuorumRound r1(cp2, rec_, 1, 0xb, absl::Milliseconds(50), {0xa, 0xb, 0xc});
  ASSERT_TRUE(r0.Post().ok());
  ASSERT_TRUE(r1.Post().ok());
  auto p = r0.Poll();
  ASSERT_TRUE(p.ok());
  EXPECT_FALSE(p->has_value());  // both of replica 2's ranks answer
  const std::string dead = ports[5]->address();
  ports[5].reset();  // replica 2's rank 1 is killed; its rank 0 lives
  absl::SleepFor(absl::Milliseconds(30));  // past the re-probe period
  auto one = cp2.Probe(2, 0xc, absl::Milliseconds(50));
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(one->liveness, Liveness::kGone);
  EXPECT_EQ(one->address, dead);
  p = r0.Poll();
  ASSERT_TRUE(p.ok());
  ASSERT_TRUE(p->has_value());
  EXPECT_THAT(**p, ElementsAre(0, 1));
  EXPECT_THAT(r0.gone(), ElementsAre(2));
}

// Issue 44: a flood of connections to a live replica's liveness port during
// a recovery (silent connections left open, as a scanner or a stuck peer
// leaves them, while the port also reads messages as the elastic mesh's
// does): every probe of the round still completes its handshake, and the
// live member is waited for, never read as gone.
TEST_F(QuorumRoundTest, AFloodOnALivePortDuringARoundLeavesItListening) {
  auto l2 = LivenessListener::Start("127.0.0.1", [](absl::string_view) {});
  ASSERT_TRUE(l2.ok()) << l2.status();
  const std::string where = (*l2)->address();
  ASSERT_TRUE(store_->set(cp_.ProbeKey(2, 0xc), where).ok());
  QuorumRound r0(cp_, rec_, 0, 0xa, absl::Milliseconds(20), {0xa, 0xb, 0xc});
  QuorumRound r1(cp_, rec_, 1, 0xb, absl::Milliseconds(20), {0xa, 0xb, 0xc});
  ASSERT_TRUE(r0.Post().ok());
  ASSERT_TRUE(r1.Post().ok());
  auto p = r0.Poll();  // replica 2 answers: trusted from now on
  ASSERT_TRUE(p.ok());
  ASSERT_FALSE(p->has_value());

  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(
      static_cast<uint16_t>(std::stoi(where.substr(where.rfind(':') + 1))));
  inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  std::atomic<bool> stop{false};
  std::atomic<int> flooded{0};
  std::thread flood([&] {
    // Up to 1,000 connections open at once, 20,000 in all, 10 s at most.
    std::deque<int> open;
    const absl::Time until = absl::Now() + absl::Seconds(10);
    for (int i = 0; i < 20000 && !stop && absl::Now() < until; ++i) {
      const int fd =
          socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
      if (fd < 0) break;
      (void)connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
      open.push_back(fd);
      flooded.fetch_add(1);
      if (open.size() > 1000) {
        close(open.front());
        open.pop_front();
      }
    }
    while (!stop) absl::SleepFor(absl::Milliseconds(5));
    for (int fd : open) close(fd);
  });
  while (flooded.load() < 300) absl::SleepFor(absl::Milliseconds(1));
  int refused = 0, unanswered = 0;
  for (int i = 0; i < 100; ++i) {
    // The mesh's probe bound (kProbeTimeout: 20 ms).
    const Liveness v = ProbeLiveness(where, absl::Milliseconds(20));
    if (v == Liveness::kGone) ++refused;
    if (v == Liveness::kUnknown) ++unanswered;
    p = r0.Poll();
    ASSERT_TRUE(p.ok()) << p.status();
    if (p->has_value()) break;
    absl::SleepFor(absl::Milliseconds(5));
  }
  stop = true;
  flood.join();
  EXPECT_EQ(refused, 0) << "probes of a live port refused during the flood";
  EXPECT_EQ(unanswered, 0) << "probes of a live port unanswered in 20 ms";
  EXPECT_FALSE(p->has_value()) << "the round decided without live replica 2";
  EXPECT_TRUE(r0.gone().empty());
  EXPECT_GT(flooded.load(), 1000);
}

// The epoch gate (epoch_gate.h): members 0 and 1 advertised their DP group
// address, member 2 (a joiner) was killed as the epoch formed.
class EpochGateTest : public QuorumRoundTest {
 protected:
  std::string Prefix() const { return cp_.GroupPrefix(rec_.epoch, 0); }
  std::string GoneKey() const { return Prefix() + "/vemesh_gone"; }
  void Advertise(int dp_rank) {
    ASSERT_TRUE(
        store_
            ->set(absl::StrCat(Prefix(), "/vemesh_host/", dp_rank), "127.0.0.1")
            .ok());
  }
};

TEST_F(EpochGateTest, EveryMemberAdvertisedPasses) {
  for (int j : {0, 1, 2}) Advertise(j);
  EpochGate gate(cp_, rec_, Prefix(), GoneKey(), nullptr);
  EXPECT_TRUE(gate.Await(absl::Now() + absl::Seconds(5)).ok());
}

TEST_F(EpochGateTest, ADeadJoinerEndsTheWaitAtOnceNotAtTheTimeout) {
  Advertise(0);
  Advertise(1);
  { auto l2 = Listen(2); }  // advertised its port, then SIGKILLed
  Reachable leader;
  leader.hosts.insert("127.0.0.1");  // replica 1's port answered there
  const absl::Time start = absl::Now();
  EpochGate gate(cp_, rec_, Prefix(), GoneKey(), &leader);
  absl::Status s = gate.Await(start + absl::Seconds(10));
  EXPECT_TRUE(absl::IsUnavailable(s)) << s;
  EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("replica 2"));
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  // The other ranks read the leader's verdict from the gone key.
  EpochGate other(cp_, rec_, Prefix(), GoneKey(), nullptr);
  s = other.Await(absl::Now() + absl::Seconds(10));
  EXPECT_TRUE(absl::IsUnavailable(s)) << s;
}

TEST_F(EpochGateTest, AnUntrustedRefusalWaitsForTheDeadline) {
  Advertise(0);
  Advertise(1);
  { auto l2 = Listen(2); }  // refuses, but nothing ever answered from there
  Reachable leader;
  EpochGate gate(cp_, rec_, Prefix(), GoneKey(), &leader);
  absl::Status s = gate.Await(absl::Now() + absl::Milliseconds(150));
  EXPECT_TRUE(absl::IsDeadlineExceeded(s)) << s;
  EXPECT_THAT(std::string(s.message()),
              ::testing::HasSubstr("DP rank 2 (replica 2)"));
}

TEST_F(EpochGateTest, ASilentLiveMemberIsWaitedFor) {
  Advertise(0);
  Advertise(1);
  auto l2 = Listen(2);  // alive, slow to advertise
  Reachable leader;
  EpochGate gate(cp_, rec_, Prefix(), GoneKey(), &leader);
  absl::Status s = gate.Await(absl::Now() + absl::Milliseconds(150));
  EXPECT_TRUE(absl::IsDeadlineExceeded(s)) << s;
  EXPECT_EQ(leader.incarnations.count(0xc), 1u);  // it answered
}

}  // namespace
}  // namespace vemesh
