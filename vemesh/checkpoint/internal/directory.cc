// vemesh/checkpoint/internal/directory.cc

#include "vemesh/checkpoint/internal/directory.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <system_error>
#include <tuple>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "vemesh/base/status_macros.h"
#include "vemesh/checkpoint/internal/file_io.h"
#include "vemesh/checkpoint/manifest.h"

namespace vemesh::checkpoint::internal {
namespace {

namespace fs = std::filesystem;

bool Exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

bool AllDigits(const std::string& s) {
  return !s.empty() && s.size() <= 18 &&
         std::all_of(s.begin(), s.end(),
                     [](char c) { return c >= '0' && c <= '9'; });
}

absl::Status FsError(const std::error_code& ec, absl::string_view what,
                     const std::string& path) {
  return FileError(ec.value(), what, path);
}

}  // namespace

std::string StepDirName(int64_t step, int64_t n) {
  return n == 0 ? absl::StrCat("step-", step)
                : absl::StrCat("step-", step, ".", n);
}

std::optional<StepDir> ParseStepDirName(const std::string& name) {
  if (name.rfind("step-", 0) != 0) return std::nullopt;
  std::string rest = name.substr(5);
  std::string n_text;
  if (size_t dot = rest.find('.'); dot != std::string::npos) {
    n_text = rest.substr(dot + 1);
    rest = rest.substr(0, dot);
    if (!AllDigits(n_text)) return std::nullopt;
  }
  if (!AllDigits(rest)) return std::nullopt;
  StepDir d;
  if (!absl::SimpleAtoi(rest, &d.step)) return std::nullopt;
  if (!n_text.empty() && (!absl::SimpleAtoi(n_text, &d.n) || d.n == 0)) {
    return std::nullopt;
  }
  d.name = name;
  return d;
}

absl::StatusOr<std::vector<StepDir>> ListStepDirs(const std::string& dir) {
  std::vector<StepDir> out;
  std::error_code ec;
  if (!fs::exists(dir, ec)) return out;
  fs::directory_iterator it(dir, ec);
  if (ec) return FsError(ec, "cannot list checkpoint directory", dir);
  for (; it != fs::directory_iterator(); it.increment(ec)) {
    if (ec) return FsError(ec, "cannot list checkpoint directory", dir);
    std::optional<StepDir> d = ParseStepDirName(it->path().filename().string());
    if (!d) continue;
    d->committed = Exists(absl::StrCat(dir, "/", d->name, "/", kManifestName));
    out.push_back(*d);
  }
  std::sort(out.begin(), out.end(), [](const StepDir& a, const StepDir& b) {
    return std::tie(a.step, a.n) < std::tie(b.step, b.n);
  });
  return out;
}

absl::StatusOr<std::optional<std::string>> FindCheckpoint(
    const std::string& dir, std::optional<int64_t> step) {
  VEMESH_ASSIGN_OR_RETURN(std::vector<StepDir> dirs, ListStepDirs(dir));
  if (!step) {
    absl::StatusOr<std::string> latest =
        ReadSmallFile(absl::StrCat(dir, "/", kLatestName), 4096);
    if (latest.ok()) {
      std::optional<StepDir> d =
          ParseStepDirName(std::string(absl::StripAsciiWhitespace(*latest)));
      if (d && Exists(absl::StrCat(dir, "/", d->name, "/", kManifestName))) {
        return absl::StrCat(dir, "/", d->name);
      }
    }
  }
  // No (usable) pointer: the newest committed directory.
  for (auto it = dirs.rbegin(); it != dirs.rend(); ++it) {
    if (it->committed && (!step || it->step == *step)) {
      return absl::StrCat(dir, "/", it->name);
    }
  }
  return std::optional<std::string>();
}

absl::StatusOr<std::optional<std::string>> ReadOwner(const std::string& dir) {
  const std::string path = absl::StrCat(dir, "/", kOwnerName);
  absl::StatusOr<std::string> text = ReadSmallFile(path, 4096);
  if (absl::IsNotFound(text.status())) return std::optional<std::string>();
  if (!text.ok()) return text.status();
  return std::optional<std::string>(
      std::string(absl::StripTrailingAsciiWhitespace(*text)));
}

namespace {

std::string JobName(const std::string& job) {
  return job.empty() ? std::string(
                           "a save that names no job (set "
                           "SaveOptions::job)")
                     : absl::StrCat("job '", job, "'");
}

// One directory, one job: refuses `job` in a directory another job owns;
// a named job claims an unowned one (link(2): of two claiming at once, one
// wins and the other then finds it owned).
absl::Status ClaimDirectory(const std::string& dir, const std::string& job) {
  const std::string path = absl::StrCat(dir, "/", kOwnerName);
  for (int attempt = 0; attempt < 2; ++attempt) {
    VEMESH_ASSIGN_OR_RETURN(std::optional<std::string> owner, ReadOwner(dir));
    if (owner) return CheckOwner(dir, job);
    if (job.empty()) return absl::OkStatus();  // unowned, unnamed: as before
    const std::string tmp =
        absl::StrCat(path, ".", static_cast<long>(::getpid()), ".tmp");
    {
      VEMESH_ASSIGN_OR_RETURN(File f, File::Create(tmp));
      const std::string line = job + "\n";
      VEMESH_RETURN_IF_ERROR(f.WriteAll(line.data(), line.size()));
      VEMESH_RETURN_IF_ERROR(f.Sync());
      VEMESH_RETURN_IF_ERROR(f.Close());
    }
    const int linked = ::link(tmp.c_str(), path.c_str());
    const int link_errno = errno;
    ::unlink(tmp.c_str());
    if (linked == 0) return SyncDirectory(dir);
    if (link_errno != EEXIST) {
      return FileError(link_errno, "cannot create owner file", path);
    }
    // Another job claimed it first: read who.
  }
  return absl::AbortedError(
      absl::StrCat("checkpoint directory '", dir, "': cannot claim it"));
}

}  // namespace

absl::Status CheckOwner(const std::string& dir, const std::string& job) {
  VEMESH_ASSIGN_OR_RETURN(std::optional<std::string> owner, ReadOwner(dir));
  if (!owner || *owner == job) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "checkpoint directory '", dir, "' belongs to job '", *owner,
      "' (its file '", dir, "/", kOwnerName, "'); ", JobName(job),
      " may not write into it: use a directory of its own, or run as job '",
      *owner, "'"));
}

