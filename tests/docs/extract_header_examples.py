#!/usr/bin/env python3
"""Compiles the usage examples of vemesh's public headers from the headers.

  python3 tests/docs/extract_header_examples.py SOURCE_DIR OUTPUT.cc [--skip DIR]...
  python3 tests/docs/extract_header_examples.py SOURCE_DIR --list

--skip leaves out the headers under vemesh/DIR/ (a folder this build does
not compile: strategies without Eigen, comm/mpi and bootstrap/mpi with
VEMESH_WITH_MPI=OFF).

Every public header (vemesh/**/*.h outside internal/) opens with a comment
whose indented lines (`//   `) hold a usage example. This script reads that
block from the header itself and writes one function per header into
OUTPUT.cc: the header is included, the example's lines are the function's
body, and what the example uses without declaring it (a communicator, a
store, the caller's own functions) comes from the header's entry in
EXAMPLES below: `params` (the function's parameters), `pre` (statements
before the example), `helpers` (declarations before the function), `subs`
(text replacements for the example's pseudo-code, such as `= ...;`). The
functions return absl::Status (OK at their end). Each is compiled; most
need a job of several ranks and are never called, and the ones marked
`execute` are run by a test, which also checks the values their comments
promise (`checks`, with PROMISE(condition)). A header whose example block
is prose, a table or pseudo-code is in
EXEMPT with the reason.

The example is the header's first run of `//   ` lines (blank `//` lines
inside it included; a prose line ends it), or the run `run` names.
tests/docs/CMakeLists.txt runs this at build time; a header whose example
stops compiling fails the build of header_examples_test.
"""

import pathlib
import re
import sys

# The caller's model, for the strategies' examples.
MODEL = ("struct Model {\n"
         "  std::vector<Parameter*> parameters() { return {}; }\n"
         "};\n"
         "struct Layer {\n"
         "  Parameter weight;\n"
         "};\n")

