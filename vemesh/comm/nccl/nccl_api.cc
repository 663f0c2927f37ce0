#include "vemesh/comm/nccl/internal/nccl_api.h"

#include <dlfcn.h>

#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace vemesh {
namespace {

// What an entry the loader could not bind answers: an error of its own
// kind, never a call through a null pointer.
template <typename R>
R Failure();
template <>
ncclResult_t Failure<ncclResult_t>() {
  return ncclSystemError;
}
template <>
cudaError_t Failure<cudaError_t>() {
  return cudaErrorSharedObjectInitFailed;
}
template <>
const char* Failure<const char*>() {
  return "vemesh could not load libnccl or libcudart (see LoadNccl())";
}

// What an optional entry the library lacks answers (ncclCommShrink before
// NCCL 2.27): a usage error the caller can fall back from.
template <typename F>
struct Missing;
template <typename... Args>
struct Missing<ncclResult_t (*)(Args...)> {
  static ncclResult_t Call(Args...) { return ncclInvalidUsage; }
};

template <typename F>
struct Unbound;
template <typename R, typename... Args>
struct Unbound<R (*)(Args...)> {
  static R Call(Args...) { return Failure<R>(); }
};

// One library to load: its default names (tried in order) and the variable
// that replaces them with one path.
struct Library {
  Library(std::string what, const char* variable,
          std::vector<std::string> names, std::string remedy)
      : what(std::move(what)),
        variable(variable),
        names(std::move(names)),
        remedy(std::move(remedy)) {}

  std::string what;      // "NCCL", "the CUDA runtime"
  const char* variable;  // VEMESH_NCCL_LIBRARY
  std::vector<std::string> names;
  std::string remedy;  // what to do when it is missing
  void* handle = nullptr;
  std::string loaded;  // the name that loaded
  bool overridden = false;
  std::vector<std::string> errors;

  void Open() {
    const char* path = std::getenv(variable);
    if (path != nullptr && *path != '\0') {
      names = {path};
      overridden = true;
    }
    for (const std::string& name : names) {
      // Never closed: the backend's handles live as long as the process.
      handle = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (handle != nullptr) {
        loaded = name;
        return;
      }
      const char* why = dlerror();
      errors.push_back(absl::StrCat("dlopen(\"", name, "\") failed: ",
                                    why != nullptr ? why : "unknown error"));
    }
  }

  // Binds `*entry` to `symbol`, or to its Unbound stand-in.
  template <typename F>
  void Bind(const char* symbol, F* entry) {
    *entry = &Unbound<F>::Call;
    if (handle == nullptr) return;
    dlerror();  // clear an old error
    void* address = dlsym(handle, symbol);
    if (address == nullptr) {
      const char* why = dlerror();
      errors.push_back(absl::StrCat(loaded, " has no symbol ", symbol, ": ",
                                    why != nullptr ? why : "null address"));
      return;
    }
    *entry = reinterpret_cast<F>(address);
  }

  // Binds `*entry` to `symbol` when the library has it; its absence is no
  // error (an entry of a newer NCCL than the one loaded).
  template <typename F>
  void BindOptional(const char* symbol, F* entry) {
    *entry = &Missing<F>::Call;
    if (handle == nullptr) return;
    dlerror();
    void* address = dlsym(handle, symbol);
    if (address != nullptr) *entry = reinterpret_cast<F>(address);
  }

