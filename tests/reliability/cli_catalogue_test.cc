// The bad-input catalogue, command-line half: `vemesh plan` and the training
// example's flags, each run as a real process. Every entry asserts the exit
// code and that stderr names the bad value. A process that runs past its
// time limit is killed and fails the entry (a hang is a failure).
//
// Some entries point the program's stdout at /dev/full or close it: the
// output must then fail the command (exit 1, a message on stderr), not vanish
// with exit 0. Entries for huge meshes also bound the wall time: a plan is
// arithmetic, never a walk over the world.
//
// The programs' paths come from CMake (VEMESH_CLI, VEMESH_TRAIN_ND,
// VEMESH_MPIEXEC); an entry whose program was not built is skipped.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <ostream>
#include <string>
#include <vector>

#include "absl/strings/str_join.h"
#include "gtest/gtest.h"

namespace {

struct ProcessResult {
  int exit_code = -1;  // -1: killed (timeout or signal)
  std::string out;
  std::string err;
  bool timed_out = false;
  double seconds = 0;  // wall time until exit
};

// Where the program's stdout goes.
enum class Stdout { kPipe, kDevFull, kClosed };

// Runs argv[0] with argv, capturing stdout (unless redirected) and stderr,
// within `limit`.
ProcessResult RunProgram(const std::vector<std::string>& argv,
                         std::chrono::seconds limit,
                         Stdout stdout_to = Stdout::kPipe) {
  ProcessResult run;
  const auto started = std::chrono::steady_clock::now();
  int out_pipe[2];
  int err_pipe[2];
  if (pipe(out_pipe) != 0 || pipe(err_pipe) != 0) return run;
  const pid_t pid = fork();
  if (pid == 0) {
    // Own process group, so a timeout kills mpiexec and its children too.
    setpgid(0, 0);
    if (stdout_to == Stdout::kDevFull) {
      const int full = open("/dev/full", O_WRONLY);
      if (full < 0) _exit(126);
      dup2(full, 1);
      close(full);
    } else if (stdout_to == Stdout::kClosed) {
      close(1);  // as `>&-`
    } else {
      dup2(out_pipe[1], 1);
    }
    dup2(err_pipe[1], 2);
    close(out_pipe[0]);
    close(err_pipe[0]);
    close(out_pipe[1]);
    close(err_pipe[1]);
    std::vector<char*> args;
    for (const std::string& a : argv)
      args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execv(args[0], args.data());
    _exit(127);
  }
  close(out_pipe[1]);
  close(err_pipe[1]);
  const auto deadline = std::chrono::steady_clock::now() + limit;
  pollfd fds[2] = {{out_pipe[0], POLLIN, 0}, {err_pipe[0], POLLIN, 0}};
  std::string* sinks[2] = {&run.out, &run.err};
  int open_fds = 2;
  while (open_fds > 0) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      run.timed_out = true;
      kill(-pid, SIGKILL);
      break;
    }
    if (poll(fds, 2, static_cast<int>(left.count())) < 0) break;
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP))) continue;
      char buf[4096];
      const ssize_t n = read(fds[i].fd, buf, sizeof buf);
      if (n > 0) {
        sinks[i]->append(buf, n);
      } else {
        close(fds[i].fd);
        fds[i].fd = -1;
        --open_fds;
      }
    }
  }
  for (pollfd& f : fds) {
    if (f.fd >= 0) close(f.fd);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  run.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started)
          .count();
  if (!run.timed_out && WIFEXITED(status)) run.exit_code = WEXITSTATUS(status);
  return run;
}

struct Entry {
  std::string name;
  std::string program;  // "cli" or "train_nd"
  std::vector<std::string> args;
  int exit_code;
  std::vector<std::string> mentions;  // substrings stderr must hold
  Stdout stdout_to = Stdout::kPipe;
  // Wall-time bound: 60 s is "no hang"; huge-mesh plans get 2 s (they take
  // milliseconds; the slack is for sanitizer builds on a shared machine).
  int max_seconds = 60;
};

// 2^62, 2^63 - 1, and 3037000499^2 (just below 2^63, two dimensions).
constexpr char kTwoTo62[] = "TP=4611686018427387904";
constexpr char kInt64Max[] = "TP=9223372036854775807";
constexpr char kSquareBelow63[] = "DP=3037000499,TP=3037000499";

