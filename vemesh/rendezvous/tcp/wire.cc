#include "vemesh/rendezvous/tcp/wire.h"

#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace vemesh {
namespace {

constexpr size_t kStringHeaderBytes = 4;
// The largest absl::StatusCode (kUnauthenticated).
constexpr uint8_t kMaxStatusCode = 16;

bool HasOneKey(StoreOp op) {
  return op == StoreOp::kSet || op == StoreOp::kAdd ||
         op == StoreOp::kCompareSet || op == StoreOp::kRemove;
}

bool IsKnownOp(uint8_t op) {
  return op >= static_cast<uint8_t>(StoreOp::kSet) &&
         op <= static_cast<uint8_t>(StoreOp::kAuth);
}

// Appends little-endian integers and length-prefixed strings.
class Writer {
 public:
  explicit Writer(size_t payload_bytes) {
    out_.reserve(kStoreFrameHeaderBytes + payload_bytes);
    U32(static_cast<uint32_t>(payload_bytes));
  }
  void U8(uint8_t v) { out_.push_back(static_cast<char>(v)); }
  void U32(uint32_t v) {
    for (int i = 0; i < 4; ++i) out_.push_back(static_cast<char>(v >> (8 * i)));
  }
  void I64(int64_t v) {
    const uint64_t u = static_cast<uint64_t>(v);
    for (int i = 0; i < 8; ++i) out_.push_back(static_cast<char>(u >> (8 * i)));
  }
  void String(absl::string_view s) {
    U32(static_cast<uint32_t>(s.size()));
    out_.append(s.data(), s.size());
  }
  std::string Take() && { return std::move(out_); }

 private:
  std::string out_;
};

// Reads one payload whose length is already known to be present: running
// out of bytes inside it is malformed, never incomplete.
class Reader {
 public:
  explicit Reader(absl::string_view bytes) : rest_(bytes) {}

  size_t left() const { return rest_.size(); }
  const std::string& error() const { return error_; }

  bool Fail(std::string why) {
    error_ = std::move(why);
    return false;
  }
  bool U8(uint8_t* v) {
    if (rest_.empty()) return Fail("payload ends before a byte field");
    *v = static_cast<uint8_t>(rest_[0]);
    rest_.remove_prefix(1);
    return true;
  }
  bool U32(uint32_t* v) {
    if (rest_.size() < 4) return Fail("payload ends inside a u32 field");
    *v = 0;
    for (int i = 0; i < 4; ++i) {
      *v |= static_cast<uint32_t>(static_cast<uint8_t>(rest_[i])) << (8 * i);
    }
    rest_.remove_prefix(4);
    return true;
  }
  bool I64(int64_t* v) {
    if (rest_.size() < 8) return Fail("payload ends inside an i64 field");
    uint64_t u = 0;
    for (int i = 0; i < 8; ++i) {
      u |= static_cast<uint64_t>(static_cast<uint8_t>(rest_[i])) << (8 * i);
    }
    *v = static_cast<int64_t>(u);
    rest_.remove_prefix(8);
    return true;
  }
  // A string of at most `max` bytes; `what` names it in the error.
  bool String(absl::string_view what, size_t max, std::string* out) {
    uint32_t n = 0;
    if (!U32(&n))
      return Fail(absl::StrCat("payload ends inside the length of ", what));
    if (n > max) {
      return Fail(
          absl::StrCat(what, " of ", n, " bytes: expected at most ", max));
    }
    if (n > rest_.size()) {
      return Fail(absl::StrCat(what, " of ", n, " bytes but only ",
                               rest_.size(), " left in the frame"));
    }
    out->assign(rest_.data(), n);
    rest_.remove_prefix(n);
    return true;
  }
  bool Key(std::string* out) {
    if (!String("key", kMaxStoreKeyBytes, out)) return false;
    if (out->empty())
      return Fail("empty key: expected 1.." +
                  std::to_string(kMaxStoreKeyBytes) + " bytes");
    return true;
  }
  // A count of items of at least `min_item_bytes` each: checked against the
  // bound and the bytes left before anyone reserves room for it.
  bool Count(absl::string_view what, size_t max, size_t min_item_bytes,
             uint32_t* n) {
    if (!U32(n)) return false;
    if (*n > max) {
      return Fail(absl::StrCat(*n, " ", what, ": expected at most ", max));
    }
    if (*n > rest_.size() / min_item_bytes) {
      return Fail(absl::StrCat(*n, " ", what, " cannot fit in the ",
                               rest_.size(), " bytes left in the frame"));
    }
    return true;
  }

