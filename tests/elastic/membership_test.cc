// The membership record of an elastic job
// (vemesh/elastic/internal/membership.h): its text form round-trips, its
// queries answer by DP order, and every malformed record from the network is
// InvalidArgument naming what is wrong.

#include "vemesh/elastic/internal/membership.h"

#include <ostream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace vemesh {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

// -- Round trips -------------------------------------------------------------

TEST(MembershipTest, EmptyTextIsEpochZeroWithNobody) {
  auto r = ParseMembership("");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->epoch, 0);
  EXPECT_THAT(r->members, IsEmpty());
  EXPECT_THAT(r->pending, IsEmpty());
  EXPECT_EQ(*r, MembershipRecord{});
}

TEST(MembershipTest, EncodesTheDocumentedForm) {
  const MembershipRecord r{
      .epoch = 4, .members = {0, 2}, .pending = {1}, .incarnations = {}};
  EXPECT_EQ(EncodeMembership(r), "e=4;m=0,2;p=1");
  // Nobody at all still names every field, and parses back to epoch 0.
  EXPECT_EQ(EncodeMembership(MembershipRecord{}), "e=0;m=;p=");
}

TEST(MembershipTest, EncodeThenParseGivesTheSameRecord) {
  std::vector<int> many;  // every id, in an order that is not sorted
  for (int i = 0; i < kMaxReplicas; ++i) {
    many.push_back((i * 7 + 3) % kMaxReplicas);  // 7 is coprime to 1024
  }
  const std::vector<MembershipRecord> records = {
      {},
      {.epoch = 1, .members = {0}, .pending = {}, .incarnations = {}},
      {.epoch = 4, .members = {0, 2}, .pending = {1}, .incarnations = {}},
      {.epoch = 9, .members = {}, .pending = {5, 3}, .incarnations = {}},
      // Admission order, not sorted order: DP rank 0 is replica 7.
      {.epoch = 123456789012345,
       .members = {7, 1, 4},
       .pending = {0, 6},
       .incarnations = {}},
      {.epoch = 2,
       .members = {kMaxReplicas - 1},
       .pending = {0},
       .incarnations = {}},
      // The most a record may hold: every id once.
      {.epoch = 3, .members = many, .pending = {}, .incarnations = {}},
      {.epoch = 3,
       .members = std::vector<int>(many.begin(), many.begin() + 600),
       .pending = std::vector<int>(many.begin() + 600, many.end()),
       .incarnations = {}},
      // Incarnations name the launch in each slot.
      {.epoch = 5,
       .members = {0, 2},
       .pending = {1},
       .incarnations = {{0, 0x1f}, {2, 0xabcdef0123456789}, {1, 7}}},
  };
  for (const MembershipRecord& r : records) {
    const std::string text = EncodeMembership(r);
    auto back = ParseMembership(text);
    ASSERT_TRUE(back.ok()) << text.substr(0, 80) << ": " << back.status();
    EXPECT_EQ(*back, r) << text.substr(0, 80);
    EXPECT_EQ(EncodeMembership(*back), text);
  }
}

TEST(MembershipTest, ParsesEveryFieldInOrder) {
  auto r = ParseMembership("e=17;m=5,0,3;p=2,9");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->epoch, 17);
  EXPECT_THAT(r->members, ElementsAre(5, 0, 3));
  EXPECT_THAT(r->pending, ElementsAre(2, 9));
}

// -- Queries -----------------------------------------------------------------

TEST(MembershipTest, QueriesFollowTheListsAndDpOrder) {
  const std::vector<int> members = {5, 2, 9, 0};
  const std::vector<int> pending = {7, 3};
  const MembershipRecord r{
      .epoch = 6, .members = members, .pending = pending, .incarnations = {}};
  for (int id = 0; id < 12; ++id) {
    int expected_dp = -1;
    for (size_t i = 0; i < members.size(); ++i) {
      if (members[i] == id) expected_dp = static_cast<int>(i);
    }
    bool expected_pending = false;
    for (int p : pending) expected_pending |= p == id;
    EXPECT_EQ(r.has_member(id), expected_dp >= 0) << "replica " << id;
    EXPECT_EQ(r.dp_rank_of(id), expected_dp) << "replica " << id;
    EXPECT_EQ(r.has_pending(id), expected_pending) << "replica " << id;
  }
  // A pending replica has no DP rank yet.
  EXPECT_EQ(r.dp_rank_of(7), -1);
  EXPECT_FALSE(MembershipRecord{}.has_member(0));
  EXPECT_FALSE(MembershipRecord{}.has_pending(0));
  EXPECT_EQ(MembershipRecord{}.dp_rank_of(0), -1);
}

