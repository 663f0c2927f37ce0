#include "vemesh/elastic/internal/job_descriptor.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace vemesh {
namespace {

// A value as an error quotes it: cut, so that a huge value written into the
// store by anyone cannot make a huge message.
std::string Quoted(absl::string_view value) {
  if (value.size() <= kMaxQuotedValue) return std::string(value);
  return absl::StrCat(value.substr(0, kMaxQuotedValue), "... (", value.size(),
                      " bytes)");
}

}  // namespace

absl::StatusOr<absl::btree_map<std::string, std::string>> ParseJobDescriptor(
    absl::string_view text) {
  if (text.size() > kMaxJobDescriptorBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("job descriptor of ", text.size(), " bytes; at most ",
                     kMaxJobDescriptorBytes, " expected"));
  }
  absl::btree_map<std::string, std::string> fields;
  size_t items = 0;
  for (absl::string_view item : absl::StrSplit(text, ';', absl::SkipEmpty())) {
    if (++items > kMaxJobDescriptorFields) {
      return absl::InvalidArgumentError(absl::StrCat(
          "job descriptor with more than ", kMaxJobDescriptorFields, " items"));
    }
    std::pair<std::string, std::string> kv =
        absl::StrSplit(item, absl::MaxSplits('=', 1));
    fields[std::move(kv.first)] = std::move(kv.second);
  }
  return fields;
}

absl::Status CompareJobDescriptors(absl::string_view mine,
                                   absl::string_view job) {
  if (mine == job) return absl::OkStatus();
  auto ours = ParseJobDescriptor(mine);
  if (!ours.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("this replica's ", ours.status().message()));
  }
  auto theirs = ParseJobDescriptor(job);
  if (!theirs.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the job's recorded ", theirs.status().message()));
  }
  std::vector<std::string> diffs;
  size_t count = 0;
  auto differ = [&](absl::string_view key, absl::string_view here,
                    absl::string_view there) {
    if (++count > kMaxNamedDifferences) return;
    diffs.push_back(absl::StrCat(Quoted(key), " is ", Quoted(here),
                                 " here but ", Quoted(there), " in the job"));
  };
  for (const auto& [key, value] : *ours) {
    auto it = theirs->find(key);
    if (it == theirs->end()) {
      differ(key, value, "(none)");
    } else if (it->second != value) {
      differ(key, value, it->second);
    }
  }
  for (const auto& [key, value] : *theirs) {
    if (!ours->contains(key)) differ(key, "(none)", value);
  }
  if (count == 0) return absl::OkStatus();  // the same items, reordered
  std::string text = absl::StrJoin(diffs, "; ");
  if (count > kMaxNamedDifferences) {
    absl::StrAppend(&text, "; and ", count - kMaxNamedDifferences,
                    " more difference(s)");
  }
  return absl::InvalidArgumentError(text);
}

}  // namespace vemesh
