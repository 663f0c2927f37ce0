// vemesh/checkpoint/internal/file_io.cc

#include "vemesh/checkpoint/internal/file_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "vemesh/base/status_macros.h"

namespace vemesh::checkpoint::internal {

absl::Status FileError(int error_number, absl::string_view what,
                       absl::string_view path) {
  return absl::Status(
      absl::ErrnoToStatusCode(error_number),
      absl::StrCat(what, " '", path, "': ", std::strerror(error_number)));
}

absl::StatusOr<File> File::Create(const std::string& path) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return FileError(errno, "cannot create", path);
  return File(fd, path);
}

absl::StatusOr<File> File::OpenRead(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return FileError(errno, "cannot open", path);
  return File(fd, path);
}

File::File(File&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)), path_(std::move(other.path_)) {}

File& File::operator=(File&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(other.fd_, -1);
    path_ = std::move(other.path_);
  }
  return *this;
}

File::~File() {
  if (fd_ >= 0) ::close(fd_);
}

absl::Status File::WriteAll(const void* data, size_t size) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    ssize_t n = ::write(fd_, p, std::min<size_t>(size, size_t{1} << 30));
    if (n < 0) {
      if (errno == EINTR) continue;
      return FileError(errno, "cannot write", path_);
    }
    p += n;
    size -= static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

absl::Status File::PreadAll(void* data, size_t size, uint64_t offset) const {
  char* p = static_cast<char*>(data);
  while (size > 0) {
    ssize_t n = ::pread(fd_, p, std::min<size_t>(size, size_t{1} << 30),
                        static_cast<off_t>(offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      return FileError(errno, "cannot read", path_);
    }
    if (n == 0) {
      return absl::DataLossError(
          absl::StrCat("file '", path_, "' ends at byte ", offset, ", ", size,
                       " bytes short of what the manifest says (truncated)"));
    }
    p += n;
    size -= static_cast<size_t>(n);
    offset += static_cast<uint64_t>(n);
  }
  return absl::OkStatus();
}

void File::WillNeed(uint64_t offset, uint64_t size) const {
  (void)::posix_fadvise(fd_, static_cast<off_t>(offset),
                        static_cast<off_t>(size), POSIX_FADV_WILLNEED);
}

absl::Status File::Sync() {
  if (::fsync(fd_) != 0) return FileError(errno, "cannot fsync", path_);
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> File::Size() const {
  struct stat st;
  if (::fstat(fd_, &st) != 0) return FileError(errno, "cannot stat", path_);
  return static_cast<uint64_t>(st.st_size);
}

absl::Status File::Close() {
  if (fd_ < 0) return absl::OkStatus();
  int rc = ::close(std::exchange(fd_, -1));
  if (rc != 0) return FileError(errno, "cannot close", path_);
  return absl::OkStatus();
}

absl::Status SyncDirectory(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return FileError(errno, "cannot open directory", path);
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  if (rc != 0) return FileError(err, "cannot fsync directory", path);
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadSmallFile(const std::string& path,
                                          uint64_t max_bytes) {
  VEMESH_ASSIGN_OR_RETURN(File f, File::OpenRead(path));
  VEMESH_ASSIGN_OR_RETURN(uint64_t size, f.Size());
  if (size > max_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "file '", path, "' is ", size, " bytes, expected at most ", max_bytes));
  }
  std::string out(size, '\0');
  VEMESH_RETURN_IF_ERROR(f.PreadAll(out.data(), size, 0));
  return out;
}

absl::Status WriteFileAtomically(const std::string& path,
                                 absl::string_view content) {
  const std::string tmp = path + ".tmp";
  {
    VEMESH_ASSIGN_OR_RETURN(File f, File::Create(tmp));
    VEMESH_RETURN_IF_ERROR(f.WriteAll(content.data(), content.size()));
    VEMESH_RETURN_IF_ERROR(f.Sync());
    VEMESH_RETURN_IF_ERROR(f.Close());
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    absl::Status s = FileError(errno, "cannot rename to", path);
    ::unlink(tmp.c_str());
    return s;
  }
  std::string dir = ".";
  if (size_t slash = path.rfind('/'); slash != std::string::npos) {
    dir = slash == 0 ? "/" : path.substr(0, slash);
  }
  return SyncDirectory(dir);
}

}  // namespace vemesh::checkpoint::internal