TEST(MembershipTest, EqualityComparesEveryField) {
  const MembershipRecord r{
      .epoch = 4, .members = {0, 2}, .pending = {1}, .incarnations = {}};
  MembershipRecord other = r;
  EXPECT_EQ(r, other);
  other.epoch = 5;
  EXPECT_NE(r, other);
  other = r;
  other.members = {2, 0};  // same set, other DP order
  EXPECT_NE(r, other);
  other = r;
  other.pending = {};
  EXPECT_NE(r, other);
}

TEST(MembershipTest, TextNamesEpochDpSizeMembersAndPending) {
  EXPECT_EQ(
      MembershipText(
          {.epoch = 4, .members = {0, 2}, .pending = {1}, .incarnations = {}}),
      "epoch 4, DP=2 [0, 2], pending [1]");
  EXPECT_EQ(MembershipText(MembershipRecord{}), "epoch 0, DP=0 [], pending []");
  const MembershipRecord r{
      .epoch = 11, .members = {3, 1, 8}, .pending = {}, .incarnations = {}};
  EXPECT_EQ(MembershipText(r),
            absl::StrCat("epoch ", r.epoch, ", DP=", r.members.size(), " [",
                         absl::StrJoin(r.members, ", "), "], pending []"));
}

// -- Malformed records
// ---------------------------------------------------------

struct BadRecord {
  const char* why;  // the test's name
  std::string text;
  std::vector<std::string> named;  // what the message must contain
};

// gtest prints a failing case by this, not as bytes.
void PrintTo(const BadRecord& bad, std::ostream* os) {
  *os << bad.why << " '" << bad.text.substr(0, 60)
      << (bad.text.size() > 60 ? "...'" : "'");
}

std::string IdList(int first, int count) {
  std::vector<int> ids;
  for (int i = 0; i < count; ++i) ids.push_back(first + i);
  return absl::StrJoin(ids, ",");
}

