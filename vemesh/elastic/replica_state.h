// vemesh/elastic/replica_state.h
//
// What one rank of an elastic job holds (parameters, optimizer state, step,
// data position), registered once as named pairs of callbacks, the shape of
// torchft's Manager.register_state_dict_fn: `state_dict` serialises the
// entry to bytes, `load_state_dict` replaces it from such bytes. The elastic
// mesh (elastic_mesh.h) calls them itself: it sends the bytes to the
// replicas that joined, along the replicate dimension, and compares a
// fingerprint of them across the replicas.
//
//   ReplicaState state;
//   std::vector<float> w(1024);
//   absl::Status s = state.Register(
//       "w",
//       [&]() -> absl::StatusOr<std::string> {
//         return std::string(reinterpret_cast<const char*>(w.data()),
//                            w.size() * sizeof(float));
//       },
//       [&](absl::string_view bytes) {
//         if (bytes.size() != w.size() * sizeof(float)) {
//           return absl::InvalidArgumentError("w: wrong size");
//         }
//         std::memcpy(w.data(), bytes.data(), bytes.size());
//         return absl::OkStatus();
//       });
//   absl::StatusOr<uint64_t> f = state.Fingerprint();
//
// Bytes, not typed buffers: a sharded model, an optimizer and a data loader
// each serialise what they hold their own way; the library only moves and
// hashes it. The cost is one copy of the state per transfer and per
// fingerprint. State that already is one buffer of a fixed size (a
// parameter shard) can be registered as its live bytes instead: sent from,
// received into and hashed in place, with no copy:
//
//   state.RegisterBytes("w", [&] {
//     return absl::MakeSpan(reinterpret_cast<char*>(w.data()),
//                           w.size() * sizeof(float));
//   });

#ifndef VEMESH_ELASTIC_REPLICA_STATE_H_
#define VEMESH_ELASTIC_REPLICA_STATE_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "vemesh/comm/communicator.h"

namespace vemesh {

// A 64-bit hash of `bytes`, continuing from `seed`: the same on every
// process (the state's fingerprint must not depend on a per-process hash
// seed) and fast on large states (four lanes of 8-byte words, several GB/s;
// hosts of one byte order, as every replica of a job is). It detects
// corruption and divergence; it is not a cryptographic hash.
uint64_t Fingerprint64(absl::string_view bytes, uint64_t seed = 0);

class ReplicaState {
 public:
  using StateDictFn = std::function<absl::StatusOr<std::string>()>;
  using LoadStateDictFn = std::function<absl::Status(absl::string_view)>;

  // Adds (or replaces) the entry `name`. Every rank of the job registers
  // the same names.
  absl::Status Register(const std::string& name, StateDictFn state_dict,
                        LoadStateDictFn load_state_dict);
  // Adds (or replaces) the entry `name` as the live bytes `bytes` returns
  // (valid until the next step changes the buffer, of the same size on
  // every replica): a receiver's transfer writes them in place, and a size
  // other than the sender's fails the transfer (nothing written).
  using BytesFn = std::function<absl::Span<char>()>;
  absl::Status RegisterBytes(const std::string& name, BytesFn bytes);
  bool empty() const { return entries_.empty(); }
  std::vector<std::string> names() const;

  // One 64-bit checksum of every entry's bytes (and names), in name order.
  absl::StatusOr<uint64_t> Fingerprint() const;

  // Collective over `group` (the ranks of one shard coordinate, one per
  // replica): DP rank `root` sends every entry, the ranks with `receive`
  // load them, and all agree that every receiver loaded (a max over the
  // group). Any rank's failure fails it on every rank: Aborted (the epoch
  // is to be rebuilt), or the error of the group operation.
  absl::Status Transfer(Communicator& group, int root, bool receive) const;

  // Collective over `group`: gathers every rank's Fingerprint and returns
  // OK if they are equal, else DataLoss in the one format of
  // comm/agreement.h: the first of `replicas` (the replica id of each DP
  // rank) whose fingerprint differs from the first's, and both
  // fingerprints ("...: replica 9 has 00ab..., replica 4 has 13f0...").
  // A failed group operation returns its error instead. `named`, if given,
  // gets those two replica ids on DataLoss ({-1, -1} otherwise), for the
  // ranks of other shard coordinates, which compared equal states.
  absl::Status CompareFingerprints(Communicator& group,
                                   const std::vector<int>& replicas,
                                   absl::string_view where,
                                   std::pair<int, int>* named = nullptr) const;

 private:
  struct Entry {
    StateDictFn state_dict;
    LoadStateDictFn load_state_dict;
    BytesFn bytes;  // set for RegisterBytes entries (the others null)
  };
  std::map<std::string, Entry> entries_;
};

}  // namespace vemesh

#endif  // VEMESH_ELASTIC_REPLICA_STATE_H_
