#include "vemesh/bootstrap/mpi/internal/arrival_report.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"

namespace vemesh {
namespace {

constexpr int kReportTag = 32766;
constexpr int kAnswerTag = 32767;
constexpr int kHostBytes = 256;     // a report: the host identity, cut
constexpr int kAnswerBytes = 4096;  // the verdict; ArrivalVerdict stays below
constexpr size_t kMaxMissingRanges = 32;
constexpr size_t kMaxHosts = 8;

// What a report exchange leaves behind: MPI may still write into the
// receive buffers or read the send buffers of requests that did not finish.
struct Pending {
  std::string report;
  std::vector<char> received = std::vector<char>(kAnswerBytes);
  std::vector<std::vector<char>> answers;  // a reporter's, one per collector
  std::string answer;
  std::vector<MPI_Request> requests;
};

void KeepForever(std::unique_ptr<Pending> pending) {
  static std::mutex mu;
  static auto* kept = new std::vector<std::unique_ptr<Pending>>();
  std::lock_guard<std::mutex> lock(mu);
  kept->push_back(std::move(pending));
}

void Pause() { std::this_thread::sleep_for(std::chrono::milliseconds(1)); }

// Polls `request` until it completes or `until`; true when it completed.
bool TestUntil(MPI_Request* request, absl::Time until, MPI_Status* status) {
  while (true) {
    int done = 0;
    if (MPI_Test(request, &done, status) != MPI_SUCCESS) return false;
    if (done) return true;
    if (absl::Now() >= until) return false;
    Pause();
  }
}

std::string RanksWord(size_t n) { return n == 1 ? "rank" : "ranks"; }

}  // namespace

absl::Duration ArrivalGrace(absl::Duration timeout) {
  return std::clamp(timeout / 10, absl::Seconds(1), absl::Seconds(5));
}

std::string RankRanges(const std::vector<int>& ranks) {
  std::vector<std::string> parts;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    parts.push_back(j == i ? absl::StrCat(ranks[i])
                           : absl::StrCat(ranks[i], "-", ranks[j]));
    i = j + 1;
  }
  return absl::StrJoin(parts, ", ");
}

std::string ArrivalVerdict(const std::vector<std::string>& hosts) {
  std::vector<int> missing;
  // Hosts in the order of their lowest arrived rank, with their ranks.
  std::vector<std::pair<std::string, std::vector<int>>> arrived;
  for (int r = 0; r < static_cast<int>(hosts.size()); ++r) {
    if (hosts[r].empty()) {
      missing.push_back(r);
      continue;
    }
    auto it = std::find_if(arrived.begin(), arrived.end(),
                           [&](const auto& h) { return h.first == hosts[r]; });
    if (it == arrived.end()) {
      arrived.push_back({hosts[r], {r}});
    } else {
      it->second.push_back(r);
    }
  }
  std::vector<std::string> on_hosts;
  for (size_t i = 0; i < arrived.size() && i < kMaxHosts; ++i) {
    on_hosts.push_back(
        absl::StrCat(arrived[i].first, ": ", RankRanges(arrived[i].second)));
  }
  if (arrived.size() > kMaxHosts) {
    on_hosts.push_back(
        absl::StrCat("and ", arrived.size() - kMaxHosts, " more hosts"));
  }
  const std::string did = absl::StrJoin(on_hosts, "; ");
  if (missing.empty()) {
    // Every rank made the call, yet it did not complete: some came after
    // the others had given up (progress stops with them).
    return absl::StrCat(
        "every rank arrived, but not in time for the others: "
        "some came after the others' deadline (the ranks: ",
        did, ")");
  }
  std::string names = RankRanges(missing);
  // Cut after kMaxMissingRanges ranges: a verdict must fit one answer.
  size_t commas = 0;
  for (size_t i = 0; i < names.size(); ++i) {
    if (names[i] == ',' && ++commas == kMaxMissingRanges) {
      names = absl::StrCat(names.substr(0, i), ", ...");
      break;
    }
  }
  return absl::StrCat(RanksWord(missing.size()), " ", names,
                      " never arrived (the ranks that did: ", did, ")");
}

