// vemesh/checkpoint/async_saver.cc

#include "vemesh/checkpoint/async_saver.h"

#include <cstring>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "vemesh/base/status_macros.h"
#include "vemesh/checkpoint/internal/save.h"

namespace vemesh::checkpoint {

struct AsyncSaver::Impl {
  std::shared_ptr<Communicator> comm;  // the saver's own
  // The save in flight: its plan, the host copies, the writer and its result.
  std::optional<internal::SavePlan> plan;
  // Host copies, kept between saves so that the next Start only copies
  // (no allocation or page faults): about this rank's shard size.
  std::vector<std::unique_ptr<char[]>> copies;
  std::vector<uint64_t> capacity;
  std::thread writer;
  absl::StatusOr<internal::ShardResult> result =
      absl::UnknownError("not written");

  void Join() {
    if (writer.joinable()) writer.join();
  }
};

AsyncSaver::AsyncSaver(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

AsyncSaver::~AsyncSaver() {
  // Bounded by the disk: the writer only writes and fsyncs one file.
  if (impl_) impl_->Join();
}

absl::StatusOr<std::unique_ptr<AsyncSaver>> AsyncSaver::Create(
    Communicator& world) {
  VEMESH_ASSIGN_OR_RETURN(std::shared_ptr<Communicator> comm,
                          world.split(0, world.rank()));
  if (comm == nullptr) {
    return absl::InternalError("AsyncSaver: split of the world gave no group");
  }
  comm->set_timeout(world.timeout());
  auto impl = std::make_unique<Impl>();
  impl->comm = std::move(comm);
  return std::unique_ptr<AsyncSaver>(new AsyncSaver(std::move(impl)));
}

absl::StatusOr<std::unique_ptr<AsyncSaver>> AsyncSaver::CreateOn(
    std::shared_ptr<Communicator> world) {
  if (world == nullptr) {
    return absl::InvalidArgumentError("AsyncSaver::CreateOn: no communicator");
  }
  auto impl = std::make_unique<Impl>();
  impl->comm = std::move(world);
  return std::unique_ptr<AsyncSaver>(new AsyncSaver(std::move(impl)));
}

bool AsyncSaver::in_flight() const { return impl_->plan.has_value(); }

absl::Status AsyncSaver::Start(const StateDict& state, int64_t step,
                               const std::string& dir,
                               const SaveOptions& options) {
  VEMESH_RETURN_IF_ERROR(Wait());
  VEMESH_ASSIGN_OR_RETURN(
      internal::SavePlan plan,
      internal::PlanSave(state, step, dir, *impl_->comm, options));
  // The stall: this rank's share, copied to host memory.
  std::vector<const void*> sources = internal::PlannedData(plan, state);
  impl_->copies.resize(sources.size());
  impl_->capacity.resize(sources.size(), 0);
  std::vector<const void*> data(sources.size());
  for (size_t i = 0; i < sources.size(); ++i) {
    const uint64_t bytes = plan.mine[i].bytes;
    if (impl_->capacity[i] < bytes) {
      impl_->copies[i].reset(new char[bytes]);
      impl_->capacity[i] = bytes;
    }
    if (bytes > 0) std::memcpy(impl_->copies[i].get(), sources[i], bytes);
    data[i] = impl_->copies[i].get();
  }
  impl_->plan = std::move(plan);
  impl_->result = absl::UnknownError("not written");
  Impl* impl = impl_.get();
  impl_->writer = std::thread([impl, data = std::move(data)] {
    impl->result = internal::WriteShard(*impl->plan, data);
  });
  return absl::OkStatus();
}

absl::Status AsyncSaver::Wait() {
  if (!impl_->plan) return absl::OkStatus();
  impl_->Join();
  absl::Status s =
      internal::CommitSave(*impl_->plan, impl_->result, *impl_->comm);
  impl_->plan.reset();
  return s;
}

}  // namespace vemesh::checkpoint
