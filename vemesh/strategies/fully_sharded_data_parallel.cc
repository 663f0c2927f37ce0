#include "vemesh/strategies/fully_sharded_data_parallel.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <mutex>
#include <optional>
#include <string>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "vemesh/base/fnv1a.h"
#include "vemesh/base/status_macros.h"
#include "vemesh/comm/agreement.h"
#include "vemesh/comm/half.h"
#include "vemesh/comm/reconfigurable_communicator.h"

namespace vemesh::strategies {
namespace {

constexpr int kMaxPrefetch = 64;

// A group of ranks of the mesh; a null communicator is a group of one.
// `size` and `rank` are Create's: the shard group's for good (the shards are
// laid out for them). The replicate group keeps its communicator even as a
// group of one and is asked its size and rank at every use (Current*), so a
// ReconfigurableCommunicator whose group changed between steps (an elastic
// mesh's replicate group) averages over the replicas there now.
struct Group {
  std::shared_ptr<Communicator> comm;
  int size = 1;
  int rank = 0;
  int CurrentSize() const { return comm == nullptr ? 1 : comm->size(); }
  int CurrentRank() const { return comm == nullptr ? 0 : comm->rank(); }
};

// Where a unit is: only its shard, an all_gather in flight, or its
// parameters materialised in the model's Parameter objects.
enum class Phase { kSharded, kGathering, kGathered };

BFloat16 ToBf16(double x) { return BFloat16(static_cast<float>(x)); }
double FromBf16(BFloat16 x) {
  return static_cast<double>(static_cast<float>(x));
}

}  // namespace

struct FullyShardedDataParallel::State {
  struct Unit {
    std::string name;
    std::vector<Parameter*> params;
    std::vector<std::pair<int64_t, int64_t>> shapes;
    size_t numel = 0;                         // unpadded elements
    size_t shard_len = 0;                     // elements of one (padded) shard
    size_t valid_begin = 0, valid_count = 0;  // this rank's, in the shard
    std::vector<double> shard;       // master values, padded with zeros
    std::vector<double> grad_shard;  // averaged gradients, accumulated
    Phase phase = Phase::kSharded;
    // The all_gather in flight (one of the pairs, by precision).
    std::vector<double> gather_f64;
    std::vector<BFloat16> gather_send_bf16, gather_bf16;
    std::shared_ptr<Work> gather_work;
    // The gradient reduction in flight: reduce_scatter into `rs_*_out`,
    // then (kHybridShard, kNoShard) all_reduce of it over the replicate
    // group.
    std::vector<double> rs_f64, rs_out_f64;
    std::vector<BFloat16> rs_bf16, rs_out_bf16;
    std::shared_ptr<Work> rs_work, ar_work;
    bool reducing = false;
  };

  FsdpOptions options;
  Group shard, replicate;
  std::vector<Unit> units;
  std::vector<size_t> pending;  // units with a reduction, in issue order
  // The backward order the hooks assume (reverse registration order): the
  // last unit PostBackward took since FinishBackward, and this rank's first
  // departure from that order, if any.
  std::optional<size_t> last_backward;
  std::string order_error;
  std::vector<std::unique_ptr<FlatOptimizer>> optimizers;  // one per unit
  Counters counters;
  // Reductions or gathers that failed in flight keep their buffers here
  // (work.h: a backend may hold them after an abort).
  std::vector<Unit> abandoned;

  State() = default;
  State(const State&) = delete;
  State& operator=(const State&) = delete;
  // Operations still in flight write into the units' buffers: each is
  // waited for, at most its group's timeout (the destructor and a move
  // assignment both end here). One that is still running then, or that
  // failed in flight, keeps its buffers for good, in a process-wide holder
  // that is never freed: the backend may still write them.
  ~State() {
    bool keep = !abandoned.empty();
    for (Unit& unit : units) {
      for (auto* w : {&unit.gather_work, &unit.rs_work, &unit.ar_work}) {
        if (*w == nullptr || (*w)->is_completed()) continue;
        absl::Duration bound = absl::Seconds(60);
        for (const Group* g : {&shard, &replicate}) {
          if (g->comm != nullptr) bound = std::max(bound, g->comm->timeout());
        }
        if (!(*w)->wait(absl::Now() + bound).ok() || !(*w)->is_completed()) {
          keep = true;
        }
      }
    }
    if (keep) {
      static std::mutex mu;
      static auto* kept = new std::vector<std::vector<Unit>>();
      std::lock_guard<std::mutex> lock(mu);
      kept->push_back(std::move(units));
      kept->push_back(std::move(abandoned));
    }
  }

  bool bf16() const {
    return options.mixed_precision == MixedPrecision::kBFloat16;
  }
  bool frees_after_forward() const {
    return options.sharding_strategy == ShardingStrategy::kFullShard ||
           options.sharding_strategy == ShardingStrategy::kHybridShard;
  }
  bool keeps_parameters() const {
    return options.sharding_strategy == ShardingStrategy::kNoShard;
  }
  size_t elt() const { return bf16() ? sizeof(BFloat16) : sizeof(double); }
  // What a rank adds to unit `u`'s reductions: u + 1 (exact in double; in
  // bfloat16 1, whose sums are exact up to 256 ranks) while its backward
  // runs in the order the hooks assume, else a negative value no sum of
  // in-order tags can reach.
  double ReductionTag(size_t u) const {
    const double in_order = bf16() ? 1.0 : static_cast<double>(u) + 1.0;
    if (order_error.empty()) return in_order;
    return -4.0 * static_cast<double>(units.size() + 1) *
           static_cast<double>(shard.size) *
           static_cast<double>(std::max(replicate.CurrentSize(), 1));
  }

  absl::Status CheckUnit(size_t u, absl::string_view op) const {
    if (u < units.size()) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat(
        "FullyShardedDataParallel::", op, ": unit ", u,
        " does not exist; expected one of [0, ", units.size(), ")"));
  }

