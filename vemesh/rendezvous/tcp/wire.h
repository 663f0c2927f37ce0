// vemesh/rendezvous/tcp/wire.h
//
// The bytes TcpStore and TcpStoreServer exchange. Every message is a frame:
//
//   u32 payload length (little-endian, at most kMaxStoreFrameBytes)
//   payload
//
// A request payload is an op byte and its operands; a reply payload is a
// status code, a message and a list of values. Strings are a u32 length and
// the bytes; integers are little-endian. The client sends one request and
// reads one reply (or pipelines a few and reads as many replies, in order).
//
//   op          operands                          reply values (when OK)
//   SET         key, value                        -
//   GET         u32 n, n keys                     the n values (multi-get;
//                                                 a missing key: NotFound)
//   WAIT        u32 n, n keys, i64 timeout_ms     - (DeadlineExceeded naming
//                                                 the missing keys)
//   ADD         key, i64 delta                    the new counter, decimal
//   COMPARE_SET key, expected, desired            the value afterwards
//   REMOVE      key                               "1" if it existed, else "0"
//   PING        -                                 -
//   HELLO       u32 n, n "name=value" fields      server nonce, server
//                                                 proof, the store's job
//   AUTH        u32 n, n "name=value" fields      -
//
// HELLO and AUTH open a connection (StoreHello below): HELLO names the job,
// the rank it claims and a client nonce; AUTH answers the server's nonce
// with an HMAC of the shared token (and, from rank 0's own client, of the
// server's owner secret). A server with a token serves nothing else before
// AUTH succeeds.
//
// The parsers take bytes from the network, so they are incremental and
// distrustful: a length is checked against the bytes present and against
// the store's bounds before anything is sized by it, and the encoding is
// canonical (one request has one encoding; trailing bytes are malformed).
//
//   std::string in;  // what the socket has delivered so far
//   ParsedRequest p = ParseRequest(in);
//   if (p.outcome == ParsedRequest::kComplete) {
//     handle(p.message);
//     in.erase(0, p.consumed);
//   }
//   if (p.outcome == ParsedRequest::kMalformed) close(fd);  // p.error: why

#ifndef VEMESH_RENDEZVOUS_TCP_WIRE_H_
#define VEMESH_RENDEZVOUS_TCP_WIRE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "vemesh/rendezvous/store.h"

namespace vemesh {

// The largest payload of one frame: a SET of the largest value with room to
// spare for the key and framing. A call whose request or reply would be
// larger (a COMPARE_SET of two large values, a multi-get whose values add up
// past it) is refused rather than split.
inline constexpr size_t kMaxStoreFrameBytes = kMaxStoreValueBytes + (64 << 10);
inline constexpr size_t kStoreFrameHeaderBytes = 4;
// Error messages in replies are cut to this.
inline constexpr size_t kMaxStoreMessageBytes = 16 << 10;

enum class StoreOp : uint8_t {
  kSet = 1,
  kGet = 2,
  kWait = 3,
  kAdd = 4,
  kCompareSet = 5,
  kRemove = 6,
  kPing = 7,
  kHello = 8,
  kAuth = 9,
};

// "SET", "GET", ...; "op 42" for a byte that is no op.
std::string StoreOpName(StoreOp op);

struct StoreRequest {
  StoreOp op = StoreOp::kPing;
  // One key for SET, ADD, COMPARE_SET, REMOVE; any number for GET, WAIT.
  std::vector<std::string> keys;
  std::string value;       // SET: the value; COMPARE_SET: desired
  std::string expected;    // COMPARE_SET
  int64_t delta = 0;       // ADD
  int64_t timeout_ms = 0;  // WAIT, relative: the hosts' clocks may differ
};

struct StoreReply {
  absl::StatusCode code = absl::StatusCode::kOk;
  std::string message;
  std::vector<std::string> values;
};

// The frame of a request. InvalidArgument when it breaks a bound (key or
// value size, key count, a WAIT with a negative timeout, a single-key op
// with other than one key, a frame over kMaxStoreFrameBytes): the client
// sends nothing then.
absl::StatusOr<std::string> EncodeRequest(const StoreRequest& request);

// The frame of a reply. A reply over kMaxStoreFrameBytes is replaced by a
// ResourceExhausted one saying so; a message is cut to
// kMaxStoreMessageBytes.
std::string EncodeReply(const StoreReply& reply);

template <typename T>
struct Parsed {
  enum Outcome { kIncomplete, kMalformed, kComplete };
  Outcome outcome = kIncomplete;
  std::string error;    // kMalformed: what was wrong
  T message;            // kComplete
  size_t consumed = 0;  // kComplete: bytes of the frame, header included
};
using ParsedRequest = Parsed<StoreRequest>;
using ParsedReply = Parsed<StoreReply>;

// The first frame of `bytes`. kIncomplete: more bytes are needed (never
// when the header already announces a frame over the bound: kMalformed).
ParsedRequest ParseRequest(absl::string_view bytes);
ParsedReply ParseReply(absl::string_view bytes);

// The fields of HELLO and AUTH, parsed from their "name=value" keys. Each
// name at most once; unknown names are refused (InvalidArgument), so that
// a typo is not a silently weaker handshake.
struct StoreHello {
  std::string job;    // the job's identity ("" : none given)
  int64_t rank = -1;  // the rank claimed (-1: none, e.g. a tool)
  std::string claim;  // hex: the claimer's identity (a process nonce)
  std::string nonce;  // hex: the client's challenge to the server
  std::string proof;  // AUTH, hex: HMAC(token, client proof text)
  std::string owner;  // AUTH, hex: HMAC(owner secret, ...)
  // HELLO: this rank's claim was refused by another store on this port (a
  // rank claimed twice there): the store answering now records a conflict,
  // so that its job fails too instead of waiting for this rank.
  bool refused = false;
};
std::vector<std::string> HelloFields(const StoreHello& hello);
absl::StatusOr<StoreHello> ParseHelloFields(
    const std::vector<std::string>& fields);

// What each side's HMAC covers: a role and both nonces, so that a proof
// cannot be replayed in the other direction or on another connection.
std::string HelloProofText(absl::string_view role,
                           absl::string_view server_nonce,
                           absl::string_view client_nonce);

// The Status a reply carries (OK, or its code and message).
absl::Status ReplyStatus(const StoreReply& reply);

}  // namespace vemesh

#endif  // VEMESH_RENDEZVOUS_TCP_WIRE_H_
