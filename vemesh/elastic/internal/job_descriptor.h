// vemesh/elastic/internal/job_descriptor.h
//
// What every replica of an elastic job must share, as text: `key=value`
// items joined by ';' (train_nd writes the mesh, model, batch, optimizer,
// ...). The first replica records it in the control plane; a joiner
// compares its own against the job's and is refused, naming the
// differences, when they differ.
//
//   absl::Status s = CompareJobDescriptors("mesh=1x2;batch=12",
//                                          "mesh=1x2;batch=24");
//   // InvalidArgument: "batch is 12 here but 24 in the job"
//
// The job's text is read from a store that anyone on the network may write:
// it is bounded before use (kMaxJobDescriptorBytes; at most
// kMaxJobDescriptorFields items), and an error names at most
// kMaxNamedDifferences differences, each value cut at kMaxQuotedValue
// characters, then how many more there are.
#ifndef VEMESH_ELASTIC_INTERNAL_JOB_DESCRIPTOR_H_
#define VEMESH_ELASTIC_INTERNAL_JOB_DESCRIPTOR_H_

#include <cstddef>
#include <string>

#include "absl/container/btree_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace vemesh {

inline constexpr size_t kMaxJobDescriptorBytes = 64 * 1024;
inline constexpr size_t kMaxJobDescriptorFields = 256;
inline constexpr size_t kMaxNamedDifferences = 8;
inline constexpr size_t kMaxQuotedValue = 64;

// The items of a descriptor, by key (a key given twice: the last value).
// InvalidArgument for a text over the bounds above, naming which.
absl::StatusOr<absl::btree_map<std::string, std::string>> ParseJobDescriptor(
    absl::string_view text);

// OK when `mine` and `job` hold the same items (in any order); otherwise
// InvalidArgument "<differences> ..." naming each differing key with both
// values ("(none)" where one side lacks it), bounded as above.
absl::Status CompareJobDescriptors(absl::string_view mine,
                                   absl::string_view job);

}  // namespace vemesh

#endif  // VEMESH_ELASTIC_INTERNAL_JOB_DESCRIPTOR_H_