  // Gives each MPI operation in flight a look, so a backend without a
  // progress thread moves it on while the model computes.
  void Progress() {
    for (Unit& unit : units) {
      if (unit.gather_work && !unit.gather_work->is_completed())
        unit.gather_work->test();
      if (unit.rs_work && !unit.rs_work->is_completed()) unit.rs_work->test();
    }
  }

  absl::Time Deadline(const Group& g) const {
    return g.comm == nullptr ? absl::InfiniteFuture()
                             : absl::Now() + g.comm->timeout();
  }

  absl::Status StartGather(size_t u) {
    Unit& unit = units[u];
    if (unit.phase != Phase::kSharded) return absl::OkStatus();
    unit.phase = Phase::kGathering;
    if (shard.size == 1) return absl::OkStatus();  // FinishGather copies
    const size_t total = unit.shard_len * shard.size;
    Communicator::WorkOr w;
    if (bf16()) {
      unit.gather_send_bf16.resize(unit.shard_len);
      for (size_t i = 0; i < unit.shard_len; ++i)
        unit.gather_send_bf16[i] = ToBf16(unit.shard[i]);
      unit.gather_bf16.resize(total);
      w = shard.comm->iall_gather(unit.gather_send_bf16.data(),
                                  unit.gather_bf16.data(), unit.shard_len,
                                  DataType::kBFloat16);
    } else {
      unit.gather_f64.resize(total);
      w = shard.comm->iall_gather(unit.shard.data(), unit.gather_f64.data(),
                                  unit.shard_len, DataType::kFloat64);
    }
    // The peers' matching gathers are under way: stop the groups rather
    // than leave this unit half started (its buffers would read as zeros).
    if (!w.ok()) return Abandon(u, w.status());
    unit.gather_work = *std::move(w);
    ++counters.all_gathers;
    counters.bytes_sent +=
        static_cast<int64_t>((shard.size - 1) * unit.shard_len * elt());
    return absl::OkStatus();
  }

  // Writes the gathered flat values into the unit's parameters.
  absl::Status FinishGather(size_t u) {
    Unit& unit = units[u];
    if (unit.phase == Phase::kGathered) return absl::OkStatus();
    VEMESH_RETURN_IF_ERROR(StartGather(u));
    if (unit.gather_work != nullptr) {
      absl::Status s = unit.gather_work->wait(Deadline(shard));
      if (!s.ok()) return Abandon(u, s);
      unit.gather_work.reset();
    }
    size_t at = 0;
    for (size_t k = 0; k < unit.params.size(); ++k) {
      Matrix& v = unit.params[k]->value;
      v.resize(unit.shapes[k].first, unit.shapes[k].second);
      double* out = v.data();
      for (int64_t j = 0; j < v.size(); ++j, ++at) {
        if (shard.size == 1) {
          // A group of one: still rounded, so that every size computes the
          // same way.
          out[j] = bf16() ? FromBf16(ToBf16(unit.shard[at])) : unit.shard[at];
        } else {
          out[j] =
              bf16() ? FromBf16(unit.gather_bf16[at]) : unit.gather_f64[at];
        }
      }
    }
    std::vector<double>().swap(unit.gather_f64);
    std::vector<BFloat16>().swap(unit.gather_bf16);
    std::vector<BFloat16>().swap(unit.gather_send_bf16);
    unit.phase = Phase::kGathered;
    return absl::OkStatus();
  }

  void Free(size_t u) {
    Unit& unit = units[u];
    if (unit.phase != Phase::kGathered) return;
    for (Parameter* p : unit.params) {
      p->value.resize(0, 0);
      p->grad.resize(0, 0);
    }
    unit.phase = Phase::kSharded;
  }

  // A collective failed with operations in flight: stop the groups (later
  // collectives would pair with the wrong messages) and keep the buffers.
  absl::Status Abandon(size_t u, absl::Status status) {
    (void)u;
    for (Group* g : {&shard, &replicate}) {
      // A group of one (a replicate group kept for when it grows) has
      // nothing in flight to pair wrongly.
      if (g->comm != nullptr && g->CurrentSize() > 1) {
        g->comm->abort(
            absl::StrCat("FullyShardedDataParallel: ", status.message()));
      }
    }
    for (Unit& unit : units) {
      Unit keep;
      keep.gather_f64 = std::move(unit.gather_f64);
      keep.gather_bf16 = std::move(unit.gather_bf16);
      keep.gather_send_bf16 = std::move(unit.gather_send_bf16);
      keep.rs_f64 = std::move(unit.rs_f64);
      keep.rs_out_f64 = std::move(unit.rs_out_f64);
      keep.rs_bf16 = std::move(unit.rs_bf16);
      keep.rs_out_bf16 = std::move(unit.rs_out_bf16);
      keep.gather_work = std::move(unit.gather_work);
      keep.rs_work = std::move(unit.rs_work);
      keep.ar_work = std::move(unit.ar_work);
      abandoned.push_back(std::move(keep));
      unit.reducing = false;
      if (unit.phase == Phase::kGathering) unit.phase = Phase::kSharded;
    }
    pending.clear();
    last_backward.reset();  // the step is redone from its forward
    order_error.clear();
    return status;
  }

  // A collective of the replicate group failed in FinishBackward (a replica
  // was lost, or the group is between configurations): stop that group
  // only (a ReconfigurableCommunicator until its next configure) and keep
  // the buffers of its operations in flight. The shard group is healthy:
  // its reduce_scatters, which every shard peer started in PostBackward,
  // are waited for, so the module stays usable. Nothing was added to the
  // gradient shards; every unit is ready for the step to be redone.
  // Lets go of the abandoned operations that have finished since (one
  // non-blocking look each): their buffers, and the communicator of the
  // epoch they ran on, which they keep alive until then.
  void PruneAbandoned() {
    std::vector<Unit> still;
    for (Unit& unit : abandoned) {
      bool done = true;
      for (auto* w : {&unit.gather_work, &unit.rs_work, &unit.ar_work}) {
        if (*w != nullptr && !(*w)->test()) done = false;
      }
      if (!done) still.push_back(std::move(unit));
    }
    abandoned = std::move(still);
  }

