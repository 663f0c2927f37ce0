// vemesh/rendezvous/tcp/internal/rank_keys.h
//
// Keys tied to a rank (issue 44): TcpStoreServer lets only the connection
// that proved rank r write a key that belongs to r, such as a bootstrap
// round's contribution "vemesh/ag/3/r" and ack "vemesh/ag/3/ack/r".
//
// A pattern is '/'-separated components: a literal, "*" (any one
// component) or "{rank}" (a rank in decimal: "0", or digits not starting
// with 0, at most 9 of them). A key matches when it has as many
// components and each one matches; the "{rank}" component is then the
// rank the key belongs to.
//
//   std::vector<std::string> patterns = {"vemesh/ag/*/{rank}",
//                                        "vemesh/ag/*/ack/{rank}"};
//   RankOfKey("vemesh/ag/0/1", patterns);      // 1
//   RankOfKey("vemesh/ag/0/verdict", patterns);  // nullopt: nobody's
//
// WriteRefusal is the server's whole rule for who may write which key (the
// rank keys, and the owner keys of tcp_store_server.h), kept free of
// sockets so that the fuzzer checks it on every frame it makes.
//
// Private to the store server and its fuzzer: not installed.

#ifndef VEMESH_RENDEZVOUS_TCP_INTERNAL_RANK_KEYS_H_
#define VEMESH_RENDEZVOUS_TCP_INTERNAL_RANK_KEYS_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "vemesh/rendezvous/tcp/wire.h"

namespace vemesh {

// OK, or InvalidArgument naming the pattern: empty, an empty component, no
// "{rank}" component or more than one.
absl::Status CheckRankKeyPattern(absl::string_view pattern);

// The rank `key` belongs to under the first pattern it matches; nullopt
// when it matches none (anybody may write it).
std::optional<int64_t> RankOfKey(absl::string_view key,
                                 absl::Span<const std::string> patterns);

// What a connection proved in its handshake.
struct KeyWriter {
  bool owner = false;  // the owner secret: rank 0's own client
  // The rank whose claim it holds (its AUTH accepted, no other claimer
  // holds the rank); -1: none.
  int64_t proved_rank = -1;
};

// The server's write rules (TcpStoreServerOptions' fields of these names).
struct WriteRules {
  absl::Span<const std::string> owner_key_suffixes;
  absl::Span<const std::string> open_value_prefixes;
  absl::Span<const std::string> rank_key_patterns;
};

// OK when `writer` may make a write of `op` (SET, ADD, COMPARE_SET,
// REMOVE; any other op is OK) to `key` with `value`; PermissionDenied
// naming the key and whose it is otherwise.
absl::Status WriteRefusal(const WriteRules& rules, const KeyWriter& writer,
                          StoreOp op, absl::string_view key,
                          absl::string_view value);

}  // namespace vemesh

#endif  // VEMESH_RENDEZVOUS_TCP_INTERNAL_RANK_KEYS_H_
