// GlooCommunicator's new groups from an existing one: a subgroup, many
// subgroups connected at once (pairs by hand, the loop spun while they
// connect), split and shrink.

#include <netinet/in.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gloo/barrier.h"
#include "gloo/context.h"
#include "gloo/transport/context.h"
#include "gloo/transport/device.h"
#include "gloo/transport/tcp/address.h"
#include "gloo/transport/tcp/attr.h"
#include "gloo/transport/tcp/device.h"
#include "gloo/transport/tcp/loop.h"
#include "vemesh/base/sigpipe.h"
#include "vemesh/base/status_macros.h"
#include "vemesh/comm/gloo/gloo_communicator.h"
#include "vemesh/comm/gloo/internal/gloo_error.h"
#include "vemesh/comm/gloo/internal/gloo_store.h"
#include "vemesh/rendezvous/prefix_store.h"

namespace vemesh {

absl::StatusOr<std::shared_ptr<GlooCommunicator>> GlooCommunicator::subgroup(
    absl::string_view name, std::vector<int> members) {
  int new_rank = -1;
  std::vector<int> global;
  global.reserve(members.size());
  for (size_t i = 0; i < members.size(); ++i) {
    const int m = members[i];
    if (m < 0 || m >= size_) {
      return absl::InvalidArgumentError(
          absl::StrCat("GlooCommunicator::subgroup '", name, "': member ", m,
                       " is outside this group of ", size_, " ranks"));
    }
    if (m == rank_) new_rank = static_cast<int>(i);
    global.push_back(ranks_[m]);
  }
  if (new_rank < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "GlooCommunicator::subgroup '", name, "': this rank (", rank_,
        ") is not among the members [", absl::StrJoin(members, ", "), "]"));
  }
  return Connect(store_, absl::StrCat(prefix_, "/sub/", name), new_rank,
                 static_cast<int>(members.size()), std::move(global),
                 gloo_timeout_, hostname_, device_);
}

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
// connected by hand (subgroups), as gloo's rendezvous would leave it.
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

