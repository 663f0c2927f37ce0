// bench/call_count.h
//
// Counts this process's calls to MPI's collective operations, by the MPI
// profiling interface: the program defines MPI_Comm_split & co., which count
// and forward to PMPI_Comm_split & co. Whoever calls them, vemesh or the
// baselines, is counted, so "collective calls per rank" in bench/RESULTS.md
// is measured, not assumed. Only calls made through the MPI API are seen (a
// call MPI makes inside itself, e.g. MPI_Cart_sub's own split, is not).
//
//   CallCounts before = CollectiveCalls();
//   ... make the communicators ...
//   CallCounts used = CollectiveCalls() - before;
//   used.total();          // 5
//   used.ToString();       // "3 Comm_split + 1 Comm_dup + 1 Comm_split_type"
//
// AllCalls() also counts the local calls and the waits (MPI_Comm_group,
// MPI_Comm_set_errhandler, MPI_Test, ...) and times every kind, to tell
// where a method's time inside MPI went.

#ifndef VEMESH_BENCH_CALL_COUNT_H_
#define VEMESH_BENCH_CALL_COUNT_H_

#include <array>
#include <cstdint>
#include <string>

namespace vemesh::bench {

enum class Call {
  kCommSplit,
  kCommSplitType,
  kCommDup,
  kCommIdup,
  kCommCreate,
  kCommCreateGroup,
  kCartCreate,
  kCartSub,
  kAllreduce,
  kIallreduce,
  kAllgather,
  kIallgather,
  kIallgatherv,
  kBcast,
  kIbcast,
  kBarrier,
  kIbarrier,
  // Local calls (no communication) and the waits: counted and timed by
  // AllCalls() only, so that a method's every MPI call can be compared.
  kCommGroup,
  kGroupIncl,
  kGroupTranslateRanks,
  kGroupFree,
  kCommSetErrhandler,
  kCommSetAttr,
  kCommRank,
  kCommSize,
  kCommFree,
  kTest,
  kWait,
  kIsThreadMain,
  kQueryThread,
  kInitialized,
  kFinalized,
  kCount  // number of kinds
};

// The first kind that is not a collective.
inline constexpr Call kFirstLocal = Call::kCommGroup;

struct CallCounts {
  std::array<int64_t, static_cast<size_t>(Call::kCount)> n{};
  // Wall seconds spent inside each kind's calls (AllCalls() only).
  std::array<double, static_cast<size_t>(Call::kCount)> seconds{};
  int64_t total() const;
  // "3 Comm_split + 1 Comm_dup", kinds in enum order; "0" when none.
  std::string ToString() const;
  friend CallCounts operator-(const CallCounts& a, const CallCounts& b);
};

// The collective kinds only (what the tables call "collective calls").
CallCounts CollectiveCalls();
// Every kind above, with the time spent in each.
CallCounts AllCalls();
// Kind i's name ("Comm_split").
const char* CallName(size_t i);

}  // namespace vemesh::bench

#endif  // VEMESH_BENCH_CALL_COUNT_H_
