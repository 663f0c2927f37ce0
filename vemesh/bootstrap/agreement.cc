#include "vemesh/bootstrap/agreement.h"

#include <cstdint>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "vemesh/base/fnv1a.h"
#include "vemesh/base/status_macros.h"
#include "vemesh/comm/agreement.h"
#include "vemesh/comm/communicator.h"

namespace vemesh {
namespace {

// FNV-1a: the same on every process (absl::Hash is seeded per process).
uint64_t Fingerprint(absl::string_view bytes) { return Fnv1a(bytes); }

// Length-prefixed fields, so that no value can fake a separator.
void AppendField(absl::string_view name, absl::string_view value,
                 std::string* out) {
  absl::StrAppend(out, name.size(), ":", name, value.size(), ":", value);
}

std::vector<AgreementField> Parse(absl::string_view text) {
  std::vector<AgreementField> fields;
  auto next = [&text](std::string* out) {
    size_t colon = text.find(':');
    if (colon == absl::string_view::npos || colon > 19) return false;
    size_t length = 0;
    for (char c : text.substr(0, colon)) {
      if (c < '0' || c > '9') return false;
      length = length * 10 + static_cast<size_t>(c - '0');
    }
    if (length > text.size() - colon - 1) return false;
    *out = std::string(text.substr(colon + 1, length));
    text.remove_prefix(colon + 1 + length);
    return true;
  };
  AgreementField f;
  while (!text.empty() && next(&f.name) && next(&f.value)) fields.push_back(f);
  return fields;
}

std::string Shorten(absl::string_view value) {
  constexpr size_t kMax = 160;
  if (value.size() <= kMax) return std::string(value);
  return absl::StrCat(value.substr(0, kMax), "... (", value.size(),
                      " characters)");
}

constexpr size_t kFingerprintBytes = sizeof(uint64_t);

// The fingerprint of (operation, fields) followed by `payload`: what each
// rank sends. `mine` receives the serialised fields (for a disagreement).
std::string AgreementMessage(absl::string_view operation,
                             absl::Span<const AgreementField> fields,
                             absl::string_view payload, std::string* mine) {
  // The operation is a field too: ranks in different collective calls of
  // the same bootstrap are told so, instead of waiting for the deadline.
  // Serialised in place, into one allocation (issue 32: creation's CPU).
  size_t bytes = operation.size() + 32;
  for (const AgreementField& f : fields) {
    bytes += f.name.size() + f.value.size() + 42;
  }
  mine->clear();
  mine->reserve(bytes);
  AppendField("operation", operation, mine);
  for (const AgreementField& f : fields) AppendField(f.name, f.value, mine);
  const uint64_t h = Fingerprint(*mine);
  std::string message;
  message.reserve(kFingerprintBytes + payload.size());
  message.append(reinterpret_cast<const char*>(&h), kFingerprintBytes);
  message.append(payload.data(), payload.size());
  return message;
}

absl::StatusOr<std::vector<std::string>> Verdict(
    Bootstrap& bootstrap, absl::string_view operation,
    const std::string& message, const std::string& mine,
    absl::StatusOr<std::vector<std::string>> gathered, absl::Time deadline) {
  if (!gathered.ok()) {
    return absl::Status(
        gathered.status().code(),
        absl::StrCat(operation, ": ", gathered.status().message()));
  }
  bool agree = true;
  for (const std::string& m : *gathered) {
    if (m.size() < kFingerprintBytes) {
      return absl::InternalError(
          absl::StrCat(operation, ": a rank sent ", m.size(),
                       " bytes to the agreement check: expected at least 8"));
    }
    agree =
        agree && std::memcmp(m.data(), message.data(), kFingerprintBytes) == 0;
  }
  if (agree) {
    // The payloads in place, without a copy per rank (issue 32: creation's
    // CPU per rank should not grow with allocations per world rank).
    for (std::string& m : *gathered) m.erase(0, kFingerprintBytes);
    return std::move(*gathered);
  }

  // They disagree (every rank knows it): one more step fetches everyone's
  // arguments, so that the message names the first rank that differs from
  // rank 0 and what each passed.
  auto texts = bootstrap.all_gather(mine, deadline);
  if (!texts.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        operation,
        ": the ranks disagree on their arguments (every rank must pass the "
        "same); fetching which rank differs failed: ",
        texts.status().message()));
  }
  int other = -1;
  for (size_t r = 1; r < texts->size(); ++r) {
    if ((*texts)[r] != (*texts)[0]) {
      other = static_cast<int>(r);
      break;
    }
  }
  if (other < 0) {
    return absl::InternalError(absl::StrCat(
        operation, ": ranks' fingerprints differ but their arguments match"));
  }
  std::vector<AgreementField> zero_fields = Parse((*texts)[0]);
  std::vector<AgreementField> other_fields = Parse((*texts)[other]);
  // One disagreement per differing field, each in the one format of
  // comm/agreement.h ("<operation> <field>: rank R has X, rank 0 has Y").
  std::string detail;
  for (size_t i = 0; i < zero_fields.size() && i < other_fields.size(); ++i) {
    if (zero_fields[i].value == other_fields[i].value) continue;
    absl::StrAppend(
        &detail, detail.empty() ? "" : "; ",
        DisagreementMessage(absl::StrCat(operation, " ", other_fields[i].name),
                            other, Shorten(other_fields[i].value), 0,
                            Shorten(zero_fields[i].value)));
  }
  if (detail.empty()) {
    detail =
        DisagreementMessage(absl::StrCat(operation, " arguments"), other,
                            Shorten((*texts)[other]), 0, Shorten((*texts)[0]));
  }
  return absl::InvalidArgumentError(
      absl::StrCat(detail, " (every rank must pass the same arguments)"));
}

}  // namespace

absl::StatusOr<std::vector<std::string>> AgreeAndGather(
    Bootstrap& bootstrap, absl::string_view operation,
    absl::Span<const AgreementField> fields, absl::string_view payload,
    absl::Time deadline) {
  std::string mine;
  const std::string message =
      AgreementMessage(operation, fields, payload, &mine);
  return Verdict(bootstrap, operation, message, mine,
                 bootstrap.all_gather(message, deadline), deadline);
}

absl::StatusOr<AgreedWorld> AgreeAndMakeWorld(
    Bootstrap& bootstrap, absl::string_view operation,
    absl::Span<const AgreementField> fields, absl::string_view payload,
    absl::Time deadline, absl::Duration op_timeout) {
  std::string mine;
  const std::string message =
      AgreementMessage(operation, fields, payload, &mine);
  auto both = bootstrap.all_gather_and_world(message, deadline, op_timeout);
  absl::StatusOr<std::vector<std::string>> gathered =
      both.ok()
          ? absl::StatusOr<std::vector<std::string>>(std::move(both->gathered))
          : both.status();
  VEMESH_ASSIGN_OR_RETURN(auto payloads,
                          Verdict(bootstrap, operation, message, mine,
                                  std::move(gathered), deadline));
  return AgreedWorld{std::move(payloads), std::move(both->world)};
}

absl::Status CheckAgreement(Bootstrap& bootstrap, absl::string_view operation,
                            absl::Span<const AgreementField> fields,
                            absl::Time deadline) {
  return AgreeAndGather(bootstrap, operation, fields, "", deadline).status();
}

}  // namespace vemesh
