// A redis-server of a test's own: started on 127.0.0.1 at a free port,
// nothing saved to disk, and killed (by its PID, never by name) when the
// RedisServer goes away.
//
//   absl::StatusOr<std::unique_ptr<RedisServer>> redis = RedisServer::Start();
//   ASSERT_TRUE(redis.ok()) << redis.status();   // fails, never skips
//   auto store = RedisStore::Connect((*redis)->address());
//   (*redis)->Kill();                             // a Redis that crashed
//
// redis-server is looked for on PATH, then at /usr/bin/redis-server;
// scripts/setup.sh installs it, so a missing one is an error (a failed
// test), not a reason to skip.
//
// The child is started with fork and exec from the calling thread and asks
// the kernel to SIGKILL it when that thread ends, so a test that crashes
// leaves no server behind. Start it from the test's main thread.
#ifndef TESTS_COMMON_REDIS_SERVER_H_
#define TESTS_COMMON_REDIS_SERVER_H_

#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace vemesh::testing {

class RedisServer {
 public:
  // How long Start waits for the server to answer PING.
  static constexpr absl::Duration kStartTimeout = absl::Seconds(10);

  // A server on a free port. The port is found by binding port 0 and
  // closing it, so another process may take it first: then the server
  // exits at once and Start tries another port, three times in all.
  // `extra`: more redis-server options, e.g. {"--requirepass", "pw"} (a
  // server that then answers PING with NOAUTH counts as started).
  static absl::StatusOr<std::unique_ptr<RedisServer>> Start(
      std::vector<std::string> extra = {}) {
    absl::StatusOr<std::string> binary = FindBinary();
    if (!binary.ok()) return binary.status();
    absl::Status last;
    for (int attempt = 0; attempt < 3; ++attempt) {
      absl::StatusOr<int> port = FreePort();
      if (!port.ok()) return port.status();
      std::unique_ptr<RedisServer> server(new RedisServer(*binary, *port));
      server->extra_ = extra;
      last = server->Launch();
      if (last.ok()) return server;
    }
    return last;
  }

  ~RedisServer() {
    Kill();
    if (!log_path_.empty()) ::unlink(log_path_.c_str());
  }
  RedisServer(const RedisServer&) = delete;
  RedisServer& operator=(const RedisServer&) = delete;