absl::StatusOr<std::string> PrepareStepDir(const std::string& dir, int64_t step,
                                           const std::string& job) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return FsError(ec, "cannot create checkpoint directory", dir);
  if (!fs::is_directory(dir, ec)) {
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint directory '", dir, "' is not a directory"));
  }
  VEMESH_RETURN_IF_ERROR(ClaimDirectory(dir, job));
  for (int64_t n = 0; n < 1000000; ++n) {
    const std::string name = StepDirName(step, n);
    const std::string path = absl::StrCat(dir, "/", name);
    if (Exists(absl::StrCat(path, "/", kManifestName))) continue;
    // Uncommitted (a crashed or failed save): start it again, empty.
    fs::remove_all(path, ec);
    if (ec) return FsError(ec, "cannot clear stale step directory", path);
    if (::mkdir(path.c_str(), 0755) != 0) {
      return FileError(errno, "cannot create step directory", path);
    }
    VEMESH_RETURN_IF_ERROR(SyncDirectory(dir));
    return name;
  }
  return absl::ResourceExhaustedError(absl::StrCat(
      "checkpoint directory '", dir, "': too many saves of step ", step));
}

absl::Status RemoveOldSteps(const std::string& dir, const std::string& current,
                            int keep_last, const std::string& job) {
  VEMESH_ASSIGN_OR_RETURN(std::vector<StepDir> dirs, ListStepDirs(dir));
  std::optional<StepDir> cur = ParseStepDirName(current);
  int kept = 0;
  for (auto it = dirs.rbegin(); it != dirs.rend(); ++it) {
    const std::string path = absl::StrCat(dir, "/", it->name);
    if (it->name == current) {
      ++kept;
      continue;
    }
    bool older = cur && std::tie(it->step, it->n) < std::tie(cur->step, cur->n);
    if (it->committed) {
      // Only this job's checkpoints count and go: another job's (or one
      // whose manifest cannot be read) stays.
      absl::StatusOr<std::string> text = ReadSmallFile(
          absl::StrCat(path, "/", kManifestName), kMaxManifestBytes);
      if (!text.ok()) continue;
      absl::StatusOr<Manifest> m = ParseManifest(*text, path);
      if (!m.ok() || m->job != job) continue;
      if (kept < keep_last) {
        ++kept;
        continue;
      }
      if (::unlink(absl::StrCat(path, "/", kManifestName).c_str()) != 0) {
        return FileError(errno, "cannot remove old manifest in", path);
      }
      VEMESH_RETURN_IF_ERROR(SyncDirectory(path));
    } else if (!older) {
      continue;  // a save in progress, perhaps
    }
    std::error_code ec;
    fs::remove_all(path, ec);
    if (ec) return FsError(ec, "cannot remove old step directory", path);
  }
  return SyncDirectory(dir);
}

}  // namespace vemesh::checkpoint::internal
