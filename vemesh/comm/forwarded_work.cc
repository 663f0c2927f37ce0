#include "vemesh/comm/forwarded_work.h"

#include <optional>
#include <utility>

#include "vemesh/base/status_macros.h"
#include "vemesh/comm/backend.h"
#include "vemesh/comm/work.h"

namespace vemesh {
namespace {

// The inner Work seen through the wrapper that owns it.
class ForwardedWork final : public Work {
 public:
  ForwardedWork(std::shared_ptr<Communicator> owner,
                std::shared_ptr<Work> inner)
      : Work(std::move(owner), inner->name()), inner_(std::move(inner)) {}

 protected:
  std::optional<absl::Status> Poll() override {
    if (!inner_->test()) return std::nullopt;
    return inner_->status();
  }
  // The inner Work decides when an abort lets the buffers go.
  bool LeavesOnAbort() const override { return false; }

 private:
  std::shared_ptr<Work> inner_;
};

}  // namespace

Communicator::WorkOr StartForwarded(std::shared_ptr<Communicator> wrapper,
                                    Communicator& inner, const Operation& op) {
  if (inner.backend() != BackendName(Backend::kNccl)) return inner.start(op);
  if (wrapper == nullptr) {
    // The Work must keep its owner alive (and abort through it).
    return absl::FailedPreconditionError(
        "an NCCL operation through a wrapper that is not owned by a "
        "shared_ptr: make the wrapper with std::make_shared");
  }
  VEMESH_ASSIGN_OR_RETURN(std::shared_ptr<Work> work, inner.start(op));
  return std::shared_ptr<Work>(
      std::make_shared<ForwardedWork>(std::move(wrapper), std::move(work)));
}

}  // namespace vemesh