# What each example needs around it. Keys are paths under vemesh/.
#   params  the function's parameters (what the example uses undeclared)
#   pre     statements before the example
#   helpers code at namespace scope before the function (the caller's own
#           functions the example calls, defined: the test links)
#   subs    (old, new) replacements in the example text, applied in order
#   run     which run of `//   ` lines is the example (default 0)
#   runs    several runs, one after the other
#   blocks  each run in a { } block of its own (they declare the same names)
#   start   the example starts at the run's first line that starts so (a
#           table before it, with no prose between, is left out)
#   execute the example needs no other rank and no parameter: a test
#           (HeaderExamples.<path>) runs it and expects OK
#   checks  statements after the example that return an error unless the
#           values its comments promise hold (run by `execute`)
#   top     the example is namespace-scope code (a function of its own)
# Every line that is only `... words ...` (the example's "and so on") is
# left out.
EXAMPLES = {
    "base/fnv1a.h": {"params": "uint64_t rows"},
    "base/json_depth.h": {
        "params": "absl::string_view text",
        "subs": [("InvalidArgumentError(...)",
                  'absl::InvalidArgumentError("too deep")')]},
    "base/log.h": {
        "helpers": ("enum LoggerLevel { WARN, INFO };\n"
                    "struct Logger {\n"
                    "  void log(LoggerLevel, absl::string_view) {}\n"
                    "};\n"
                    "inline Logger my_logger;\n"),
    },
    "base/status_codes.h": {
        "params": "std::shared_ptr<Communicator> comm, std::vector<float> grad"},
    "base/status_macros.h": {
        "top": True,
        "helpers": ("absl::Status Connect() { return absl::OkStatus(); }\n"
                    "absl::StatusOr<DeviceMesh> Build() {\n"
                    "  return absl::UnimplementedError(\"the caller's\");\n"
                    "}\n"),
        "includes": ["vemesh/mesh/device_mesh.h"],
        "subs": [("  ...\n}", "  return absl::OkStatus();\n}")]},
    "bootstrap/agreement.h": {
        "params": "Bootstrap& boot, absl::Time deadline"},
    "bootstrap/bootstrap.h": {"start": "absl::StatusOr"},
    "bootstrap/bootstrap_over.h": {
        "params": "std::shared_ptr<Communicator> world",
        "subs": [("= ...;", "= world;")]},
    "bootstrap/init_timeout.h": {
        "start": "absl::StatusOr", "execute": True, "includes": ["cstdlib"],
        "pre": "unsetenv(\"VEMESH_INIT_TIMEOUT\");  // the default\n",
        "checks": "PROMISE(*t == absl::Seconds(60));\n"},
    "bootstrap/launch.h": {"run": 1},
    "bootstrap/launch_session.h": {
        "run": 1, "top": True,
        "includes": ["cstdio", "vemesh/registry/ve_device_mesh.h"],
        "subs": [("int main(", "int ExampleMain("),
                 ('  ... VESCALE_DEVICE_MESH.init_device_mesh("cpu", {2, 2, 2}) ...',
                  '  (void)VESCALE_DEVICE_MESH.init_device_mesh("cpu", {2, 2, 2});'),
                 ("MPI\n}", "MPI\n  return 0;\n}")]},
    "bootstrap/mpi/mpi_bootstrap.h": {},
    "bootstrap/rank0_store.h": {
        "start": "Rank0StoreSpec spec;",
        "includes": ["vemesh/bootstrap/launch.h", "vemesh/rendezvous/tcp/tcp_store_server.h"],
        "params": ("const LaunchInfo& info, absl::Time deadline, "
                   "std::unique_ptr<TcpStoreServer>& kept_server")},
    "bootstrap/store_bootstrap.h": {
        "params": "std::shared_ptr<Store> shared, int rank, int size",
        "subs": [("= ...;", "= shared;")]},
    "checkpoint/async_saver.h": {
        "helpers": "void Train(int64_t step) {}\n",
        "params": "std::shared_ptr<Communicator> world, const StateDict& state"},
    "checkpoint/box.h": {
        "execute": True,
        "checks": ("PROMISE(BoxNumel(rows) == 64);\n"
                   "PROMISE(boxes.size() == 3u);\n"
                   "PROMISE(boxes[0] == (Box{{0, 10}, {1, 6}}));\n"
                   "PROMISE(boxes[1] == (Box{{1, 0}, {1, 16}}));\n"
                   "PROMISE(boxes[2] == (Box{{2, 0}, {1, 8}}));\n")},
    "checkpoint/checkpoint.h": {
        "params": ("std::shared_ptr<Communicator> world, "
                   "std::shared_ptr<Communicator> world2, int64_t rank, "
                   "float* rows, float* cols"),
    },
    "checkpoint/dtype.h": {
        "execute": True,
        "checks": ("PROMISE(DTypeName(t) == \"F32\");\n"
                   "PROMISE(DTypeSize(t) == 4u);\n"
                   "PROMISE(back.ok() && *back == DType::kBF16);\n")},
    "checkpoint/manifest.h": {
        "start": "absl::StatusOr", "execute": True,
        "pre": "Manifest made;\nmade.step = 100;\nconst std::string text = ManifestToJson(made);\n",
        "checks": ("PROMISE(m.ok() && m->step == 100);\n"
                   "PROMISE(ParseManifest(again, \"again\")->step == 100);\n")},
    "checkpoint/export.h": {},
    "checkpoint/inspect.h": {"includes": ["sstream"]},
    "checkpoint/safetensors.h": {"params": "const std::string& path"},
    "checkpoint/state_dict.h": {
        "execute": True,
        "checks": "PROMISE(s.ok());\nPROMISE(state.pieces().size() == 1u);\n"},
    "comm/backend.h": {
        "includes": ["vemesh/mesh/mesh_options.h"],
        "params": "const MeshOptions& options",
        "subs": [("if (b == Backend::kNccl) ...;", "if (b == Backend::kNccl) {}")]},
    "comm/buffer.h": {"params": "std::shared_ptr<Communicator> comm"},
    "comm/agreement.h": {
        "params": "std::shared_ptr<Communicator> dp, std::string step_text"},
    "comm/communicator.h": {
        "includes": ["vemesh/registry/ve_device_mesh.h"],
        "params": ("std::shared_ptr<Communicator> mesh_tp, "
                   "std::shared_ptr<Communicator> dp, "
                   "std::shared_ptr<Communicator> pp, std::vector<float> bucket, "
                   "std::vector<float> act"),
        "subs": [("= ...;", "= mesh_tp;")]},
    "comm/data_type.h": {
        "execute": True,
        "checks": ("PROMISE(bytes == 4096);\nPROMISE(name == \"int8\");\n"
                   "PROMISE(!avg_ok);\nPROMISE(op == \"avg\");\n")},
    "comm/gloo/gloo_communicator.h": {
        "params": ("std::shared_ptr<Store> shared, int rank, int size, "
                   "std::vector<int> global_ranks"),
        "subs": [("= ...;", "= shared;")]},
    "comm/half.h": {"params": "std::shared_ptr<Communicator> comm, size_t n"},
    "comm/mpi/mpi_communicator.h": {"params": "int rank"},
    "comm/mpi/mpi_environment.h": {
        "run": 1, "top": True,
        "includes": ["vemesh/mesh/device_mesh.h"],
        "subs": [("int main(", "int ExampleMain("),
                 ('  ... init_device_mesh("cpu", {2, 2, 2}) ...',
                  '  (void)init_device_mesh("cpu", {2, 2, 2});'),
                 ("}   // MPI_Finalize", "  return 0;\n}   // MPI_Finalize")]},
    "comm/mpi/mpi_request.h": {"params": "MPI_Comm comm, absl::Time deadline"},
    "comm/nccl/cuda_device.h": {"start": "DeviceChoiceInput in;"},
    "comm/nccl/nccl_communicator.h": {
        "params": ("std::shared_ptr<Communicator> world, int local_rank, "
                   "float* device_buffer, size_t n"),
        "subs": [("host_world = ...;", "host_world = world;"),
                 ("grad = ...;", "grad = device_buffer;")]},
    "comm/nccl_options.h": {
        "includes": ["vemesh/mesh/device_mesh.h"],
        "params": "const MeshLayout& layout"},
    # The old home of NcclOptions, forwarding to comm/nccl_options.h.
    "comm/nccl/nccl_options.h": {},
    "comm/operation.h": {
        "params": ("std::shared_ptr<Communicator> comm, std::vector<float> grad, "
                   "std::vector<float> out, std::vector<float> in, "
                   "int next, int prev")},
    "comm/reconfigurable_communicator.h": {
        "params": ("std::shared_ptr<Communicator> epoch_group, "
                   "std::vector<int> epoch_ranks, "
                   "std::shared_ptr<Communicator> smaller_group, "
                   "std::vector<int> smaller_ranks, std::vector<float> grad")},
    "comm/work.h": {
        "params": "std::shared_ptr<Communicator> dp, std::vector<float> bucket",
    },
    "comm/forwarded_work.h": {
        "includes": ["vemesh/comm/operation.h"],
        "params": ("std::shared_ptr<Communicator> wrapper, "
                   "std::shared_ptr<Communicator> inner, const Operation& op")},
    "elastic/elastic_mesh.h": {
        "includes": ["vemesh/registry/ve_device_mesh.h", "cstdio"],
        "helpers": ("absl::Status TrainStep(int64_t step) { return absl::OkStatus(); }\n"
                    "void RestoreStartOfStep() {}\n"
                    "ReplicaState::StateDictFn SaveStep(int64_t* step) { return {}; }\n"
                    "ReplicaState::LoadStateDictFn LoadStep(int64_t* step) { return {}; }\n"
                    "ReplicaState::StateDictFn SaveModel() { return {}; }\n"
                    "ReplicaState::LoadStateDictFn LoadModel() { return {}; }\n"),
        "params": "int k, int64_t steps",
        "pragma_missing_field_initializers": True},
    "elastic/epoch_communicator.h": {
        "includes": ["vemesh/registry/ve_device_mesh.h"],
        "params": "std::vector<float> grad",
        "subs": [("dp->all_reduce(...);",
                  "dp->all_reduce(absl::MakeSpan(grad), ReduceOp::kSum);")]},
    "elastic/replica_state.h": {
        "runs": [0, 1], "execute": True, "checks": "PROMISE(s.ok() && f.ok());\n"},
    "layout/device_type.h": {
        "start": "ParseDeviceType(", "execute": True,
        "checks": ("PROMISE(ParseDeviceType(\"cuda\")->type == DeviceType::kCuda);\n"
                   "PROMISE(ParseDeviceType(\"cuda:1\")->index == 1);\n"
                   "PROMISE(absl::IsInvalidArgument(ParseDeviceType(\"tpu\").status()));\n")},
    "layout/fast_divider.h": {
        "execute": True, "checks": "PROMISE(by_8.quotient(45) == 5);\n"},
    "layout/mesh_layout.h": {
        "execute": True,
        "checks": ("PROMISE(layout.ok());\n"
                   "PROMISE(*layout->coordinate_of(5) == (Coordinate{1, 0, 1}));\n"
                   "PROMISE(*layout->rank_at({1, 0, 1}) == 5);\n"
                   "PROMISE(layout->submesh({\"TP\"}, 5)->ranks() ==\n"
                   "      (std::vector<int64_t>{4, 5}));\n"
                   "PROMISE(*layout->groups({\"DP\"}) ==\n"
                   "      (std::vector<std::vector<int64_t>>{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));\n"
                   "PROMISE(layout->group_members(1, 3) == (std::vector<int64_t>{5, 7}));\n"
                   "PROMISE(*layout->find_role(\"tp\") == 2);\n"
                   "PROMISE(*layout->neighbor(\"PP\", 5, -1) == std::optional<int64_t>(1));\n"
                   "PROMISE(layout->flatten({\"DP\", \"TP\"}, \"DPTP\").ok());\n")},
    "layout/mesh_spec.h": {
        "execute": True,
        "checks": ("PROMISE(spec->shape == (std::vector<int64_t>{2, 2, 2}));\n"
                   "PROMISE(spec->names == (std::vector<std::string>{\"PP\", \"DP\", \"TP\"}));\n")},
    "mesh/device_mesh.h": {},
    "mesh/mesh_options.h": {
        "params": "const absl::StatusOr<MeshLayout>& layout"},
    "placement/host_locality.h": {"params": "const MeshLayout& layout"},
    "placement/host_map.h": {
        "execute": True,
        "checks": ("PROMISE(block.host_of(5) == 1);\n"
                   "PROMISE(cyclic.host_of(5) == 1 && cyclic.local_of(5) == 2);\n"
                   "PROMISE(slots.host_of(5) == 1);\n")},
    "placement/placement.h": {
        "includes": ["vemesh/registry/ve_device_mesh.h"],
        "params": "const std::string& text"},
    "registry/ve_device_mesh.h": {"runs": [0, 1, 2, 3]},
    "rendezvous/memory_store.h": {
        "post": "t.join();\n", "execute": True,
        "checks": "PROMISE(*store->get(\"ready\") == \"1\");\n"},
    "rendezvous/prefix_store.h": {
        "pre": "auto store = std::make_shared<MemoryStore>();\n",
        "includes": ["vemesh/rendezvous/memory_store.h"], "execute": True,
        "checks": "PROMISE(*store->get(\"vemesh/init/3/host/0\") == \"node7\");\n"},
    "rendezvous/redis/redis_store.h": {"pragma_missing_field_initializers": True},
    "rendezvous/store.h": {
        "params": "std::shared_ptr<Store> shared",
        "subs": [("= ...;", "= shared;")]},
    "rendezvous/tcp/sha256.h": {"params": "const std::string& received"},
    "rendezvous/tcp/socket.h": {"params": "pollfd pfd, absl::Time deadline",
                                "includes": ["poll.h", "sys/socket.h"]},
    "rendezvous/tcp/tcp_store.h": {
        "params": ("const std::string& master_addr, int master_port, "
                   "const std::vector<std::string>& keys")},
    "rendezvous/tcp/tcp_store_server.h": {
        "includes": ["vemesh/rendezvous/tcp/tcp_store.h"],
        "subs": [("...                                            // clients:\n"
                  "TcpStore::Connect\n", "")]},
    "rendezvous/tcp/wire.h": {
        "run": 2,
        "helpers": "void handle(const StoreRequest& request) {}\n",
        "params": "int fd",
        "includes": ["unistd.h"]},
    "strategies/column_parallel_linear.h": {
        "start": "absl::StatusOr",
        "params": ("const Matrix& full_weight, const Matrix& full_bias, "
                   "const Matrix& x, const Matrix& dy")},
    "strategies/data_parallel.h": {
        "helpers": MODEL,
        "params": "Model& model, double lr, Layer& last",
        "runs": [0, 1],
        "subs": [("absl::StatusOr<BucketStats> st = dp.FinishGradientSync",
                  "st = dp.FinishGradientSync")]},
    "strategies/dense.h": {"params": "Eigen::Index batch, Eigen::Index features"},
    "strategies/distributed_optimizer.h": {
        "helpers": MODEL, "params": "Model& model",
        "pragma_missing_field_initializers": True},
    "strategies/expert_parallel.h": {
        "includes": ["vemesh/registry/ve_device_mesh.h"],
        "helpers": ("Matrix Weight(int expert) { return Matrix::Zero(4, 4); }\n"
                    "Matrix Bias(int expert) { return Matrix::Zero(1, 4); }\n"),
        "params": ("absl::Span<const int64_t> token_ids, const Matrix& x, "
                   "const Matrix& dy")},
    "strategies/expert_mesh.h": {
        "includes": ["vemesh/strategies/expert_parallel.h"],
        "params": "const std::function<ExpertInit(int)>& init",
        "subs": [("... forward, backward ...", "")]},
    "strategies/elastic_loop.h": {
        "includes": ["vemesh/registry/ve_device_mesh.h"],
        "helpers": "absl::StatusOr<double> TrainStep(int64_t step) { return 0.0; }\n",
        "params": ("FullyShardedDataParallel& fsdp, "
                   "std::vector<std::vector<Parameter*>> units, int launch_rank"),
        "pragma_missing_field_initializers": True},
    "strategies/elastic_verdict.h": {
        "includes": ["cstdio", "vector"],
        "params": ("ElasticMesh& el, TrainingState& state, "
                   "ElasticLoopHooks hooks, std::vector<double> serial_losses, "
                   "int launch_rank"),
        "pragma_missing_field_initializers": True},
    "strategies/loss_curve.h": {
        "includes": ["vector", "absl/strings/str_cat.h"],
        "params": "std::map<int64_t, double> losses, std::vector<double> serial"},
    "strategies/training_metadata.h": {
        "includes": ["vemesh/strategies/state_dict.h"],
        "params": ("TrainingState& state, int64_t step, int64_t steps, "
                   "const std::string& dir, Communicator& world")},
    "strategies/data_parallel_trainer.h": {
        "includes": ["vemesh/mesh/device_mesh.h"],
        "params": ("absl::StatusOr<DeviceMesh> mesh, Parameter& w0, Parameter& w1, "
                   "std::vector<ParameterPlacement> placements"),
        "pragma_missing_field_initializers": True},
    "strategies/elastic_state.h": {
        "params": ("ElasticMesh& el, FullyShardedDataParallel& fsdp, "
                   "std::vector<std::vector<Parameter*>> units")},
    "strategies/fully_sharded_data_parallel.h": {
        "includes": ["vemesh/mesh/device_mesh.h", "vemesh/strategies/linear.h"],
        "params": ("Linear& layer1, Linear& layer2, const Matrix& x, "
                   "const Matrix& a, const Matrix& dy, const Matrix& dh"),
        "pre": "absl::Status s;\nMatrix h, y, da;\n",
        "subs": [("Linear fc1(...), fc2(...);",
                  "Linear& fc1 = layer1;\nLinear& fc2 = layer2;")],
        "pragma_missing_field_initializers": True},
    "strategies/linear.h": {
        "params": ("const Matrix& weight, const Matrix& bias, const Matrix& x, "
                   "const Matrix& dy")},
    "strategies/optimizer.h": {
        "helpers": MODEL,
        "params": ("std::vector<double> shard, std::vector<double> grad_shard, "
                   "Model& model"),
        "runs": [0, 1], "blocks": True,
        "subs": [("s = opt->Step();", "absl::Status s = opt->Step();")]},
    "strategies/parameter.h": {
        "execute": True,
        "subs": [("w.grad += ...;", "w.grad += Matrix::Ones(16, 64);")]},
    "strategies/parameter_placement.h": {
        "execute": True,
        "checks": ("PROMISE(b.box == (checkpoint::Box{{0, 0}, {1, 10}}));\n"
                   "PROMISE(col.ok() && (*col)[0].box == "
                   "(checkpoint::Box{{0, 32}, {64, 32}}));\n"
                   "PROMISE(row.ok() && (*row)[0].box == "
                   "(checkpoint::Box{{32, 0}, {32, 64}}));\n"
                   "PROMISE(pieces.ok() && pieces->size() == 3u);\n"
                   "PROMISE((*pieces)[0].box == "
                   "(checkpoint::Box{{62, 48}, {1, 16}}));\n"
                   "PROMISE((*pieces)[2].placement == 1u && "
                   "(*pieces)[2].offset == 48);\n")},
    "strategies/periodic_checkpoint.h": {
        "helpers": "absl::Status TrainStep(int64_t step) { return absl::OkStatus(); }\n",
        "params": ("std::shared_ptr<Communicator> replica_world, "
                   "TrainingState& state, int64_t steps, int64_t dp_rank")},
    "strategies/pipeline_runner.h": {
        "params": "PipelineStageModel& stage_model",
        "pragma_missing_field_initializers": True},
    "strategies/pipeline_schedule.h": {
        "execute": True, "checks": "PROMISE(!ops.empty());\n"},
    "strategies/role_group.h": {
        "includes": ["vemesh/registry/ve_device_mesh.h"],
        "params": "std::vector<double> grad",
        "subs": [("tp->comm->all_reduce(...);",
                  "tp->comm->all_reduce(absl::MakeSpan(grad), ReduceOp::kSum);")]},
    "strategies/row_parallel_linear.h": {
        "start": "absl::StatusOr",
        "params": ("const Matrix& full_weight, const Matrix& full_bias, "
                   "const Matrix& x_t, const Matrix& dy"),
        "pragma_missing_field_initializers": True},
    "strategies/tensor_parallel_shard.h": {},
    "strategies/state_snapshot.h": {
        "includes": ["vemesh/elastic/elastic_mesh.h"],
        "helpers": "absl::Status TrainStep(int64_t step) { return absl::OkStatus(); }\n",
        "params": "TrainingState& state, ElasticMesh& el, int64_t step"},
    "strategies/state_dict.h": {
        "includes": ["vemesh/checkpoint/checkpoint.h"],
        "params": ("ColumnParallelLinear& fc0, RowParallelLinear& fc1, "
                   "Parameter& head, Optimizer& opt, DistributedOptimizer* zero, "
                   "std::vector<Parameter*> params, "
                   "std::vector<Parameter*> experts, "
                   "FullyShardedDataParallel& fsdp, int64_t step, "
                   "const std::string& dir, std::shared_ptr<Communicator> world")},
    "vemesh.h": {"subs": [('#include "vemesh/vemesh.h"\n', "")]},
}

