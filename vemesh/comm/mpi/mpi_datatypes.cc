#include "vemesh/comm/mpi/internal/mpi_datatypes.h"

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>

#include "vemesh/base/status_macros.h"
#include "vemesh/comm/internal/host_reduce.h"
#include "vemesh/comm/mpi/mpi_environment.h"

namespace vemesh {
namespace {

// MPI has no bfloat16 or float16: each is a derived datatype of two bytes
// with user operators that combine in float and round back once per pair.

// An MPI user function (inout[i] = in[i] op inout[i]) over the host
// reduction (comm/internal/host_reduce.h): fp32 inside, one rounding.
template <typename T, ReduceOp kOp>
void Combine16(void* in, void* inout, int* len, MPI_Datatype*) {
  HostCombine<T, kOp>(inout, in, inout, static_cast<size_t>(*len));
}

// The operators of one 16-bit type, by ReduceOp (avg shares sum's).
constexpr int kOps = 4;  // sum, prod, min, max
int OpIndex(ReduceOp op) {
  switch (op) {
    case ReduceOp::kProd:
      return 1;
    case ReduceOp::kMin:
      return 2;
    case ReduceOp::kMax:
      return 3;
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      break;
  }
  return 0;
}

struct Half {
  MPI_Datatype type = MPI_DATATYPE_NULL;
  MPI_Op ops[kOps] = {MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL};
};
struct Halves {
  Half bf16;
  Half fp16;
  absl::Status status;
};

// Made once, then only read: the handles are plain values that MPI keeps
// valid until they are freed, which happens inside MPI_Finalize (below).
// Not made (and not latched as failed) while MPI is not running.
Halves halves;
std::atomic<bool> halves_made{false};
std::mutex halves_mu;

// Runs at the start of MPI_Finalize (attributes of MPI_COMM_SELF are
// deleted first, MPI 3.1 8.7.1): gives the types and operators back while
// MPI is still alive, so that leak checkers see nothing of ours. Nothing
// can use them afterwards: every MPI call is refused after finalisation.
int FreeHalves(MPI_Comm, int, void*, void*) {
  for (Half* h : {&halves.bf16, &halves.fp16}) {
    for (MPI_Op& op : h->ops) {
      if (op != MPI_OP_NULL) MPI_Op_free(&op);
    }
    if (h->type != MPI_DATATYPE_NULL) MPI_Type_free(&h->type);
  }
  return MPI_SUCCESS;
}

template <typename T>
absl::Status MakeHalf(Half* h) {
  VEMESH_RETURN_IF_ERROR(MpiStatus(MPI_Type_contiguous(2, MPI_BYTE, &h->type),
                                   "MPI_Type_contiguous"));
  VEMESH_RETURN_IF_ERROR(
      MpiStatus(MPI_Type_commit(&h->type), "MPI_Type_commit"));
  MPI_User_function* fns[kOps] = {
      &Combine16<T, ReduceOp::kSum>, &Combine16<T, ReduceOp::kProd>,
      &Combine16<T, ReduceOp::kMin>, &Combine16<T, ReduceOp::kMax>};
  for (int i = 0; i < kOps; ++i) {
    VEMESH_RETURN_IF_ERROR(MpiStatus(
        MPI_Op_create(fns[i], /*commute=*/1, &h->ops[i]), "MPI_Op_create"));
  }
  return absl::OkStatus();
}

const Halves& GetHalves() {
  if (halves_made.load(std::memory_order_acquire)) return halves;
  std::lock_guard<std::mutex> lock(halves_mu);
  if (halves_made.load(std::memory_order_relaxed)) return halves;
  if (!MpiIsUsable()) {
    static const Halves* const not_yet = [] {
      auto* h = new Halves;
      h->status = absl::FailedPreconditionError(
          "the 16-bit MPI datatypes need a running MPI");
      return h;
    }();
    return *not_yet;
  }
  halves.status = MakeHalf<BFloat16>(&halves.bf16);
  if (halves.status.ok()) halves.status = MakeHalf<Float16>(&halves.fp16);
  int key = MPI_KEYVAL_INVALID;
  if (MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, FreeHalves, &key,
                             nullptr) == MPI_SUCCESS) {
    MPI_Comm_set_attr(MPI_COMM_SELF, key, nullptr);
  }
  halves_made.store(true, std::memory_order_release);
  return halves;
}

const Half* HalfOf(DataType type) {
  if (type != DataType::kBFloat16 && type != DataType::kFloat16) return nullptr;
  const Halves& h = GetHalves();
  if (!h.status.ok()) return nullptr;
  return type == DataType::kBFloat16 ? &h.bf16 : &h.fp16;
}

}  // namespace

MPI_Datatype MpiDataType(DataType type) {
  switch (type) {
    case DataType::kFloat32:
      return MPI_FLOAT;
    case DataType::kFloat64:
      return MPI_DOUBLE;
    case DataType::kInt32:
      return MPI_INT32_T;
    case DataType::kInt64:
      return MPI_INT64_T;
    case DataType::kInt8:
      return MPI_INT8_T;
    case DataType::kUInt8:
      return MPI_UINT8_T;
    case DataType::kBFloat16:
    case DataType::kFloat16: {
      const Half* h = HalfOf(type);
      return h == nullptr ? MPI_DATATYPE_NULL : h->type;
    }
  }
  return MPI_DATATYPE_NULL;
}

MPI_Op MpiReduceOp(ReduceOp op, DataType type) {
  if (type == DataType::kBFloat16 || type == DataType::kFloat16) {
    const Half* h = HalfOf(type);
    return h == nullptr ? MPI_OP_NULL : h->ops[OpIndex(op)];
  }
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      return MPI_SUM;
    case ReduceOp::kProd:
      return MPI_PROD;
    case ReduceOp::kMax:
      return MPI_MAX;
    case ReduceOp::kMin:
      return MPI_MIN;
  }
  return MPI_OP_NULL;
}

absl::Status MpiHalfTypesStatus() { return GetHalves().status; }

}  // namespace vemesh