 private:
  absl::string_view rest_;
  std::string error_;
};

template <typename T>
Parsed<T> Malformed(std::string why) {
  Parsed<T> p;
  p.outcome = Parsed<T>::kMalformed;
  p.error = std::move(why);
  return p;
}

// The payload of the first frame, or why there is none yet.
template <typename T>
bool FramePayload(absl::string_view bytes, absl::string_view* payload,
                  Parsed<T>* result) {
  if (bytes.size() < kStoreFrameHeaderBytes) return false;  // incomplete
  uint32_t n = 0;
  for (int i = 0; i < 4; ++i) {
    n |= static_cast<uint32_t>(static_cast<uint8_t>(bytes[i])) << (8 * i);
  }
  if (n == 0) {
    *result = Malformed<T>("empty frame: expected an op or status byte");
    return false;
  }
  if (n > kMaxStoreFrameBytes) {
    *result = Malformed<T>(absl::StrCat(
        "frame of ", n, " bytes: expected at most ", kMaxStoreFrameBytes));
    return false;
  }
  if (bytes.size() - kStoreFrameHeaderBytes < n) return false;  // incomplete
  *payload = bytes.substr(kStoreFrameHeaderBytes, n);
  result->consumed = kStoreFrameHeaderBytes + n;
  return true;
}

bool ReadKeys(Reader& r, std::vector<std::string>* keys) {
  uint32_t n = 0;
  // A key is at least its length and one byte.
  if (!r.Count("keys", kMaxStoreKeysPerCall, kStringHeaderBytes + 1, &n)) {
    return false;
  }
  keys->resize(n);
  for (std::string& key : *keys) {
    if (!r.Key(&key)) return false;
  }
  return true;
}

size_t KeysBytes(const std::vector<std::string>& keys) {
  size_t n = 4;
  for (const std::string& key : keys) n += kStringHeaderBytes + key.size();
  return n;
}

}  // namespace

std::string StoreOpName(StoreOp op) {
  switch (op) {
    case StoreOp::kSet:
      return "SET";
    case StoreOp::kGet:
      return "GET";
    case StoreOp::kWait:
      return "WAIT";
    case StoreOp::kAdd:
      return "ADD";
    case StoreOp::kCompareSet:
      return "COMPARE_SET";
    case StoreOp::kRemove:
      return "REMOVE";
    case StoreOp::kPing:
      return "PING";
    case StoreOp::kHello:
      return "HELLO";
    case StoreOp::kAuth:
      return "AUTH";
  }
  return absl::StrCat("op ", static_cast<int>(op));
}

absl::StatusOr<std::string> EncodeRequest(const StoreRequest& r) {
  if (!IsKnownOp(static_cast<uint8_t>(r.op))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "store request has ", StoreOpName(r.op), ": expected SET..AUTH"));
  }
  if (HasOneKey(r.op) && r.keys.size() != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("store ", StoreOpName(r.op), " request names ",
                     r.keys.size(), " keys: expected exactly 1"));
  }
  if (r.op == StoreOp::kPing && !r.keys.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "store PING request names ", r.keys.size(), " keys: expected none"));
  }
  absl::Status status = CheckStoreKeys(r.keys);
  if (!status.ok()) return status;
  size_t payload = 1;
  switch (r.op) {
    case StoreOp::kSet:
      status = CheckStoreValue(r.keys[0], r.value);
      payload += 2 * kStringHeaderBytes + r.keys[0].size() + r.value.size();
      break;
    case StoreOp::kGet:
    case StoreOp::kHello:
    case StoreOp::kAuth:
      payload += KeysBytes(r.keys);
      break;
    case StoreOp::kWait:
      if (r.timeout_ms < 0) {
        status = absl::InvalidArgumentError(absl::StrCat(
            "store WAIT timeout of ", r.timeout_ms, " ms: expected >= 0"));
      }
      payload += KeysBytes(r.keys) + 8;
      break;
    case StoreOp::kAdd:
      payload += kStringHeaderBytes + r.keys[0].size() + 8;
      break;
    case StoreOp::kCompareSet:
      status = CheckStoreValue(r.keys[0], r.expected);
      if (status.ok()) status = CheckStoreValue(r.keys[0], r.value);
      payload += 3 * kStringHeaderBytes + r.keys[0].size() + r.expected.size() +
                 r.value.size();
      break;
    case StoreOp::kRemove:
      payload += kStringHeaderBytes + r.keys[0].size();
      break;
    case StoreOp::kPing:
      break;
  }
  if (!status.ok()) return status;
  if (payload > kMaxStoreFrameBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "store ", StoreOpName(r.op), " request",
        r.keys.empty() ? ""
                       : absl::StrCat(" for '", r.keys[0].substr(0, 64), "'"),
        " is ", payload, " bytes: expected at most ", kMaxStoreFrameBytes,
        " per call (keys, values and framing together)"));
  }
  Writer w(payload);
  w.U8(static_cast<uint8_t>(r.op));
  switch (r.op) {
    case StoreOp::kSet:
      w.String(r.keys[0]);
      w.String(r.value);
      break;
    case StoreOp::kGet:
    case StoreOp::kWait:
    case StoreOp::kHello:
    case StoreOp::kAuth:
      w.U32(static_cast<uint32_t>(r.keys.size()));
      for (const std::string& key : r.keys) w.String(key);
      if (r.op == StoreOp::kWait) w.I64(r.timeout_ms);
      break;
    case StoreOp::kAdd:
      w.String(r.keys[0]);
      w.I64(r.delta);
      break;
    case StoreOp::kCompareSet:
      w.String(r.keys[0]);
      w.String(r.expected);
      w.String(r.value);
      break;
    case StoreOp::kRemove:
      w.String(r.keys[0]);
      break;
    case StoreOp::kPing:
      break;
  }
  return std::move(w).Take();
}

