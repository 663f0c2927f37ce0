#include "vemesh/rendezvous/redis/redis_store.h"

#include <hiredis/hiredis.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "vemesh/base/sigpipe.h"
#include "vemesh/base/status_macros.h"
#include "vemesh/rendezvous/internal/keys_text.h"
#include "vemesh/rendezvous/memory_store.h"
#include "vemesh/rendezvous/tcp/socket.h"

namespace vemesh {
namespace {

// A poll of wait() near its deadline still gets this long: a busy Redis
// that answers late is slow, not lost.
constexpr absl::Duration kMinPollTimeout = absl::Milliseconds(100);
constexpr absl::Duration kFirstPollSleep = absl::Milliseconds(1);
constexpr absl::Duration kMaxPollSleep = absl::Milliseconds(20);
// Error texts name at most this many keys.
using rendezvous_internal::kKeysNamed;

// compare_set, atomic because Redis runs a script alone. KEYS[1] the key;
// ARGV expected, desired, and "1" to keep the key's lease (add's fallback)
// or "0" to store a value that never expires (compare_set). Returns
// {1 if stored, the value afterwards}; an absent key equals "".
constexpr absl::string_view kCompareSetScript = R"lua(
local v = redis.call('GET', KEYS[1])
if v == false then v = '' end
if v ~= ARGV[1] then return {0, v} end
if ARGV[3] == '1' then
  local ttl = redis.call('PTTL', KEYS[1])
  redis.call('SET', KEYS[1], ARGV[2])
  if ttl > 0 then redis.call('PEXPIRE', KEYS[1], ttl) end
else
  redis.call('SET', KEYS[1], ARGV[2])
end
return {1, ARGV[2]}
)lua";

// The 1-based indexes of KEYS that do not exist, at most kKeysNamed + 1 of
// them (one more than are named, to know there are more).
constexpr absl::string_view kMissingKeysScript = R"lua(
local missing = {}
for i, k in ipairs(KEYS) do
  if redis.call('EXISTS', k) == 0 then
    missing[#missing + 1] = i
    if #missing > 8 then break end
  end
end
return missing
)lua";

struct RedisAddress {
  std::string host;
  int port = 0;
  std::string user;
  std::string password;
  bool has_credentials = false;
};

absl::StatusOr<RedisAddress> ParseRedisAddress(absl::string_view full) {
  // The credentials, if any, are cut off first and never shown.
  absl::string_view rest = full;
  const bool scheme = absl::ConsumePrefix(&rest, "redis://");
  RedisAddress address;
  std::string shown;
  if (const size_t at = rest.rfind('@'); at != absl::string_view::npos) {
    const absl::string_view credentials = rest.substr(0, at);
    const size_t colon = credentials.find(':');
    rest.remove_prefix(at + 1);
    // A lone word may be a password: hidden too.
    shown = absl::StrCat(
        scheme ? "redis://" : "",
        colon == absl::string_view::npos ? "" : credentials.substr(0, colon),
        colon == absl::string_view::npos ? "***@" : ":***@", rest);
    if (colon == absl::string_view::npos) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Redis address '", shown.substr(0, 256),
          "' has credentials without a ':': expected "
          "redis://USER:PASSWORD@HOST:PORT or redis://:PASSWORD@HOST:PORT"));
    }
    address.user = std::string(credentials.substr(0, colon));
    address.password = std::string(credentials.substr(colon + 1));
    address.has_credentials = true;
  } else {
    shown = std::string(full);
  }
  const absl::string_view text = shown;
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Redis address '", text.substr(0, 256), "' ", why,
        ": expected redis://HOST:PORT or HOST:PORT with a port in 1..65535"));
  };
  absl::string_view port_text;
  if (absl::ConsumePrefix(&rest, "[")) {
    // An IPv6 literal: "[::1]:6379".
    const size_t close = rest.find(']');
    if (close == absl::string_view::npos) return bad("has no ']' after '['");
    const absl::string_view host = rest.substr(0, close);
    if (host.empty() || !std::all_of(host.begin(), host.end(), [](char c) {
          return absl::ascii_isxdigit(c) || c == ':' || c == '.';
        })) {
      return bad("has no IPv6 address in its brackets");
    }
    address.host = std::string(host);
    rest.remove_prefix(close + 1);
    if (!absl::ConsumePrefix(&rest, ":")) return bad("has no ':PORT'");
    port_text = rest;
  } else {
    const size_t colon = rest.find(':');
    if (colon == absl::string_view::npos) return bad("has no ':PORT'");
    const absl::string_view host = rest.substr(0, colon);
    if (host.empty()) return bad("has no host");
    // A host name or an IPv4 address; a user, a database ("/0") or a bare
    // IPv6 address is not one.
    if (!std::all_of(host.begin(), host.end(), [](char c) {
          return absl::ascii_isalnum(c) || c == '.' || c == '-' || c == '_';
        })) {
      return bad(absl::StrCat("has host '", host.substr(0, 64),
                              "', which is not a host name or IPv4 address "
                              "(an IPv6 address goes in brackets)"));
    }
    address.host = std::string(host);
    port_text = rest.substr(colon + 1);
  }
  int port = 0;
  if (port_text.empty() || port_text.size() > 5 ||
      !std::all_of(port_text.begin(), port_text.end(), absl::ascii_isdigit) ||
      !absl::SimpleAtoi(port_text, &port) || port < 1 || port > 65535) {
    return bad(absl::StrCat("has port '", port_text.substr(0, 32), "'"));
  }
  address.port = port;
  return address;
}

