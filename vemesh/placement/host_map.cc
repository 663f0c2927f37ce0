#include "vemesh/placement/host_map.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace vemesh {

absl::string_view PlacementPolicyName(PlacementPolicy policy) {
  switch (policy) {
    case PlacementPolicy::kBlock:
      return "block";
    case PlacementPolicy::kCyclic:
      return "cyclic";
    case PlacementPolicy::kHostfile:
      return "hostfile";
  }
  return "block";
}

HostMap::HostMap(int64_t ranks_per_host, int64_t world_size)
    : world_size_(world_size), ranks_per_host_(ranks_per_host) {}

HostMap HostMap::Block(int64_t ranks_per_host, int64_t world_size) {
  return HostMap(ranks_per_host, world_size);
}

HostMap HostMap::Cyclic(int64_t host_count, int64_t world_size) {
  HostMap m;
  m.policy_ = PlacementPolicy::kCyclic;
  m.world_size_ = world_size;
  m.cyclic_hosts_ = host_count;
  // (Not (world + hosts - 1) / hosts: that overflows near 2^63.)
  m.ranks_per_host_ = world_size / host_count + (world_size % host_count != 0);
  return m;
}

HostMap HostMap::Slots(std::vector<std::string> names,
                       std::vector<int64_t> sizes) {
  HostMap m;
  m.policy_ = PlacementPolicy::kHostfile;
  m.names_ = std::move(names);
  m.starts_.reserve(sizes.size() + 1);
  int64_t next = 0;
  for (int64_t s : sizes) {
    m.starts_.push_back(next);
    next += s;
    m.ranks_per_host_ = std::max(m.ranks_per_host_, s);
  }
  m.starts_.push_back(next);
  m.world_size_ = next;
  return m;
}

int64_t HostMap::host_count() const {
  switch (policy_) {
    case PlacementPolicy::kBlock:
      // (Not (world + per_host - 1) / per_host: that overflows near 2^63.)
      return world_size_ / ranks_per_host_ +
             (world_size_ % ranks_per_host_ != 0);
    case PlacementPolicy::kCyclic:
      return cyclic_hosts_;
    case PlacementPolicy::kHostfile:
      return static_cast<int64_t>(starts_.size()) - 1;
  }
  return 1;
}

int64_t HostMap::max_host_size() const {
  return std::min(ranks_per_host_, world_size_);
}

int64_t HostMap::host_of(int64_t rank) const {
  switch (policy_) {
    case PlacementPolicy::kBlock:
      return rank / ranks_per_host_;
    case PlacementPolicy::kCyclic:
      return rank % cyclic_hosts_;
    case PlacementPolicy::kHostfile: {
      // The last start <= rank.
      auto it = std::upper_bound(starts_.begin(), starts_.end() - 1, rank);
      return static_cast<int64_t>(it - starts_.begin()) - 1;
    }
  }
  return 0;
}

int64_t HostMap::local_of(int64_t rank) const {
  switch (policy_) {
    case PlacementPolicy::kBlock:
      return rank % ranks_per_host_;
    case PlacementPolicy::kCyclic:
      return rank / cyclic_hosts_;
    case PlacementPolicy::kHostfile:
      return rank - starts_[host_of(rank)];
  }
  return 0;
}

int64_t HostMap::host_size(int64_t host) const {
  switch (policy_) {
    case PlacementPolicy::kBlock: {
      const int64_t first = host * ranks_per_host_;
      return std::min(ranks_per_host_, world_size_ - first);
    }
    case PlacementPolicy::kCyclic:
      return world_size_ / cyclic_hosts_ + (host < world_size_ % cyclic_hosts_);
    case PlacementPolicy::kHostfile:
      return starts_[host + 1] - starts_[host];
  }
  return 0;
}

int64_t HostMap::rank_on(int64_t host, int64_t local) const {
  switch (policy_) {
    case PlacementPolicy::kBlock:
      return host * ranks_per_host_ + local;
    case PlacementPolicy::kCyclic:
      return local * cyclic_hosts_ + host;
    case PlacementPolicy::kHostfile:
      return starts_[host] + local;
  }
  return 0;
}

std::string HostMap::Describe() const {
  switch (policy_) {
    case PlacementPolicy::kBlock:
      return absl::StrCat(ranks_per_host_, " ranks per host");
    case PlacementPolicy::kCyclic:
      return absl::StrCat("cyclic over ", cyclic_hosts_, " hosts");
    case PlacementPolicy::kHostfile: {
      std::vector<int64_t> sizes;
      for (size_t i = 0; i + 1 < starts_.size() && i < 16; ++i) {
        sizes.push_back(starts_[i + 1] - starts_[i]);
      }
      return absl::StrCat("hostfile slots ", absl::StrJoin(sizes, ","),
                          starts_.size() > 17 ? ",..." : "");
    }
  }
  return "";
}

}  // namespace vemesh
