// The store's authentication and job identity (wire.h, HELLO/AUTH): SHA-256
// and HMAC-SHA-256 against their published test vectors (FIPS 180-4's
// examples, RFC 4231), the token handshake, a client of another job, a rank
// claimed twice, and keys only rank 0's own connection may write; keys
// tied to the rank its connection proved, a ranked client's failed proof
// told to the whole job at once (issue 44).
// Everything runs on 127.0.0.1 and every wait has a deadline.

#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "vemesh/rendezvous/tcp/internal/rank_keys.h"
#include "vemesh/rendezvous/tcp/sha256.h"
#include "vemesh/rendezvous/tcp/tcp_store.h"
#include "vemesh/rendezvous/tcp/tcp_store_server.h"
#include "vemesh/rendezvous/tcp/wire.h"

namespace vemesh {
namespace {

using ::testing::HasSubstr;

constexpr char kHost[] = "127.0.0.1";

std::string Hex(absl::string_view bytes) { return HexText(bytes); }
std::string Bytes(absl::string_view hex) { return absl::HexStringToBytes(hex); }

TEST(Sha256Test, Fips180Examples) {
  EXPECT_EQ(Hex(Sha256("abc")),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(Hex(Sha256("")),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(
      Hex(Sha256("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq")),
      "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  EXPECT_EQ(Hex(Sha256(std::string(1000000, 'a'))),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  // Lengths around the padding's block boundary (55, 56, 64 bytes).
  EXPECT_EQ(Hex(Sha256(std::string(55, 'a'))),
            "9f4390f8d30c2dd92ec9f095b65e2b9ae9b0a925a5258e241c9f1e910f734318");
  EXPECT_EQ(Hex(Sha256(std::string(56, 'a'))),
            "b35439a4ac6f0948b6d6f9e3c6af0f5f590ce20f1bde7090ef7970686ec6738a");
  EXPECT_EQ(Hex(Sha256(std::string(64, 'a'))),
            "ffe054fe7ae0cb6dc65c3af9b61d5209f439851db43d0ba5997337df154668eb");
}

TEST(HmacSha256Test, Rfc4231Vectors) {
  // Test case 1.
  EXPECT_EQ(Hex(HmacSha256(std::string(20, '\x0b'), "Hi There")),
            "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
  // Test case 2: a key shorter than the block.
  EXPECT_EQ(Hex(HmacSha256("Jefe", "what do ya want for nothing?")),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  // Test case 3.
  EXPECT_EQ(Hex(HmacSha256(std::string(20, '\xaa'), std::string(50, '\xdd'))),
            "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe");
  // Test case 6: a key longer than the block is hashed first.
  EXPECT_EQ(Hex(HmacSha256(std::string(131, '\xaa'),
                           "Test Using Larger Than Block-Size Key - Hash Key "
                           "First")),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
  (void)Bytes;
}

TEST(ConstantTimeEqualsTest, ComparesWholeStrings) {
  EXPECT_TRUE(ConstantTimeEquals("abc", "abc"));
  EXPECT_FALSE(ConstantTimeEquals("abc", "abd"));
  EXPECT_FALSE(ConstantTimeEquals("abc", "ab"));
  EXPECT_TRUE(ConstantTimeEquals("", ""));
}

TEST(HelloFieldsTest, RoundTripsAndRefusesBadFields) {
  StoreHello hello;
  hello.job = "slurm-42.0";
  hello.rank = 3;
  hello.claim = "00ff";
  hello.nonce = "abcd";
  auto parsed = ParseHelloFields(HelloFields(hello));
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->job, "slurm-42.0");
  EXPECT_EQ(parsed->rank, 3);
  EXPECT_EQ(parsed->claim, "00ff");
  EXPECT_EQ(parsed->nonce, "abcd");
  EXPECT_THAT(ParseHelloFields({"rank=1", "rank=2"}).status().message(),
              HasSubstr("appears twice"));
  EXPECT_THAT(ParseHelloFields({"color=red"}).status().message(),
              HasSubstr("unknown"));
  EXPECT_THAT(ParseHelloFields({"nonce=XYZ"}).status().message(),
              HasSubstr("hex"));
  EXPECT_THAT(ParseHelloFields({"rank=-5"}).status().message(),
              HasSubstr("rank '-5'"));
  EXPECT_THAT(ParseHelloFields({"noequals"}).status().message(),
              HasSubstr("name=value"));
}

std::unique_ptr<TcpStoreServer> Start(TcpStoreServerOptions options) {
  auto server = TcpStoreServer::Start(kHost, 0, std::move(options));
  EXPECT_TRUE(server.ok()) << server.status();
  return server.ok() ? *std::move(server) : nullptr;
}

// A client refused as another job's (or without the token) tries again
// until its deadline, in case its own job's store takes the port: 1 s here.
absl::StatusOr<std::unique_ptr<TcpStore>> Connect(int port,
                                                  TcpStoreOptions options) {
  options.timeout = absl::Seconds(5);
  return TcpStore::Connect(kHost, port, absl::Now() + absl::Seconds(1),
                           std::move(options));
}

TEST(StoreAuthTest, TheRightTokenIsServedAndOthersAreNot) {
  TcpStoreServerOptions server_options;
  server_options.token = "s3cret";
  auto server = Start(server_options);
  ASSERT_NE(server, nullptr);
  TcpStoreOptions good;
  good.token = "s3cret";
  auto store = Connect(server->port(), good);
  ASSERT_TRUE(store.ok()) << store.status();
  ASSERT_TRUE((*store)->set("k", "v").ok());
  EXPECT_EQ((*store)->get("k").value_or(""), "v");

  // A wrong token: the client sees the server cannot prove it.
  TcpStoreOptions bad;
  bad.token = "guess";
  auto refused = Connect(server->port(), bad);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnauthenticated)
      << refused.status();
  // No handshake at all: every request is Unauthenticated, nothing leaks.
  auto plain = Connect(server->port(), TcpStoreOptions());
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ((*plain)->get("k").status().code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_EQ((*plain)->set("k", "forged").code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_EQ((*store)->get("k").value_or(""), "v");
}

TEST(StoreAuthTest, AClientOfAnotherJobIsRefusedNamingBoth) {
  TcpStoreServerOptions server_options;
  server_options.job = "job-a";
  auto server = Start(server_options);
  ASSERT_NE(server, nullptr);
  TcpStoreOptions other;
  other.job = "job-b";
  other.rank = 1;
  auto refused = Connect(server->port(), other);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.status().message(), HasSubstr("job 'job-a'"));
  EXPECT_THAT(refused.status().message(), HasSubstr("job 'job-b'"));
  TcpStoreOptions same;
  same.job = "job-a";
  same.rank = 1;
  EXPECT_TRUE(Connect(server->port(), same).ok());
}

TEST(StoreAuthTest, ASecondClaimOfARankFailsAndIsRecorded) {
  TcpStoreServerOptions server_options;
  server_options.conflict_key = "vemesh/conflict";
  auto server = Start(server_options);
  ASSERT_NE(server, nullptr);
  TcpStoreOptions first;
  first.rank = 1;
  auto a = Connect(server->port(), first);
  ASSERT_TRUE(a.ok()) << a.status();
  // The same process reconnecting keeps its claim.
  TcpStoreOptions again = first;
  again.claim = "00";
  TcpStoreOptions same_claim;
  same_claim.rank = 2;
  same_claim.claim = "0a0b";
  ASSERT_TRUE(Connect(server->port(), same_claim).ok());
  ASSERT_TRUE(Connect(server->port(), same_claim).ok());
  // Another process claiming rank 1.
  auto b = Connect(server->port(), first);
  EXPECT_EQ(b.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(b.status().message(), HasSubstr("rank 1 was claimed twice"));
  auto conflict = (*a)->get("vemesh/conflict");
  ASSERT_TRUE(conflict.ok()) << conflict.status();
  EXPECT_THAT(*conflict, HasSubstr("rank 1 was claimed twice"));
}

TEST(StoreAuthTest, OnlyTheOwnerWritesVerdictsOthersOnlyErrors) {
  TcpStoreServerOptions server_options;
  server_options.owner_key_suffixes = {"/verdict"};
  server_options.open_value_prefixes = {"E"};
  auto server = Start(server_options);
  ASSERT_NE(server, nullptr);
  auto rogue = Connect(server->port(), TcpStoreOptions());
  ASSERT_TRUE(rogue.ok());
  EXPECT_EQ((*rogue)->set("r/verdict", "Oforged").code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ((*rogue)->compare_set("r/verdict", "", "Oforged").status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ((*rogue)->remove("r/verdict").status().code(),
            absl::StatusCode::kPermissionDenied);
  // An error verdict is open to all (a rank that gives up says so).
  EXPECT_TRUE((*rogue)->compare_set("e/verdict", "", "Egave up").ok());
  // A forged owner proof is refused.
  TcpStoreOptions forger;
  forger.owner_secret = "not the secret";
  EXPECT_EQ(Connect(server->port(), forger).status().code(),
            absl::StatusCode::kPermissionDenied);
  TcpStoreOptions owner;
  owner.owner_secret = server->owner_secret();
  auto zero = Connect(server->port(), owner);
  ASSERT_TRUE(zero.ok()) << zero.status();
  EXPECT_TRUE((*zero)->set("r/verdict", "Oreal").ok());
  EXPECT_EQ((*rogue)->get("r/verdict").value_or(""), "Oreal");
}

TEST(RankKeysTest, PatternsMatchWholeComponentsAndOneSpellingOfARank) {
  const std::vector<std::string> patterns = {"j/ag/*/{rank}",
                                             "j/ag/*/ack/{rank}"};
  EXPECT_EQ(RankOfKey("j/ag/0/1", patterns), std::optional<int64_t>(1));
  EXPECT_EQ(RankOfKey("j/ag/17/ack/0", patterns), std::optional<int64_t>(0));
  EXPECT_EQ(RankOfKey("j/ag/0/verdict", patterns), std::nullopt);
  EXPECT_EQ(RankOfKey("j/ag/0/01", patterns), std::nullopt);
  EXPECT_EQ(RankOfKey("j/ag/0/1/x", patterns), std::nullopt);
  EXPECT_EQ(RankOfKey("j/ag/1", patterns), std::nullopt);
  EXPECT_EQ(RankOfKey("k/ag/0/1", patterns), std::nullopt);
  EXPECT_EQ(RankOfKey("j/ag/0/1234567890", patterns), std::nullopt);
  EXPECT_TRUE(CheckRankKeyPattern("j/ag/*/{rank}").ok());
  EXPECT_THAT(CheckRankKeyPattern("j/ag/*").message(),
              HasSubstr("expected exactly one"));
  EXPECT_THAT(CheckRankKeyPattern("j//{rank}").message(),
              HasSubstr("empty component"));
  EXPECT_FALSE(CheckRankKeyPattern("{rank}/{rank}").ok());
}

TcpStoreServerOptions RankKeyOptions() {
  TcpStoreServerOptions options;
  options.conflict_key = "j/conflict";
  options.rank_key_patterns = {"j/ag/*/{rank}", "j/ag/*/ack/{rank}"};
  return options;
}

TEST(StoreAuthTest, RankKeysAreWrittenOnlyByTheConnectionThatProvedTheRank) {
  auto server = Start(RankKeyOptions());
  ASSERT_NE(server, nullptr);
  TcpStoreOptions one;
  one.rank = 1;
  one.claim = "0101";
  auto a = Connect(server->port(), one);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_TRUE((*a)->set("j/ag/0/1", "mine").ok());
  EXPECT_TRUE((*a)->set("j/ag/0/ack/1", "").ok());
  const absl::Status other = (*a)->set("j/ag/0/2", "forged");
  EXPECT_EQ(other.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(other.message(), HasSubstr("belongs to rank 2"));
  EXPECT_THAT(other.message(), HasSubstr("proved rank 1"));
  EXPECT_EQ((*a)->add("j/ag/0/2", 1).status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ((*a)->remove("j/ag/0/ack/2").status().code(),
            absl::StatusCode::kPermissionDenied);
  // No handshake: no rank's key; other keys as before.
  auto plain = Connect(server->port(), TcpStoreOptions());
  ASSERT_TRUE(plain.ok());
  const absl::Status anonymous = (*plain)->set("j/ag/0/1", "forged");
  EXPECT_EQ(anonymous.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(anonymous.message(), HasSubstr("proved no rank"));
  EXPECT_EQ((*plain)->compare_set("j/ag/0/ack/1", "", "x").status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE((*plain)->set("j/other", "v").ok());
  // The same process reconnecting (its claim) still writes its keys.
  auto again = Connect(server->port(), one);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE((*again)->set("j/ag/1/1", "mine").ok());
  // Another process claiming rank 1 is refused, and writes nothing.
  TcpStoreOptions impostor;
  impostor.rank = 1;
  EXPECT_EQ(Connect(server->port(), impostor).status().code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_EQ((*plain)->get("j/ag/0/1").value_or(""), "mine");
}

TEST(StoreAuthTest, ARankedClientsFailedProofFailsTheJobAndItsWaitsAtOnce) {
  TcpStoreServerOptions options = RankKeyOptions();
  options.token = "s3cret";
  auto server = Start(options);
  ASSERT_NE(server, nullptr);
  TcpStoreOptions zero;
  zero.token = "s3cret";
  zero.rank = 0;
  zero.claim = "0000";  // one process: its reconnections keep the claim
  auto waiter = Connect(server->port(), zero);
  ASSERT_TRUE(waiter.ok()) << waiter.status();
  const absl::Time start = absl::Now();
  absl::Status waited;
  std::thread parked([&] {
    waited = (*waiter)->wait({"j/ag/0/1"}, start + absl::Seconds(20));
  });
  absl::SleepFor(absl::Milliseconds(100));  // parked (or not: same outcome)
  TcpStoreOptions wrong;
  wrong.token = "guess";
  wrong.rank = 1;
  auto refused = Connect(server->port(), wrong);
  parked.join();
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kPermissionDenied)
      << refused.status();
  EXPECT_THAT(refused.status().message(),
              HasSubstr("rank 1's proof of the job's store token was refused"));
  EXPECT_EQ(waited.code(), absl::StatusCode::kAlreadyExists) << waited;
  EXPECT_THAT(waited.message(), HasSubstr("rank 1's proof"));
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  // A later WAIT on a missing key hears of it too; a set key still waits OK.
  auto again = Connect(server->port(), zero);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(
      (*again)->wait({"j/ag/5/ack/1"}, absl::Now() + absl::Seconds(20)).code(),
      absl::StatusCode::kAlreadyExists);
  EXPECT_TRUE(
      (*again)->wait({"j/conflict"}, absl::Now() + absl::Seconds(1)).ok());
  // No token where the store needs one, and one where it has none.
  TcpStoreOptions none;
  none.rank = 2;
  EXPECT_THAT(Connect(server->port(), none).status().message(),
              HasSubstr("it has no token and this store needs one"));
  auto open = Start(RankKeyOptions());
  ASSERT_NE(open, nullptr);
  EXPECT_THAT(Connect(open->port(), wrong).status().message(),
              HasSubstr("this store has none"));
  // Unranked clients with a wrong token: refused as before, the job
  // untouched.
  auto fresh = Start(options);
  ASSERT_NE(fresh, nullptr);
  TcpStoreOptions unranked;
  unranked.token = "guess";
  EXPECT_EQ(Connect(fresh->port(), unranked).status().code(),
            absl::StatusCode::kUnauthenticated);
  auto fine = Connect(fresh->port(), zero);
  ASSERT_TRUE(fine.ok()) << fine.status();
  EXPECT_EQ((*fine)->get("j/conflict").status().code(),
            absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace vemesh