  absl::Status AbandonReplicate(absl::Status status) {
    if (replicate.comm != nullptr) {
      replicate.comm->abort(
          absl::StrCat("FullyShardedDataParallel: ", status.message()));
    }
    for (size_t u : pending) {
      Unit& unit = units[u];
      if (unit.rs_work != nullptr) {
        absl::Status s = unit.rs_work->wait(Deadline(shard));
        if (!s.ok()) return Abandon(u, s);
        unit.rs_work.reset();
      }
    }
    for (size_t u : pending) {
      Unit& unit = units[u];
      Unit keep;
      keep.rs_out_f64 = std::move(unit.rs_out_f64);
      keep.rs_out_bf16 = std::move(unit.rs_out_bf16);
      keep.ar_work = std::move(unit.ar_work);
      if (keep.ar_work != nullptr && !keep.ar_work->is_completed()) {
        abandoned.push_back(std::move(keep));
      }
      std::vector<double>().swap(unit.rs_f64);
      std::vector<BFloat16>().swap(unit.rs_bf16);
      std::vector<double>().swap(unit.rs_out_f64);
      std::vector<BFloat16>().swap(unit.rs_out_bf16);
      unit.reducing = false;
    }
    pending.clear();
    last_backward.reset();  // the step is redone from its forward
    order_error.clear();
    return status;
  }

  // The next `options.prefetch` units after (forward) or before (backward)
  // `u` that are not materialised: start their all_gathers.
  absl::Status Prefetch(size_t u, bool forward) {
    for (int k = 1; k <= options.prefetch; ++k) {
      const int64_t v =
          forward ? static_cast<int64_t>(u) + k : static_cast<int64_t>(u) - k;
      if (v < 0 || v >= static_cast<int64_t>(units.size())) break;
      VEMESH_RETURN_IF_ERROR(StartGather(static_cast<size_t>(v)));
    }
    return absl::OkStatus();
  }
};

absl::string_view ShardingStrategyName(ShardingStrategy s) {
  switch (s) {
    case ShardingStrategy::kFullShard:
      return "full_shard";
    case ShardingStrategy::kShardGradOp:
      return "shard_grad_op";
    case ShardingStrategy::kHybridShard:
      return "hybrid_shard";
    case ShardingStrategy::kNoShard:
      return "no_shard";
  }
  return "unknown";
}

absl::StatusOr<ShardingStrategy> ParseShardingStrategy(absl::string_view text) {
  const std::string lower = absl::AsciiStrToLower(text);
  for (ShardingStrategy s :
       {ShardingStrategy::kFullShard, ShardingStrategy::kShardGradOp,
        ShardingStrategy::kHybridShard, ShardingStrategy::kNoShard}) {
    if (lower == ShardingStrategyName(s)) return s;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("sharding strategy '", text,
                   "' is unknown; expected full_shard, shard_grad_op, "
                   "hybrid_shard or no_shard"));
}

namespace {

// The caller's arguments, checked on this rank alone; fills in the default
// dimensions.
absl::Status CheckLocally(const DeviceMesh& mesh,
                          const std::vector<FsdpUnit>& units, FsdpOptions& o) {
  const std::vector<std::string> names = mesh.mesh_dim_names();
  if (o.prefetch < 0 || o.prefetch > kMaxPrefetch) {
    return absl::InvalidArgumentError(absl::StrCat(
        "FSDP prefetch ", o.prefetch, " is out of range; expected ",
        "0 (off) to ", kMaxPrefetch));
  }
  const ShardingStrategy s = o.sharding_strategy;
  if (s != ShardingStrategy::kFullShard &&
      s != ShardingStrategy::kShardGradOp &&
      s != ShardingStrategy::kHybridShard && s != ShardingStrategy::kNoShard) {
    return absl::InvalidArgumentError(absl::StrCat(
        "FSDP sharding_strategy ", static_cast<int>(s), " is not one of ",
        "kFullShard, kShardGradOp, kHybridShard, kNoShard"));
  }
  if (o.mixed_precision != MixedPrecision::kNone &&
      o.mixed_precision != MixedPrecision::kBFloat16) {
    return absl::InvalidArgumentError(absl::StrCat(
        "FSDP mixed_precision ", static_cast<int>(o.mixed_precision),
        " is not kNone or kBFloat16"));
  }
  if (o.shard_dims.empty() && o.replicate_dims.empty()) {
    switch (s) {
      case ShardingStrategy::kFullShard:
      case ShardingStrategy::kShardGradOp:
        o.shard_dims = names;
        break;
      case ShardingStrategy::kHybridShard:
        if (names.size() < 2) {
          return absl::InvalidArgumentError(absl::StrCat(
              "FSDP hybrid_shard on a ", names.size(),
              "-D mesh: expected a mesh of 2 or more dimensions (replicate, "
              "shard...) or explicit shard_dims and replicate_dims"));
        }
        o.replicate_dims = {names[0]};
        o.shard_dims.assign(names.begin() + 1, names.end());
        break;
      case ShardingStrategy::kNoShard:
        o.replicate_dims = names;
        break;
    }
  }
  if (s == ShardingStrategy::kNoShard && !o.shard_dims.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "FSDP no_shard with shard_dims {", absl::StrJoin(o.shard_dims, ", "),
        "}: no_shard shards nothing; expected no shard_dims"));
  }
  if ((s == ShardingStrategy::kFullShard ||
       s == ShardingStrategy::kShardGradOp) &&
      !o.replicate_dims.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "FSDP ", ShardingStrategyName(s), " with replicate_dims {",
        absl::StrJoin(o.replicate_dims, ", "),
        "}: only hybrid_shard and no_shard replicate; expected none"));
  }
  absl::flat_hash_set<std::string> seen;
  for (const std::vector<std::string>* dims :
       {&o.shard_dims, &o.replicate_dims}) {
    const char* what = dims == &o.shard_dims ? "shard" : "replicate";
    for (const std::string& d : *dims) {
      if (!mesh.size(d).ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("FSDP ", what, " dimension '", d,
                         "' is not a dimension of the "
                         "mesh; expected one of {",
                         absl::StrJoin(names, ", "), "}"));
      }
      if (!seen.insert(d).second) {
        return absl::InvalidArgumentError(absl::StrCat(
            "FSDP dimension '", d,
            "' is named twice in shard_dims and replicate_dims; expected "
            "each at most once"));
      }
    }
  }
  if (units.empty()) {
    return absl::InvalidArgumentError("FSDP: no units; expected at least one");
  }
  absl::flat_hash_set<const Parameter*> params;
  for (size_t u = 0; u < units.size(); ++u) {
    if (units[u].params.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("FSDP unit ", u, " ('", units[u].name,
                       "') has no parameters; expected at least one"));
    }
    for (const Parameter* p : units[u].params) {
      if (p == nullptr) {
        return absl::InvalidArgumentError(absl::StrCat(
            "FSDP unit ", u, " ('", units[u].name, "') has a null parameter"));
      }
      if (!params.insert(p).second) {
        return absl::InvalidArgumentError(
            absl::StrCat("FSDP parameter '", p->name, "' of unit ", u, " ('",
                         units[u].name, "') is registered twice"));
      }
      if (p->value.size() == 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("FSDP parameter '", p->name, "' of unit ", u, " ('",
                         units[u].name, "') is empty (", p->value.rows(), "x",
                         p->value.cols(), "); expected at least one element"));
      }
    }
  }
  return absl::OkStatus();
}

