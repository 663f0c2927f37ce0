// libFuzzer target: the elastic job descriptor's admission check
// (CompareJobDescriptors) on arbitrary text, as a joiner reads the job's
// descriptor back from a store that anyone on the network can write.
//
// The input is split at its first NUL byte into this replica's descriptor
// and the job's. Invariants checked on every input (a violation aborts,
// which libFuzzer reports as a crash with the input saved):
//   - a descriptor always equals itself (OK);
//   - the answer is OK or InvalidArgument, and symmetric in OK-ness;
//   - an error's message is bounded whatever the input's size: at most
//     kMaxNamedDifferences differences, each value quoted to
//     kMaxQuotedValue characters (plus a constant);
//   - an accepted text has at most kMaxJobDescriptorFields items.
#include <cstddef>
#include <cstdint>

#include "absl/strings/string_view.h"
#include "fuzz_check.h"
#include "vemesh/elastic/internal/job_descriptor.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view input(reinterpret_cast<const char*>(data), size);
  const size_t cut = input.find('\0');
  const absl::string_view mine = input.substr(0, cut);
  const absl::string_view job = cut == absl::string_view::npos
                                    ? absl::string_view()
                                    : input.substr(cut + 1);

  FUZZ_CHECK(vemesh::CompareJobDescriptors(mine, mine).ok() ||
             mine.size() > vemesh::kMaxJobDescriptorBytes ||
             !vemesh::ParseJobDescriptor(mine).ok());
  const absl::Status a = vemesh::CompareJobDescriptors(mine, job);
  const absl::Status b = vemesh::CompareJobDescriptors(job, mine);
  FUZZ_CHECK(a.ok() || a.code() == absl::StatusCode::kInvalidArgument);
  FUZZ_CHECK(a.ok() == b.ok());
  // Each named difference: two keys' and values' quotes of at most
  // kMaxQuotedValue + 32 characters, and the words around them.
  constexpr size_t kBound =
      vemesh::kMaxNamedDifferences * (3 * (vemesh::kMaxQuotedValue + 32) + 40) +
      200;
  FUZZ_CHECK(a.message().size() <= kBound);
  auto fields = vemesh::ParseJobDescriptor(mine);
  if (fields.ok()) {
    FUZZ_CHECK(fields->size() <= vemesh::kMaxJobDescriptorFields);
  }
  return 0;
}
