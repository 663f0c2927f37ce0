// ReplicaState (vemesh/elastic/replica_state.h) on real Gloo groups made in
// this process over a MemoryStore, one thread per rank: the transfer loads
// the root's bytes on the receivers only, a receiver that cannot load fails
// it on every rank, differing registrations are refused, and the
// fingerprint comparison names the replicas that differ.

#include "vemesh/elastic/replica_state.h"

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "vemesh/comm/gloo/gloo_communicator.h"
#include "vemesh/rendezvous/memory_store.h"

namespace vemesh {
namespace {

using ::testing::HasSubstr;

// Runs `body(rank, group)` on `n` threads of one fresh Gloo group.
void OnRanks(int n, const std::function<void(int, Communicator&)>& body) {
  auto store = std::make_shared<MemoryStore>();
  std::vector<int> ranks;
  for (int r = 0; r < n; ++r) ranks.push_back(r);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      auto comm =
          GlooCommunicator::Create(store, "rs", r, n, ranks, absl::Seconds(20));
      ASSERT_TRUE(comm.ok()) << comm.status();
      body(r, **comm);
    });
  }
  for (std::thread& t : threads) t.join();
}

// One string entry named `name` on `state`, stored in `value`.
void RegisterString(ReplicaState& state, const std::string& name,
                    std::string* value, bool refuse = false) {
  ASSERT_TRUE(
      state
          .Register(
              name, [value]() -> absl::StatusOr<std::string> { return *value; },
              [value, refuse](absl::string_view b) {
                if (refuse) return absl::InvalidArgumentError("no");
                *value = std::string(b);
                return absl::OkStatus();
              })
          .ok());
}

TEST(ReplicaState, RegisterRefusesEmptyNamesAndCallbacks) {
  ReplicaState s;
  EXPECT_TRUE(absl::IsInvalidArgument(s.Register("", nullptr, nullptr)));
  EXPECT_TRUE(s.empty());
}

TEST(ReplicaState, FingerprintIsStableAndSeesEveryByte) {
  EXPECT_EQ(Fingerprint64("abc"), Fingerprint64("abc"));
  EXPECT_NE(Fingerprint64("abc"), Fingerprint64("abd"));
  // Every bit of a buffer longer than the lanes' 32-byte blocks counts, in
  // any lane and in the tail; so does the length (trailing zeros).
  std::string big(1000, '\0');
  const uint64_t zero = Fingerprint64(big);
  for (size_t i = 0; i < big.size(); i += 37) {
    for (int bit = 0; bit < 8; bit += 3) {
      big[i] = static_cast<char>(1 << bit);
      EXPECT_NE(Fingerprint64(big), zero) << "byte " << i << " bit " << bit;
      big[i] = '\0';
    }
  }
  EXPECT_NE(Fingerprint64(big + std::string(1, '\0')), zero);
  EXPECT_NE(Fingerprint64(big, 1), zero);
  ReplicaState s;
  std::string v = "hello";
  RegisterString(s, "v", &v);
  const uint64_t before = *s.Fingerprint();
  v[0] = 'j';
  EXPECT_NE(*s.Fingerprint(), before);
}

TEST(ReplicaState, TransferLoadsTheRootsBytesOnReceiversOnly) {
  std::vector<std::string> a = {"root-a", "x", "keep"};
  std::vector<std::string> b = {"root-b", "y", "keep-b"};
  OnRanks(3, [&](int r, Communicator& group) {
    ReplicaState s;
    RegisterString(s, "a", &a[r]);
    RegisterString(s, "b", &b[r]);
    // Rank 1 receives; rank 2 is a member that already holds the state.
    EXPECT_TRUE(s.Transfer(group, 0, /*receive=*/r == 1).ok());
  });
  EXPECT_EQ(a[1], "root-a");
  EXPECT_EQ(b[1], "root-b");
  EXPECT_EQ(a[2], "keep");
  EXPECT_EQ(b[2], "keep-b");
}

TEST(ReplicaState, ALoadFailureFailsTheTransferEverywhere) {
  std::vector<std::string> v = {"state", "", ""};
  std::vector<absl::Status> out(3);
  OnRanks(3, [&](int r, Communicator& group) {
    ReplicaState s;
    RegisterString(s, "v", &v[r], /*refuse=*/r == 2);
    out[r] = s.Transfer(group, 0, r != 0);
  });
  for (int r = 0; r < 3; ++r) {
    EXPECT_TRUE(absl::IsAborted(out[r])) << r << ": " << out[r];
  }
  EXPECT_THAT(std::string(out[2].message()),
              HasSubstr("load_state_dict of 'v': no"));
}

