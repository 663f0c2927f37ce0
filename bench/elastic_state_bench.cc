// bench/elastic_state_bench.cc
//
// The elastic mesh's state transfer (register_state_dict_fn + sync_state,
// vemesh/elastic/elastic_mesh.h) against the link it runs on, in one
// process: first loopback TCP bandwidth, a plain socket pair sending the
// same number of bytes (best of --link_runs); then, per size, --runs fresh
// jobs of one thread per replica over a shared MemoryStore control plane:
// --replicas - 1 founders train, one more replica joins late, and the
// joiner's sync_state() receives the registered state (one entry of SIZE
// bytes). Its Recovery::state_time is the figure; the table gives its
// median as MB/s and as a share of the link. Beside it, in seconds
// (median), the parts of the same path timed alone on the same data:
//
//   xfer    ReplicaState::Transfer over the same DP group, right after the
//           join (serialisation copy, Gloo broadcast, load)
//   cmp     ReplicaState::CompareFingerprints over it, which sync_state
//           runs after the transfer on every rank
//   bcast   one plain Gloo broadcast of SIZE bytes (the wire part alone)
//   copy    state_dict's bytes appended into one buffer, one thread
//   fp      ReplicaState::Fingerprint (state_dict + FNV-1a), one thread
//
// --in_place registers the model as its live bytes (register_state_bytes):
// no serialisation copy, received in place, hashed without a copy.
//
//   build/bench/elastic_state_bench                       # 64, 256 MiB
//   build/bench/elastic_state_bench --in_place
//   build/bench/elastic_state_bench --sizes_mib=1 --runs=1 --link_runs=1

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "vemesh/bootstrap/store_bootstrap.h"
#include "vemesh/elastic/elastic_mesh.h"
#include "vemesh/elastic/replica_state.h"
#include "vemesh/rendezvous/memory_store.h"

ABSL_FLAG(std::vector<std::string>, sizes_mib,
          std::vector<std::string>({"64", "256"}), "state sizes in MiB");
ABSL_FLAG(int, runs, 3, "jobs per size (median)");
ABSL_FLAG(int, link_runs, 3, "loopback socket runs per size (best)");
ABSL_FLAG(bool, in_place, false,
          "register the model entry as its live bytes (register_state_bytes: "
          "sent, received and hashed in place) instead of a state_dict pair");
ABSL_FLAG(int, replicas, 2,
          "replicas after the join: replicas - 1 founders and one joiner");

