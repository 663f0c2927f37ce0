// vemesh/elastic/internal/liveness_probe.h
//
// Tells a dead process from a slow one in milliseconds, without waiting for
// its lease: each replica's leader listens on a TCP port of its own (and
// advertises "HOST:PORT" in the store); a survivor that lost a peer on the
// data plane connects to the peer's port. The kernel answers for the
// process: a killed process's port is closed and the connect is refused at
// once; a live one, even stopped (SIGSTOP) or busy, completes the handshake
// (the kernel accepts into the backlog). A host that does not answer at all
// is "unknown": the lease decides, as before.
//
//   absl::StatusOr<std::unique_ptr<LivenessListener>> l =
//       LivenessListener::Start("127.0.0.1");
//   std::string where = (*l)->address();          // "127.0.0.1:41234"
//   Liveness v = ProbeLiveness(where, absl::Milliseconds(20));
//   // kListening while *l lives, kGone once it is destroyed.

#ifndef VEMESH_ELASTIC_INTERNAL_LIVENESS_PROBE_H_
#define VEMESH_ELASTIC_INTERNAL_LIVENESS_PROBE_H_

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace vemesh {

enum class Liveness {
  kGone,       // refused: nobody listens there any more
  kListening,  // the handshake completed: the process is alive
  kUnknown,    // no answer within the bound, or a bad address
};

class LivenessListener {
 public:
  // Listens on `host` at a port the kernel picks; a thread accepts and
  // closes each connection (so that the backlog never fills).
  static absl::StatusOr<std::unique_ptr<LivenessListener>> Start(
      const std::string& host);
  ~LivenessListener();
  LivenessListener(const LivenessListener&) = delete;
  LivenessListener& operator=(const LivenessListener&) = delete;

  const std::string& address() const { return address_; }

 private:
  LivenessListener(int fd, std::string address);
  void Run();

  const int fd_;
  const std::string address_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// Connects to "HOST:PORT" (IPv4 or a name) within `timeout`.
Liveness ProbeLiveness(absl::string_view address, absl::Duration timeout);

}  // namespace vemesh

#endif  // VEMESH_ELASTIC_INTERNAL_LIVENESS_PROBE_H_
