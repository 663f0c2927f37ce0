// One rank of an env:// job that counts the sockets it holds after creating
// a cpu mesh (issue 32): no rank may hold a socket per world member.
//
//   socket_probe 2,2,4        (RANK, WORLD_SIZE, MASTER_PORT set by the
//                              launcher; the shape multiplies to WORLD_SIZE)
//
// prints, after the mesh is made and each dimension's group has run one
// all_reduce (so every lazily made connection that the mesh needs exists):
//
//   sockets rank R: T total, S store, G groups, bound B: OK|OVER
//
// T counts /proc/self/fd entries that are sockets; S those of the launcher's
// rendezvous store (local or remote port MASTER_PORT, from /proc/net/tcp*:
// rank 0 hosts that store, one connection per rank, as torch's TCPStore
// does); G = T - S; B = sum over dimensions of (group size - 1) plus
// kSlack. OVER (and exit code 1) when G > B.

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "open_sockets.h"
#include "vemesh/bootstrap/launch.h"
#include "vemesh/mesh/device_mesh.h"

namespace {

// Sockets a rank may hold beyond its groups' peers (the store's client is
// counted apart; this covers a listener left open or a wake-up pipe pair).
constexpr int kSlack = 2;

// Inodes of TCP sockets with local or remote port `port`.
std::set<std::string> InodesOnPort(int port) {
  std::set<std::string> out;
  for (const char* file : {"/proc/self/net/tcp", "/proc/self/net/tcp6"}) {
    std::ifstream in(file);
    std::string line;
    std::getline(in, line);  // header
    while (std::getline(in, line)) {
      std::istringstream fields(line);
      std::string sl, local, remote, st, queues, tr, retr, uid, timeout, inode;
      fields >> sl >> local >> remote >> st >> queues >> tr >> retr >> uid >>
          timeout >> inode;
      auto port_of = [](const std::string& a) {
        return std::strtol(a.substr(a.find(':') + 1).c_str(), nullptr, 16);
      };
      if (port_of(local) == port || port_of(remote) == port) out.insert(inode);
    }
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: socket_probe 2,2,4\n");
    return 2;
  }
  std::vector<int64_t> shape;
  for (absl::string_view s : absl::StrSplit(argv[1], ',')) {
    int64_t v = 0;
    if (!absl::SimpleAtoi(s, &v)) return 2;
    shape.push_back(v);
  }
  std::vector<std::string> names;
  for (size_t d = 0; d < shape.size(); ++d)
    names.push_back(absl::StrCat("d", d));
  const int rank = vemesh::LauncherRank();
  vemesh::MeshOptions options;
  options.timeout = absl::Seconds(60);
  auto mesh = vemesh::init_device_mesh("cpu", shape, names, options);
  if (!mesh.ok()) {
    std::printf("sockets rank %d: %s\n", rank,
                mesh.status().ToString().c_str());
    return 1;
  }
  int bound = kSlack;
  for (size_t d = 0; d < shape.size(); ++d) {
    bound += static_cast<int>(shape[d]) - 1;
    auto group = mesh->get_group(names[d]);
    int64_t v = 1;
    absl::Status s = group.ok() ? (*group)->all_reduce(absl::MakeSpan(&v, 1),
                                                       vemesh::ReduceOp::kSum)
                                : group.status();
    if (!s.ok() || v != shape[d]) {
      std::printf("sockets rank %d: all_reduce over %s: %s\n", rank,
                  names[d].c_str(), s.ToString().c_str());
      return 1;
    }
  }
  const std::set<std::string> all = vemesh::OpenSocketInodes();
  int port = 0;
  if (const char* p = std::getenv("MASTER_PORT"))
    (void)absl::SimpleAtoi(p, &port);
  const std::set<std::string> on_port = InodesOnPort(port);
  int store = 0;
  for (const std::string& inode : all) store += on_port.count(inode);
  const int total = static_cast<int>(all.size());
  const int groups = total - store;
  std::printf("sockets rank %d: %d total, %d store, %d groups, bound %d: %s\n",
              rank, total, store, groups, bound,
              groups <= bound ? "OK" : "OVER");
  std::fflush(stdout);
  // Every rank counted before any drops its connections.
  auto world_group = mesh->get_group(names[0]);
  if (world_group.ok()) (void)(*world_group)->barrier();
  return groups <= bound ? 0 : 1;
}