namespace vemesh {
namespace {

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

double MBps(size_t bytes, double seconds) {
  return seconds > 0 ? bytes / 1e6 / seconds : 0.0;
}

// Seconds to send `bytes` from one thread to another over a TCP socket pair
// on 127.0.0.1, from the first send to the last byte received.
absl::StatusOr<double> LoopbackOnce(size_t bytes) {
  int listener = socket(AF_INET, SOCK_STREAM, 0);
  if (listener < 0) return absl::InternalError("socket");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  if (bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      listen(listener, 1) != 0 ||
      getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    close(listener);
    return absl::InternalError("bind/listen on 127.0.0.1");
  }
  int out = socket(AF_INET, SOCK_STREAM, 0);
  if (connect(out, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(out);
    close(listener);
    return absl::InternalError("connect to 127.0.0.1");
  }
  int in = accept(listener, nullptr, nullptr);
  close(listener);
  if (in < 0) {
    close(out);
    return absl::InternalError("accept");
  }
  std::vector<char> src(bytes, 1);
  std::vector<char> dst(bytes);
  const absl::Time start = absl::Now();
  std::thread sender([&] {
    size_t at = 0;
    while (at < bytes) {
      ssize_t n = send(out, src.data() + at, bytes - at, 0);
      if (n <= 0) break;
      at += static_cast<size_t>(n);
    }
  });
  size_t got = 0;
  while (got < bytes) {
    ssize_t n = recv(in, dst.data() + got, bytes - got, 0);
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  const double secs = absl::ToDoubleSeconds(absl::Now() - start);
  sender.join();
  close(out);
  close(in);
  if (got != bytes) return absl::InternalError("short loopback transfer");
  return secs;
}

// One rank's registered state: `bytes` bytes, and the step.
struct State {
  std::string data;
  int64_t step = 0;

  absl::Status Register(ElasticMesh& el) {
    absl::Status s = el.register_state_dict_fn(
        "step",
        [this]() -> absl::StatusOr<std::string> {
          return std::string(reinterpret_cast<const char*>(&step),
                             sizeof(step));
        },
        [this](absl::string_view b) {
          if (b.size() != sizeof(step)) return absl::InvalidArgumentError("s");
          std::memcpy(&step, b.data(), sizeof(step));
          return absl::OkStatus();
        });
    if (!s.ok()) return s;
    if (absl::GetFlag(FLAGS_in_place)) {
      return el.register_state_bytes(
          "model", [this] { return absl::MakeSpan(data.data(), data.size()); });
    }
    return el.register_state_dict_fn(
        "model", [this]() -> absl::StatusOr<std::string> { return data; },
        [this](absl::string_view b) {
          if (b.size() != data.size()) {
            return absl::InvalidArgumentError("model: wrong size");
          }
          std::memcpy(data.data(), b.data(), b.size());
          return absl::OkStatus();
        });
  }
};

struct JobResult {
  absl::Status status;
  double state_s = 0;  // the joiner's Recovery::state_time
  double bcast_s = 0;  // one plain Gloo broadcast of the same size
  double xfer_s = 0;   // ReplicaState::Transfer alone
  double cmp_s = 0;    // ReplicaState::CompareFingerprints alone
};

// One job: founders 0 .. replicas-2, then replica `replicas - 1` joins.
JobResult RunJob(int job, int replicas, size_t bytes) {
  auto control = std::make_shared<MemoryStore>();
  const int founders = replicas - 1;
  std::atomic<bool> joined{false};
  std::atomic<bool> go_join{false};
  std::vector<absl::Status> status(replicas);
  std::vector<double> bcast(replicas, 0.0);
  std::vector<double> xfer(replicas, 0.0);
  std::vector<double> cmp(replicas, 0.0);
  double state_s = 0;

  auto run = [&](int k) {
    auto launch = std::make_shared<MemoryStore>();
    MeshOptions inner;
    inner.backend = "gloo";
    inner.timeout = absl::Seconds(60);
    inner.bootstrap =
        std::make_shared<StoreBootstrap>(launch, 0, 1, absl::StrCat("l", k));
    ElasticOptions o;
    o.control_store = control;
    o.replica = k;
    o.replica_dim = "DP";
    o.job = absl::StrCat("state_bench", job);
    o.heartbeat_ttl = absl::Seconds(2);
    o.op_timeout = absl::Seconds(60);
    o.recovery_timeout = absl::Seconds(120);
    o.form_timeout = absl::Seconds(10);
    auto layout = MeshLayout::Create({founders}, {"DP"});
    if (!layout.ok()) {
      status[k] = layout.status();
      return;
    }
    auto el = ElasticMesh::Create(DeviceType::kCpu, *layout, inner, o);
    if (!el.ok()) {
      status[k] = el.status();
      return;
    }
    State st;
    st.step = (*el)->last_recovery().resume_step;
    st.data.assign(bytes, k < founders ? '\x5a' : '\0');
    if (absl::Status s = st.Register(**el); !s.ok()) {
      status[k] = s;
      return;
    }
    absl::Status s = (*el)->sync_state();
    if (k == founders) {
      // The joiner: sync_state received the state.
      state_s = absl::ToDoubleSeconds((*el)->last_recovery().state_time);
      if (s.ok() && st.data[bytes / 2] != '\x5a') {
        s = absl::DataLossError("the joiner's state was not loaded");
      }
    } else {
      go_join = true;
      // Founders train (no data-plane work) until the join's recovery.
      while (s.ok()) {
        absl::StatusOr<StepVerdict> v = (*el)->end_step(absl::OkStatus());
        if (!v.ok()) {
          s = v.status();
          break;
        }
        if (v->committed) ++st.step;
        if (v->recover) {
          absl::StatusOr<Recovery> r = (*el)->recover(st.step);
          if (!r.ok()) s = r.status();
          if (r.ok() && r->dp_size == replicas) break;
        }
        absl::SleepFor(absl::Milliseconds(5));
      }
    }
    // Both sides: the wire alone, one broadcast of the same bytes.
    if (s.ok()) {
      auto dp = (*el)->mesh().get_group("DP");
      if (!dp.ok()) {
        s = dp.status();
      } else {
        const absl::Time start = absl::Now();
        s = (*dp)->broadcast(st.data.data(), bytes, DataType::kUInt8, 0);
        bcast[k] = absl::ToDoubleSeconds(absl::Now() - start);
        // The two halves of sync_state alone, through the same public
        // calls: ReplicaState::Transfer, then CompareFingerprints.
        ReplicaState rs;
        if (s.ok() && absl::GetFlag(FLAGS_in_place)) {
          s = rs.RegisterBytes("model", [&] {
            return absl::MakeSpan(st.data.data(), st.data.size());
          });
        } else if (s.ok()) {
          s = rs.Register(
              "model", [&]() -> absl::StatusOr<std::string> { return st.data; },
              [&](absl::string_view b) {
                std::memcpy(st.data.data(), b.data(), b.size());
                return absl::OkStatus();
              });
        }
        std::vector<int> ids(replicas);
        for (int i = 0; i < replicas; ++i) ids[i] = i;
        absl::Time t0 = absl::Now();
        if (s.ok()) s = rs.Transfer(**dp, 0, k == founders);
        xfer[k] = absl::ToDoubleSeconds(absl::Now() - t0);
        t0 = absl::Now();
        if (s.ok()) s = rs.CompareFingerprints(**dp, ids, "in the bench");
        cmp[k] = absl::ToDoubleSeconds(absl::Now() - t0);
      }
    }
    if (k == founders) joined = true;
    status[k] = s;
    // Keep the founders' leases until the joiner is done.
    while (!joined) absl::SleepFor(absl::Milliseconds(2));
  };

  std::vector<std::thread> threads;
  for (int k = 0; k < founders; ++k) threads.emplace_back(run, k);
  while (!go_join) absl::SleepFor(absl::Milliseconds(2));
  absl::SleepFor(absl::Milliseconds(50));
  threads.emplace_back(run, founders);
  for (std::thread& t : threads) t.join();
  JobResult out;
  for (const absl::Status& s : status) {
    if (!s.ok() && out.status.ok()) out.status = s;
  }
  out.state_s = state_s;
  out.bcast_s = *std::max_element(bcast.begin(), bcast.end());
  out.xfer_s = *std::max_element(xfer.begin(), xfer.end());
  out.cmp_s = *std::max_element(cmp.begin(), cmp.end());
  return out;
}

int Main() {
  const int replicas = absl::GetFlag(FLAGS_replicas);
  if (replicas < 2) {
    std::fprintf(stderr, "--replicas=%d: expected at least 2\n", replicas);
    return 2;
  }
  std::printf(
      "state transfer to one joiner, %d replicas after the join, "
      "one rank each (threads), Gloo over 127.0.0.1; model entry %s\n",
      replicas,
      absl::GetFlag(FLAGS_in_place) ? "in place (register_state_bytes)"
                                    : "a state_dict pair");
  std::printf("%6s %9s %10s %8s %8s %8s %8s %8s %8s %8s\n", "MiB", "link MB/s",
              "state MB/s", "of link", "state s", "xfer s", "cmp s", "bcast s",
              "copy s", "fp s");
  int job = 0;
  for (const std::string& text : absl::GetFlag(FLAGS_sizes_mib)) {
    const size_t mib = std::stoul(text);
    const size_t bytes = mib << 20;
    double link_s = 1e30;
    for (int i = 0; i < absl::GetFlag(FLAGS_link_runs); ++i) {
      absl::StatusOr<double> t = LoopbackOnce(bytes);
      if (!t.ok()) {
        std::fprintf(stderr, "loopback: %s\n", t.status().ToString().c_str());
        return 1;
      }
      link_s = std::min(link_s, *t);
    }
    std::vector<double> state, bc, xf, cm, copy, fp;
    for (int i = 0; i < absl::GetFlag(FLAGS_runs); ++i) {
      JobResult r = RunJob(job++, replicas, bytes);
      if (!r.status.ok()) {
        std::fprintf(stderr, "job of %zu MiB: %s\n", mib,
                     r.status.ToString().c_str());
        return 1;
      }
      state.push_back(r.state_s);
      bc.push_back(r.bcast_s);
      xf.push_back(r.xfer_s);
      cm.push_back(r.cmp_s);
      // The parts of the path, alone on the same bytes.
      std::string data(bytes, '\x5a');
      ReplicaState rs;
      absl::Status s = rs.Register(
          "model", [&]() -> absl::StatusOr<std::string> { return data; },
          [](absl::string_view) { return absl::OkStatus(); });
      if (!s.ok()) return 1;
      absl::Time t0 = absl::Now();
      std::string joined;
      joined += data;
      copy.push_back(absl::ToDoubleSeconds(absl::Now() - t0));
      t0 = absl::Now();
      absl::StatusOr<uint64_t> f = rs.Fingerprint();
      fp.push_back(absl::ToDoubleSeconds(absl::Now() - t0));
      if (!f.ok()) return 1;
    }
    const double st = Median(state);
    std::printf(
        "%6zu %9.0f %10.0f %7.1f%% %8.3f %8.3f %8.3f %8.3f %8.3f %8.3f\n", mib,
        MBps(bytes, link_s), MBps(bytes, st), 100.0 * link_s / st, st,
        Median(xf), Median(cm), Median(bc), Median(copy), Median(fp));
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace
}  // namespace vemesh

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return vemesh::Main();
}