absl::Status CheckTimeout(absl::string_view name, absl::Duration d) {
  if (d <= absl::ZeroDuration() || d == absl::InfiniteDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "RedisStoreOptions.", name, " is ", absl::FormatDuration(d),
        ": expected a positive, finite duration"));
  }
  return absl::OkStatus();
}

// hiredis reads {0, 0} as "no timeout": never hand it less than 1 ms.
timeval Timeval(absl::Duration d) {
  return absl::ToTimeval(std::max(d, absl::Milliseconds(1)));
}

// hiredis writes with write(): every command runs under ScopedSigpipeBlock
// (vemesh/base/sigpipe.h), so a Redis that went away mid-command is an
// error, not the end of the process.

// Whether a command on `c` returned no reply because the socket timeout
// ran out; `err` is errno right after it.
bool TimedOut(const redisContext& c, int err) {
  return c.err == REDIS_ERR_IO && (err == EAGAIN || err == EWOULDBLOCK);
}

// Why a command on `c` returned no reply.
std::string LostText(const redisContext& c, int err, absl::Duration timeout) {
  if (TimedOut(c, err)) {
    return absl::StrCat("no answer within ", absl::FormatDuration(timeout));
  }
  if (c.err == REDIS_ERR_EOF) {
    return "it closed the connection (stopped or crashed)";
  }
  return c.errstr[0] != '\0' ? std::string(c.errstr)
                             : absl::StrCat("hiredis error ", c.err);
}

// A reply, for an error text.
std::string ReplyText(const redisReply& r) {
  switch (r.type) {
    case REDIS_REPLY_STRING:
      return absl::StrCat("a string of ", r.len, " bytes");
    case REDIS_REPLY_ARRAY:
      return absl::StrCat("an array of ", r.elements);
    case REDIS_REPLY_INTEGER:
      return absl::StrCat("the integer ", r.integer);
    case REDIS_REPLY_NIL:
      return "nil";
    case REDIS_REPLY_STATUS:
    case REDIS_REPLY_ERROR:
      return absl::StrCat(r.type == REDIS_REPLY_STATUS ? "status" : "error",
                          " '", absl::string_view(r.str, r.len).substr(0, 200),
                          "'");
    default:
      return absl::StrCat("a reply of type ", r.type);
  }
}

absl::string_view Text(const redisReply& r) {
  return r.str == nullptr ? absl::string_view()
                          : absl::string_view(r.str, r.len);
}

using rendezvous_internal::KeysText;

// "SET 'rank/3'": a command and its key, for an error text.
std::string What(absl::string_view command, absl::string_view key) {
  return absl::StrCat(command, " '", key.substr(0, 64), "'");
}