std::vector<Entry> Catalogue() {
  return {
      // -- vemesh plan (exit 2: bad input, 1: output not writable) --------
      {"cli_no_command", "cli", {}, 2, {"Usage: vemesh"}},
      {"cli_unknown_command", "cli", {"frob"}, 2, {"'frob'"}},
      {"plan_missing_mesh", "cli", {"plan"}, 2, {"--mesh is required"}},
      {"plan_mesh_without_value",
       "cli",
       {"plan", "--mesh"},
       2,
       {"--mesh needs a value"}},
      {"plan_zero_size", "cli", {"plan", "--mesh", "PP=0"}, 2, {"'0'"}},
      {"plan_bad_spec", "cli", {"plan", "--mesh", "PP2"}, 2, {"'PP2'"}},
      {"plan_duplicate_dim",
       "cli",
       {"plan", "--mesh", "TP=2,TP=2"},
       2,
       {"'TP'"}},
      {"plan_overflow",
       "cli",
       {"plan", "--mesh", "A=4294967296,B=4294967296"},
       2,
       {"4294967296"}},
      {"plan_rank_out_of_range",
       "cli",
       {"plan", "--mesh", "PP=2,TP=2", "--rank", "9"},
       2,
       {"--rank 9"}},
      {"plan_rank_not_a_number",
       "cli",
       {"plan", "--mesh", "PP=2", "--rank", "abc"},
       2,
       {"--rank", "'abc'"}},
      {"plan_bad_format",
       "cli",
       {"plan", "--mesh", "PP=2", "--format", "xml"},
       2,
       {"--format", "'xml'"}},
      {"plan_zero_ranks_per_host",
       "cli",
       {"plan", "--mesh", "PP=2", "--ranks-per-host", "0"},
       2,
       {"--ranks-per-host", "got 0"}},
      {"plan_color_by_unknown_dim",
       "cli",
       {"plan", "--mesh", "PP=2,TP=2", "--color-by", "EP"},
       2,
       {"--color-by 'EP'"}},
      {"plan_unknown_flag",
       "cli",
       {"plan", "--mesh", "PP=2", "--bogus"},
       2,
       {"'--bogus'"}},
      {"plan_output_unwritable",
       "cli",
       {"plan", "--mesh", "PP=2", "--output", "/nonexistent-dir/plan.svg"},
       1,
       {"/nonexistent-dir/plan.svg"}},
      {"plan_ranks_per_host_too_big",
       "cli",
       {"plan", "--mesh", "PP=2", "--ranks-per-host", "4097"},
       2,
       {"--ranks-per-host", "4097", "4096"}},
      // A full or closed stdout is an I/O error, not a silent success.
      {"plan_stdout_full",
       "cli",
       {"plan", "--mesh", "PP=2,TP=2"},
       1,
       {"cannot write", "stdout"},
       Stdout::kDevFull},
      {"plan_stdout_closed",
       "cli",
       {"plan", "--mesh", "PP=2,TP=2"},
       1,
       {"cannot write", "stdout"},
       Stdout::kClosed},
      {"plan_json_stdout_full",
       "cli",
       {"plan", "--mesh", "PP=2,TP=2", "--format", "json"},
       1,
       {"cannot write", "stdout"},
       Stdout::kDevFull},
      {"plan_help_stdout_closed",
       "cli",
       {"plan", "--help"},
       1,
       {"cannot write", "stdout"},
       Stdout::kClosed},
      {"cli_help_stdout_full",
       "cli",
       {"--help"},
       1,
       {"cannot write", "stdout"},
       Stdout::kDevFull},
      // Huge worlds are planned arithmetically: exit 0 within 2 s. (They used
      // to walk every rank: 10^10 aborted after 103 s, 2^62 never ended.)
      {"plan_huge_1e10",
       "cli",
       {"plan", "--mesh", "TP=10000000000"},
       0,
       {},
       Stdout::kPipe,
       2},
      {"plan_huge_2e62",
       "cli",
       {"plan", "--mesh", kTwoTo62},
       0,
       {},
       Stdout::kPipe,
       2},
      {"plan_huge_2e62_rank_view",
       "cli",
       {"plan", "--mesh", kTwoTo62, "--rank", "4611686018427387903"},
       0,
       {},
       Stdout::kPipe,
       2},
      {"plan_huge_int64_max_svg",
       "cli",
       {"plan", "--mesh", kInt64Max, "--format", "svg"},
       0,
       {},
       Stdout::kPipe,
       2},
      {"plan_huge_square_json_rank",
       "cli",
       {"plan", "--mesh", kSquareBelow63, "--format", "json", "--rank",
        "9223372030926249000", "--ranks-per-host", "4096"},
       0,
       {},
       Stdout::kPipe,
       2},
      {"plan_huge_tp_warning_search",
       "cli",
       {"plan", "--mesh", "PP=3,TP=7,DP=439208192231179800", "--ranks-per-host",
        "4095"},
       0,
       {},
       Stdout::kPipe,
       2},
      // -- train_nd flags (exit 2 from its validation; absl flags exit 1) --
      {"train_mesh_bigger_than_job",
       "train_nd",
       {"--mesh", "PP=2,DP=2,TP=2"},
       2,
       {"PP=2,DP=2,TP=2"}},
      {"train_mesh_unparsable",
       "train_nd",
       {"--mesh", "PP=2,TP"},
       2,
       {"--mesh", "'TP'"}},
      {"train_unknown_role", "train_nd", {"--mesh", "XP=1"}, 2, {"'XP'"}},
      {"train_bad_schedule",
       "train_nd",
       {"--mesh", "TP=1", "--schedule", "zigzag"},
       2,
       {"zigzag"}},
      {"train_zero_steps",
       "train_nd",
       {"--mesh", "TP=1", "--steps", "0"},
       2,
       {"--steps=0"}},
      {"train_negative_lr",
       "train_nd",
       {"--mesh", "TP=1", "--lr", "-1"},
       2,
       {"--lr=-1"}},
      {"train_flag_not_a_number",
       "train_nd",
       {"--mesh", "TP=1", "--layers", "many"},
       1,
       {"many"}},
      // Sizes past memory: refused by name before anything is allocated
      // (they used to end in bad_alloc on every rank).
      {"train_batch_too_big",
       "train_nd",
       {"--mesh", "TP=1", "--batch", "1000000000000"},
       2,
       {"--batch=1000000000000", "1048576"}},
      {"train_hidden_too_big",
       "train_nd",
       {"--mesh", "TP=1", "--hidden", "1000000000"},
       2,
       {"--hidden=1000000000", "65536"}},
      {"train_layers_too_big",
       "train_nd",
       {"--mesh", "TP=1", "--layers", "1000000"},
       2,
       {"--layers=1000000", "1024"}},
      {"train_micro_batches_too_big",
       "train_nd",
       {"--mesh", "TP=1", "--micro_batches", "2147483647"},
       2,
       {"--micro_batches=2147483647", "4096"}},
      {"train_steps_too_big",
       "train_nd",
       {"--mesh", "TP=1", "--steps", "2000000000"},
       2,
       {"--steps=2000000000", "1000000"}},
      {"train_bucket_too_big",
       "train_nd",
       {"--mesh", "TP=1", "--bucket_elements", "4294967296"},
       2,
       {"--bucket_elements=4294967296", "16777216"}},
      {"train_model_too_big",
       "train_nd",
       {"--mesh", "TP=1", "--hidden", "65536", "--layers", "4"},
       2,
       {"--hidden=65536", "weights", "16777216"}},
      {"train_activations_too_big",
       "train_nd",
       {"--mesh", "TP=1", "--batch", "1048576", "--hidden", "4096", "--layers",
        "2"},
       2,
       {"--batch=1048576", "activations", "16777216"}},
  };
}

