// VEMESH_RETURN_IF_ERROR and VEMESH_ASSIGN_OR_RETURN
// (vemesh/base/status_macros.h): the error is returned unchanged, the value is
// moved out, and the right-hand side is evaluated exactly once.
#include "vemesh/base/status_macros.h"

#include <memory>
#include <string>
#include <utility>

#include "gtest/gtest.h"

namespace vemesh {
namespace {

int calls = 0;

absl::Status Fails() {
  ++calls;
  return absl::InvalidArgumentError("bad value 7: expected 3");
}
absl::Status Succeeds() {
  ++calls;
  return absl::OkStatus();
}
absl::StatusOr<std::unique_ptr<int>> Boxed(int v) {
  ++calls;
  if (v < 0) return absl::OutOfRangeError("negative");
  return std::make_unique<int>(v);
}

absl::Status ReturnIfError(bool fail, int* after) {
  VEMESH_RETURN_IF_ERROR(fail ? Fails() : Succeeds());
  *after = 1;
  return absl::OkStatus();
}

absl::StatusOr<int> AssignOrReturn(int v) {
  VEMESH_ASSIGN_OR_RETURN(std::unique_ptr<int> box, Boxed(v));
  VEMESH_ASSIGN_OR_RETURN(auto again, Boxed(*box + 1));  // two on one scope
  int into = 0;
  VEMESH_ASSIGN_OR_RETURN(into, absl::StatusOr<int>(*again * 10));
  return into;
}

absl::Status StatusOrToReturnIfError(int v) {
  VEMESH_RETURN_IF_ERROR(Boxed(v));  // a StatusOr: its status is checked
  return absl::OkStatus();
}

TEST(StatusMacros, ReturnIfErrorReturnsTheErrorUnchanged) {
  calls = 0;
  int after = 0;
  const absl::Status s = ReturnIfError(true, &after);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "bad value 7: expected 3");
  EXPECT_EQ(after, 0);
  EXPECT_EQ(calls, 1);
  EXPECT_TRUE(ReturnIfError(false, &after).ok());
  EXPECT_EQ(after, 1);
  EXPECT_EQ(calls, 2);
}

TEST(StatusMacros, AssignOrReturnMovesTheValueOut) {
  calls = 0;
  auto v = AssignOrReturn(4);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(*v, 50);
  EXPECT_EQ(calls, 2);  // each right-hand side once
  auto bad = AssignOrReturn(-1);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(bad.status().message(), "negative");
}

TEST(StatusMacros, ReturnIfErrorTakesAStatusOr) {
  EXPECT_TRUE(StatusOrToReturnIfError(1).ok());
  EXPECT_EQ(StatusOrToReturnIfError(-1).code(), absl::StatusCode::kOutOfRange);
}

}  // namespace
}  // namespace vemesh
