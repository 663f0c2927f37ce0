// tests/common/open_sockets.h
//
// The sockets this process holds: the inode numbers of /proc/self/fd
// entries that are sockets. Tests and benchmarks count what a mesh keeps
// open (issue 32: no world-sized connections per rank).
//
//   const size_t before = OpenSocketInodes().size();

#ifndef VEMESH_TESTS_COMMON_OPEN_SOCKETS_H_
#define VEMESH_TESTS_COMMON_OPEN_SOCKETS_H_

#include <dirent.h>
#include <unistd.h>

#include <set>
#include <string>

namespace vemesh {

inline std::set<std::string> OpenSocketInodes() {
  std::set<std::string> out;
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return out;
  while (dirent* e = readdir(dir)) {
    char target[64] = {};
    const std::string path = std::string("/proc/self/fd/") + e->d_name;
    if (readlink(path.c_str(), target, sizeof(target) - 1) <= 0) continue;
    const std::string t(target);
    if (t.rfind("socket:[", 0) == 0) out.insert(t.substr(8, t.size() - 9));
  }
  closedir(dir);
  return out;
}

}  // namespace vemesh

#endif  // VEMESH_TESTS_COMMON_OPEN_SOCKETS_H_
