// vemesh/checkpoint/internal/crc32c.h
//
// CRC32C (Castagnoli), the checksum of every chunk a checkpoint stores:
// SSE4.2's crc32 instruction where the CPU has it, a table otherwise (the
// same value either way).
//
//   uint32_t c = Crc32c(data, size);            // of one buffer
//   uint32_t d = Crc32cExtend(c, more, n);      // of data + more

#ifndef VEMESH_CHECKPOINT_INTERNAL_CRC32C_H_
#define VEMESH_CHECKPOINT_INTERNAL_CRC32C_H_

#include <cstddef>
#include <cstdint>

namespace vemesh::checkpoint::internal {

uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t size);
inline uint32_t Crc32c(const void* data, size_t size) {
  return Crc32cExtend(0, data, size);
}

}  // namespace vemesh::checkpoint::internal

#endif  // VEMESH_CHECKPOINT_INTERNAL_CRC32C_H_
