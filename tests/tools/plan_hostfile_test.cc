// Open MPI hostfiles as `vemesh plan --placement hostfile:FILE` reads them:
// what parses, and for what does not, a message naming the file, the line,
// the bad text and what was expected.

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tools/plan/hostfile.h"

namespace vemesh::plan {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

TEST(Hostfile, ParsesSlotsCommentsAndBlankLines) {
  const Hostfile h = ParseHostfile(
                         "# cluster A\n"
                         "\n"
                         "node0 slots=4\n"
                         "  node1\tslots=2 max_slots=8   # the small one\n"
                         "node2 slots=3 max-slots=3\r\n",
                         "hosts.txt")
                         .value();
  EXPECT_EQ(h.path, "hosts.txt");
  EXPECT_EQ(h.names, (std::vector<std::string>{"node0", "node1", "node2"}));
  EXPECT_EQ(h.slots, (std::vector<int64_t>{4, 2, 3}));
  EXPECT_EQ(h.total_slots(), 9);
}

struct BadCase {
  std::string text;
  int line;
  std::string shown;     // the bad text, as the message quotes it
  std::string expected;  // part of what the message says was expected
};

TEST(Hostfile, BadLinesNameFileLineTextAndExpectation) {
  const std::vector<BadCase> cases = {
      {"node0 slots=4\nnode1\n", 2, "'node1'", "slots=N"},
      {"node0 slots=0\n", 1, "'node0 slots=0'", "slots=N with N from 1"},
      {"node0 slots=four\n", 1, "'node0 slots=four'", "slots=N with N from 1"},
      {"node0 slots=-2\n", 1, "'node0 slots=-2'", "slots=N with N from 1"},
      {"# x\n\nnode0 cpus=4\n", 3, "'node0 cpus=4'", "'HOST slots=N"},
      {"slots=4\n", 1, "'slots=4'", "a host name first"},
      {"node0 slots=4\nnode0 slots=2\n", 2, "'node0 slots=2'",
       "already on line 1"},
      {"node0 slots=2 max_slots=x\n", 1, "'node0 slots=2 max_slots=x'",
       "max_slots=N"},
      {"node0 slots=99999999999\n", 1, "'node0 slots=99999999999'",
       "slots=N with N from 1 to 1048576"},
  };
  for (const BadCase& c : cases) {
    absl::StatusOr<Hostfile> h = ParseHostfile(c.text, "hf.txt");
    ASSERT_FALSE(h.ok()) << c.text;
    EXPECT_EQ(h.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(
        std::string(h.status().message()),
        AllOf(HasSubstr("hostfile 'hf.txt'"),
              HasSubstr(absl::StrCat("line ", c.line, ":")), HasSubstr(c.shown),
              HasSubstr("expected"), HasSubstr(c.expected)))
        << c.text;
  }
}

TEST(Hostfile, AFileWithoutHostsIsRefused) {
  absl::StatusOr<Hostfile> h = ParseHostfile("# nothing\n\n", "empty.txt");
  ASSERT_FALSE(h.ok());
  EXPECT_THAT(std::string(h.status().message()),
              AllOf(HasSubstr("'empty.txt' lists no hosts"),
                    HasSubstr("node0 slots=4")));
}

TEST(Hostfile, TooFewSlotsNamesBothNumbers) {
  const Hostfile h = ParseHostfile("a slots=4\nb slots=2\n", "h").value();
  absl::StatusOr<HostMap> m = HostMapFromHostfile(h, 8);
  ASSERT_FALSE(m.ok());
  EXPECT_THAT(std::string(m.status().message()),
              AllOf(HasSubstr("has 6 slots"), HasSubstr("8 ranks")));
}

TEST(Hostfile, FillsSlotsInFileOrderAndDropsEmptyHosts) {
  const Hostfile h =
      ParseHostfile("a slots=4\nb slots=2\nc slots=5\n", "h").value();
  const HostMap m = HostMapFromHostfile(h, 7).value();
  EXPECT_EQ(m.host_count(), 3);
  EXPECT_EQ(m.host_of(3), 0);
  EXPECT_EQ(m.host_of(4), 1);
  EXPECT_EQ(m.host_of(6), 2);
  EXPECT_EQ(m.host_size(2), 1);
  const HostMap small = HostMapFromHostfile(h, 5).value();
  EXPECT_EQ(small.host_count(), 2);  // c gets no rank
  EXPECT_EQ(small.names(), (std::vector<std::string>{"a", "b"}));
}

TEST(Hostfile, LoadNamesAMissingFileAndRefusesAHugeOne) {
  absl::StatusOr<Hostfile> missing = LoadHostfile("/nonexistent/hosts");
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(std::string(missing.status().message()),
              HasSubstr("cannot open hostfile '/nonexistent/hosts'"));

  const std::string path =
      absl::StrCat(::testing::TempDir(), "/vemesh_huge_hostfile");
  {
    std::ofstream out(path, std::ios::binary);
    const std::string line(1023, '#');
    for (int64_t i = 0; i <= kMaxHostfileBytes / 1024; ++i) out << line << "\n";
  }
  absl::StatusOr<Hostfile> huge = LoadHostfile(path);
  std::remove(path.c_str());
  ASSERT_FALSE(huge.ok());
  EXPECT_THAT(std::string(huge.status().message()),
              HasSubstr(absl::StrCat("larger than ", kMaxHostfileBytes)));
}

}  // namespace
}  // namespace vemesh::plan