// FNV-1a (base/fnv1a.h) over what is fed to it, lengths included.
class Fnv {
 public:
  Fnv& Add(absl::string_view bytes) {
    h_ = Fnv1a(bytes, h_);
    return Add(static_cast<int64_t>(bytes.size()));
  }
  Fnv& Add(int64_t v) {
    h_ = Fnv1aWord(static_cast<uint64_t>(v), h_);
    return *this;
  }
  uint64_t value() const { return h_; }

 private:
  uint64_t h_ = kFnv1aOffset;
};

// What every rank must agree on: the options and every unit's name and
// shapes. Kept below 2^62 so that its negation fits too.
int64_t Fingerprint(const std::vector<FsdpUnit>& units, const FsdpOptions& o) {
  Fnv f;
  f.Add(static_cast<int64_t>(o.sharding_strategy))
      .Add(o.prefetch)
      .Add(static_cast<int64_t>(o.mixed_precision));
  for (const auto* dims : {&o.shard_dims, &o.replicate_dims}) {
    f.Add(static_cast<int64_t>(dims->size()));
    for (const std::string& d : *dims) f.Add(d);
  }
  f.Add(static_cast<int64_t>(units.size()));
  for (const FsdpUnit& u : units) {
    f.Add(u.name).Add(static_cast<int64_t>(u.params.size()));
    for (const Parameter* p : u.params) {
      if (p == nullptr) {
        f.Add(-1);
      } else {
        f.Add(p->name).Add(p->value.rows()).Add(p->value.cols());
      }
    }
  }
  return static_cast<int64_t>(f.value() & ((uint64_t{1} << 62) - 1));
}

// Whether Create agrees over dimension `dim`'s group: not over a
// reconfigurable group outside the shard dims (an elastic mesh's replicate
// dimension), whose members do not create their modules together: a
// replica that joins a running job creates its module alone, while the
// others are inside their recovery on the same group.
bool AgreesOver(const Communicator& g, const std::string& dim,
                const FsdpOptions& o) {
  if (dynamic_cast<const ReconfigurableCommunicator*>(&g) == nullptr) {
    return true;
  }
  return std::find(o.shard_dims.begin(), o.shard_dims.end(), dim) !=
         o.shard_dims.end();
}

// Global min of `v` over the mesh (the dimensions AgreesOver), one
// all_reduce per dimension (the minimum over each dimension in turn is the
// minimum over the product).
absl::Status MinOverMesh(const DeviceMesh& mesh, const FsdpOptions& o,
                         absl::Span<int64_t> v) {
  for (const std::string& d : mesh.mesh_dim_names()) {
    VEMESH_ASSIGN_OR_RETURN(std::shared_ptr<Communicator> g, mesh.get_group(d));
    if (g == nullptr || g->size() == 1 || !AgreesOver(*g, d, o)) continue;
    VEMESH_RETURN_IF_ERROR(g->all_reduce(v, ReduceOp::kMin));
  }
  return absl::OkStatus();
}

// What Fingerprint covers, in words for a disagreement: the options but
// the precision, then the units' names and shapes while they fit.
std::string FsdpSummaryText(const std::vector<FsdpUnit>& units,
                            const FsdpOptions& o) {
  std::string t =
      absl::StrCat(ShardingStrategyName(o.sharding_strategy), " shard [",
                   absl::StrJoin(o.shard_dims, ", "), "] replicate [",
                   absl::StrJoin(o.replicate_dims, ", "), "] prefetch ",
                   o.prefetch, ", ", units.size(), " units:");
  for (const FsdpUnit& u : units) {
    if (t.size() > kAgreementTextBytes) break;
    absl::StrAppend(&t, " ", u.name, " [");
    for (size_t i = 0; i < u.params.size(); ++i) {
      const Parameter* p = u.params[i];
      absl::StrAppend(
          &t, i == 0 ? "" : ", ",
          p == nullptr ? std::string("null")
                       : absl::StrCat(p->value.rows(), "x", p->value.cols()));
    }
    t += ']';
  }
  return t;
}

