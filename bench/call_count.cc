#include "bench/call_count.h"

#include <mpi.h>

#include <chrono>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace vemesh::bench {
namespace {

// One process, one thread makes these calls: plain counters will do.
CallCounts g_counts;

// Counts a call and adds the time until it goes out of scope.
class Timed {
 public:
  explicit Timed(Call c)
      : i_(static_cast<size_t>(c)), start_(std::chrono::steady_clock::now()) {
    ++g_counts.n[i_];
  }
  ~Timed() {
    g_counts.seconds[i_] +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start_)
            .count();
  }

 private:
  size_t i_;
  std::chrono::steady_clock::time_point start_;
};

const char* const kNames[] = {"Comm_split",     "Comm_split_type",
                              "Comm_dup",       "Comm_idup",
                              "Comm_create",    "Comm_create_group",
                              "Cart_create",    "Cart_sub",
                              "Allreduce",      "Iallreduce",
                              "Allgather",      "Iallgather",
                              "Iallgatherv",    "Bcast",
                              "Ibcast",         "Barrier",
                              "Ibarrier",       "Comm_group",
                              "Group_incl",     "Group_translate_ranks",
                              "Group_free",     "Comm_set_errhandler",
                              "Comm_set_attr",  "Comm_rank",
                              "Comm_size",      "Comm_free",
                              "Test",           "Wait",
                              "Is_thread_main", "Query_thread",
                              "Initialized",    "Finalized"};
static_assert(sizeof(kNames) / sizeof(kNames[0]) ==
              static_cast<size_t>(Call::kCount));

}  // namespace

int64_t CallCounts::total() const {
  int64_t t = 0;
  for (int64_t v : n) t += v;
  return t;
}

std::string CallCounts::ToString() const {
  std::vector<std::string> parts;
  for (size_t i = 0; i < n.size(); ++i) {
    if (n[i] != 0) parts.push_back(absl::StrCat(n[i], " ", kNames[i]));
  }
  return parts.empty() ? "0" : absl::StrJoin(parts, " + ");
}

CallCounts operator-(const CallCounts& a, const CallCounts& b) {
  CallCounts out;
  for (size_t i = 0; i < out.n.size(); ++i) {
    out.n[i] = a.n[i] - b.n[i];
    out.seconds[i] = a.seconds[i] - b.seconds[i];
  }
  return out;
}

CallCounts CollectiveCalls() {
  CallCounts out;
  for (size_t i = 0; i < static_cast<size_t>(kFirstLocal); ++i) {
    out.n[i] = g_counts.n[i];
  }
  return out;
}

CallCounts AllCalls() { return g_counts; }

const char* CallName(size_t i) { return kNames[i]; }

}  // namespace vemesh::bench

// -- The interposed MPI calls: count, then forward to the PMPI entry point ----

using vemesh::bench::Call;
using vemesh::bench::Timed;