TEST(ReplicaState, OtherRegistrationsAreRefused) {
  std::vector<std::string> v = {"state", ""};
  std::vector<absl::Status> out(2);
  OnRanks(2, [&](int r, Communicator& group) {
    ReplicaState s;
    RegisterString(s, r == 0 ? "v" : "w", &v[r]);
    out[r] = s.Transfer(group, 0, r == 1);
  });
  EXPECT_TRUE(absl::IsAborted(out[0])) << out[0];
  EXPECT_THAT(std::string(out[1].message()),
              HasSubstr("other state entries than this rank's [w]"));
  EXPECT_EQ(v[1], "");
}

// Live-bytes entries (RegisterBytes) beside a state_dict pair: sent from
// and received into the buffers themselves; the fingerprint is the one the
// same bytes give through a state_dict pair.
TEST(ReplicaState, BytesEntriesAreSentAndReceivedInPlace) {
  std::vector<std::string> w = {"0123456789abcdef", std::string(16, '.'),
                                "keep-keep-keep-k"};
  std::vector<std::string> step = {"7", "", "6"};
  const char* const before = w[1].data();
  OnRanks(3, [&](int r, Communicator& group) {
    ReplicaState s;
    ASSERT_TRUE(s.RegisterBytes("w", [&w, r] {
                   return absl::MakeSpan(w[r].data(), w[r].size());
                 }).ok());
    RegisterString(s, "step", &step[r]);
    EXPECT_TRUE(s.Transfer(group, 0, /*receive=*/r == 1).ok());
  });
  EXPECT_EQ(w[1], "0123456789abcdef");
  EXPECT_EQ(w[1].data(), before);  // the same buffer, written in place
  EXPECT_EQ(step[1], "7");
  EXPECT_EQ(w[2], "keep-keep-keep-k");  // a member with state keeps its own
  ReplicaState bytes, pair;
  ASSERT_TRUE(
      bytes
          .RegisterBytes(
              "w", [&w] { return absl::MakeSpan(w[0].data(), w[0].size()); })
          .ok());
  RegisterString(pair, "w", &w[0]);
  EXPECT_EQ(*bytes.Fingerprint(), *pair.Fingerprint());
  EXPECT_TRUE(absl::IsInvalidArgument(bytes.RegisterBytes("w", nullptr)));
}

TEST(ReplicaState, ABytesEntryOfAnotherSizeFailsTheTransfer) {
  std::vector<std::string> w = {"0123456789", "short"};
  std::vector<absl::Status> out(2);
  OnRanks(2, [&](int r, Communicator& group) {
    ReplicaState s;
    ASSERT_TRUE(s.RegisterBytes("w", [&w, r] {
                   return absl::MakeSpan(w[r].data(), w[r].size());
                 }).ok());
    out[r] = s.Transfer(group, 0, r == 1);
  });
  EXPECT_TRUE(absl::IsAborted(out[0])) << out[0];
  EXPECT_THAT(std::string(out[1].message()),
              HasSubstr("'w': 10 bytes sent, this rank holds 5"));
  EXPECT_EQ(w[1], "short");  // nothing written
}

TEST(ReplicaState, FingerprintsNameTheReplicasThatDiffer) {
  std::vector<std::string> v = {"same", "same", "other"};
  std::vector<absl::Status> out(3);
  OnRanks(3, [&](int r, Communicator& group) {
    ReplicaState s;
    RegisterString(s, "v", &v[r]);
    out[r] = s.CompareFingerprints(group, {4, 7, 9}, "at step 3");
  });
  for (int r = 0; r < 3; ++r) {
    ASSERT_TRUE(absl::IsDataLoss(out[r])) << out[r];
    EXPECT_THAT(std::string(out[r].message()), HasSubstr("differ at step 3: "));
    // The first replica that differs from the first one, and both values.
    EXPECT_THAT(std::string(out[r].message()), HasSubstr("replica 9 has "));
    EXPECT_THAT(std::string(out[r].message()), HasSubstr(", replica 4 has "));
    EXPECT_EQ(out[r].message(), out[0].message());
  }
  v[2] = "same";
  OnRanks(3, [&](int r, Communicator& group) {
    ReplicaState s;
    RegisterString(s, "v", &v[r]);
    EXPECT_TRUE(s.CompareFingerprints(group, {4, 7, 9}, "now").ok());
  });
}

}  // namespace
}  // namespace vemesh
