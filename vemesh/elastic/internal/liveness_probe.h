// vemesh/elastic/internal/liveness_probe.h
//
// Tells a dead process from a slow one in milliseconds, without waiting for
// its lease: every rank of a replica listens on a TCP port of its own (and
// advertises "HOST:PORT" in the store); a survivor that lost a peer on the
// data plane connects to the peer's ports (ControlPlane::Probe: one refused
// port ends the replica). The kernel answers for the
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
//
// The same port carries one short message to a live process: a rank whose
// step lost a peer tells its replica's other ranks to abort the epoch's
// groups they may be blocked in (SendToListener; the listener hands the
// text, at most kMaxListenerMessage bytes, to its callback).

#ifndef VEMESH_ELASTIC_INTERNAL_LIVENESS_PROBE_H_
#define VEMESH_ELASTIC_INTERNAL_LIVENESS_PROBE_H_

#include <atomic>
#include <cstddef>
#include <functional>
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

inline constexpr size_t kMaxListenerMessage = 128;

class LivenessListener {
 public:
  // What a peer sent (called on the listener's thread).
  using OnMessage = std::function<void(absl::string_view text)>;

  // Listens on `host` at a port the kernel picks (a backlog of up to 4096,
  // as net.core.somaxconn allows); a thread accepts every pending
  // connection at each wake-up and closes it (so that a flood never fills
  // the backlog and a probe always completes its handshake), first reading
  // what the peer sent within a few milliseconds when `on_message` is set
  // (a probe sends nothing and closes at once). Messages are awaited on at
  // most 64 connections together, the oldest closed first: silent peers
  // never hold the accepting thread.
  static absl::StatusOr<std::unique_ptr<LivenessListener>> Start(
      const std::string& host, OnMessage on_message = nullptr);
  ~LivenessListener();
  LivenessListener(const LivenessListener&) = delete;
  LivenessListener& operator=(const LivenessListener&) = delete;

  const std::string& address() const { return address_; }

 private:
  LivenessListener(int fd, std::string address, OnMessage on_message);
  void Run();

  const int fd_;
  const std::string address_;
  const OnMessage on_message_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// Connects to "HOST:PORT" (IPv4 or a name) within `timeout`.
Liveness ProbeLiveness(absl::string_view address, absl::Duration timeout);

// Whether `address` is (or was) a listener of this process: its refusal
// then is a thread's mesh ending, not a process dying.
bool ListenerStartedHere(absl::string_view address);

// Connects to a listener within `timeout` and sends `text` (at most
// kMaxListenerMessage bytes); false if it could not.
bool SendToListener(absl::string_view address, absl::string_view text,
                    absl::Duration timeout);

}  // namespace vemesh

#endif  // VEMESH_ELASTIC_INTERNAL_LIVENESS_PROBE_H_
