// Parsing `vemesh plan` flags, and the whole command run in-process: each bad
// input gives exit code 2 and a message naming the bad value.

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
      "--mesh", "PP=2,TP=4", "--rank=3", "--ranks-per-host", "4",
      "--format=svg", "--color-by", "PP", "--output", "x.svg"};
  const PlanOptions o = ParsePlanArgs(args).value();
  EXPECT_EQ(o.mesh, "PP=2,TP=4");
  EXPECT_EQ(o.rank, 3);
  EXPECT_EQ(o.ranks_per_host, 4);
  EXPECT_EQ(o.format, OutputFormat::kSvg);
  EXPECT_EQ(o.color_by, "PP");
  EXPECT_EQ(o.output, "x.svg");
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
      {{"--mesh", "PP=2,TP=2", "--format", "xml"}, "'xml'"},
      {{"--mesh", "PP=2,TP=2", "--frobnicate"}, "'--frobnicate'"},
      {{"--mesh", "PP=2,TP=2", "stray"}, "'stray'"},
      {{"--mesh"}, "--mesh needs a value"},
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
    EXPECT_EQ(RunPlanCommand({"--mesh", "PP=2,DP=2,TP=2", "--format", fmt},
                             out, err),
              kExitOk);
    EXPECT_FALSE(out.str().empty());
    EXPECT_TRUE(err.str().empty()) << err.str();
  }
  std::ostringstream out, err;
  EXPECT_EQ(RunPlanCommand({"--help"}, out, err), kExitOk);
  EXPECT_NE(out.str().find("--ranks-per-host"), std::string::npos);
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
