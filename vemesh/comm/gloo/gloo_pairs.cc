// Gloo groups whose pairs vemesh connects itself (gloo_pairs.h).

#include "vemesh/comm/gloo/internal/gloo_pairs.h"

#include <netinet/in.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gloo/barrier.h"
#include "gloo/context.h"
#include "gloo/transport/context.h"
#include "gloo/transport/device.h"
#include "gloo/transport/tcp/address.h"
#include "gloo/transport/tcp/device.h"
#include "gloo/transport/tcp/loop.h"
#include "vemesh/base/sigpipe.h"
#include "vemesh/base/status_macros.h"
#include "vemesh/comm/gloo/internal/gloo_error.h"

namespace vemesh {
namespace gloo_internal {
namespace {

// Turns a tcp device's event loop while armed. Idle, Gloo's loop sleeps in
// epoll_wait for up to 10 ms, and a pair that connects out from the
// caller's thread first waits for the loop's next turn (it unregisters its
// listening socket): about 10 ms per such connect, more than the rest of a
// mesh's creation. Armed, an always-readable eventfd makes the loop turn at
// once (pausing 200 us per turn). Disarmed, the fd stays registered with no
// events, so the loop sleeps and the spinner costs nothing: a turn costs a
// few microseconds of CPU, and on a busy machine the turns of every rank
// add up. Arming only re-registers the fd (epoll_ctl wakes the loop);
// disarming happens on the loop's next turn, from the loop's own thread,
// as does taking the spinner off, so nothing here waits for a turn.
class LoopSpinner final : public gloo::transport::tcp::Handler {
 public:
  explicit LoopSpinner(gloo::transport::Device* device)
      : device_(dynamic_cast<gloo::transport::tcp::Device*>(device)) {
    if (device_ == nullptr) return;
    fd_ = eventfd(1, EFD_NONBLOCK | EFD_CLOEXEC);
    if (fd_ < 0) return;
    registered_ = Watch(0);  // without it connects are only slower
  }

  ~LoopSpinner() override {
    if (registered_) {
      std::unique_lock<std::mutex> lock(mu_);
      stop_ = true;
      // The loop takes the spinner off on its next turn: make it come.
      if (!Watch(EPOLLIN) ||
          !cv_.wait_for(lock, std::chrono::seconds(5), [&] { return off_; })) {
        lock.unlock();  // the loop is not turning: take it off from here
        try {
          device_->unregisterDescriptor(fd_, this);
        } catch (const std::exception&) {
        }
      }
    }
    if (fd_ >= 0) close(fd_);
  }

  // Keeps the loop turning until the matching Disarm (they nest).
  void Arm() {
    std::lock_guard<std::mutex> lock(mu_);
    if (armed_++ == 0 && registered_ && !stop_) Watch(EPOLLIN);
  }
  void Disarm() {
    std::lock_guard<std::mutex> lock(mu_);
    --armed_;  // the loop's next turn goes back to sleep
  }

  // On the loop's thread.
  void handleEvents(int /*events*/) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (off_) return;
      if (stop_) {
        try {
          device_->unregisterDescriptor(fd_, this);
        } catch (const std::exception&) {
        }
        off_ = true;
        cv_.notify_all();  // under the lock: the waiter returns after us
        return;
      }
      if (armed_ == 0) {
        Watch(0);
        return;
      }
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }

 private:
  // (Re-)registers the fd for `events` (0: registered, never reported).
  bool Watch(int events) {
    try {
      device_->registerDescriptor(fd_, events, this);
      return true;
    } catch (const std::exception&) {
      return false;
    }
  }