// Collective over the mesh: the fingerprint and summary text of the one
// rank where `holder` is true (the others send the maximum), on every rank.
absl::StatusOr<AgreementSummary> FromOne(const DeviceMesh& mesh,
                                         const FsdpOptions& o, bool holder,
                                         int64_t fp, absl::string_view text) {
  constexpr int64_t kNone = std::numeric_limits<int64_t>::max();
  // One byte past the limit, so that a cut text is shown as cut.
  std::vector<int64_t> v(kAgreementTextBytes + 2, holder ? 0 : kNone);
  if (holder) {
    v[0] = fp;
    for (size_t i = 0; i + 1 < v.size() && i < text.size(); ++i) {
      v[i + 1] = static_cast<unsigned char>(text[i]);
    }
  }
  VEMESH_RETURN_IF_ERROR(MinOverMesh(mesh, o, absl::MakeSpan(v)));
  AgreementSummary out{static_cast<uint64_t>(v[0]), ""};
  for (size_t i = 1; i < v.size() && v[i] > 0 && v[i] < 256; ++i) {
    out.text.push_back(static_cast<char>(v[i]));
  }
  return out;
}

absl::StatusOr<Group> GroupOf(const DeviceMesh& mesh,
                              const std::vector<std::string>& dims,
                              absl::string_view what, bool replicate) {
  Group g;
  if (dims.empty()) return g;
  std::shared_ptr<Communicator> comm;
  if (dims.size() == 1) {
    VEMESH_ASSIGN_OR_RETURN(comm, mesh.get_group(dims[0]));
  } else {
    VEMESH_ASSIGN_OR_RETURN(comm, mesh.flatten(dims));
  }
  if (comm == nullptr) {
    return absl::InternalError(absl::StrCat(
        "FSDP ", what, " group of {", absl::StrJoin(dims, ", "), "} is null"));
  }
  if (comm->size() > 1 && comm->backend() == "nccl") {
    return absl::FailedPreconditionError(absl::StrCat(
        "FSDP ", what, " group {", absl::StrJoin(dims, ", "),
        "} is on nccl, but FullyShardedDataParallel keeps its buffers in "
        "host memory; use a cpu mesh (mpi or gloo)"));
  }
  // A group that may change size later must not be on NCCL either.
  if (comm->backend() == "nccl" &&
      dynamic_cast<const ReconfigurableCommunicator*>(comm.get()) != nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "FSDP ", what, " group {", absl::StrJoin(dims, ", "),
        "} is a reconfigurable nccl group, but FullyShardedDataParallel "
        "keeps its buffers in host memory; use a cpu mesh (mpi or gloo)"));
  }
  g.size = comm->size();
  g.rank = comm->rank();
  // The replicate group is kept whatever its size now: a reconfigurable
  // one may grow later.
  const bool keep = g.size > 1 || (replicate && comm->backend() != "nccl");
  g.comm = keep ? std::move(comm) : nullptr;
  return g;
}

}  // namespace

absl::StatusOr<FullyShardedDataParallel> FullyShardedDataParallel::Create(
    const DeviceMesh& mesh, std::vector<FsdpUnit> units, FsdpOptions options) {
  const absl::Status local = CheckLocally(mesh, units, options);
  // Agreement before anything else: [fingerprint, -fingerprint, -bad,
  // global rank].
  const int64_t fp = Fingerprint(units, options);
  const int64_t me = mesh.global_rank();
  std::vector<int64_t> agree = {fp, -fp, local.ok() ? 0 : -1, me};
  VEMESH_RETURN_IF_ERROR(MinOverMesh(mesh, options, absl::MakeSpan(agree)));
  if (!local.ok()) return local;
  if (agree[2] != 0) {
    return absl::InvalidArgumentError(
        "FSDP: another rank rejected its arguments (its error names them); "
        "every rank must pass the same units and options");
  }
  if (agree[0] != fp || -agree[1] != fp) {
    // Every rank knows they differ. The mesh has no one communicator to
    // gather over (its groups are per dimension), so three more rounds of
    // minima name the first rank (lowest global rank) that differs from the
    // mesh's first, and both: then comm/agreement.h's one verdict.
    constexpr int64_t kNone = std::numeric_limits<int64_t>::max();
    const int64_t first = agree[3];
    const std::string text = FsdpSummaryText(units, options);
    VEMESH_ASSIGN_OR_RETURN(AgreementSummary head,
                            FromOne(mesh, options, me == first, fp, text));
    std::vector<int64_t> other = {
        static_cast<uint64_t>(fp) != head.hash ? me : kNone};
    VEMESH_RETURN_IF_ERROR(MinOverMesh(mesh, options, absl::MakeSpan(other)));
    VEMESH_ASSIGN_OR_RETURN(AgreementSummary theirs,
                            FromOne(mesh, options, me == other[0], fp, text));
    const AgreementSummary both[2] = {head, theirs};
    const int ids[2] = {static_cast<int>(first), static_cast<int>(other[0])};
    absl::Status verdict = AgreementVerdict(
        "FSDP units, shapes and options (every rank must pass the same)", both,
        {.ids = ids});
    if (verdict.ok()) {
      verdict = absl::InternalError(
          "FSDP: the fingerprints differ, yet "
          "the first rank's and another's match");
    }
    return verdict;
  }

  auto state = std::make_unique<State>();
  VEMESH_ASSIGN_OR_RETURN(state->shard,
                          GroupOf(mesh, options.shard_dims, "shard",
                                  /*replicate=*/false));
  VEMESH_ASSIGN_OR_RETURN(state->replicate,
                          GroupOf(mesh, options.replicate_dims, "replicate",
                                  /*replicate=*/true));
  state->options = std::move(options);
  const int s = state->shard.size;
  for (FsdpUnit& in : units) {
    State::Unit unit;
    unit.name = std::move(in.name);
    unit.params = std::move(in.params);
    for (const Parameter* p : unit.params) {
      unit.shapes.emplace_back(p->value.rows(), p->value.cols());
      unit.numel += static_cast<size_t>(p->value.size());
    }
    unit.shard_len = (unit.numel + s - 1) / s;
    const size_t begin = unit.shard_len * state->shard.rank;
    unit.valid_begin = 0;
    unit.valid_count =
        begin >= unit.numel ? 0 : std::min(unit.shard_len, unit.numel - begin);
    unit.shard.assign(unit.shard_len, 0.0);
    unit.grad_shard.assign(unit.shard_len, 0.0);
    size_t at = 0;
    for (Parameter* p : unit.params) {
      const double* v = p->value.data();
      for (int64_t j = 0; j < p->value.size(); ++j, ++at) {
        if (at >= begin && at < begin + unit.valid_count)
          unit.shard[at - begin] = v[j];
      }
    }
    state->units.push_back(std::move(unit));
  }
  // Materialised from now on only by the hooks (kNoShard: always).
  for (size_t u = 0; u < state->units.size(); ++u) {
    if (state->keeps_parameters()) {
      VEMESH_RETURN_IF_ERROR(state->FinishGather(u));  // bf16 rounding
      for (Parameter* p : state->units[u].params) p->ZeroGrad();
    } else {
      state->units[u].phase = Phase::kGathered;
      state->Free(u);
    }
  }
  return FullyShardedDataParallel(std::move(state));
}

