// vemesh/checkpoint/async_saver.cc

#include "vemesh/checkpoint/async_saver.h"

namespace vemesh::checkpoint {

struct AsyncSaver::Impl {};

AsyncSaver::AsyncSaver(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
AsyncSaver::~AsyncSaver() = default;

absl::StatusOr<std::unique_ptr<AsyncSaver>> AsyncSaver::Create(Communicator&) {
  return absl::UnimplementedError("AsyncSaver: not yet");
}
absl::Status AsyncSaver::Start(const StateDict&, int64_t, const std::string&,
                               const SaveOptions&) {
  return absl::UnimplementedError("AsyncSaver: not yet");
}
absl::Status AsyncSaver::Wait() { return absl::OkStatus(); }
bool AsyncSaver::in_flight() const { return false; }

}  // namespace vemesh::checkpoint
