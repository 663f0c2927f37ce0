// The TCP store's frames (vemesh/rendezvous/tcp/wire.h): every request and
// reply survives encode -> parse, every strict prefix is incomplete, and
// lengths that lie are malformed before anything is sized by them.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "vemesh/rendezvous/tcp/wire.h"

namespace vemesh {
namespace {

using ::testing::HasSubstr;

std::string U32(uint32_t v) {
  std::string out;
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>(v >> (8 * i)));
  return out;
}
std::string I64(int64_t v) {
  std::string out;
  for (int i = 0; i < 8; ++i) {
    out.push_back(static_cast<char>(static_cast<uint64_t>(v) >> (8 * i)));
  }
  return out;
}
std::string Str(const std::string& s) { return U32(s.size()) + s; }
std::string Frame(const std::string& payload) {
  return U32(payload.size()) + payload;
}
std::string Op(StoreOp op) { return std::string(1, static_cast<char>(op)); }

StoreRequest Request(StoreOp op, std::vector<std::string> keys) {
  StoreRequest r;
  r.op = op;
  r.keys = std::move(keys);
  return r;
}

std::vector<StoreRequest> EveryOp() {
  std::vector<StoreRequest> all;
  StoreRequest set = Request(StoreOp::kSet, {"rank/0/addr"});
  set.value = std::string("10.0.0.7:4242\0\xff", 15);
  all.push_back(set);
  all.push_back(Request(StoreOp::kGet, {"a", "bb", "ccc"}));
  StoreRequest wait = Request(StoreOp::kWait, {"x", "y"});
  wait.timeout_ms = 30000;
  all.push_back(wait);
  StoreRequest add = Request(StoreOp::kAdd, {"n"});
  add.delta = -5;
  all.push_back(add);
  StoreRequest cas = Request(StoreOp::kCompareSet, {"epoch"});
  cas.expected = "7";
  cas.value = "8";
  all.push_back(cas);
  all.push_back(Request(StoreOp::kRemove, {"gone"}));
  all.push_back(Request(StoreOp::kPing, {}));
  return all;
}

void ExpectSame(const StoreRequest& a, const StoreRequest& b) {
  EXPECT_EQ(a.op, b.op);
  EXPECT_EQ(a.keys, b.keys);
  EXPECT_EQ(a.value, b.value);
  EXPECT_EQ(a.expected, b.expected);
  EXPECT_EQ(a.delta, b.delta);
  EXPECT_EQ(a.timeout_ms, b.timeout_ms);
}

TEST(StoreWireTest, EveryRequestRoundTrips) {
  for (const StoreRequest& request : EveryOp()) {
    SCOPED_TRACE(StoreOpName(request.op));
    absl::StatusOr<std::string> frame = EncodeRequest(request);
    ASSERT_TRUE(frame.ok()) << frame.status();
    ParsedRequest p = ParseRequest(*frame);
    ASSERT_EQ(p.outcome, ParsedRequest::kComplete) << p.error;
    EXPECT_EQ(p.consumed, frame->size());
    ExpectSame(p.message, request);
  }
}

TEST(StoreWireTest, EveryStrictPrefixIsIncomplete) {
  for (const StoreRequest& request : EveryOp()) {
    SCOPED_TRACE(StoreOpName(request.op));
    const std::string frame = *EncodeRequest(request);
    for (size_t n = 0; n < frame.size(); ++n) {
      EXPECT_EQ(ParseRequest(absl::string_view(frame).substr(0, n)).outcome,
                ParsedRequest::kIncomplete)
          << n;
    }
  }
}

TEST(StoreWireTest, BackToBackFramesParseOneAtATime) {
  const std::string a = *EncodeRequest(Request(StoreOp::kGet, {"a"}));
  const std::string b = *EncodeRequest(Request(StoreOp::kPing, {}));
  const std::string both = a + b;
  ParsedRequest first = ParseRequest(both);
  ASSERT_EQ(first.outcome, ParsedRequest::kComplete);
  EXPECT_EQ(first.consumed, a.size());
  ParsedRequest second =
      ParseRequest(absl::string_view(both).substr(first.consumed));
  ASSERT_EQ(second.outcome, ParsedRequest::kComplete);
  EXPECT_EQ(second.message.op, StoreOp::kPing);
}

TEST(StoreWireTest, OverlongFrameIsMalformedFromItsHeaderAlone) {
  ParsedRequest p = ParseRequest(U32(0xffffffffu));
  EXPECT_EQ(p.outcome, ParsedRequest::kMalformed);
  EXPECT_THAT(p.error, HasSubstr("4294967295"));
  EXPECT_EQ(ParseRequest(U32(kMaxStoreFrameBytes + 1)).outcome,
            ParsedRequest::kMalformed);
  // At the bound it is merely incomplete.
  EXPECT_EQ(ParseRequest(U32(kMaxStoreFrameBytes)).outcome,
            ParsedRequest::kIncomplete);
}

TEST(StoreWireTest, MalformedPayloadsSayWhy) {
  struct Case {
    std::string name;
    std::string frame;
    std::string error;
  };
  const std::vector<Case> cases = {
      {"empty frame", U32(0), "empty frame"},
      {"unknown op", Frame("\x63"), "unknown op byte 99"},
      {"op zero", Frame(std::string(1, '\0')), "unknown op byte 0"},
      {"key longer than the frame",
       Frame(Op(StoreOp::kRemove) + U32(100) + "abc"), "only 3 left"},
      {"key over the bound",
       Frame(Op(StoreOp::kRemove) +
             Str(std::string(kMaxStoreKeyBytes + 1, 'k'))),
       "expected at most 4096"},
      {"empty key", Frame(Op(StoreOp::kRemove) + Str("")), "empty key"},
      {"key count over the bound",
       Frame(Op(StoreOp::kGet) + U32(kMaxStoreKeysPerCall + 1)),
       "expected at most 65536"},
      {"key count past the frame",
       Frame(Op(StoreOp::kGet) + U32(1000) + Str("a")), "cannot fit"},
      {"trailing bytes", Frame(Op(StoreOp::kPing) + "x"), "1 trailing bytes"},
      {"negative wait", Frame(Op(StoreOp::kWait) + U32(1) + Str("k") + I64(-1)),
       "expected >= 0"},
      {"add without delta", Frame(Op(StoreOp::kAdd) + Str("n") + "abc"), "i64"},
      {"value length past the frame",
       Frame(Op(StoreOp::kSet) + Str("k") + U32(0x7fffffff)),
       "expected at most"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    ParsedRequest p = ParseRequest(c.frame);
    EXPECT_EQ(p.outcome, ParsedRequest::kMalformed);
    EXPECT_THAT(p.error, HasSubstr(c.error));
  }
}

TEST(StoreWireTest, EncodeRefusesWhatTheParserWouldRefuse) {
  EXPECT_EQ(EncodeRequest(Request(StoreOp::kSet, {"a", "b"})).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(EncodeRequest(Request(StoreOp::kGet, {""})).status().code(),
            absl::StatusCode::kInvalidArgument);
  StoreRequest wait = Request(StoreOp::kWait, {"k"});
  wait.timeout_ms = -1;
  EXPECT_EQ(EncodeRequest(wait).status().code(),
            absl::StatusCode::kInvalidArgument);
  StoreRequest bad_op = Request(static_cast<StoreOp>(42), {});
  EXPECT_EQ(EncodeRequest(bad_op).status().code(),
            absl::StatusCode::kInvalidArgument);
  // Two values that are each in bounds but not together in one frame.
  StoreRequest cas = Request(StoreOp::kCompareSet, {"k"});
  cas.expected.assign(kMaxStoreFrameBytes / 2 + 1, 'e');
  cas.value.assign(kMaxStoreFrameBytes / 2 + 1, 'd');
  absl::StatusOr<std::string> frame = EncodeRequest(cas);
  EXPECT_EQ(frame.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(frame.status().message(), HasSubstr("per call"));
}

TEST(StoreWireTest, RepliesRoundTrip) {
  StoreReply ok;
  ok.values = {"", "v1", std::string("\0\1", 2)};
  StoreReply error;
  error.code = absl::StatusCode::kNotFound;
  error.message = "store has no key 'k'";
  for (const StoreReply& reply : {ok, error}) {
    const std::string frame = EncodeReply(reply);
    ParsedReply p = ParseReply(frame);
    ASSERT_EQ(p.outcome, ParsedReply::kComplete) << p.error;
    EXPECT_EQ(p.consumed, frame.size());
    EXPECT_EQ(p.message.code, reply.code);
    EXPECT_EQ(p.message.message, reply.message);
    EXPECT_EQ(p.message.values, reply.values);
    EXPECT_EQ(ReplyStatus(p.message).code(), reply.code);
    for (size_t n = 0; n < frame.size(); ++n) {
      EXPECT_EQ(ParseReply(absl::string_view(frame).substr(0, n)).outcome,
                ParsedReply::kIncomplete);
    }
  }
}

TEST(StoreWireTest, ReplyOverTheFrameBoundBecomesResourceExhausted) {
  StoreReply big;
  big.values = {std::string(kMaxStoreValueBytes, 'a'),
                std::string(1 << 20, 'b')};
  ParsedReply p = ParseReply(EncodeReply(big));
  ASSERT_EQ(p.outcome, ParsedReply::kComplete) << p.error;
  EXPECT_EQ(p.message.code, absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(p.message.message, HasSubstr("fewer keys"));
}

TEST(StoreWireTest, MalformedRepliesAreRefused) {
  EXPECT_EQ(
      ParseReply(Frame(std::string(1, '\x11') + Str("") + U32(0))).outcome,
      ParsedReply::kMalformed);  // status code 17
  EXPECT_EQ(ParseReply(Frame(std::string(1, '\0') + Str("") + U32(5))).outcome,
            ParsedReply::kMalformed);  // 5 values in 0 bytes
  EXPECT_EQ(ParseReply(U32(0xfffffff0u)).outcome, ParsedReply::kMalformed);
}

}  // namespace
}  // namespace vemesh