FullyShardedDataParallel::FullyShardedDataParallel(std::unique_ptr<State> state)
    : state_(std::move(state)) {}
FullyShardedDataParallel::FullyShardedDataParallel(
    FullyShardedDataParallel&&) noexcept = default;
FullyShardedDataParallel& FullyShardedDataParallel::operator=(
    FullyShardedDataParallel&&) noexcept = default;
// State's destructor waits for what is in flight (bounded).
FullyShardedDataParallel::~FullyShardedDataParallel() = default;

absl::Status FullyShardedDataParallel::PreForward(size_t u) {
  VEMESH_RETURN_IF_ERROR(state_->CheckUnit(u, "PreForward"));
  VEMESH_RETURN_IF_ERROR(state_->StartGather(u));
  VEMESH_RETURN_IF_ERROR(state_->Prefetch(u, /*forward=*/true));
  return state_->FinishGather(u);
}

absl::Status FullyShardedDataParallel::PostForward(size_t u) {
  VEMESH_RETURN_IF_ERROR(state_->CheckUnit(u, "PostForward"));
  if (state_->frees_after_forward()) state_->Free(u);
  state_->Progress();
  return absl::OkStatus();
}

absl::Status FullyShardedDataParallel::PreBackward(size_t u) {
  VEMESH_RETURN_IF_ERROR(state_->CheckUnit(u, "PreBackward"));
  VEMESH_RETURN_IF_ERROR(state_->StartGather(u));
  VEMESH_RETURN_IF_ERROR(state_->Prefetch(u, /*forward=*/false));
  VEMESH_RETURN_IF_ERROR(state_->FinishGather(u));
  for (Parameter* p : state_->units[u].params) p->ZeroGrad();
  return absl::OkStatus();
}

absl::Status FullyShardedDataParallel::PostBackward(size_t u) {
  VEMESH_RETURN_IF_ERROR(state_->CheckUnit(u, "PostBackward"));
  State& st = *state_;
  State::Unit& unit = st.units[u];
  if (unit.phase != Phase::kGathered) {
    return absl::FailedPreconditionError(
        absl::StrCat("FSDP PostBackward(", u, ") ('", unit.name,
                     "'): the unit is not materialised; call PreBackward "
                     "first"));
  }
  if (unit.reducing) {
    return absl::FailedPreconditionError(absl::StrCat(
        "FSDP PostBackward(", u, ") ('", unit.name,
        "'): its previous reduction is pending; call FinishBackward first"));
  }
  // The padded flat gradient of the whole unit, each shard's block followed
  // by the unit's tag (ReductionTag): the reductions sum it with the peers'
  // and FinishBackward checks that every rank reduced this same unit.
  const size_t block = unit.shard_len + 1;
  const size_t total = block * st.shard.size;
  if (st.order_error.empty() && st.last_backward.has_value() &&
      u >= *st.last_backward) {
    st.order_error =
        absl::StrCat("FSDP PostBackward(", u, ") ('", unit.name,
                     "') after PostBackward(", *st.last_backward,
                     ") on this rank: the hooks run backward in reverse "
                     "registration order (units ",
                     st.units.size() - 1, " down to 0)");
  }
  st.last_backward = u;
  const double tag = st.ReductionTag(u);
  if (st.bf16()) {
    unit.rs_bf16.assign(total, BFloat16(0.0f));
    for (size_t b = 0; b < static_cast<size_t>(st.shard.size); ++b) {
      unit.rs_bf16[b * block + unit.shard_len] = ToBf16(tag);
    }
  } else {
    unit.rs_f64.assign(total, 0.0);
    for (size_t b = 0; b < static_cast<size_t>(st.shard.size); ++b) {
      unit.rs_f64[b * block + unit.shard_len] = tag;
    }
  }
  size_t flat = 0;
  for (size_t k = 0; k < unit.params.size(); ++k) {
    const Matrix& g = unit.params[k]->grad;
    if (g.rows() != unit.shapes[k].first || g.cols() != unit.shapes[k].second) {
      return absl::InvalidArgumentError(absl::StrCat(
          "FSDP PostBackward(", u, "): gradient of '", unit.params[k]->name,
          "' is ", g.rows(), "x", g.cols(), "; expected ", unit.shapes[k].first,
          "x", unit.shapes[k].second));
    }
    for (int64_t j = 0; j < g.size(); ++j, ++flat) {
      const size_t at = flat / unit.shard_len * block + flat % unit.shard_len;
      if (st.bf16()) {
        unit.rs_bf16[at] = ToBf16(g.data()[j]);
      } else {
        unit.rs_f64[at] = g.data()[j];
      }
    }
  }
  if (st.keeps_parameters()) {
    for (Parameter* p : unit.params) p->ZeroGrad();
  } else {
    st.Free(u);
  }
  unit.reducing = true;
  st.pending.push_back(u);
  if (st.shard.size == 1) {
    // The reduce_scatter of a group of one is the identity.
    unit.rs_out_f64 = std::move(unit.rs_f64);
    unit.rs_out_bf16 = std::move(unit.rs_bf16);
  } else {
    Communicator::WorkOr w;
    if (st.bf16()) {
      unit.rs_out_bf16.resize(block);
      w = st.shard.comm->ireduce_scatter(unit.rs_bf16.data(),
                                         unit.rs_out_bf16.data(), block,
                                         DataType::kBFloat16, ReduceOp::kSum);
    } else {
      unit.rs_out_f64.resize(block);
      w = st.shard.comm->ireduce_scatter(unit.rs_f64.data(),
                                         unit.rs_out_f64.data(), block,
                                         DataType::kFloat64, ReduceOp::kSum);
    }
    if (!w.ok()) return st.Abandon(u, w.status());
    unit.rs_work = *std::move(w);
    ++st.counters.reduce_scatters;
    st.counters.bytes_sent +=
        static_cast<int64_t>((st.shard.size - 1) * unit.shard_len * st.elt());
  }
  st.Progress();
  return absl::OkStatus();
}

