// A StoreBootstrap for thread-rank tests of cuda meshes: it hands out the
// host world it made (so a test can ask whether its Gloo pairs were ever
// connected), and can make that world connected at once instead of lazily
// (a host world like MPI's: the mesh then takes the world NCCL
// communicator and ncclCommSplit path, not the store path).
//
//   auto boot = std::make_shared<StoreWorldBootstrap>(store, rank, 8);
//   options.bootstrap = boot;
//   ... DeviceMesh::Create(DeviceType::kCuda, layout, options) ...
//   EXPECT_FALSE(boot->gloo_world()->connected());

#ifndef TESTS_COMM_STORE_WORLD_BOOTSTRAP_H_
#define TESTS_COMM_STORE_WORLD_BOOTSTRAP_H_

#include <algorithm>
#include <memory>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "vemesh/bootstrap/store_bootstrap.h"
#include "vemesh/comm/gloo/gloo_communicator.h"

namespace vemesh::testing {

class StoreWorldBootstrap final : public Bootstrap {
 public:
  StoreWorldBootstrap(std::shared_ptr<Store> store, int rank, int size,
                      bool connected_world = false)
      : inner_(store, rank, size, "job"),
        store_(std::move(store)),
        connected_world_(connected_world) {}

  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  absl::string_view kind() const override { return inner_.kind(); }
  std::string reason() const override { return inner_.reason(); }
  absl::StatusOr<std::vector<std::string>> all_gather(
      absl::string_view data, absl::Time deadline) override {
    return inner_.all_gather(data, deadline);
  }
  std::shared_ptr<Store> store() const override { return store_; }
  absl::StatusOr<std::shared_ptr<Communicator>> world(
      absl::Time deadline, absl::Duration op_timeout) override {
    if (!connected_world_) {
      auto world = inner_.world(deadline, op_timeout);
      if (world.ok()) {
        gloo_world_ = std::dynamic_pointer_cast<GlooCommunicator>(*world);
      }
      return world;
    }
    std::vector<int> ranks(static_cast<size_t>(size()));
    std::iota(ranks.begin(), ranks.end(), 0);
    auto world = GlooCommunicator::Create(
        store_, absl::StrCat("connected-world/", worlds_++), rank(), size(),
        std::move(ranks), std::max(op_timeout, deadline - absl::Now()));
    if (!world.ok()) return world.status();
    gloo_world_ = *world;
    return std::shared_ptr<Communicator>(*std::move(world));
  }

  // The last host world handed out (null before the first).
  const std::shared_ptr<GlooCommunicator>& gloo_world() const {
    return gloo_world_;
  }

 private:
  StoreBootstrap inner_;
  std::shared_ptr<Store> store_;
  bool connected_world_;
  int worlds_ = 0;
  std::shared_ptr<GlooCommunicator> gloo_world_;
};

}  // namespace vemesh::testing

#endif  // TESTS_COMM_STORE_WORLD_BOOTSTRAP_H_