std::string EncodeReply(const StoreReply& reply) {
  const absl::string_view message =
      absl::string_view(reply.message).substr(0, kMaxStoreMessageBytes);
  size_t payload = 1 + kStringHeaderBytes + message.size() + 4;
  for (const std::string& v : reply.values)
    payload += kStringHeaderBytes + v.size();
  if (payload > kMaxStoreFrameBytes) {
    StoreReply refused;
    refused.code = absl::StatusCode::kResourceExhausted;
    refused.message =
        absl::StrCat("store reply of ", reply.values.size(), " values is ",
                     payload, " bytes: expected at most ", kMaxStoreFrameBytes,
                     " per call; ask for fewer keys at a time");
    return EncodeReply(refused);
  }
  Writer w(payload);
  w.U8(static_cast<uint8_t>(reply.code));
  w.String(message);
  w.U32(static_cast<uint32_t>(reply.values.size()));
  for (const std::string& v : reply.values) w.String(v);
  return std::move(w).Take();
}

ParsedRequest ParseRequest(absl::string_view bytes) {
  ParsedRequest result;
  absl::string_view payload;
  if (!FramePayload(bytes, &payload, &result)) return result;
  Reader r(payload);
  uint8_t op = 0;
  r.U8(&op);  // the frame is not empty: cannot fail
  if (!IsKnownOp(op)) {
    return Malformed<StoreRequest>(
        absl::StrCat("unknown op byte ", static_cast<int>(op), ": expected 1..",
                     static_cast<int>(StoreOp::kAuth)));
  }
  StoreRequest& req = result.message;
  req.op = static_cast<StoreOp>(op);
  bool ok = true;
  if (HasOneKey(req.op)) {
    req.keys.resize(1);
    ok = r.Key(&req.keys[0]);
  }
  switch (req.op) {
    case StoreOp::kSet:
      ok = ok && r.String("value", kMaxStoreValueBytes, &req.value);
      break;
    case StoreOp::kGet:
    case StoreOp::kHello:
    case StoreOp::kAuth:
      ok = ReadKeys(r, &req.keys);
      break;
    case StoreOp::kWait:
      ok = ReadKeys(r, &req.keys) && r.I64(&req.timeout_ms);
      if (ok && req.timeout_ms < 0) {
        ok = r.Fail(absl::StrCat("WAIT timeout of ", req.timeout_ms,
                                 " ms: expected >= 0"));
      }
      break;
    case StoreOp::kAdd:
      ok = ok && r.I64(&req.delta);
      break;
    case StoreOp::kCompareSet:
      ok = ok &&
           r.String("expected value", kMaxStoreValueBytes, &req.expected) &&
           r.String("desired value", kMaxStoreValueBytes, &req.value);
      break;
    case StoreOp::kRemove:
    case StoreOp::kPing:
      break;
  }
  if (!ok) {
    return Malformed<StoreRequest>(
        absl::StrCat(StoreOpName(req.op), " request: ", r.error()));
  }
  if (r.left() != 0) {
    return Malformed<StoreRequest>(absl::StrCat(
        StoreOpName(req.op), " request: ", r.left(), " trailing bytes"));
  }
  result.outcome = ParsedRequest::kComplete;
  return result;
}