# Headers whose example is not C++ to compile, and why.
EXEMPT = {
    "base/sigpipe.h": "the example calls hiredis's redisCommand on a Redis "
                      "context (hiredis is private to rendezvous)",
    "strategies/pipeline_stage_model.h": "the stage class's body is elided "
                                         "({ ... }): an outline, not code",
}

COMMON_INCLUDES = ["cstdint", "cstring", "memory", "optional", "span", "string",
                   "thread", "vector", "absl/status/status.h",
                   "absl/status/statusor.h", "absl/strings/string_view.h",
                   "absl/time/clock.h", "absl/time/time.h", "absl/types/span.h",
                   "vemesh/base/status_macros.h"]


def public_headers(source_dir):
  root = source_dir / "vemesh"
  return sorted(p.relative_to(root).as_posix() for p in root.rglob("*.h")
                if "internal" not in p.relative_to(root).parts)


def example_runs(text):
  """The runs of `//   ` lines of the header's opening comment."""
  runs, current = [], None
  for line in text.splitlines():
    if not line.startswith("//"):
      break
    if line.startswith("//   "):
      if current is None:
        current = []
        runs.append(current)
      current.append(line[5:])
    elif line.strip() == "//":
      if current is not None:
        current.append("")
    else:
      current = None
  return ["\n".join(run).strip("\n") + "\n" for run in runs]


