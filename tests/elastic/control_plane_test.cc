// The elastic control plane's admission and restore (vemesh/elastic/
// control_plane.h): the first descriptor is the job's, a joiner that
// differs is InvalidArgument naming each field, a lost record is
// written back only where it is absent, and a replica's liveness addresses
// are read once per incarnation.

#include "vemesh/elastic/internal/control_plane.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "forwarding_store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "vemesh/rendezvous/memory_store.h"

namespace vemesh {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

TEST(ControlPlaneTest, FirstDescriptorIsTheJobsAndAnEqualOneIsAdmitted) {
  auto store = std::make_shared<MemoryStore>();
  ControlPlane cp(store, "j", 2);
  EXPECT_TRUE(cp.CheckDescriptor("mesh=A;batch=24", 0).ok());
  EXPECT_TRUE(cp.CheckDescriptor("mesh=A;batch=24", 1).ok());
}

TEST(ControlPlaneTest, ADifferentDescriptorIsRefusedNamingEachField) {
  auto store = std::make_shared<MemoryStore>();
  ControlPlane cp(store, "j", 2);
  ASSERT_TRUE(cp.CheckDescriptor("mesh=A;batch=24;lr=0.5", 0).ok());
  absl::Status s = cp.CheckDescriptor("mesh=B;batch=12;seed=1", 3);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(),
              AllOf(HasSubstr("replica 3 cannot join"),
                    HasSubstr("batch is 12 here but 24 in the job"),
                    HasSubstr("mesh is B here but A in the job"),
                    HasSubstr("seed is 1 here but (none) in the job"),
                    HasSubstr("lr is (none) here but 0.5 in the job")));
  // The job's descriptor is unchanged.
  EXPECT_TRUE(cp.CheckDescriptor("mesh=A;batch=24;lr=0.5", 1).ok());
  // A fresh job under the same name replaces it.
  ASSERT_TRUE(cp.SetDescriptor("mesh=B;batch=12;seed=1").ok());
  EXPECT_TRUE(cp.CheckDescriptor("mesh=B;batch=12;seed=1", 3).ok());
}

TEST(ControlPlaneTest, RestoreWritesBackOnlyWhatIsAbsent) {
  auto store = std::make_shared<MemoryStore>();
  ControlPlane cp(store, "j", 1);
  MembershipRecord mine;
  mine.epoch = 4;
  mine.members = {0, 2};
  // Lost (a Redis restarted empty): written back.
  ASSERT_TRUE(cp.RestoreIfAbsent(EncodeMembership(mine), "mesh=A").ok());
  auto now = cp.Read();
  ASSERT_TRUE(now.ok()) << now.status();
  EXPECT_EQ(now->record, mine);
  EXPECT_TRUE(cp.CheckDescriptor("mesh=A", 2).ok());
  EXPECT_FALSE(cp.CheckDescriptor("mesh=B", 2).ok());
  // Present (a newer epoch made by another replica): left alone.
  MembershipRecord newer;
  newer.epoch = 5;
  newer.members = {0};
  ASSERT_TRUE(cp.Transition(*now, newer).ok());
  ASSERT_TRUE(cp.RestoreIfAbsent(EncodeMembership(mine), "mesh=A").ok());
  now = cp.Read();
  ASSERT_TRUE(now.ok()) << now.status();
  EXPECT_EQ(now->record, newer);
  // An evicted replica has nothing to restore.
  EXPECT_TRUE(cp.RestoreIfAbsent("", "mesh=A").ok());
}