absl::Status FullyShardedDataParallel::FinishBackward() {
  State& st = *state_;
  st.PruneAbandoned();
  // The replicate group as it is now (it may have changed size since the
  // last step: a ReconfigurableCommunicator); read once, so every unit of
  // this step is averaged alike.
  const int replicas = st.replicate.CurrentSize();
  // Reduce-scatters in issue order; each shard's all_reduce over the
  // replicate group starts as soon as its reduce_scatter is done.
  for (size_t u : st.pending) {
    State::Unit& unit = st.units[u];
    if (unit.rs_work != nullptr) {
      absl::Status s = unit.rs_work->wait(st.Deadline(st.shard));
      if (!s.ok()) return st.Abandon(u, s);
      unit.rs_work.reset();
    }
    std::vector<double>().swap(unit.rs_f64);
    std::vector<BFloat16>().swap(unit.rs_bf16);
    if (replicas == 1) continue;
    Communicator::WorkOr w =
        st.bf16() ? st.replicate.comm->iall_reduce(
                        absl::MakeSpan(unit.rs_out_bf16), ReduceOp::kSum)
                  : st.replicate.comm->iall_reduce(
                        absl::MakeSpan(unit.rs_out_f64), ReduceOp::kSum);
    if (!w.ok()) return st.AbandonReplicate(w.status());
    unit.ar_work = *std::move(w);
    ++st.counters.all_reduces;
    // A ring all_reduce sends 2 (R - 1) / R of the buffer.
    st.counters.bytes_sent += static_cast<int64_t>(
        2 * (replicas - 1) * unit.shard_len * st.elt() / replicas);
  }
  // Every all_reduce first, so that a failed one leaves the gradient shards
  // as they were (the step can be redone after a recovery).
  for (size_t u : st.pending) {
    State::Unit& unit = st.units[u];
    if (unit.ar_work != nullptr) {
      absl::Status s = unit.ar_work->wait(st.Deadline(st.replicate));
      if (!s.ok()) return st.AbandonReplicate(s);
      unit.ar_work.reset();
    }
  }
  // Every rank of the data-parallel group reduced the same unit in each
  // reduction, in the order the hooks assume: the tags summed to the
  // expected value, the same on every rank, so every rank fails alike.
  const std::string order_error = std::move(st.order_error);
  st.order_error.clear();
  st.last_backward.reset();
  for (size_t u : st.pending) {
    const State::Unit& unit = st.units[u];
    const double got = st.bf16() ? FromBf16(unit.rs_out_bf16[unit.shard_len])
                                 : unit.rs_out_f64[unit.shard_len];
    const double want = st.ReductionTag(u) * st.shard.size * replicas;
    const double slack = st.bf16() ? 0.02 * want + 0.5 : 0.0;
    if (std::abs(got - want) <= slack && order_error.empty()) continue;
    for (size_t v : st.pending) {
      st.units[v].reducing = false;
      std::vector<double>().swap(st.units[v].rs_out_f64);
      std::vector<BFloat16>().swap(st.units[v].rs_out_bf16);
    }
    st.pending.clear();
    return absl::InvalidArgumentError(
        !order_error.empty()
            ? absl::StrCat(order_error,
                           "; every rank's reductions of this step are "
                           "dropped (ZeroGrad and redo the step)")
            : absl::StrCat(
                  "FSDP FinishBackward: the reduction of unit ", u, " ('",
                  unit.name,
                  "') was paired with another unit on some rank "
                  "(tag sum ",
                  got, ", expected ", want,
                  "): a rank ran its "
                  "backward hooks out of reverse registration order; every "
                  "rank's reductions of this step are dropped"));
  }
  const double scale = 1.0 / (st.shard.size * replicas);
  for (size_t u : st.pending) {
    State::Unit& unit = st.units[u];
    for (size_t i = 0; i < unit.shard_len; ++i) {
      const double sum =
          st.bf16() ? FromBf16(unit.rs_out_bf16[i]) : unit.rs_out_f64[i];
      unit.grad_shard[i] += sum * scale;
    }
    std::vector<double>().swap(unit.rs_out_f64);
    std::vector<BFloat16>().swap(unit.rs_out_bf16);
    unit.reducing = false;
  }
  st.pending.clear();
  return absl::OkStatus();
}