  gloo::transport::tcp::Device* device_;
  int fd_ = -1;
  bool registered_ = false;
  std::mutex mu_;
  std::condition_variable cv_;
  int armed_ = 0;      // under mu_
  bool stop_ = false;  // under mu_
  bool off_ = false;   // under mu_
};

// Which side of a tcp pair connects out, by Gloo's rule (tcp::Pair::connect
// in gloo 2022-05): the pair whose listening address is the larger (the IP,
// then the port as stored) connects to the other, which accepts. Only the
// connecting side needs the loop to turn (see LoopSpinner). Unsure (an
// address that does not parse): true, which costs only some loop turns.
bool ConnectsOut(const std::vector<char>& self_bytes,
                 const std::vector<char>& peer_bytes) {
  try {
    const gloo::transport::tcp::Address self(self_bytes);
    const gloo::transport::tcp::Address peer(peer_bytes);
    const sockaddr_storage& a = self.getSockaddr();
    const sockaddr_storage& b = peer.getSockaddr();
    if (a.ss_family != b.ss_family) return true;
    int order = 0;
    if (a.ss_family == AF_INET) {
      const auto* sa = reinterpret_cast<const sockaddr_in*>(&a);
      const auto* sb = reinterpret_cast<const sockaddr_in*>(&b);
      order = std::memcmp(&sa->sin_addr, &sb->sin_addr, sizeof(in_addr));
      if (order == 0) order = sa->sin_port - sb->sin_port;
    } else if (a.ss_family == AF_INET6) {
      const auto* sa = reinterpret_cast<const sockaddr_in6*>(&a);
      const auto* sb = reinterpret_cast<const sockaddr_in6*>(&b);
      order = std::memcmp(&sa->sin6_addr, &sb->sin6_addr, sizeof(in6_addr));
      if (order == 0) order = sa->sin6_port - sb->sin6_port;
    } else {
      return true;
    }
    return order > 0;
  } catch (const std::exception&) {
    return true;
  }
}

// A gloo::Context put together from a transport context whose pairs were
// connected by hand (ConnectPairGroups), as gloo's rendezvous would leave it.
class AssembledContext final : public gloo::Context {
 public:
  AssembledContext(int rank, int size,
                   std::shared_ptr<gloo::transport::Device> device,
                   std::shared_ptr<gloo::transport::Context> transport)
      : gloo::Context(rank, size) {
    device_ = std::move(device);
    transportContext_ = std::move(transport);
  }
};

void AppendU32(std::string& out, uint32_t v) {
  char bytes[4];
  std::memcpy(bytes, &v, 4);
  out.append(bytes, 4);
}

bool ReadU32(absl::string_view& in, uint32_t* v) {
  if (in.size() < 4) return false;
  std::memcpy(v, in.data(), 4);
  in.remove_prefix(4);
  return true;
}

bool ReadBytes(absl::string_view& in, absl::string_view* out) {
  uint32_t n = 0;
  if (!ReadU32(in, &n) || in.size() < n) return false;
  *out = in.substr(0, n);
  in.remove_prefix(n);
  return true;
}

// In a peer's posted value (groups of: name, then (peer, address) entries),
// the address its pair of group `name` made for `me`; nullopt if absent.
std::optional<std::vector<char>> FindAddress(absl::string_view value,
                                             absl::string_view name,
                                             uint32_t me) {
  uint32_t groups = 0;
  if (!ReadU32(value, &groups)) return std::nullopt;
  for (uint32_t g = 0; g < groups; ++g) {
    absl::string_view group;
    uint32_t entries = 0;
    if (!ReadBytes(value, &group) || !ReadU32(value, &entries)) break;
    for (uint32_t e = 0; e < entries; ++e) {
      uint32_t peer = 0;
      absl::string_view address;
      if (!ReadU32(value, &peer) || !ReadBytes(value, &address)) {
        return std::nullopt;
      }
      if (group == name && peer == me) {
        return std::vector<char>(address.begin(), address.end());
      }
    }
  }
  return std::nullopt;
}

}  // namespace

absl::StatusOr<std::vector<std::shared_ptr<gloo::Context>>> ConnectPairGroups(
    Store& store, absl::string_view key_prefix, int my_id,
    const std::shared_ptr<gloo::transport::Device>& device,
    absl::Duration timeout, const std::vector<PairGroup>& groups,
    absl::string_view what, size_t reply_bytes) {
  const absl::Time deadline = absl::Now() + timeout;
  std::vector<int> peers;  // the union of the groups' other members
  for (const PairGroup& g : groups) {
    for (size_t i = 0; i < g.members.size(); ++i) {
      if (static_cast<int>(i) != g.index) peers.push_back(g.members[i]);
    }
  }
  std::sort(peers.begin(), peers.end());
  peers.erase(std::unique(peers.begin(), peers.end()), peers.end());

  // (1) Every group's pairs, and their addresses in one value.
  std::vector<std::shared_ptr<gloo::transport::Context>> transports(
      groups.size());
  std::string value;
  ScopedSigpipeBlock no_sigpipe;  // connecting and the barriers write here
  VEMESH_RETURN_IF_ERROR(RunGloo(absl::StrCat(what, ": pairs"), [&] {
    AppendU32(value, static_cast<uint32_t>(groups.size()));
    for (size_t g = 0; g < groups.size(); ++g) {
      const int size = static_cast<int>(groups[g].members.size());
      transports[g] = device->createContext(groups[g].index, size);
      transports[g]->setTimeout(absl::ToChronoMilliseconds(timeout));
      AppendU32(value, static_cast<uint32_t>(groups[g].name.size()));
      value += groups[g].name;
      AppendU32(value, static_cast<uint32_t>(size - 1));
      for (int i = 0; i < size; ++i) {
        if (i == groups[g].index) continue;
        const std::vector<char> address =
            transports[g]->createPair(i)->address().bytes();
        AppendU32(value, static_cast<uint32_t>(groups[g].members[i]));
        AppendU32(value, static_cast<uint32_t>(address.size()));
        value.append(address.data(), address.size());
      }
    }
  }));
  VEMESH_RETURN_IF_ERROR(store.set(absl::StrCat(key_prefix, my_id), value));

  // (2) The peers' values, read in runs whose reply stays near
  // reply_bytes (a peer's value is about as long as this rank's: n - 1
  // addresses for a group of n), each kept only until this rank's
  // addresses are taken from it: one read up to 64 ranks, and at 1,024 a
  // value per read (the TCP store refuses a reply over 64 MiB, and budgets
  // what it buffers), never O(n^2) bytes held.
  struct PairConnect {
    size_t group;
    int peer;  // index in the group
    std::vector<char> address;
    bool out;
  };
  std::vector<PairConnect> connects;
  const size_t per_read =
      std::max<size_t>(1, reply_bytes / std::max<size_t>(1, value.size()));
  for (size_t first = 0; first < peers.size(); first += per_read) {
    const size_t last = std::min(peers.size(), first + per_read);
    std::vector<std::string> keys;
    keys.reserve(last - first);
    for (size_t k = first; k < last; ++k) {
      keys.push_back(absl::StrCat(key_prefix, peers[k]));
    }
    VEMESH_ASSIGN_OR_RETURN(std::vector<std::string> values,
                            store.wait_get(keys, deadline));
    for (size_t g = 0; g < groups.size(); ++g) {
      const std::vector<int>& members = groups[g].members;
      for (size_t i = 0; i < members.size(); ++i) {
        if (static_cast<int>(i) == groups[g].index) continue;
        const auto at = std::lower_bound(peers.begin() + first,
                                         peers.begin() + last, members[i]);
        if (at == peers.begin() + last || *at != members[i]) continue;
        auto address =
            FindAddress(values[static_cast<size_t>(at - peers.begin()) - first],
                        groups[g].name, static_cast<uint32_t>(my_id));
        if (!address.has_value()) {
          return absl::InvalidArgumentError(absl::StrCat(
              what, ": member ", members[i], " posted no address for group '",
              groups[g].name, "' toward ", my_id,
              " (the members' group lists differ)"));
        }
        const bool out = ConnectsOut(
            transports[g]->getPair(static_cast<int>(i))->address().bytes(),
            *address);
        connects.push_back({g, static_cast<int>(i), *std::move(address), out});
      }
    }
  }

  // (3) Connect every pair, then one barrier per group: a TCP connect
  // completes before the peer accepts it, and a rank that dropped a group
  // at once would close a socket still being accepted. Of a pair, one side
  // connects out (to the listening socket its peer made before posting its
  // address, so it never waits for the peer) and the other waits for that.
  // Each rank first makes all its outgoing connects, then waits for its
  // incoming ones, so no wait depends on another rank's wait and one thread
  // does it all. Only the outgoing connects need Gloo's loop to turn: the
  // spinner is armed for those alone.
  LoopSpinner spinner(device.get());
  std::stable_partition(connects.begin(), connects.end(),
                        [](const PairConnect& c) { return c.out; });
  auto connect = [&](const PairConnect& c) {
    return RunGloo(
        absl::StrCat(what, ": connect group '", groups[c.group].name, "' rank ",
                     groups[c.group].index, " to ", c.peer),
        [&] { transports[c.group]->getPair(c.peer)->connect(c.address); });
  };
  {
    spinner.Arm();
    absl::Status status;
    for (const PairConnect& c : connects) {
      if (!c.out) break;
      status = connect(c);
      if (!status.ok()) break;
    }
    spinner.Disarm();
    VEMESH_RETURN_IF_ERROR(status);
  }
  for (const PairConnect& c : connects) {
    if (!c.out) VEMESH_RETURN_IF_ERROR(connect(c));
  }
  std::vector<std::shared_ptr<gloo::Context>> out;
  out.reserve(groups.size());
  for (size_t g = 0; g < groups.size(); ++g) {
    const int size = static_cast<int>(groups[g].members.size());
    auto context = std::make_shared<AssembledContext>(groups[g].index, size,
                                                      device, transports[g]);
    context->setTimeout(absl::ToChronoMilliseconds(timeout));
    VEMESH_RETURN_IF_ERROR(RunGloo(
        absl::StrCat(what, ": barrier of group '", groups[g].name, "'"), [&] {
          gloo::BarrierOptions barrier(
              std::static_pointer_cast<gloo::Context>(context));
          barrier.setTag(0);
          gloo::barrier(barrier);
        }));
    out.push_back(std::move(context));
  }
  return out;
}

}  // namespace gloo_internal
}  // namespace vemesh