  // Every name tried with dlerror()'s text, and the remedy; empty when the
  // library and all its symbols were found.
  std::string Reason() const {
    if (errors.empty()) return "";
    return absl::StrCat("the NCCL backend could not load ", what, " (",
                        variable, overridden ? " is set" : " is not set",
                        "): ", absl::StrJoin(errors, "; "), ". ", remedy);
  }
};

struct RealTable {
  NcclApi table;
  absl::Status status;
};

// The name a header gives an entry, after its macros (CUDA renames some
// functions, e.g. cudaMemset to cudaMemset_ptds under per-thread streams).
#define VEMESH_SYMBOL_NAME(name) #name
#define VEMESH_SYMBOL(name) VEMESH_SYMBOL_NAME(name)
#define VEMESH_BIND(library, entry) \
  library.Bind(VEMESH_SYMBOL(entry), &out.table.entry)

RealTable LoadReal() {
  RealTable out;
  Library nccl{
      "NCCL",
      "VEMESH_NCCL_LIBRARY",
      {absl::StrCat("libnccl.so.", NCCL_MAJOR)},
      "Install NCCL 2.18 or newer where the loader finds it (ldconfig, "
      "LD_LIBRARY_PATH), or set VEMESH_NCCL_LIBRARY to the path of its "
      "libnccl.so.2."};
  Library cudart{
      "the CUDA runtime",
      "VEMESH_CUDART_LIBRARY",
      {absl::StrCat("libcudart.so.", CUDART_VERSION / 1000), "libcudart.so"},
      absl::StrCat("Install the CUDA ", CUDART_VERSION / 1000,
                   " runtime where the loader finds it (ldconfig, "
                   "LD_LIBRARY_PATH), or set VEMESH_CUDART_LIBRARY to the "
                   "path of its libcudart.so.",
                   CUDART_VERSION / 1000, ".")};
  cudart.Open();
  nccl.Open();
  VEMESH_BIND(nccl, ncclGetVersion);
  VEMESH_BIND(nccl, ncclGetUniqueId);
  VEMESH_BIND(nccl, ncclCommInitRankConfig);
  VEMESH_BIND(nccl, ncclCommSplit);
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 27, 0)
  nccl.BindOptional("ncclCommShrink", &out.table.ncclCommShrink);
#else
  out.table.ncclCommShrink = &Missing<decltype(out.table.ncclCommShrink)>::Call;
#endif
  VEMESH_BIND(nccl, ncclCommGetAsyncError);
  VEMESH_BIND(nccl, ncclCommAbort);
  VEMESH_BIND(nccl, ncclCommDestroy);
  VEMESH_BIND(nccl, ncclGetErrorString);
  VEMESH_BIND(nccl, ncclGetLastError);
  VEMESH_BIND(nccl, ncclGroupStart);
  VEMESH_BIND(nccl, ncclGroupEnd);
  VEMESH_BIND(nccl, ncclAllReduce);
  VEMESH_BIND(nccl, ncclBroadcast);
  VEMESH_BIND(nccl, ncclReduce);
  VEMESH_BIND(nccl, ncclAllGather);
  VEMESH_BIND(nccl, ncclReduceScatter);
  VEMESH_BIND(nccl, ncclSend);
  VEMESH_BIND(nccl, ncclRecv);
  VEMESH_BIND(cudart, cudaGetDeviceCount);
  VEMESH_BIND(cudart, cudaGetDevice);
  VEMESH_BIND(cudart, cudaSetDevice);
  VEMESH_BIND(cudart, cudaGetLastError);
  VEMESH_BIND(cudart, cudaGetErrorName);
  VEMESH_BIND(cudart, cudaGetErrorString);
  VEMESH_BIND(cudart, cudaStreamCreateWithFlags);
  VEMESH_BIND(cudart, cudaStreamDestroy);
  VEMESH_BIND(cudart, cudaMalloc);
  VEMESH_BIND(cudart, cudaMemset);
  VEMESH_BIND(cudart, cudaFree);
  VEMESH_BIND(cudart, cudaPointerGetAttributes);
  VEMESH_BIND(cudart, cudaEventCreateWithFlags);
  VEMESH_BIND(cudart, cudaEventRecord);
  VEMESH_BIND(cudart, cudaEventQuery);
  VEMESH_BIND(cudart, cudaEventDestroy);
  // Both libraries' reasons, so that one look says everything to fix.
  std::vector<std::string> reasons;
  for (const Library* library : {&cudart, &nccl}) {
    if (!library->errors.empty()) reasons.push_back(library->Reason());
  }
  if (!reasons.empty()) {
    out.status = absl::UnavailableError(absl::StrJoin(reasons, " Also, "));
  }
  return out;
}

#undef VEMESH_BIND
#undef VEMESH_SYMBOL
#undef VEMESH_SYMBOL_NAME

// Loaded once, at the first call, by whichever thread comes first (a
// function-local static: the others wait for it).
const RealTable& LoadedReal() {
  static const RealTable* const real = new RealTable(LoadReal());
  return *real;
}

}  // namespace

namespace nccl_internal {
constinit std::atomic<const NcclApi*> installed{nullptr};
}  // namespace nccl_internal

const NcclApi& NcclApi::Real() { return LoadedReal().table; }

absl::StatusOr<const NcclApi*> LoadNccl() {
  const NcclApi* api = nccl_internal::installed.load(std::memory_order_acquire);
  if (api != nullptr) return api;
  const RealTable& real = LoadedReal();
  if (!real.status.ok()) return real.status;
  return &real.table;
}

ScopedNcclApi::ScopedNcclApi(const NcclApi& api)
    : previous_(
          nccl_internal::installed.exchange(&api, std::memory_order_acq_rel)) {}

ScopedNcclApi::~ScopedNcclApi() {
  nccl_internal::installed.store(previous_, std::memory_order_release);
}

}  // namespace vemesh