extern "C" {

int MPI_Comm_split(MPI_Comm comm, int color, int key, MPI_Comm* out) {
  Timed t(Call::kCommSplit);
  return PMPI_Comm_split(comm, color, key, out);
}
int MPI_Comm_split_type(MPI_Comm comm, int type, int key, MPI_Info info,
                        MPI_Comm* out) {
  Timed t(Call::kCommSplitType);
  return PMPI_Comm_split_type(comm, type, key, info, out);
}
int MPI_Comm_dup(MPI_Comm comm, MPI_Comm* out) {
  Timed t(Call::kCommDup);
  return PMPI_Comm_dup(comm, out);
}
int MPI_Comm_idup(MPI_Comm comm, MPI_Comm* out, MPI_Request* request) {
  Timed t(Call::kCommIdup);
  return PMPI_Comm_idup(comm, out, request);
}
int MPI_Comm_create(MPI_Comm comm, MPI_Group group, MPI_Comm* out) {
  Timed t(Call::kCommCreate);
  return PMPI_Comm_create(comm, group, out);
}
int MPI_Comm_create_group(MPI_Comm comm, MPI_Group group, int tag,
                          MPI_Comm* out) {
  Timed t(Call::kCommCreateGroup);
  return PMPI_Comm_create_group(comm, group, tag, out);
}
int MPI_Cart_create(MPI_Comm comm, int ndims, const int dims[],
                    const int periods[], int reorder, MPI_Comm* out) {
  Timed t(Call::kCartCreate);
  return PMPI_Cart_create(comm, ndims, dims, periods, reorder, out);
}
int MPI_Cart_sub(MPI_Comm comm, const int remain[], MPI_Comm* out) {
  Timed t(Call::kCartSub);
  return PMPI_Cart_sub(comm, remain, out);
}
int MPI_Allreduce(const void* send, void* recv, int count, MPI_Datatype type,
                  MPI_Op op, MPI_Comm comm) {
  Timed t(Call::kAllreduce);
  return PMPI_Allreduce(send, recv, count, type, op, comm);
}
int MPI_Iallreduce(const void* send, void* recv, int count, MPI_Datatype type,
                   MPI_Op op, MPI_Comm comm, MPI_Request* request) {
  Timed t(Call::kIallreduce);
  return PMPI_Iallreduce(send, recv, count, type, op, comm, request);
}
int MPI_Allgather(const void* send, int send_count, MPI_Datatype send_type,
                  void* recv, int recv_count, MPI_Datatype recv_type,
                  MPI_Comm comm) {
  Timed t(Call::kAllgather);
  return PMPI_Allgather(send, send_count, send_type, recv, recv_count,
                        recv_type, comm);
}
int MPI_Iallgather(const void* send, int send_count, MPI_Datatype send_type,
                   void* recv, int recv_count, MPI_Datatype recv_type,
                   MPI_Comm comm, MPI_Request* request) {
  Timed t(Call::kIallgather);
  return PMPI_Iallgather(send, send_count, send_type, recv, recv_count,
                         recv_type, comm, request);
}
int MPI_Iallgatherv(const void* send, int send_count, MPI_Datatype send_type,
                    void* recv, const int recv_counts[], const int displs[],
                    MPI_Datatype recv_type, MPI_Comm comm,
                    MPI_Request* request) {
  Timed t(Call::kIallgatherv);
  return PMPI_Iallgatherv(send, send_count, send_type, recv, recv_counts,
                          displs, recv_type, comm, request);
}
int MPI_Bcast(void* data, int count, MPI_Datatype type, int root,
              MPI_Comm comm) {
  Timed t(Call::kBcast);
  return PMPI_Bcast(data, count, type, root, comm);
}
int MPI_Ibcast(void* data, int count, MPI_Datatype type, int root,
               MPI_Comm comm, MPI_Request* request) {
  Timed t(Call::kIbcast);
  return PMPI_Ibcast(data, count, type, root, comm, request);
}
int MPI_Barrier(MPI_Comm comm) {
  Timed t(Call::kBarrier);
  return PMPI_Barrier(comm);
}
int MPI_Ibarrier(MPI_Comm comm, MPI_Request* request) {
  Timed t(Call::kIbarrier);
  return PMPI_Ibarrier(comm, request);
}

int MPI_Comm_group(MPI_Comm comm, MPI_Group* group) {
  Timed t(Call::kCommGroup);
  return PMPI_Comm_group(comm, group);
}
int MPI_Group_incl(MPI_Group group, int n, const int ranks[], MPI_Group* out) {
  Timed t(Call::kGroupIncl);
  return PMPI_Group_incl(group, n, ranks, out);
}
int MPI_Group_translate_ranks(MPI_Group a, int n, const int ranks_a[],
                              MPI_Group b, int ranks_b[]) {
  Timed t(Call::kGroupTranslateRanks);
  return PMPI_Group_translate_ranks(a, n, ranks_a, b, ranks_b);
}
int MPI_Group_free(MPI_Group* group) {
  Timed t(Call::kGroupFree);
  return PMPI_Group_free(group);
}
int MPI_Comm_set_errhandler(MPI_Comm comm, MPI_Errhandler handler) {
  Timed t(Call::kCommSetErrhandler);
  return PMPI_Comm_set_errhandler(comm, handler);
}
int MPI_Comm_set_attr(MPI_Comm comm, int keyval, void* value) {
  Timed t(Call::kCommSetAttr);
  return PMPI_Comm_set_attr(comm, keyval, value);
}
int MPI_Comm_rank(MPI_Comm comm, int* rank) {
  Timed t(Call::kCommRank);
  return PMPI_Comm_rank(comm, rank);
}
int MPI_Comm_size(MPI_Comm comm, int* size) {
  Timed t(Call::kCommSize);
  return PMPI_Comm_size(comm, size);
}
int MPI_Comm_free(MPI_Comm* comm) {
  Timed t(Call::kCommFree);
  return PMPI_Comm_free(comm);
}
int MPI_Test(MPI_Request* request, int* flag, MPI_Status* status) {
  Timed t(Call::kTest);
  return PMPI_Test(request, flag, status);
}
int MPI_Wait(MPI_Request* request, MPI_Status* status) {
  Timed t(Call::kWait);
  return PMPI_Wait(request, status);
}
int MPI_Is_thread_main(int* flag) {
  Timed t(Call::kIsThreadMain);
  return PMPI_Is_thread_main(flag);
}
int MPI_Query_thread(int* level) {
  Timed t(Call::kQueryThread);
  return PMPI_Query_thread(level);
}
int MPI_Initialized(int* flag) {
  Timed t(Call::kInitialized);
  return PMPI_Initialized(flag);
}
int MPI_Finalized(int* flag) {
  Timed t(Call::kFinalized);
  return PMPI_Finalized(flag);
}

}  // extern "C"