// gtest prints a parameter by its name, not as bytes.
void PrintTo(const Entry& e, std::ostream* os) { *os << e.name; }

class CliCatalogue : public ::testing::TestWithParam<Entry> {};

TEST_P(CliCatalogue, ExitsWithCodeNamingTheValue) {
  const Entry& e = GetParam();
  std::vector<std::string> argv;
  if (e.program == "cli") {
#ifndef VEMESH_CLI
    GTEST_SKIP() << "vemesh CLI not built";
#else
    argv = {VEMESH_CLI};
#endif
  } else {
#ifndef VEMESH_TRAIN_ND
    GTEST_SKIP() << "train_nd not built";
#else
    // One rank: flag validation happens on every rank before any
    // collective, so one rank shows it.
    argv = {VEMESH_MPIEXEC, "-n",           "1", "--oversubscribe", "--bind-to",
            "none",         VEMESH_TRAIN_ND};
    setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
    setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
    // One host: Open MPI's TCP (data and out-of-band) stays on loopback.
    setenv("OMPI_MCA_btl_tcp_if_include", "lo", 1);
    setenv("OMPI_MCA_oob_tcp_if_include", "lo", 1);
    // Under LeakSanitizer an MPI process needs full unwinding for the Open
    // MPI suppressions to match (see tests/CMakeLists.txt).
    if (const char* lsan = std::getenv("LSAN_OPTIONS");
        lsan != nullptr &&
        std::string(lsan).find("fast_unwind") == std::string::npos) {
      setenv("LSAN_OPTIONS",
             (std::string(lsan) + ":fast_unwind_on_malloc=0:use_tls=0").c_str(),
             1);
    }
#endif
  }
  argv.insert(argv.end(), e.args.begin(), e.args.end());
  const ProcessResult run =
      RunProgram(argv, std::chrono::seconds(60), e.stdout_to);
  const std::string cmd = absl::StrJoin(argv, " ");
  ASSERT_FALSE(run.timed_out) << cmd << " hung";
  EXPECT_EQ(run.exit_code, e.exit_code) << cmd << "\nstderr: " << run.err;
  EXPECT_LT(run.seconds, e.max_seconds)
      << cmd << " took " << run.seconds << " s";
  if (e.exit_code == 0) {
    EXPECT_TRUE(run.err.empty()) << cmd << ": " << run.err;
    EXPECT_FALSE(run.out.empty()) << cmd << " printed nothing";
  }
  for (const std::string& m : e.mentions) {
    EXPECT_NE(run.err.find(m), std::string::npos)
        << cmd << ": stderr does not mention \"" << m << "\": " << run.err;
  }
}

INSTANTIATE_TEST_SUITE_P(Catalogue, CliCatalogue,
                         ::testing::ValuesIn(Catalogue()),
                         [](const ::testing::TestParamInfo<Entry>& info) {
                           return info.param.name;
                         });

}  // namespace