def namespace_of(text):
  for match in re.finditer(r"^namespace (vemesh[a-z_:]*) \{", text, re.M):
    if "internal" not in match.group(1):
      return match.group(1)
  return "vemesh"


def include_line(name):
  if name.startswith(("vemesh/", "absl/", "gtest/")):
    return f'#include "{name}"'
  return f"#include <{name}>"


def generate(source_dir, skip=()):
  headers = [h for h in public_headers(source_dir)
             if not any(h.startswith(d.rstrip("/") + "/") for d in skip)]
  unknown = [h for h in headers if h not in EXAMPLES and h not in EXEMPT]
  stale = [h for h in list(EXAMPLES) + list(EXEMPT)
           if h not in headers and h not in public_headers(source_dir)]
  includes = set(COMMON_INCLUDES)
  bodies = []
  for header in headers:
    if header not in EXAMPLES:
      continue
    config = EXAMPLES[header]
    text = (source_dir / "vemesh" / header).read_text()
    runs = example_runs(text)
    indexes = config.get("runs", [config.get("run", 0)])
    if max(indexes) >= len(runs):
      unknown.append(f"{header} (no example run {max(indexes)})")
      continue
    chosen = [runs[i] for i in indexes]
    if "start" in config:
      lines = chosen[0].split("\n")
      first = [i for i, line in enumerate(lines) if line.startswith(config["start"])]
      if not first:
        stale.append(f"{header}: no example line starts with {config['start']!r}")
        continue
      chosen[0] = "\n".join(lines[first[0]:])
    # Several runs: one after the other, or each in a block of its own when
    # they declare the same names.
    if config.get("blocks"):
      chosen = ["{\n" + "\n".join("  " + line for line in run.rstrip("\n").split("\n"))
                + "\n}\n" for run in chosen]
    example = "\n".join(chosen)
    for old, new in config.get("subs", []):
      if old not in example:
        stale.append(f"{header}: substitution {old!r} no longer matches")
      example = example.replace(old, new)
    example = "\n".join(line for line in example.split("\n")
                        if not re.fullmatch(r"\s*\.\.\.(.*\.\.\.)?\s*", line))
    includes.add(f"vemesh/{header}")
    includes.update(config.get("includes", []))
    name = re.sub(r"[^A-Za-z0-9]", "_", header[:-2])
    out = [f"// vemesh/{header}"]
    out.append(f"namespace {namespace_of(text)}::header_example_{name} {{")
    if config.get("helpers"):
      out.append(config["helpers"].rstrip("\n"))
    if config.get("pragma_missing_field_initializers"):
      out.append("#pragma GCC diagnostic push")
      out.append('#pragma GCC diagnostic ignored "-Wmissing-field-initializers"')
    if config.get("top"):
      out.append(example.rstrip("\n"))
    else:
      out.append(f"absl::Status Example({config.get('params', '')}) {{")
      body = (config.get("pre", "") + example + config.get("post", "")
              + config.get("checks", ""))
      out.extend(("  " + line).rstrip() for line in body.rstrip("\n").split("\n"))
      out.append("  return absl::OkStatus();")
      out.append("}")
    if config.get("pragma_missing_field_initializers"):
      out.append("#pragma GCC diagnostic pop")
    out.append(f"}}  // namespace {namespace_of(text)}::header_example_{name}")
    if config.get("execute"):
      if config.get("params") or config.get("top"):
        stale.append(f"{header}: execute needs an example with no params")
      out.append(f"TEST(HeaderExamples, {name}) {{")
      out.append(f"  absl::Status s = {namespace_of(text)}::header_example_{name}::Example();")
      out.append("  EXPECT_TRUE(s.ok()) << s;")
      out.append("}")
    bodies.append("\n".join(out) + "\n")
  head = ["// Generated by tests/docs/extract_header_examples.py from the",
          "// usage examples of vemesh's public headers: do not edit. Each is",
          "// compiled; the ones that need no other rank are also run",
          "// (HeaderExamples.*), with the values their comments promise checked.",
          ""]
  includes.add("gtest/gtest.h")
  head += [include_line(i) for i in sorted(includes, key=lambda i: (i.startswith(("vemesh/", "absl/", "gtest/")), i))]
  head += ["",
           "// What `checks` use: an error naming the promise that does not hold.",
           "#define PROMISE(condition) \\",
           "  if (!(condition))        \\",
           "  return absl::InternalError(\"the example's comment promises \" #condition)"]
  return "\n".join(head) + "\n\n" + "\n".join(bodies), unknown, stale


def main(argv):
  if len(argv) < 3 or len(argv) % 2 == 0 or any(a != "--skip" for a in argv[3::2]):
    print(__doc__)
    return 2
  source_dir = pathlib.Path(argv[1]).resolve()
  if argv[2] == "--list":
    for header in public_headers(source_dir):
      state = "compiled" if header in EXAMPLES else f"exempt: {EXEMPT.get(header, 'NOT LISTED')}"
      print(f"vemesh/{header}: {state}")
    return 0
  code, unknown, stale = generate(source_dir, argv[4::2])
  problems = [f"{h}: a public header with no entry in EXAMPLES or EXEMPT "
              "(tests/docs/extract_header_examples.py)" for h in unknown]
  problems += [f"{s}: stale entry (tests/docs/extract_header_examples.py)"
               for s in stale]
  if problems:
    for problem in problems:
      print(f"extract_header_examples: {problem}", file=sys.stderr)
    return 1
  output = pathlib.Path(argv[2])
  if not output.exists() or output.read_text() != code:
    output.write_text(code)
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv))
