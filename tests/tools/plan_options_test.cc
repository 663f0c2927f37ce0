// Parsing `vemesh plan` flags, and the whole command run in-process: each bad
// input gives exit code 2 and a message naming the bad value.

#include <chrono>
#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tools/plan/plan_command.h"
#include "tools/plan/plan_options.h"

namespace vemesh::plan {
namespace {

TEST(PlanOptions, ParsesBothFlagForms) {
  const std::vector<std::string> args = {
      "--mesh",       "PP=2,TP=4",  "--rank=3", "--ranks-per-host", "4",
      "--format=svg", "--color-by", "PP",       "--output",         "x.svg"};
  const PlanOptions o = ParsePlanArgs(args).value();
  EXPECT_EQ(o.mesh, "PP=2,TP=4");
  EXPECT_EQ(o.rank, 3);
  EXPECT_EQ(o.ranks_per_host, 4);
  EXPECT_EQ(o.format, OutputFormat::kSvg);
  EXPECT_EQ(o.color_by, "PP");
  EXPECT_EQ(o.output, "x.svg");
}

TEST(PlanOptions, ParsesPlacementHostsRolesAndCheck) {
  const std::vector<std::string> args = {
      "--mesh",  "PP=2,TP=4", "--placement=cyclic",
      "--hosts", "2",         "--latency-sensitive",
      "TP,PP",   "--check",   "job.json"};
  const PlanOptions o = ParsePlanArgs(args).value();
  EXPECT_EQ(o.placement, PlacementPolicy::kCyclic);
  EXPECT_EQ(o.hosts, 2);
  EXPECT_FALSE(o.ranks_per_host.has_value());
  EXPECT_EQ(o.latency_sensitive, (std::vector<std::string>{"TP", "PP"}));
  EXPECT_EQ(o.check, "job.json");
  const PlanOptions h =
      ParsePlanArgs(std::vector<std::string>{"--mesh", "TP=2", "--placement",
                                             "hostfile:a:b.txt",
                                             "--latency-sensitive="})
          .value();
  EXPECT_EQ(h.placement, PlacementPolicy::kHostfile);
  EXPECT_EQ(h.hostfile, "a:b.txt");
  EXPECT_EQ(h.latency_sensitive, std::vector<std::string>{});  // none
  const PlanOptions d =
      ParsePlanArgs(std::vector<std::string>{"--mesh", "TP=2"}).value();
  EXPECT_EQ(d.placement, PlacementPolicy::kBlock);
  EXPECT_FALSE(d.latency_sensitive.has_value());  // TP when the mesh has it
}

struct BadCase {
  std::vector<std::string> args;
  std::string expected_in_message;
};

TEST(PlanCommand, BadInputsExitWithAMessage) {
  const std::vector<BadCase> cases = {
      {{"--mesh", "PP=2,,TP=2"}, "PP=2,,TP=2"},
      {{"--mesh", "PP=x"}, "PP=x"},
      {{"--mesh", "PP=2,PP=2"}, "PP"},
      {{"--mesh", "PP=2,TP=2", "--color-by", "EP"}, "'EP'"},
      {{"--mesh", "PP=2,TP=2", "--rank", "4"}, "--rank 4"},
      {{"--mesh", "PP=2,TP=2", "--rank", "-1"}, "-1"},
      {{"--mesh", "PP=2,TP=2", "--rank", "two"}, "'two'"},
      {{"--mesh", "PP=2,TP=2", "--ranks-per-host", "0"}, "got 0"},
      {{"--mesh", "PP=2,TP=2", "--ranks-per-host", "4097"},
       "--ranks-per-host expects an integer from 1 to 4096, got 4097"},
      {{"--mesh", "PP=2,TP=2", "--format", "xml"}, "'xml'"},
      {{"--mesh", "PP=2,TP=2", "--frobnicate"}, "'--frobnicate'"},
      {{"--mesh", "PP=2,TP=2", "stray"}, "'stray'"},
      {{"--mesh"}, "--mesh needs a value"},
      {{"--mesh", "TP=2", "--placement", "random"},
       "--placement expects block, cyclic or hostfile:FILE, got 'random'"},
      {{"--mesh", "TP=2", "--placement", "hostfile:"}, "got 'hostfile:'"},
      {{"--mesh", "TP=2", "--placement", "hostfile:/nonexistent/h"},
       "cannot open hostfile '/nonexistent/h'"},
      {{"--mesh", "TP=2", "--hosts", "0"}, "--hosts expects a host count"},
      {{"--mesh", "TP=2", "--hosts", "x"}, "'x'"},
      {{"--mesh", "TP=2", "--hosts", "3"},
       "--hosts expects an integer from 1 to the mesh's 2 ranks, got 3"},
      {{"--mesh", "TP=8", "--hosts", "3", "--ranks-per-host", "2"},
       "--hosts 3 and --ranks-per-host 2 disagree: 8 ranks at 2 per host "
       "fill 4 hosts"},
      {{"--mesh", "TP=8", "--hosts", "5"},
       "--hosts 5 cannot be filled in blocks: 8 ranks at 2 per host fill 4"},
      {{"--mesh", "TP=8192", "--hosts", "1"},
       "--hosts 1 puts 8192 of the 8192 ranks on a host: expected at most "
       "4096"},
      {{"--mesh", "PP=2,TP=2", "--latency-sensitive", "TP,EP,CP"},
       "--latency-sensitive names EP, CP, which are not dimensions of "
       "PP=2,TP=2; expected names from PP, TP"},
      {{"--mesh", "PP=2,TP=2", "--latency-sensitive", "TP,,PP"},
       "--latency-sensitive expects dimension names separated by commas"},
      {{"--mesh", "PP=2,TP=2", "--check", ""}, "--check expects the file"},
      {{}, "--mesh is required"},
  };
  for (const BadCase& c : cases) {
    std::ostringstream out, err;
    EXPECT_EQ(RunPlanCommand(c.args, out, err), kExitUsage)
        << c.expected_in_message;
    EXPECT_NE(err.str().find(c.expected_in_message), std::string::npos)
        << err.str();
    EXPECT_TRUE(out.str().empty());
  }
}

TEST(PlanCommand, GoodRunsPrintEveryFormat) {
  for (const std::string fmt : {"table", "json", "svg"}) {
    std::ostringstream out, err;
    EXPECT_EQ(
        RunPlanCommand({"--mesh", "PP=2,DP=2,TP=2", "--format", fmt}, out, err),
        kExitOk);
    EXPECT_FALSE(out.str().empty());
    EXPECT_TRUE(err.str().empty()) << err.str();
  }
  std::ostringstream out, err;
  EXPECT_EQ(RunPlanCommand({"--help"}, out, err), kExitOk);
  EXPECT_NE(out.str().find("--ranks-per-host"), std::string::npos);
}

// Every plan is arithmetic on the shape: a world of 2^62 ranks is planned in
// milliseconds, in every format, with or without a rank view. (Reported:
// TP=10000000000 aborted after 103 s, TP=2^62 never ended.)
TEST(PlanCommand, HugeWorldsArePlannedInWellUnderASecond) {
  const std::vector<std::vector<std::string>> meshes = {
      {"--mesh", "TP=10000000000"},
      {"--mesh", "TP=4611686018427387904", "--rank", "4611686018427387903"},
      {"--mesh", "TP=9223372036854775807", "--ranks-per-host", "4096"},
      {"--mesh", "DP=3037000499,TP=3037000499", "--rank",
       "9223372030926249000"},
      // TP crosses hosts: the order search runs on a huge world too.
      {"--mesh", "PP=3,TP=7,DP=439208192231179800", "--ranks-per-host", "4095"},
      // Six dimensions: every order is tried, at the largest host size.
      {"--mesh", "A=3,B=5,TP=7,C=11,D=13,E=1000000000000", "--ranks-per-host",
       "4096"},
      // Cyclic placement: TP crosses, and the block alternative (2^61 ranks
      // per host) must not be counted rank by rank.
      {"--mesh", "DP=2305843009213693952,TP=2", "--placement", "cyclic",
       "--hosts", "2"},
      {"--mesh", "TP=4611686018427387904", "--placement", "cyclic", "--hosts",
       "3", "--rank", "4611686018427387903"},
      {"--mesh", "A=3,B=5,TP=7,C=11,D=13,E=1000000000000", "--placement",
       "cyclic", "--hosts", "4096", "--latency-sensitive", "TP,A,B,C,D,E"},
      {"--mesh", "DP=2305843009213693952,TP=2", "--hosts",
       "2305843009213693952", "--latency-sensitive", "DP,TP"},
  };
  for (const std::vector<std::string>& mesh : meshes) {
    for (const std::string fmt : {"table", "json", "svg"}) {
      std::vector<std::string> args = mesh;
      args.insert(args.end(), {"--format", fmt});
      std::ostringstream out, err;
      const auto start = std::chrono::steady_clock::now();
      EXPECT_EQ(RunPlanCommand(args, out, err), kExitOk) << err.str();
      const double seconds = std::chrono::duration<double>(
                                 std::chrono::steady_clock::now() - start)
                                 .count();
      EXPECT_LT(seconds, 1.0) << mesh[1] << " " << fmt;
      EXPECT_TRUE(err.str().empty()) << err.str();
      EXPECT_FALSE(out.str().empty());
    }
  }
}

// A stream that refuses the bytes (stdout on a full disk, or closed) fails
// the command with exit 1 and says so; the output is never silently lost.
TEST(PlanCommand, AStdoutThatRefusesTheOutputIsAnIoError) {
  for (const std::vector<std::string>& args :
       std::vector<std::vector<std::string>>{{"--mesh", "PP=2,TP=2"},
                                             {"--help"}}) {
    std::ostream refusing(nullptr);  // no buffer: every write fails
    std::ostringstream err;
    EXPECT_EQ(RunPlanCommand(args, refusing, err), kExitIoError);
    EXPECT_NE(err.str().find("cannot write"), std::string::npos) << err.str();
    EXPECT_NE(err.str().find("stdout"), std::string::npos) << err.str();
  }
}

TEST(PlanCommand, UnwritableOutputIsAnIoError) {
  std::ostringstream out, err;
  EXPECT_EQ(RunPlanCommand({"--mesh", "TP=2", "--output", "/nonexistent/d/x"},
                           out, err),
            kExitIoError);
  EXPECT_NE(err.str().find("/nonexistent/d/x"), std::string::npos);
}

}  // namespace
}  // namespace vemesh::plan
