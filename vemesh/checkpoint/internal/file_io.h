// vemesh/checkpoint/internal/file_io.h
//
// The POSIX file operations a checkpoint needs, each returning a Status
// that names the file and the system's reason (ENOSPC: ResourceExhausted,
// EACCES: PermissionDenied, ENOENT: NotFound).
//
//   VEMESH_ASSIGN_OR_RETURN(File f, File::Create(path));
//   VEMESH_RETURN_IF_ERROR(f.WriteAll(data, size));
//   VEMESH_RETURN_IF_ERROR(f.Sync());
//   VEMESH_RETURN_IF_ERROR(SyncDirectory(dir));

#ifndef VEMESH_CHECKPOINT_INTERNAL_FILE_IO_H_
#define VEMESH_CHECKPOINT_INTERNAL_FILE_IO_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace vemesh::checkpoint::internal {

// "<what> '<path>': <strerror>" with the code ErrnoToStatusCode gives.
absl::Status FileError(int error_number, absl::string_view what,
                       absl::string_view path);

// An open file descriptor, closed by the destructor.
class File {
 public:
  // Truncates or creates (mode 0644) for writing.
  static absl::StatusOr<File> Create(const std::string& path);
  static absl::StatusOr<File> OpenRead(const std::string& path);
  File(File&& other) noexcept;
  File& operator=(File&& other) noexcept;
  ~File();

  absl::Status WriteAll(const void* data, size_t size);
  // Exactly `size` bytes at `offset`; DataLoss naming the file when it ends
  // first (truncated).
  absl::Status PreadAll(void* data, size_t size, uint64_t offset) const;
  // Asks the kernel to start reading [offset, +size) into the page cache
  // and returns at once (posix_fadvise WILLNEED): a later PreadAll of the
  // range then waits less. Only a hint: errors are ignored.
  void WillNeed(uint64_t offset, uint64_t size) const;
  absl::Status Sync();
  absl::StatusOr<uint64_t> Size() const;
  // Reports a failed close (NFS and full disks report late).
  absl::Status Close();
  const std::string& path() const { return path_; }

 private:
  File(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  int fd_ = -1;
  std::string path_;
};

// fsync of a directory, so the names created in it are durable.
absl::Status SyncDirectory(const std::string& path);
// The whole file, refused (InvalidArgument) when larger than `max_bytes`.
absl::StatusOr<std::string> ReadSmallFile(const std::string& path,
                                          uint64_t max_bytes);
// Replaces `path` atomically: writes <path>.tmp, fsyncs it, renames it over
// `path`, fsyncs the directory. A crash leaves the old or the new content.
absl::Status WriteFileAtomically(const std::string& path,
                                 absl::string_view content);

}  // namespace vemesh::checkpoint::internal

#endif  // VEMESH_CHECKPOINT_INTERNAL_FILE_IO_H_