  // "127.0.0.1:PORT".
  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }
  int port() const { return port_; }
  // The server's PID; -1 once it is killed or stopped.
  pid_t pid() const { return pid_; }

  // SIGKILL by PID, then reaps it: a Redis that crashed. Idempotent.
  void Kill() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    Reap(pid_);
    pid_ = -1;
  }

  // SIGTERM, up to 5 s to exit, then Kill: a Redis shut down.
  void Stop() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGTERM);
    const absl::Time give_up = absl::Now() + absl::Seconds(5);
    while (absl::Now() < give_up) {
      const pid_t done = ::waitpid(pid_, nullptr, WNOHANG);
      if (done == pid_ || (done < 0 && errno == ECHILD)) {
        pid_ = -1;
        return;
      }
      absl::SleepFor(absl::Milliseconds(10));
    }
    Kill();
  }

  // A fresh, empty server on the same port after Kill or Stop: a Redis that
  // came back. Fails if another process took the port in between.
  absl::Status Restart() {
    Kill();
    return Launch();
  }

  // Sends one command (its words, no spaces inside them) on a connection of
  // its own and returns the first line of the reply ("+OK", ":42",
  // "-WRONGTYPE ..."), within 5 s. For a test to set up what the code under
  // test cannot, without the code under test.
  absl::StatusOr<std::string> RawCommand(absl::string_view command) const {
    const std::vector<std::string> words =
        absl::StrSplit(command, ' ', absl::SkipEmpty());
    std::string request = absl::StrCat("*", words.size(), "\r\n");
    for (const std::string& word : words) {
      absl::StrAppend(&request, "$", word.size(), "\r\n", word, "\r\n");
    }
    return Exchange(port_, request, absl::Now() + absl::Seconds(5));
  }

 private:
  RedisServer(std::string binary, int port)
      : binary_(std::move(binary)), port_(port) {
    char path[] = "/tmp/vemesh-redis-XXXXXX";
    const int fd = ::mkstemp(path);
    if (fd >= 0) {
      ::close(fd);
      log_path_ = path;
    }
  }

  static absl::StatusOr<std::string> FindBinary() {
    std::vector<std::string> candidates;
    if (const char* path = ::getenv("PATH")) {
      for (absl::string_view dir :
           absl::StrSplit(path, ':', absl::SkipEmpty())) {
        candidates.push_back(absl::StrCat(dir, "/redis-server"));
      }
    }
    candidates.push_back("/usr/bin/redis-server");
    for (const std::string& candidate : candidates) {
      if (::access(candidate.c_str(), X_OK) == 0) return candidate;
    }
    return absl::FailedPreconditionError(
        "redis-server not found on PATH nor at /usr/bin/redis-server: "
        "expected Debian's redis-server package, which scripts/setup.sh "
        "installs");
  }

  // A port the kernel just handed out and took back.
  static absl::StatusOr<int> FreePort() {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
      return absl::InternalError(
          absl::StrCat("socket: ", std::strerror(errno)));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    int port = -1;
    if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
      port = ntohs(addr.sin_port);
    }
    const int err = errno;
    ::close(fd);
    if (port <= 0) {
      return absl::InternalError(
          absl::StrCat("no free port on 127.0.0.1: ", std::strerror(err)));
    }
    return port;
  }

  static void Reap(pid_t pid) {
    while (::waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {
    }
  }

  // Starts the server on port_ and waits until it answers PING.
  absl::Status Launch() {
    const std::string port = absl::StrCat(port_);
    std::vector<std::string> args = {binary_,
                                     "--port",
                                     port,
                                     "--bind",
                                     "127.0.0.1",
                                     "--save",
                                     "",
                                     "--appendonly",
                                     "no",
                                     "--protected-mode",
                                     "no",
                                     "--daemonize",
                                     "no",
                                     "--logfile",
                                     log_path_.empty() ? "" : log_path_};
    args.insert(args.end(), extra_.begin(), extra_.end());
    // Everything the child touches is made before fork: after it, only
    // async-signal-safe calls until exec.
    std::vector<char*> argv;
    for (const std::string& arg : args)
      argv.push_back(const_cast<char*>(arg.c_str()));
    argv.push_back(nullptr);
    const int devnull = ::open("/dev/null", O_RDWR | O_CLOEXEC);
    const pid_t parent = ::getpid();
    const pid_t pid = ::fork();
    if (pid < 0) {
      if (devnull >= 0) ::close(devnull);
      return absl::InternalError(absl::StrCat("fork: ", std::strerror(errno)));
    }
    if (pid == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(127);  // the parent is gone already
      if (devnull >= 0) {
        ::dup2(devnull, 0);
        ::dup2(devnull, 1);
        ::dup2(devnull, 2);
      }
      // Nothing else of the test's (its sockets) goes to the server.
      ::close_range(3, ~0U, 0);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    if (devnull >= 0) ::close(devnull);
    pid_ = pid;
    const absl::Time give_up = absl::Now() + kStartTimeout;
    while (absl::Now() < give_up) {
      int wstatus = 0;
      if (::waitpid(pid_, &wstatus, WNOHANG) == pid_) {
        pid_ = -1;
        return absl::InternalError(absl::StrCat(
            "redis-server (", binary_, ") on 127.0.0.1:", port_,
            " exited at start (status ", wstatus, "); its log: ", LogTail()));
      }
      absl::StatusOr<std::string> pong =
          Exchange(port_, "PING\r\n", absl::Now() + absl::Milliseconds(500));
      if (pong.ok() && (*pong == "+PONG" || absl::StartsWith(*pong, "-NOAUTH")))
        return absl::OkStatus();
      absl::SleepFor(absl::Milliseconds(10));
    }
    Kill();
    return absl::DeadlineExceededError(absl::StrCat(
        "redis-server (", binary_, ") on 127.0.0.1:", port_,
        " did not answer PING within ", absl::FormatDuration(kStartTimeout),
        "; its log: ", LogTail()));
  }

  // Connects, sends `request`, and reads the reply's first line.
  static absl::StatusOr<std::string> Exchange(int port,
                                              absl::string_view request,
                                              absl::Time deadline) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
      return absl::InternalError(
          absl::StrCat("socket: ", std::strerror(errno)));
    struct Closer {
      int fd;
      ~Closer() { ::close(fd); }
    } closer{fd};
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
      return absl::UnavailableError(
          absl::StrCat("connect: ", std::strerror(errno)));
    }
    while (!request.empty()) {
      const ssize_t n =
          ::send(fd, request.data(), request.size(), MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0)
        return absl::UnavailableError(
            absl::StrCat("send: ", std::strerror(errno)));
      request.remove_prefix(static_cast<size_t>(n));
    }
    std::string reply;
    char buffer[4096];
    while (reply.find("\r\n") == std::string::npos) {
      const absl::Duration left = deadline - absl::Now();
      if (left <= absl::ZeroDuration())
        return absl::DeadlineExceededError("no reply");
      pollfd pfd{fd, POLLIN, 0};
      const int ready = ::poll(
          &pfd, 1, static_cast<int>(absl::ToInt64Milliseconds(left)) + 1);
      if (ready < 0 && errno == EINTR) continue;
      if (ready <= 0) return absl::DeadlineExceededError("no reply");
      const ssize_t n = ::recv(fd, buffer, sizeof(buffer), 0);
      if (n <= 0)
        return absl::UnavailableError("connection closed before a reply");
      reply.append(buffer, static_cast<size_t>(n));
    }
    return reply.substr(0, reply.find("\r\n"));
  }

  std::string LogTail() const {
    std::ifstream in(log_path_);
    std::stringstream text;
    text << in.rdbuf();
    const std::string all = text.str();
    return all.size() <= 2000 ? all : all.substr(all.size() - 2000);
  }

  const std::string binary_;
  const int port_;
  std::vector<std::string> extra_;
  std::string log_path_;
  pid_t pid_ = -1;
};

}  // namespace vemesh::testing

#endif  // TESTS_COMMON_REDIS_SERVER_H_
