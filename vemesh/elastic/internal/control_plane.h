// vemesh/elastic/internal/control_plane.h
//
// What an elastic job keeps in the store that outlives every replica (Redis
// in production, a MemoryStore in unit tests), under "vemesh/elastic/JOB/":
//
//   membership            the one MembershipRecord (membership.h)
//   descriptor            what every replica must share (the mesh, model,
//                         batch, ...): KEY=VALUE;... fields, written by the
//                         founder and compared by every joiner
//   hb/REPLICA/INC/RANK   a lease per rank of a replica's incarnation INC
//                         (membership.h): its heartbeat
//   probe/REPLICA/INC[/RANK]  HOST:PORT of a rank's liveness port (rank 0
//                         without the suffix)
//   epoch/E/alive/REPLICA the incarnation of a replica that reached the
//                         recovery after epoch E (the quorum round)
//   epoch/E/dp/POS/...    the rendezvous of epoch E's DP group at inner
//                         position POS (Gloo's keys)
//   store_up, store_back  whether the store lost its keys lately (see
//                         NoteStoreUp)
//
//   ControlPlane cp(store, "job7", /*ranks_per_replica=*/2);
//   absl::StatusOr<ControlPlane::Reading> now = cp.Read();
//   absl::StatusOr<bool> up = cp.Alive(1, inc);   // every lease of replica 1
//   auto after = cp.Transition(*now, next);       // compare-and-set
//
// A replica is alive while every one of its ranks holds its lease: a killed
// rank stops renewing and its lease expires after the TTL, and so does a
// stopped (SIGSTOP) one, since its renewing thread stops with it. (A rank
// whose main thread hangs while its heartbeat thread runs stays alive: the
// lease proves the process, not its progress.)
// A store that cannot be reached is Unavailable, passed up as is.

#ifndef VEMESH_ELASTIC_INTERNAL_CONTROL_PLANE_H_
#define VEMESH_ELASTIC_INTERNAL_CONTROL_PLANE_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "vemesh/elastic/internal/liveness_probe.h"
#include "vemesh/elastic/internal/membership.h"
#include "vemesh/rendezvous/store.h"

namespace vemesh {

class ControlPlane {
 public:
  // The record and the exact text it was read as (the compare-and-set
  // compares text).
  struct Reading {
    MembershipRecord record;
    std::string text;
  };

  ControlPlane(std::shared_ptr<Store> store, std::string job,
               int ranks_per_replica);

  // The record now. An unreachable store (Unavailable) is retried with
  // backoff (20 ms doubling to 320 ms) for up to retry_for (none unless
  // set; the elastic mesh sets its lease TTL).
  absl::StatusOr<Reading> Read() const;
  void set_retry_for(absl::Duration d) { retry_for_ = d; }
  // Replaces `from` by `to` if the record is still `from`; returns what the
  // record is afterwards (`to` when this call won).
  absl::StatusOr<Reading> Transition(const Reading& from,
                                     const MembershipRecord& to) const;
  absl::StatusOr<bool> Alive(int replica, uint64_t incarnation) const;
  // The replicas of `ids` whose incarnation in `record` is alive, in order.
  absl::StatusOr<std::vector<int>> AliveOf(const MembershipRecord& record,
                                           const std::vector<int>& ids) const;

  // Claims the job's descriptor if none is recorded, else compares it:
  // InvalidArgument naming each field in which `mine` differs (replica
  // `replica`'s view against the job's).
  absl::Status CheckDescriptor(const std::string& mine, int replica) const;
  // Overwrites the descriptor (a fresh job under the name of one that ended).
  absl::Status SetDescriptor(const std::string& descriptor) const;
  // Writes the record and the descriptor back where they are absent (a Redis
  // restarted empty or flushed): a live member's copy wins over any newcomer,
  // which waits longer than the heartbeat period before founding a job.
  absl::Status RestoreIfAbsent(const std::string& record_text,
                               const std::string& descriptor) const;