ParsedReply ParseReply(absl::string_view bytes) {
  ParsedReply result;
  absl::string_view payload;
  if (!FramePayload(bytes, &payload, &result)) return result;
  Reader r(payload);
  uint8_t code = 0;
  r.U8(&code);  // the frame is not empty: cannot fail
  if (code > kMaxStatusCode) {
    return Malformed<StoreReply>(
        absl::StrCat("reply status code ", static_cast<int>(code),
                     ": expected 0..", static_cast<int>(kMaxStatusCode)));
  }
  StoreReply& reply = result.message;
  reply.code = static_cast<absl::StatusCode>(code);
  uint32_t n = 0;
  bool ok =
      r.String("reply message", kMaxStoreMessageBytes, &reply.message) &&
      r.Count("reply values", kMaxStoreKeysPerCall, kStringHeaderBytes, &n);
  if (ok) {
    reply.values.resize(n);
    for (std::string& v : reply.values) {
      if (!(ok = r.String("reply value", kMaxStoreValueBytes, &v))) break;
    }
  }
  if (!ok) return Malformed<StoreReply>(r.error());
  if (r.left() != 0) {
    return Malformed<StoreReply>(
        absl::StrCat("reply: ", r.left(), " trailing bytes"));
  }
  result.outcome = ParsedReply::kComplete;
  return result;
}

std::vector<std::string> HelloFields(const StoreHello& hello) {
  std::vector<std::string> out;
  if (!hello.job.empty()) out.push_back(absl::StrCat("job=", hello.job));
  if (hello.rank >= 0) out.push_back(absl::StrCat("rank=", hello.rank));
  if (!hello.claim.empty()) out.push_back(absl::StrCat("claim=", hello.claim));
  if (!hello.nonce.empty()) out.push_back(absl::StrCat("nonce=", hello.nonce));
  if (!hello.proof.empty()) out.push_back(absl::StrCat("proof=", hello.proof));
  if (!hello.owner.empty()) out.push_back(absl::StrCat("owner=", hello.owner));
  if (hello.refused) out.push_back("refused=1");
  if (out.empty()) out.push_back("rank=-1");  // a key list is never empty
  return out;
}

absl::StatusOr<StoreHello> ParseHelloFields(
    const std::vector<std::string>& fields) {
  StoreHello out;
  uint32_t seen = 0;
  for (const std::string& field : fields) {
    const size_t eq = field.find('=');
    if (eq == std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat("store handshake field '",
                                                     field.substr(0, 64),
                                                     "': expected name=value"));
    }
    const absl::string_view name = absl::string_view(field).substr(0, eq);
    const absl::string_view value = absl::string_view(field).substr(eq + 1);
    static constexpr absl::string_view kNames[] = {
        "job", "rank", "claim", "nonce", "proof", "owner", "refused"};
    int index = -1;
    for (int i = 0; i < 7; ++i) {
      if (name == kNames[i]) index = i;
    }
    if (index < 0 || (seen & (1u << index)) != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "store handshake field '", name.substr(0, 64),
          index < 0 ? "' is unknown" : "' appears twice",
          ": expected each of job, rank, claim, nonce, proof, owner, refused "
          "at most once"));
    }
    seen |= 1u << index;
    // Hex fields: bounded and made of hex digits only.
    if (index >= 2) {
      if (value.size() > 2 * 64) {
        return absl::InvalidArgumentError(absl::StrCat(
            "store handshake field '", name, "' has ", value.size(),
            " characters: expected at most 128 hex digits"));
      }
      for (char c : value) {
        if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) {
          return absl::InvalidArgumentError(absl::StrCat(
              "store handshake field '", name,
              "' holds a character that is no lower-case hex digit"));
        }
      }
    }
    switch (index) {
      case 0:
        out.job = std::string(value);
        break;
      case 1: {
        int64_t rank = 0;
        if (!absl::SimpleAtoi(value, &rank) || rank < -1 ||
            rank > (int64_t{1} << 24)) {
          return absl::InvalidArgumentError(
              absl::StrCat("store handshake rank '", value.substr(0, 32),
                           "': expected an integer in [-1, 16777216]"));
        }
        out.rank = rank;
        break;
      }
      case 2:
        out.claim = std::string(value);
        break;
      case 3:
        out.nonce = std::string(value);
        break;
      case 4:
        out.proof = std::string(value);
        break;
      case 5:
        out.owner = std::string(value);
        break;
      default:
        if (value != "1") {
          return absl::InvalidArgumentError(
              "store handshake field 'refused' must be 1 when present");
        }
        out.refused = true;
        break;
    }
  }
  return out;
}

std::string HelloProofText(absl::string_view role,
                           absl::string_view server_nonce,
                           absl::string_view client_nonce) {
  return absl::StrCat("vemesh-store ", role, " ", server_nonce, " ",
                      client_nonce);
}

absl::Status ReplyStatus(const StoreReply& reply) {
  if (reply.code == absl::StatusCode::kOk) return absl::OkStatus();
  return absl::Status(reply.code, reply.message);
}

}  // namespace vemesh