absl::StatusOr<std::vector<std::shared_ptr<GlooCommunicator>>>
GlooCommunicator::subgroups(absl::string_view batch,
                            std::vector<SubgroupSpec> specs) {
  const std::string what =
      absl::StrCat("GlooCommunicator::subgroups '", batch, "'");
  // Each group's rank of this process and global ranks, checked as
  // subgroup() checks them.
  std::vector<int> new_rank(specs.size(), -1);
  std::vector<std::vector<int>> global(specs.size());
  std::vector<int> peers;  // the union of the groups' other members
  for (size_t g = 0; g < specs.size(); ++g) {
    for (size_t i = 0; i < specs[g].members.size(); ++i) {
      const int m = specs[g].members[i];
      if (m < 0 || m >= size_) {
        return absl::InvalidArgumentError(
            absl::StrCat(what, ": group '", specs[g].name, "' member ", m,
                         " is outside this group of ", size_, " ranks"));
      }
      if (m == rank_) {
        new_rank[g] = static_cast<int>(i);
      } else {
        peers.push_back(m);
      }
      global[g].push_back(ranks_[m]);
    }
    if (new_rank[g] < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, ": this rank (", rank_, ") is not among the members [",
          absl::StrJoin(specs[g].members, ", "), "] of group '", specs[g].name,
          "'"));
    }
  }
  std::sort(peers.begin(), peers.end());
  peers.erase(std::unique(peers.begin(), peers.end()), peers.end());
  const std::string key_prefix = absl::StrCat(prefix_, "/fold/", batch, "/");
  const absl::Time deadline = absl::Now() + gloo_timeout_;

  // (1) Every group's pairs, and their addresses in one value.
  std::vector<std::shared_ptr<gloo::transport::Context>> transports(
      specs.size());
  std::string value;
  ScopedSigpipeBlock no_sigpipe;  // connecting and the barriers write here
  VEMESH_RETURN_IF_ERROR(RunGloo(absl::StrCat(what, ": pairs"), [&] {
    AppendU32(value, static_cast<uint32_t>(specs.size()));
    for (size_t g = 0; g < specs.size(); ++g) {
      const int size = static_cast<int>(specs[g].members.size());
      transports[g] = device_->createContext(new_rank[g], size);
      transports[g]->setTimeout(absl::ToChronoMilliseconds(gloo_timeout_));
      AppendU32(value, static_cast<uint32_t>(specs[g].name.size()));
      value += specs[g].name;
      AppendU32(value, static_cast<uint32_t>(size - 1));
      for (int i = 0; i < size; ++i) {
        if (i == new_rank[g]) continue;
        const std::vector<char> address =
            transports[g]->createPair(i)->address().bytes();
        AppendU32(value, static_cast<uint32_t>(specs[g].members[i]));
        AppendU32(value, static_cast<uint32_t>(address.size()));
        value.append(address.data(), address.size());
      }
    }
  }));
  VEMESH_RETURN_IF_ERROR(store_->set(absl::StrCat(key_prefix, rank_), value));

  // (2) The peers' values, in one wait.
  std::vector<std::string> keys;
  keys.reserve(peers.size());
  for (int p : peers) keys.push_back(absl::StrCat(key_prefix, p));
  auto values = store_->wait_get(keys, deadline);
  if (!values.ok()) {
    if (!absl::IsDeadlineExceeded(values.status())) return values.status();
    // Name, per group, the members whose value never came.
    std::vector<std::string> lines;
    for (size_t g = 0; g < specs.size(); ++g) {
      std::vector<std::string> missing;
      for (size_t i = 0; i < specs[g].members.size(); ++i) {
        const int m = specs[g].members[i];
        if (m == rank_) continue;
        if (!store_->get(absl::StrCat(key_prefix, m)).ok()) {
          missing.push_back(absl::StrCat(i, " (global rank ", ranks_[m], ")"));
        }
      }
      if (missing.empty()) continue;
      lines.push_back(absl::StrCat("gloo group '", prefix_, "/sub/",
                                   specs[g].name, "': peer rank(s) ",
                                   absl::StrJoin(missing, ", ")));
    }
    return absl::DeadlineExceededError(
        absl::StrCat(absl::StrJoin(lines, "; "), " never connected within ",
                     absl::FormatDuration(gloo_timeout_),
                     " (gone, or never made this call); rank ", rank_,
                     " gives up: ", values.status().message()));
  }
  auto value_of = [&](int member) -> absl::string_view {
    const size_t at = static_cast<size_t>(
        std::lower_bound(peers.begin(), peers.end(), member) - peers.begin());
    return (*values)[at];
  };

  // (3) Connect every pair, then one barrier per group (every rank takes
  // its groups in the same order, so the barriers cannot wait in a cycle):
  // a TCP connect completes before the peer accepts it, and a rank that
  // dropped a group at once would close a socket still being accepted.
  // Of a pair, one side connects out (to the listening socket its peer made
  // before posting its address, so it never waits for the peer) and the
  // other waits for that. Each rank first makes all its outgoing connects,
  // then waits for its incoming ones, so no wait depends on another rank's
  // wait and one thread does it all. Only the outgoing connects need Gloo's
  // loop to turn: the spinner is armed for those alone.
  struct PairConnect {
    size_t group;
    int peer;
    std::vector<char> address;
    bool out;
  };
  LoopSpinner spinner(device_.get());
  std::vector<PairConnect> connects;
  for (size_t g = 0; g < specs.size(); ++g) {
    const int size = static_cast<int>(specs[g].members.size());
    for (int i = 0; i < size; ++i) {
      if (i == new_rank[g]) continue;
      auto address = FindAddress(value_of(specs[g].members[i]), specs[g].name,
                                 static_cast<uint32_t>(rank_));
      if (!address.has_value()) {
        return absl::InvalidArgumentError(absl::StrCat(
            what, ": member ", specs[g].members[i], " (global rank ",
            ranks_[specs[g].members[i]], ") posted no address for group '",
            specs[g].name, "' toward rank ", rank_,
            " (the members' group lists differ)"));
      }
      const bool out =
          ConnectsOut(transports[g]->getPair(i)->address().bytes(), *address);
      connects.push_back({g, i, *std::move(address), out});
    }
  }
  std::stable_partition(connects.begin(), connects.end(),
                        [](const PairConnect& c) { return c.out; });
  auto connect = [&](const PairConnect& c) {
    return RunGloo(
        absl::StrCat(what, ": connect group '", specs[c.group].name, "' rank ",
                     new_rank[c.group], " to ", c.peer),
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
  std::vector<std::shared_ptr<GlooCommunicator>> out;
  out.reserve(specs.size());
  for (size_t g = 0; g < specs.size(); ++g) {
    const int size = static_cast<int>(specs[g].members.size());
    auto context = std::make_shared<AssembledContext>(new_rank[g], size,
                                                      device_, transports[g]);
    context->setTimeout(absl::ToChronoMilliseconds(gloo_timeout_));
    VEMESH_RETURN_IF_ERROR(RunGloo(
        absl::StrCat(what, ": barrier of group '", specs[g].name, "'"), [&] {
          gloo::BarrierOptions barrier(
              std::static_pointer_cast<gloo::Context>(context));
          barrier.setTag(0);
          gloo::barrier(barrier);
        }));
    out.push_back(std::shared_ptr<GlooCommunicator>(new GlooCommunicator(
        store_, absl::StrCat(prefix_, "/sub/", specs[g].name), new_rank[g],
        size, std::move(global[g]), gloo_timeout_, hostname_, device_,
        std::move(context))));
  }
  return out;
}

absl::StatusOr<std::vector<std::shared_ptr<Communicator>>>
GlooCommunicator::split_many(absl::Span<const SplitRequest> requests,
                             absl::Time deadline) {
  // Numbered on every rank of this group (split_many is collective over
  // it), so the batches' keys agree without talking.
  const int64_t seq = next_split_many_++;
  const bool by_members =
      !connected() &&
      std::all_of(requests.begin(), requests.end(), [](const SplitRequest& r) {
        return r.color < 0 || (r.group_local && !r.members.empty());
      });
  if (!by_members) return Communicator::split_many(requests, deadline);
  // The groups this rank is in, among their members only.
  std::vector<SubgroupSpec> specs;
  std::vector<size_t> index;  // the request of each spec
  for (size_t i = 0; i < requests.size(); ++i) {
    const SplitRequest& r = requests[i];
    if (r.color < 0) continue;
    specs.push_back(
        {absl::StrCat("many", seq, "/", i, "/", r.members.front()), r.members});
    index.push_back(i);
  }
  std::vector<std::shared_ptr<Communicator>> out(requests.size());
  if (specs.empty()) return out;  // in none of the groups: no call
  VEMESH_ASSIGN_OR_RETURN(
      auto groups, subgroups(absl::StrCat("many", seq), std::move(specs)));
  for (size_t g = 0; g < groups.size(); ++g) {
    out[index[g]] = std::move(groups[g]);
  }
  return out;
}

StoreScope GlooCommunicator::store_scope() const { return {store_, prefix_}; }

absl::StatusOr<std::shared_ptr<Communicator>> GlooCommunicator::split(int color,
                                                                      int key) {
  // Splits are collective, so every rank numbers them alike and the new
  // groups' prefixes agree without talking.
  const int64_t seq = next_split_++;
  VEMESH_RETURN_IF_ERROR(EnsureConnected());
  const int64_t mine[2] = {color, key};
  std::vector<int64_t> all(2 * static_cast<size_t>(size_));
  VEMESH_RETURN_IF_ERROR(all_gather(mine, all.data(), 2, DataType::kInt64));
  if (color < 0) return std::shared_ptr<Communicator>();
  // Members of my color, ordered by (key, rank).
  std::vector<std::pair<int64_t, int>> members;
  for (int r = 0; r < size_; ++r) {
    if (all[2 * r] == color) members.emplace_back(all[2 * r + 1], r);
  }
  std::sort(members.begin(), members.end());
  int new_rank = 0;
  std::vector<int> global;
  global.reserve(members.size());
  for (size_t i = 0; i < members.size(); ++i) {
    if (members[i].second == rank_) new_rank = static_cast<int>(i);
    global.push_back(ranks_[members[i].second]);
  }
  VEMESH_ASSIGN_OR_RETURN(
      auto child,
      Connect(store_, absl::StrCat(prefix_, "/split/", seq, "/", color),
              new_rank, static_cast<int>(members.size()), std::move(global),
              gloo_timeout_, hostname_, device_));
  return std::shared_ptr<Communicator>(std::move(child));
}

absl::StatusOr<std::shared_ptr<Communicator>> GlooCommunicator::Shrink(
    absl::Span<const int> exclude, const ShrinkOptions& /*options*/) {
  const int64_t seq = next_shrink_++;
  int new_rank = 0;
  std::vector<int> global = Survivors(exclude, &new_rank);
  const int size = static_cast<int>(global.size());
  VEMESH_ASSIGN_OR_RETURN(
      auto child, Connect(store_,
                          absl::StrCat(prefix_, "/shrink/", seq, "/",
                                       absl::StrJoin(exclude, ",")),
                          new_rank, size, std::move(global), gloo_timeout_,
                          hostname_, device_));
  return std::shared_ptr<Communicator>(std::move(child));
}

}  // namespace vemesh
