#include "bench/call_count.h"

#include <mpi.h>

#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace vemesh::bench {
namespace {

// One process, one thread makes these calls: plain counters will do.
CallCounts g_counts;

void Count(Call c) { ++g_counts.n[static_cast<size_t>(c)]; }

const char* const kNames[] = {
    "Comm_split",  "Comm_split_type", "Comm_dup",
    "Comm_idup",   "Comm_create",     "Comm_create_group",
    "Cart_create", "Cart_sub",        "Allreduce",
    "Iallreduce",  "Allgather",       "Iallgather",
    "Iallgatherv", "Bcast",           "Ibcast",
    "Barrier",     "Ibarrier"};
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
  for (size_t i = 0; i < out.n.size(); ++i) out.n[i] = a.n[i] - b.n[i];
  return out;
}

CallCounts CollectiveCalls() { return g_counts; }

}  // namespace vemesh::bench

// -- The interposed MPI calls: count, then forward to the PMPI entry point ----

using vemesh::bench::Call;
using vemesh::bench::Count;

extern "C" {

int MPI_Comm_split(MPI_Comm comm, int color, int key, MPI_Comm* out) {
  Count(Call::kCommSplit);
  return PMPI_Comm_split(comm, color, key, out);
}
int MPI_Comm_split_type(MPI_Comm comm, int type, int key, MPI_Info info,
                        MPI_Comm* out) {
  Count(Call::kCommSplitType);
  return PMPI_Comm_split_type(comm, type, key, info, out);
}
int MPI_Comm_dup(MPI_Comm comm, MPI_Comm* out) {
  Count(Call::kCommDup);
  return PMPI_Comm_dup(comm, out);
}
int MPI_Comm_idup(MPI_Comm comm, MPI_Comm* out, MPI_Request* request) {
  Count(Call::kCommIdup);
  return PMPI_Comm_idup(comm, out, request);
}
int MPI_Comm_create(MPI_Comm comm, MPI_Group group, MPI_Comm* out) {
  Count(Call::kCommCreate);
  return PMPI_Comm_create(comm, group, out);
}
int MPI_Comm_create_group(MPI_Comm comm, MPI_Group group, int tag,
                          MPI_Comm* out) {
  Count(Call::kCommCreateGroup);
  return PMPI_Comm_create_group(comm, group, tag, out);
}
int MPI_Cart_create(MPI_Comm comm, int ndims, const int dims[],
                    const int periods[], int reorder, MPI_Comm* out) {
  Count(Call::kCartCreate);
  return PMPI_Cart_create(comm, ndims, dims, periods, reorder, out);
}
int MPI_Cart_sub(MPI_Comm comm, const int remain[], MPI_Comm* out) {
  Count(Call::kCartSub);
  return PMPI_Cart_sub(comm, remain, out);
}
int MPI_Allreduce(const void* send, void* recv, int count, MPI_Datatype type,
                  MPI_Op op, MPI_Comm comm) {
  Count(Call::kAllreduce);
  return PMPI_Allreduce(send, recv, count, type, op, comm);
}
int MPI_Iallreduce(const void* send, void* recv, int count, MPI_Datatype type,
                   MPI_Op op, MPI_Comm comm, MPI_Request* request) {
  Count(Call::kIallreduce);
  return PMPI_Iallreduce(send, recv, count, type, op, comm, request);
}
int MPI_Allgather(const void* send, int send_count, MPI_Datatype send_type,
                  void* recv, int recv_count, MPI_Datatype recv_type,
                  MPI_Comm comm) {
  Count(Call::kAllgather);
  return PMPI_Allgather(send, send_count, send_type, recv, recv_count,
                        recv_type, comm);
}
int MPI_Iallgather(const void* send, int send_count, MPI_Datatype send_type,
                   void* recv, int recv_count, MPI_Datatype recv_type,
                   MPI_Comm comm, MPI_Request* request) {
  Count(Call::kIallgather);
  return PMPI_Iallgather(send, send_count, send_type, recv, recv_count,
                         recv_type, comm, request);
}
int MPI_Iallgatherv(const void* send, int send_count, MPI_Datatype send_type,
                    void* recv, const int recv_counts[], const int displs[],
                    MPI_Datatype recv_type, MPI_Comm comm,
                    MPI_Request* request) {
  Count(Call::kIallgatherv);
  return PMPI_Iallgatherv(send, send_count, send_type, recv, recv_counts,
                          displs, recv_type, comm, request);
}
int MPI_Bcast(void* data, int count, MPI_Datatype type, int root,
              MPI_Comm comm) {
  Count(Call::kBcast);
  return PMPI_Bcast(data, count, type, root, comm);
}
int MPI_Ibcast(void* data, int count, MPI_Datatype type, int root,
               MPI_Comm comm, MPI_Request* request) {
  Count(Call::kIbcast);
  return PMPI_Ibcast(data, count, type, root, comm, request);
}
int MPI_Barrier(MPI_Comm comm) {
  Count(Call::kBarrier);
  return PMPI_Barrier(comm);
}
int MPI_Ibarrier(MPI_Comm comm, MPI_Request* request) {
  Count(Call::kIbarrier);
  return PMPI_Ibarrier(comm, request);
}

}  // extern "C"
