// vemesh/comm/mpi/internal/mpi_datatypes.h
//
// vemesh's data types and reductions as MPI's: the native ones, and the
// 16-bit floats, which MPI lacks, as derived datatypes with user operators
// (the host reduction of comm/internal/host_reduce.h inside).
//
//   MPI_Datatype type = MpiDataType(DataType::kBFloat16);
//   MPI_Op sum = MpiReduceOp(ReduceOp::kSum, DataType::kBFloat16);
//   MPI_Allreduce(MPI_IN_PLACE, data, n, type, sum, comm);
//
// Internal to the MPI backend and its tests.

#ifndef VEMESH_COMM_MPI_INTERNAL_MPI_DATATYPES_H_
#define VEMESH_COMM_MPI_INTERNAL_MPI_DATATYPES_H_

#include <mpi.h>

#include "absl/status/status.h"
#include "vemesh/comm/data_type.h"

namespace vemesh {

// The MPI datatype of a vemesh DataType. The 16-bit floats' derived
// datatypes are made on first use (a few local MPI calls, once per process,
// thread-safe; call from a thread that may call MPI) and freed when MPI is
// finalised; MPI_DATATYPE_NULL if MPI could not make them.
MPI_Datatype MpiDataType(DataType type);
// The MPI reduction that combines elements of `type` by `op`: MPI's own
// operators for the native types, vemesh's user operators (fp32 inside) for
// bfloat16 and float16. avg is MPI_SUM (or the 16-bit sum): the caller
// divides by the group size afterwards.
MPI_Op MpiReduceOp(ReduceOp op, DataType type = DataType::kFloat32);

// Why the 16-bit datatypes are MPI_DATATYPE_NULL (OK once they were made):
// for the message of an operation that needed them.
absl::Status MpiHalfTypesStatus();

}  // namespace vemesh

#endif  // VEMESH_COMM_MPI_INTERNAL_MPI_DATATYPES_H_