// One connection to host:port and a PING, each within its timeout. The
// name lookup, if host is a name, is not bounded (hiredis resolves it).
absl::StatusOr<redisContext*> ConnectOnce(const std::string& host, int port,
                                          absl::Duration connect_timeout,
                                          absl::Duration op_timeout,
                                          const RedisStoreOptions& options) {
  const std::string where = HostPortText(host, port);
  redisContext* c =
      redisConnectWithTimeout(host.c_str(), port, Timeval(connect_timeout));
  if (c == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("no memory for a connection to Redis at ", where));
  }
  auto fail = [&](absl::Status status) {
    redisFree(c);
    return status;
  };
  if (c->err != 0) {
    return fail(absl::UnavailableError(
        absl::StrCat("cannot reach Redis at ", where, " within ",
                     absl::FormatDuration(connect_timeout), ": ", c->errstr,
                     ": expected a redis-server listening there")));
  }
  if (redisSetTimeout(c, Timeval(op_timeout)) != REDIS_OK) {
    return fail(absl::UnavailableError(
        absl::StrCat("cannot set a timeout on the connection to Redis at ",
                     where, ": ", c->errstr)));
  }
  if (!options.password.empty()) {
    // AUTH [user] password, before anything else.
    std::vector<const char*> argv = {"AUTH"};
    std::vector<size_t> lens = {4};
    if (!options.user.empty()) {
      argv.push_back(options.user.data());
      lens.push_back(options.user.size());
    }
    argv.push_back(options.password.data());
    lens.push_back(options.password.size());
    void* raw = nullptr;
    int err = 0;
    {
      ScopedSigpipeBlock no_sigpipe;
      errno = 0;
      raw = redisCommandArgv(c, static_cast<int>(argv.size()), argv.data(),
                             lens.data());
      err = errno;
    }
    if (raw == nullptr) {
      return fail(absl::UnavailableError(absl::StrCat(
          "Redis at ", where,
          " did not answer AUTH: ", LostText(*c, err, op_timeout))));
    }
    std::unique_ptr<redisReply, void (*)(void*)> auth(
        static_cast<redisReply*>(raw), freeReplyObject);
    if (auth->type == REDIS_REPLY_ERROR) {
      return fail(absl::UnauthenticatedError(absl::StrCat(
          "Redis at ", where, " refused AUTH",
          options.user.empty() ? ""
                               : absl::StrCat(" for user '", options.user, "'"),
          ": ", Text(*auth),
          ": expected the password (and ACL user) of that Redis in the "
          "address, redis://USER:PASSWORD@HOST:PORT")));
    }
  }
  const char* ping = "PING";
  const size_t ping_len = 4;
  void* raw = nullptr;
  int err = 0;
  {
    ScopedSigpipeBlock no_sigpipe;
    errno = 0;
    raw = redisCommandArgv(c, 1, &ping, &ping_len);
    err = errno;
  }
  if (raw == nullptr) {
    return fail(absl::UnavailableError(
        absl::StrCat("Redis at ", where,
                     " did not answer PING: ", LostText(*c, err, op_timeout))));
  }
  std::unique_ptr<redisReply, void (*)(void*)> reply(
      static_cast<redisReply*>(raw), freeReplyObject);
  if (reply->type == REDIS_REPLY_ERROR) {
    return fail(absl::InternalError(
        absl::StrCat("Redis at ", where, " refused PING: ", Text(*reply),
                     options.password.empty()
                         ? ": it needs a password: give it in the address, "
                           "redis://USER:PASSWORD@HOST:PORT or "
                           "redis://:PASSWORD@HOST:PORT"
                         : "")));
  }
  if (reply->type != REDIS_REPLY_STATUS || Text(*reply) != "PONG") {
    return fail(absl::UnavailableError(
        absl::StrCat("the server at ", where, " answered PING with ",
                     ReplyText(*reply), ": expected a Redis server (PONG)")));
  }
  return c;
}

}  // namespace

void RedisStore::ReplyFree::operator()(redisReply* reply) const {
  freeReplyObject(reply);
}

RedisStore::RedisStore(std::string host, int port, RedisStoreOptions options,
                       redisContext* context)
    : host_(std::move(host)),
      port_(port),
      address_(HostPortText(host_, port_)),
      options_(std::move(options)),
      context_(context),
      context_timeout_(options_.op_timeout) {}