absl::Status FullyShardedDataParallel::Step(const ShardStepFn& step) {
  State& st = *state_;
  if (!st.pending.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("FSDP Step: ", st.pending.size(),
                     " gradient reductions are pending; call FinishBackward "
                     "first"));
  }
  for (size_t u = 0; u < st.units.size(); ++u) {
    State::Unit& unit = st.units[u];
    if (unit.phase == Phase::kGathering) {
      // A prefetch nobody used: let it land before the shard changes.
      VEMESH_RETURN_IF_ERROR(st.FinishGather(u));
    }
    VEMESH_RETURN_IF_ERROR(step(
        u,
        absl::MakeSpan(unit.shard.data() + unit.valid_begin, unit.valid_count),
        absl::MakeConstSpan(unit.grad_shard.data() + unit.valid_begin,
                            unit.valid_count)));
  }
  // What is materialised is stale now: a group of one copies the new
  // values, larger groups gather again when the unit next runs.
  for (size_t u = 0; u < st.units.size(); ++u) {
    if (st.units[u].phase != Phase::kGathered) continue;
    if (st.keeps_parameters() && st.shard.size == 1) {
      st.units[u].phase = Phase::kSharded;
      VEMESH_RETURN_IF_ERROR(st.FinishGather(u));  // a copy: no collective
    } else {
      st.Free(u);
    }
  }
  return absl::OkStatus();
}

absl::Status FullyShardedDataParallel::SgdStep(double learning_rate) {
  return Step([learning_rate](size_t, absl::Span<double> v,
                              absl::Span<const double> g) {
    for (size_t i = 0; i < v.size(); ++i) v[i] -= learning_rate * g[i];
    return absl::OkStatus();
  });
}

absl::Status FullyShardedDataParallel::SetOptimizer(
    const OptimizerOptions& options) {
  std::vector<std::unique_ptr<FlatOptimizer>> made;
  for (const State::Unit& unit : state_->units) {
    VEMESH_ASSIGN_OR_RETURN(std::unique_ptr<FlatOptimizer> opt,
                            MakeFlatOptimizer(options, unit.valid_count));
    made.push_back(std::move(opt));
  }
  state_->optimizers = std::move(made);
  return absl::OkStatus();
}

FlatOptimizer* FullyShardedDataParallel::optimizer(size_t u) {
  if (u >= state_->optimizers.size()) return nullptr;
  return state_->optimizers[u].get();
}

absl::Status FullyShardedDataParallel::OptimizerStep() {
  if (state_->optimizers.empty()) {
    return absl::FailedPreconditionError(
        "FSDP OptimizerStep: no optimizer; call SetOptimizer first");
  }
  return Step(
      [this](size_t u, absl::Span<double> v, absl::Span<const double> g) {
        return state_->optimizers[u]->Step(v, g);
      });
}

void FullyShardedDataParallel::ZeroGrad() {
  for (State::Unit& unit : state_->units) {
    std::fill(unit.grad_shard.begin(), unit.grad_shard.end(), 0.0);
  }
}

absl::StatusOr<std::vector<Matrix>> FullyShardedDataParallel::FullParameters(
    size_t u) {
  VEMESH_RETURN_IF_ERROR(state_->CheckUnit(u, "FullParameters"));
  State& st = *state_;
  const State::Unit& unit = st.units[u];
  std::vector<double> flat(unit.shard_len * st.shard.size);
  if (st.shard.size == 1) {
    flat = unit.shard;
  } else {
    VEMESH_RETURN_IF_ERROR(st.shard.comm->all_gather(
        absl::MakeConstSpan(unit.shard), absl::MakeSpan(flat)));
  }
  std::vector<Matrix> out;
  size_t at = 0;
  for (const auto& [rows, cols] : unit.shapes) {
    Matrix m(rows, cols);
    std::copy_n(flat.data() + at, m.size(), m.data());
    at += static_cast<size_t>(m.size());
    out.push_back(std::move(m));
  }
  return out;
}

absl::Span<const double> FullyShardedDataParallel::local_shard(size_t u) const {
  const State::Unit& unit = state_->units.at(u);
  return absl::MakeConstSpan(unit.shard.data() + unit.valid_begin,
                             unit.valid_count);
}

absl::Span<double> FullyShardedDataParallel::mutable_local_shard(size_t u) {
  State::Unit& unit = state_->units.at(u);
  return absl::MakeSpan(unit.shard.data() + unit.valid_begin, unit.valid_count);
}

absl::Span<const double> FullyShardedDataParallel::local_grad_shard(
    size_t u) const {
  const State::Unit& unit = state_->units.at(u);
  return absl::MakeConstSpan(unit.grad_shard.data() + unit.valid_begin,
                             unit.valid_count);
}

FsdpMemory FullyShardedDataParallel::MemoryUsage() const {
  const State& st = *state_;
  FsdpMemory m;
  size_t largest = 0, all = 0;
  for (const State::Unit& unit : st.units) {
    m.parameter_shards += unit.shard.size() * sizeof(double);
    m.gradient_shards += unit.grad_shard.size() * sizeof(double);
    for (const Parameter* p : unit.params) {
      m.gathered += static_cast<size_t>(p->value.size() + p->grad.size()) *
                    sizeof(double);
    }
    largest = std::max(largest, 2 * unit.numel * sizeof(double));
    all += 2 * unit.numel * sizeof(double);
  }
  for (const auto& opt : st.optimizers) m.optimizer_state += opt->state_bytes();
  m.gathered_peak = st.frees_after_forward() ? largest : all;
  return m;
}

size_t FullyShardedDataParallel::num_units() const {
  return state_->units.size();
}
const std::string& FullyShardedDataParallel::unit_name(size_t u) const {
  return state_->units.at(u).name;
}
size_t FullyShardedDataParallel::unit_elements(size_t u) const {
  return state_->units.at(u).numel;
}
size_t FullyShardedDataParallel::shard_elements(size_t u) const {
  return state_->units.at(u).shard_len;
}
int FullyShardedDataParallel::shard_size() const { return state_->shard.size; }
int FullyShardedDataParallel::shard_rank() const { return state_->shard.rank; }
int FullyShardedDataParallel::replicate_size() const {
  return state_->replicate.CurrentSize();
}
int FullyShardedDataParallel::replicate_rank() const {
  return state_->replicate.CurrentRank();
}
const FullyShardedDataParallel::Counters& FullyShardedDataParallel::counters()
    const {
  return state_->counters;
}
const FsdpOptions& FullyShardedDataParallel::options() const {
  return state_->options;
}

}  // namespace vemesh::strategies