  // A store restarted empty (Redis without persistence) loses every lease
  // at once: for a while after, an absent lease says nothing about its
  // holder. NoteStoreUp (each renewal of a replica's rank 0, and a restore
  // of the record) marks the store as this job's ("store_up"); one that
  // finds the mark gone first starts a grace of `grace` ("store_back", a
  // lease of its own), then writes the mark, so that LeasesTrusted (the
  // mark there, the grace over) is false from the restart until a grace
  // after the first renewal that saw it.
  absl::Status NoteStoreUp(absl::Duration grace) const;
  absl::StatusOr<bool> LeasesTrusted() const;

  std::string LeaseKey(int replica, uint64_t incarnation, int rank) const;
  // The key prefix of epoch `epoch`'s DP group at inner position `pos`.
  std::string GroupPrefix(int64_t epoch, int pos) const;
  // Where rank `rank` of a replica's incarnation advertises its liveness
  // port (liveness_probe.h), and where its leader posts "alive after epoch
  // E" (quorum_round.h).
  std::string ProbeKey(int replica, uint64_t incarnation, int rank = 0) const;
  std::string AliveKey(int64_t epoch, int replica) const;

  // What the liveness ports of every rank of a replica's incarnation say:
  // kGone as soon as one refuses (`address` is that port's: one dead rank
  // ends a replica, its launcher ends the rest at its own pace), kListening
  // when every rank's answers (`address` is rank 0's), kUnknown otherwise
  // (a port not advertised or not answering: the lease decides).
  struct ReplicaLiveness {
    Liveness liveness = Liveness::kUnknown;
    std::string address;
  };
  absl::StatusOr<ReplicaLiveness> Probe(int replica, uint64_t incarnation,
                                        absl::Duration timeout) const;
  // The liveness addresses every rank of a replica's incarnation advertised
  // (ProbeKey), by inner rank; "" where a rank advertised none. The one
  // reader of those keys (Probe, a replica's mates, the tells of
  // ElasticMesh::AbortEpochPeers): an incarnation's addresses never change,
  // so a complete set is read once and kept (at most kProbeCacheEntries
  // incarnations); an incomplete one is read again next time.
  absl::StatusOr<std::vector<std::string>> ProbeAddresses(
      int replica, uint64_t incarnation) const;
  static constexpr size_t kProbeCacheEntries = 4096;
  const std::shared_ptr<Store>& store() const { return store_; }

 private:
  absl::StatusOr<Reading> ReadOnce() const;

  std::shared_ptr<Store> store_;
  std::string root_;
  int ranks_per_replica_;
  absl::Duration retry_for_ = absl::ZeroDuration();
  mutable std::mutex probe_mu_;
  // (replica, incarnation) -> complete ProbeAddresses; under probe_mu_.
  mutable std::map<std::pair<int, uint64_t>, std::vector<std::string>>
      probe_addresses_;
};

// Renews one lease every ttl/4 on its own thread (and its own store
// connection, so a slow call elsewhere never delays it) until destroyed.
// A renewal that fails is remembered: `lost()` says the lease may have
// expired, with the store's error.
class Heartbeat {
 public:
  static absl::StatusOr<std::unique_ptr<Heartbeat>> Start(
      std::shared_ptr<Store> store, std::string key, absl::Duration ttl,
      std::function<void()> after_renewal = nullptr);
  ~Heartbeat();
  Heartbeat(const Heartbeat&) = delete;
  Heartbeat& operator=(const Heartbeat&) = delete;

  // OK while every renewal since the last success is younger than the TTL.
  absl::Status lost() const;

 private:
  Heartbeat(std::shared_ptr<Store> store, std::string key, absl::Duration ttl,
            std::function<void()> after_renewal);
  void Run();

  const std::shared_ptr<Store> store_;
  const std::string key_;
  const absl::Duration ttl_;
  // Runs on the heartbeat's thread after each successful renewal (the
  // elastic mesh restores a vanished record there, whatever the main thread
  // is doing).
  const std::function<void()> after_renewal_;
  mutable std::mutex mu_;
  std::condition_variable wake_;
  bool stop_ = false;        // under mu_
  absl::Status last_error_;  // under mu_
  absl::Time last_success_;  // under mu_
  std::thread thread_;
};

}  // namespace vemesh

#endif  // VEMESH_ELASTIC_INTERNAL_CONTROL_PLANE_H_