RedisStore::~RedisStore() {
  if (context_ != nullptr) redisFree(context_);
}

absl::StatusOr<std::shared_ptr<RedisStore>> RedisStore::Connect(
    absl::string_view address, RedisStoreOptions options) {
  VEMESH_ASSIGN_OR_RETURN(RedisAddress parsed, ParseRedisAddress(address));
  absl::Status status =
      CheckTimeout("connect_timeout", options.connect_timeout);
  if (status.ok()) status = CheckTimeout("op_timeout", options.op_timeout);
  if (!status.ok()) return status;
  if (parsed.has_credentials) {
    options.user = std::move(parsed.user);
    options.password = std::move(parsed.password);
  }
  VEMESH_ASSIGN_OR_RETURN(
      redisContext * context,
      ConnectOnce(parsed.host, parsed.port, options.connect_timeout,
                  options.op_timeout, options));
  return std::shared_ptr<RedisStore>(new RedisStore(
      std::move(parsed.host), parsed.port, std::move(options), context));
}

void RedisStore::DropLocked() {
  if (context_ != nullptr) redisFree(context_);
  context_ = nullptr;
}

std::string RedisStore::Key(absl::string_view key) const {
  return absl::StrCat(options_.key_prefix, key);
}

absl::StatusOr<RedisStore::Reply> RedisStore::Command(
    absl::Span<const absl::string_view> args, absl::Duration timeout,
    absl::string_view what, bool* timed_out) {
  if (timed_out != nullptr) *timed_out = false;
  std::vector<const char*> argv;
  std::vector<size_t> lens;
  argv.reserve(args.size());
  lens.reserve(args.size());
  for (absl::string_view arg : args) {
    argv.push_back(arg.data());
    lens.push_back(arg.size());
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (context_ == nullptr) {
    // The last call lost the connection: one attempt, no retries, so that
    // calls to a dead Redis fail fast.
    absl::StatusOr<redisContext*> context =
        ConnectOnce(host_, port_, std::min(options_.connect_timeout, timeout),
                    timeout, options_);
    if (!context.ok()) {
      return absl::Status(
          context.status().code(),
          absl::StrCat("Redis at ", address_,
                       " is unreachable after a lost "
                       "connection (",
                       what, "): ", context.status().message()));
    }
    context_ = *context;
    context_timeout_ = timeout;
  }
  if (timeout != context_timeout_) {
    if (redisSetTimeout(context_, Timeval(timeout)) != REDIS_OK) {
      const std::string why = context_->errstr;
      DropLocked();
      return absl::UnavailableError(
          absl::StrCat("cannot set a timeout on the connection to Redis at ",
                       address_, " (", what, "): ", why));
    }
    context_timeout_ = timeout;
  }
  void* raw = nullptr;
  int err = 0;
  {
    ScopedSigpipeBlock no_sigpipe;
    errno = 0;
    raw = redisCommandArgv(context_, static_cast<int>(argv.size()), argv.data(),
                           lens.data());
    err = errno;
  }
  if (raw == nullptr) {
    // The connection's state is unknown (a reply may be half read).
    const std::string why = LostText(*context_, err, timeout);
    if (timed_out != nullptr) *timed_out = TimedOut(*context_, err);
    DropLocked();
    return absl::UnavailableError(
        absl::StrCat("Redis at ", address_, " failed ", what, ": ", why));
  }
  return Reply(static_cast<redisReply*>(raw));
}

absl::StatusOr<RedisStore::Reply> RedisStore::Call(
    absl::Span<const absl::string_view> args, absl::string_view what) {
  absl::StatusOr<Reply> reply = Command(args, options_.op_timeout, what);
  if (reply.ok() && (*reply)->type == REDIS_REPLY_ERROR) {
    return absl::InternalError(absl::StrCat("Redis at ", address_, " refused ",
                                            what, ": ", Text(**reply)));
  }
  return reply;
}

namespace {

// Internal naming what Redis answered instead of what it should have.
absl::Status Unexpected(absl::string_view address, absl::string_view what,
                        const redisReply& reply, absl::string_view expected) {
  return absl::InternalError(absl::StrCat("Redis at ", address, " answered ",
                                          what, " with ", ReplyText(reply),
                                          ": expected ", expected));
}

}  // namespace

absl::Status RedisStore::set(absl::string_view key, absl::string_view value) {
  absl::Status status = CheckStoreValue(key, value);
  if (!status.ok()) return status;
  const std::string k = Key(key);
  const std::string what = What("SET", key);
  const absl::string_view args[] = {"SET", k, value};
  VEMESH_ASSIGN_OR_RETURN(Reply reply, Call(args, what));
  if (reply->type != REDIS_REPLY_STATUS) {
    return Unexpected(address_, what, *reply, "status OK");
  }
  return absl::OkStatus();
}

absl::Status RedisStore::set_lease(absl::string_view key,
                                   absl::string_view value,
                                   absl::Duration ttl) {
  absl::Status status = CheckStoreLease(key, value, ttl);
  if (!status.ok()) return status;
  // PX takes whole milliseconds, at least 1: round up, never to 0.
  const std::string ms = absl::StrCat(
      absl::ToInt64Milliseconds(absl::Ceil(ttl, absl::Milliseconds(1))));
  const std::string k = Key(key);
  const std::string what = What("SET PX", key);
  const absl::string_view args[] = {"SET", k, value, "PX", ms};
  VEMESH_ASSIGN_OR_RETURN(Reply reply, Call(args, what));
  if (reply->type != REDIS_REPLY_STATUS) {
    return Unexpected(address_, what, *reply, "status OK");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> RedisStore::get(absl::string_view key) {
  absl::Status status = CheckStoreKey(key);
  if (!status.ok()) return status;
  const std::string k = Key(key);
  const std::string what = What("GET", key);
  const absl::string_view args[] = {"GET", k};
  VEMESH_ASSIGN_OR_RETURN(Reply reply, Call(args, what));
  switch (reply->type) {
    case REDIS_REPLY_STRING:
      return std::string(Text(*reply));
    case REDIS_REPLY_NIL:
      return absl::NotFoundError(absl::StrCat("store has no key '", key, "'"));
    default:
      return Unexpected(address_, what, *reply, "a string or nil");
  }
}

absl::StatusOr<bool> RedisStore::remove(absl::string_view key) {
  absl::Status status = CheckStoreKey(key);
  if (!status.ok()) return status;
  const std::string k = Key(key);
  const std::string what = What("DEL", key);
  const absl::string_view args[] = {"DEL", k};
  VEMESH_ASSIGN_OR_RETURN(Reply reply, Call(args, what));
  if (reply->type != REDIS_REPLY_INTEGER) {
    return Unexpected(address_, what, *reply, "an integer");
  }
  return reply->integer > 0;
}

absl::StatusOr<RedisStore::Swap> RedisStore::CompareSwap(
    absl::string_view key, absl::string_view expected,
    absl::string_view desired, bool keep_lease) {
  const std::string k = Key(key);
  const std::string what = What("compare_set script", key);
  const absl::string_view args[] = {
      "EVAL",  kCompareSetScript,     "1", k, expected,
      desired, keep_lease ? "1" : "0"};
  VEMESH_ASSIGN_OR_RETURN(Reply reply, Call(args, what));
  const redisReply& r = *reply;
  if (r.type != REDIS_REPLY_ARRAY || r.elements != 2 ||
      r.element[0]->type != REDIS_REPLY_INTEGER ||
      r.element[1]->type != REDIS_REPLY_STRING) {
    return Unexpected(address_, what, r, "an array {0 or 1, value}");
  }
  Swap swap;
  swap.stored = r.element[0]->integer == 1;
  swap.value = std::string(Text(*r.element[1]));
  return swap;
}

absl::StatusOr<std::string> RedisStore::compare_set(absl::string_view key,
                                                    absl::string_view expected,
                                                    absl::string_view desired) {
  absl::Status status = CheckStoreValue(key, desired);
  if (status.ok()) status = CheckStoreValue(key, expected);
  if (!status.ok()) return status;
  VEMESH_ASSIGN_OR_RETURN(
      Swap swap, CompareSwap(key, expected, desired, /*keep_lease=*/false));
  return std::move(swap.value);
}

absl::StatusOr<int64_t> RedisStore::add(absl::string_view key, int64_t delta) {
  absl::Status status = CheckStoreKey(key);
  if (!status.ok()) return status;
  const std::string k = Key(key);
  const std::string by = absl::StrCat(delta);
  const std::string what = What("INCRBY", key);
  const absl::string_view args[] = {"INCRBY", k, by};
  VEMESH_ASSIGN_OR_RETURN(Reply reply,
                          Command(args, options_.op_timeout, what));
  const redisReply& r = *reply;
  if (r.type == REDIS_REPLY_INTEGER) return static_cast<int64_t>(r.integer);
  // "ERR value is not an integer or out of range", "ERR increment or
  // decrement would overflow": Redis is stricter than ParseCounter and does
  // not wrap.
  if (r.type == REDIS_REPLY_ERROR &&
      (absl::StrContains(Text(r), "not an integer") ||
       absl::StrContains(Text(r), "overflow"))) {
    return AddByCompareSet(key, delta);
  }
  if (r.type == REDIS_REPLY_ERROR) {
    return absl::InternalError(
        absl::StrCat("Redis at ", address_, " refused ", what, ": ", Text(r)));
  }
  return Unexpected(address_, what, r, "an integer");
}

absl::StatusOr<int64_t> RedisStore::AddByCompareSet(absl::string_view key,
                                                    int64_t delta) {
  // Each round either stores or saw another writer's change; give up (and
  // say so) once op_timeout of rounds all lost.
  const absl::Time give_up = absl::Now() + options_.op_timeout;
  const std::string k = Key(key);
  const std::string what = What("GET", key);
  const absl::string_view args[] = {"GET", k};
  for (int rounds = 1;; ++rounds) {
    VEMESH_ASSIGN_OR_RETURN(Reply reply, Call(args, what));
    if (reply->type != REDIS_REPLY_STRING && reply->type != REDIS_REPLY_NIL) {
      return Unexpected(address_, what, *reply, "a string or nil");
    }
    const std::string current(Text(*reply));
    VEMESH_ASSIGN_OR_RETURN(int64_t value, ParseCounter(key, current));
    // Wraps like a two's-complement counter, as MemoryStore does.
    const int64_t next = static_cast<int64_t>(static_cast<uint64_t>(value) +
                                              static_cast<uint64_t>(delta));
    VEMESH_ASSIGN_OR_RETURN(
        Swap swap,
        CompareSwap(key, current, absl::StrCat(next), /*keep_lease=*/true));
    if (swap.stored) return next;
    if (absl::Now() > give_up) {
      return absl::AbortedError(
          absl::StrCat("add to store key '", key, "' lost ", rounds,
                       " compare_set rounds to other writers within ",
                       absl::FormatDuration(options_.op_timeout)));
    }
  }
}

absl::StatusOr<int64_t> RedisStore::CountExisting(
    absl::Span<const std::string> keys, absl::Duration timeout,
    bool* timed_out) {
  std::vector<std::string> prefixed;
  prefixed.reserve(keys.size());
  for (const std::string& key : keys) prefixed.push_back(Key(key));
  std::vector<absl::string_view> args;
  args.reserve(keys.size() + 1);
  args.push_back("EXISTS");
  for (const std::string& key : prefixed) args.push_back(key);
  const std::string what = absl::StrCat("EXISTS of ", keys.size(), " keys ('",
                                        keys[0].substr(0, 64), "', ...)");
  VEMESH_ASSIGN_OR_RETURN(Reply reply, Command(args, timeout, what, timed_out));
  if (reply->type == REDIS_REPLY_ERROR) {
    return absl::InternalError(absl::StrCat("Redis at ", address_, " refused ",
                                            what, ": ", Text(*reply)));
  }
  if (reply->type != REDIS_REPLY_INTEGER) {
    return Unexpected(address_, what, *reply, "an integer");
  }
  return static_cast<int64_t>(reply->integer);
}

std::string RedisStore::MissingKeys(absl::Span<const std::string> keys) {
  std::vector<std::string> prefixed;
  prefixed.reserve(keys.size());
  for (const std::string& key : keys) prefixed.push_back(Key(key));
  const std::string count = absl::StrCat(keys.size());
  std::vector<absl::string_view> args = {"EVAL", kMissingKeysScript, count};
  args.reserve(keys.size() + 3);
  for (const std::string& key : prefixed) args.push_back(key);
  // Bounded like a last poll: the deadline has passed already.
  absl::StatusOr<Reply> reply =
      Command(args, std::min(options_.op_timeout, kMinPollTimeout),
              "the missing-keys script");
  if (!reply.ok() || (*reply)->type != REDIS_REPLY_ARRAY) {
    return absl::StrCat(KeysText(keys), " (not all of them missing, maybe)");
  }
  std::vector<std::string> missing;
  for (size_t i = 0; i < (*reply)->elements; ++i) {
    const redisReply& index = *(*reply)->element[i];
    if (index.type != REDIS_REPLY_INTEGER || index.integer < 1 ||
        static_cast<uint64_t>(index.integer) > keys.size()) {
      continue;
    }
    if (missing.size() == kKeysNamed) {
      missing.push_back("...");
      break;
    }
    missing.push_back(keys[static_cast<size_t>(index.integer - 1)]);
  }
  return absl::StrJoin(missing, ", ");
}

absl::Status RedisStore::wait(absl::Span<const std::string> keys,
                              absl::Time deadline) {
  absl::Status status = CheckStoreKeys(keys);
  if (!status.ok()) return status;
  if (keys.empty()) return absl::OkStatus();
  absl::Duration sleep = kFirstPollSleep;
  for (;;) {
    // A poll never runs past the deadline by more than kMinPollTimeout, nor
    // past op_timeout.
    const absl::Duration poll_timeout = std::min(
        options_.op_timeout, std::max(deadline - absl::Now(), kMinPollTimeout));
    bool timed_out = false;
    absl::StatusOr<int64_t> present =
        CountExisting(keys, poll_timeout, &timed_out);
    if (!present.ok()) {
      // Silent until the deadline: the wait's time is up, whatever Redis
      // would have said.
      if (timed_out && poll_timeout < options_.op_timeout) {
        return absl::DeadlineExceededError(absl::StrCat(
            "store keys not all seen before the deadline (the last poll: ",
            present.status().message(), "): ", KeysText(keys)));
      }
      return present.status();
    }
    if (static_cast<uint64_t>(*present) >= keys.size()) return absl::OkStatus();
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) {
      return absl::DeadlineExceededError(absl::StrCat(
          "store keys never set before the deadline: ", MissingKeys(keys)));
    }
    absl::SleepFor(std::min(sleep, left));
    sleep = std::min(sleep * 2, kMaxPollSleep);
  }
}

absl::StatusOr<std::vector<std::string>> RedisStore::wait_get(
    absl::Span<const std::string> keys, absl::Time deadline) {
  absl::Status status = wait(keys, deadline);
  if (!status.ok()) return status;
  if (keys.empty()) return std::vector<std::string>();
  std::vector<std::string> prefixed;
  prefixed.reserve(keys.size());
  for (const std::string& key : keys) prefixed.push_back(Key(key));
  std::vector<absl::string_view> args;
  args.reserve(keys.size() + 1);
  args.push_back("MGET");
  for (const std::string& key : prefixed) args.push_back(key);
  const std::string what = absl::StrCat("MGET of ", keys.size(), " keys ('",
                                        keys[0].substr(0, 64), "', ...)");
  VEMESH_ASSIGN_OR_RETURN(Reply reply, Call(args, what));
  const redisReply& r = *reply;
  if (r.type != REDIS_REPLY_ARRAY || r.elements != keys.size()) {
    return Unexpected(address_, what, r,
                      absl::StrCat("an array of ", keys.size()));
  }
  std::vector<std::string> values;
  values.reserve(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    const redisReply& value = *r.element[i];
    if (value.type == REDIS_REPLY_NIL) {
      // Removed, or its lease ran out, between the wait and the MGET.
      return absl::NotFoundError(absl::StrCat("store has no key '", keys[i],
                                              "' (gone since the wait)"));
    }
    if (value.type != REDIS_REPLY_STRING) {
      return Unexpected(address_, what, value, "a string or nil per key");
    }
    values.emplace_back(Text(value));
  }
  return values;
}

}  // namespace vemesh