std::string ReportArrival(MPI_Comm comm, int rank, int size,
                          absl::string_view host, absl::Duration grace) {
  auto pending = std::make_unique<Pending>();
  Pending& p = *pending;
  p.report = host.empty() ? std::string(1, '?')
                          : std::string(host.substr(0, kHostBytes));
  // Two collectors, so that a missing rank 0 is named too (by rank 1).
  const int collectors = std::min(size, 2);
  std::string verdict;
  if (rank < collectors) {
    // Report to the other collector, then collect reports from any rank
    // until everyone reported or the grace is over (one receive buffer,
    // re-posted after each report).
    std::vector<std::string> hosts(static_cast<size_t>(size));
    hosts[rank] = p.report;
    p.requests.assign(1, MPI_REQUEST_NULL);
    if (collectors == 2) {
      p.requests.push_back(MPI_REQUEST_NULL);
      MPI_Isend(p.report.data(), static_cast<int>(p.report.size()), MPI_CHAR,
                1 - rank, kReportTag, comm, &p.requests.back());
    }
    int heard = 0;
    const absl::Time until = absl::Now() + grace;
    while (heard < size - 1) {
      if (MPI_Irecv(p.received.data(), kHostBytes, MPI_CHAR, MPI_ANY_SOURCE,
                    kReportTag, comm, &p.requests[0]) != MPI_SUCCESS) {
        break;
      }
      MPI_Status status;
      if (!TestUntil(&p.requests[0], until, &status)) break;
      int count = 0;
      MPI_Get_count(&status, MPI_CHAR, &count);
      const int from = status.MPI_SOURCE;
      if (from >= 0 && from < size && hosts[from].empty()) {
        hosts[from].assign(p.received.data(),
                           static_cast<size_t>(std::max(count, 1)));
        ++heard;
      }
    }
    // Nobody else at all: most likely the others came first and gave up.
    verdict = heard == 0 && size > 1
                  ? absl::StrCat("no other rank reported within ",
                                 absl::FormatDuration(grace),
                                 ": they gave up before this rank arrived, or "
                                 "none arrived")
                  : ArrivalVerdict(hosts);
    p.answer = verdict.substr(0, kAnswerBytes);
    const size_t first_send = p.requests.size();
    for (int r = collectors; r < size; ++r) {
      if (hosts[r].empty()) continue;
      p.requests.push_back(MPI_REQUEST_NULL);
      MPI_Isend(p.answer.data(), static_cast<int>(p.answer.size()), MPI_CHAR, r,
                kAnswerTag, comm, &p.requests.back());
    }
    // Small messages leave at once; a bounded wait for the rest.
    const absl::Time sent_by = absl::Now() + grace / 2;
    for (size_t i = first_send; i < p.requests.size(); ++i) {
      if (!TestUntil(&p.requests[i], sent_by, MPI_STATUS_IGNORE)) break;
    }
  } else {
    // Report to both collectors; rank 0's answer wins, rank 1's stands in
    // when rank 0's does not follow it within half a second.
    p.requests.assign(4, MPI_REQUEST_NULL);
    for (int c = 0; c < collectors; ++c) {
      MPI_Isend(p.report.data(), static_cast<int>(p.report.size()), MPI_CHAR, c,
                kReportTag, comm, &p.requests[c]);
    }
    p.answers.assign(2, std::vector<char>(kAnswerBytes));
    for (int c = 0; c < collectors; ++c) {
      MPI_Irecv(p.answers[c].data(), kAnswerBytes, MPI_CHAR, c, kAnswerTag,
                comm, &p.requests[2 + c]);
    }
    const absl::Duration wait = 2 * grace + absl::Milliseconds(500);
    absl::Time until = absl::Now() + wait;
    bool answered[2] = {false, false};
    std::string texts[2];
    while (true) {
      for (int c = 0; c < collectors; ++c) {
        if (answered[c]) continue;
        int done = 0;
        MPI_Status status;
        if (MPI_Test(&p.requests[2 + c], &done, &status) != MPI_SUCCESS ||
            !done) {
          continue;
        }
        answered[c] = true;
        int count = 0;
        MPI_Get_count(&status, MPI_CHAR, &count);
        texts[c].assign(p.answers[c].data(),
                        static_cast<size_t>(std::max(count, 0)));
        if (c == 1) {
          until = std::min(until, absl::Now() + absl::Milliseconds(500));
        }
      }
      if (answered[0] || absl::Now() >= until) break;
      Pause();
    }
    if (answered[0] || answered[1]) {
      verdict = answered[0] ? texts[0] : texts[1];
    } else {
      verdict = absl::StrCat(
          "ranks 0 and 1, which collect the reports of the ranks that "
          "arrived, did not answer this rank's report within ",
          absl::FormatDuration(wait),
          ": they gave up before this rank arrived, or they are missing too");
    }
  }
  KeepForever(std::move(pending));
  return verdict;
}

}  // namespace vemesh