// Issue 44: a store restarted empty loses every lease at once; absent
// leases are not trusted until a grace after the first renewal that finds
// the store's mark gone (the job's start counts as one).
TEST(ControlPlaneTest, LeasesAreNotTrustedRightAfterTheStoreLostThem) {
  auto store = std::make_shared<MemoryStore>();
  ControlPlane cp(store, "j", 1);
  auto trusted = cp.LeasesTrusted();
  ASSERT_TRUE(trusted.ok()) << trusted.status();
  EXPECT_FALSE(*trusted);  // no mark yet: the store may have lost them
  ASSERT_TRUE(cp.NoteStoreUp(absl::Milliseconds(200)).ok());
  ASSERT_TRUE(cp.NoteStoreUp(absl::Milliseconds(200)).ok());  // no new grace
  trusted = cp.LeasesTrusted();
  ASSERT_TRUE(trusted.ok());
  EXPECT_FALSE(*trusted);  // within the grace
  const absl::Time until = absl::Now() + absl::Seconds(10);
  while (absl::Now() < until && !*cp.LeasesTrusted()) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_TRUE(*cp.LeasesTrusted());
  // The store restarted empty: untrusted until the next mark's grace ends.
  ASSERT_TRUE(store->remove("vemesh/elastic/j/store_up").ok());
  EXPECT_FALSE(*cp.LeasesTrusted());
  ASSERT_TRUE(cp.NoteStoreUp(absl::Milliseconds(200)).ok());
  EXPECT_FALSE(*cp.LeasesTrusted());
}

// A store that is unreachable for its first `down` reads (a Redis
// restarting), then a MemoryStore.
class RestartingStore : public testing::ForwardingStore {
 public:
  explicit RestartingStore(int down) : down_(down) {}
  absl::StatusOr<std::string> get(absl::string_view key) override {
    if (down_ > 0) {
      --down_;
      return absl::UnavailableError("Redis at 127.0.0.1:1 is unreachable");
    }
    return ForwardingStore::get(key);
  }

 private:
  int down_;
};

// Issue 44: Read rides out an unreachable store within its bound (the
// elastic mesh's lease TTL), and fails Unavailable past it.
TEST(ControlPlaneTest, ReadRetriesAnUnreachableStoreWithinItsBound) {
  auto store = std::make_shared<RestartingStore>(3);
  ControlPlane cp(store, "j", 1);
  cp.set_retry_for(absl::Seconds(5));
  auto now = cp.Read();
  ASSERT_TRUE(now.ok()) << now.status();
  EXPECT_EQ(now->record.epoch, 0);
  auto never = std::make_shared<RestartingStore>(1 << 30);
  ControlPlane gone(never, "j", 1);
  gone.set_retry_for(absl::Milliseconds(200));
  const absl::Time start = absl::Now();
  EXPECT_TRUE(absl::IsUnavailable(gone.Read().status()));
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  ControlPlane once(std::make_shared<RestartingStore>(1), "j", 1);
  EXPECT_TRUE(absl::IsUnavailable(once.Read().status()));  // no bound: once
}

// The one reader of the probe keys: a complete set is read once and kept
// (an incarnation's addresses never change), an incomplete one again.
TEST(ControlPlaneTest, ProbeAddressesAreReadOncePerIncarnation) {
  auto store = std::make_shared<MemoryStore>();
  ControlPlane cp(store, "j", 2);
  ASSERT_TRUE(store->set(cp.ProbeKey(3, 0xab, 0), "127.0.0.1:1").ok());
  auto got = cp.ProbeAddresses(3, 0xab);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, (std::vector<std::string>{"127.0.0.1:1", ""}));
  ASSERT_TRUE(store->set(cp.ProbeKey(3, 0xab, 1), "127.0.0.1:2").ok());
  got = cp.ProbeAddresses(3, 0xab);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, (std::vector<std::string>{"127.0.0.1:1", "127.0.0.1:2"}));
  // Complete: kept, the store is not read again.
  ASSERT_TRUE(store->remove(cp.ProbeKey(3, 0xab, 1)).ok());
  got = cp.ProbeAddresses(3, 0xab);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, (std::vector<std::string>{"127.0.0.1:1", "127.0.0.1:2"}));
  // Another incarnation of the same replica is its own.
  got = cp.ProbeAddresses(3, 0xac);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, (std::vector<std::string>{"", ""}));
}

}  // namespace
}  // namespace vemesh