std::vector<BadRecord> BadRecords() {
  const std::string format = "expected 'e=EPOCH;m=IDS;p=IDS[;i=ID:HEX,...]'";
  const std::string inc = "expected ID:HEX with a listed replica id";
  const std::string range = absl::StrCat("[0, ", kMaxReplicas, ")");
  return {
      {"MissingPending", "e=1;m=0", {"'e=1;m=0'", format}},
      {"IncarnationOfAnUnlistedReplica",
       "e=1;m=0;p=;i=3:1f",
       {"membership incarnation '3:1f'", inc}},
      {"ZeroIncarnation", "e=1;m=0;p=;i=0:0", {"'0:0'", inc}},
      {"NonHexIncarnation", "e=1;m=0;p=;i=0:xyz", {"'0:xyz'", inc}},
      {"IncarnationTwice", "e=1;m=0;p=;i=0:1,0:2", {"'0:2'", inc}},
      {"SeventeenDigitIncarnation",
       "e=1;m=0;p=;i=0:11111111111111111",
       {"'0:11111111111111111'", inc}},
      {"IncarnationWithoutId", "e=1;m=0;p=;i=1f", {"'1f'", inc}},
      {"MissingMembers", "e=1;p=0", {"'e=1;p=0'", format}},
      {"EpochOnly", "e=1", {"'e=1'", format}},
      {"NoEqualsSigns", "1;0;2", {"'1;0;2'", format}},
      {"ExtraField", "e=1;m=0;p=;x=2", {"'e=1;m=0;p=;x=2'", format}},
      {"TrailingSeparator", "e=1;m=0;p=;", {"'e=1;m=0;p=;'", format}},
      {"MembersFirst", "m=0;e=1;p=", {"'m=0;e=1;p='", format}},
      {"PendingBeforeMembers", "e=1;p=2;m=0", {"'e=1;p=2;m=0'", format}},
      {"UpperCaseKey", "E=1;m=0;p=", {"'E=1;m=0;p='", format}},
      {"NonNumericEpoch",
       "e=x;m=0;p=",
       {"membership epoch 'x'", "non-negative"}},
      {"EmptyEpoch", "e=;m=0;p=", {"membership epoch ''", "non-negative"}},
      {"NegativeEpoch",
       "e=-1;m=0;p=",
       {"membership epoch '-1'", "non-negative"}},
      {"EpochTooBig",
       "e=99999999999999999999;m=0;p=",
       {"membership epoch '99999999999999999999'"}},
      {"MemberIdTooBig",
       absl::StrCat("e=1;m=0,", kMaxReplicas, ";p="),
       {"field 'm'", absl::StrCat("replica '", kMaxReplicas, "'"), range}},
      {"NegativeMemberId", "e=1;m=-1;p=", {"field 'm'", "replica '-1'", range}},
      {"PendingIdTooBig",
       absl::StrCat("e=1;m=0;p=", kMaxReplicas + 5),
       {"field 'p'", absl::StrCat("replica '", kMaxReplicas + 5, "'"), range}},
      {"NegativePendingId", "e=1;m=0;p=-3", {"field 'p'", "replica '-3'"}},
      {"NonNumericMemberId", "e=1;m=0,two;p=", {"field 'm'", "replica 'two'"}},
      {"NonNumericPendingId", "e=1;m=;p=1x", {"field 'p'", "replica '1x'"}},
      {"EmptyMemberItem", "e=1;m=1,,2;p=", {"field 'm'", "replica ''"}},
      {"TrailingComma", "e=1;m=1,2,;p=", {"field 'm'", "replica ''"}},
      {"EmptyPendingItem", "e=1;m=0;p=,4", {"field 'p'", "replica ''"}},
      {"DuplicateMember", "e=1;m=3,1,3;p=", {"replica 3 twice"}},
      {"DuplicatePending", "e=1;m=0;p=4,4", {"replica 4 twice"}},
      {"MemberAndPending", "e=1;m=0,6;p=6", {"replica 6 twice"}},
      {"TooManyMembers",
       // Every id once, then one more: refused for its count, not its id.
       absl::StrCat("e=1;m=", IdList(0, kMaxReplicas), ",0;p="),
       {"field 'm'", absl::StrCat("more than ", kMaxReplicas)}},
      {"TooManyPending",
       absl::StrCat("e=1;m=;p=", IdList(0, kMaxReplicas), ",5"),
       {"field 'p'", absl::StrCat("more than ", kMaxReplicas)}},
      {"TooManyTogether",
       absl::StrCat("e=1;m=", IdList(0, kMaxReplicas), ";p=0"),
       {absl::StrCat("lists ", kMaxReplicas + 1, " replicas"),
        absl::StrCat("at most ", kMaxReplicas)}},
  };
}

class MembershipBadTest : public ::testing::TestWithParam<BadRecord> {};

TEST_P(MembershipBadTest, IsInvalidArgumentNamingTheBadPart) {
  const BadRecord& bad = GetParam();
  auto r = ParseMembership(bad.text);
  ASSERT_FALSE(r.ok()) << bad.text.substr(0, 80) << " parsed as "
                       << MembershipText(*r);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument)
      << r.status();
  for (const std::string& part : bad.named) {
    EXPECT_THAT(r.status().message(), HasSubstr(part));
  }
}

INSTANTIATE_TEST_SUITE_P(Catalogue, MembershipBadTest,
                         ::testing::ValuesIn(BadRecords()),
                         [](const ::testing::TestParamInfo<BadRecord>& info) {
                           return std::string(info.param.why);
                         });

TEST(MembershipTest, LongMalformedRecordIsQuotedOnlyInPart) {
  // A record from the network may be anything: the message quotes its
  // start, not all of it.
  const std::string junk(100000, 'x');
  auto r = ParseMembership(junk);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("xxxx"));
  EXPECT_LT(r.status().message().size(), 1000u);
}

TEST(MembershipTest, AtTheLimitIsAccepted) {
  // kMaxReplicas entries split over both lists is allowed; one more is not
  // (TooManyTogether above).
  const std::string text =
      absl::StrCat("e=2;m=", IdList(0, kMaxReplicas / 2),
                   ";p=", IdList(kMaxReplicas / 2, kMaxReplicas / 2));
  auto r = ParseMembership(text);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->members.size() + r->pending.size(),
            static_cast<size_t>(kMaxReplicas));
  EXPECT_EQ(r->dp_rank_of(kMaxReplicas / 2 - 1), kMaxReplicas / 2 - 1);
  EXPECT_TRUE(r->has_pending(kMaxReplicas - 1));
}

}  // namespace
}  // namespace vemesh
