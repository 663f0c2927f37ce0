#include "communicator_py.h"

#include <pybind11/stl.h>
#include <sched.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "errors.h"
#include "tensor_buffer.h"
#include "vemesh/comm/gloo/gloo_communicator.h"
#include "vemesh/comm/operation.h"
#include "vemesh/comm/work.h"

namespace py = pybind11;

namespace vemesh::python {
namespace {

// How often a blocked wait takes the GIL back to look for Ctrl-C.
constexpr absl::Duration kSignalSlice = absl::Milliseconds(50);

// One started operation and what must outlive it: the group (the Work
// holds it too) and the Python buffers it reads and writes.
struct Pending {
  std::shared_ptr<Communicator> comm;
  std::shared_ptr<Work> work;
  std::vector<TensorBuffer> buffers;

  // The results of staged buffers (tensor_buffer.h) copied back, once the
  // operation succeeded; under the GIL.
  absl::Status Unstage() {
    absl::Status s;
    for (TensorBuffer& b : buffers) s.Update(b.Unstage());
    return s;
  }
};

// Operations whose Python Work was dropped, or whose wait was interrupted,
// before they finished: their buffers stay alive here until they do. Looked
// at (and the finished ones freed) at every new operation. Under the GIL.
std::vector<std::unique_ptr<Pending>>& Orphans() {
  static auto* orphans = new std::vector<std::unique_ptr<Pending>>();
  return *orphans;
}

// Whether `p`'s buffers may go: its operation ended by itself. One that
// was aborted (or timed out, which aborts) may still be written by the
// backend (work.h): its buffers are kept for the life of the process.
bool Finished(Pending& p) {
  if (p.work == nullptr) return true;  // never started
  if (!p.work->test()) return false;
  const absl::Status s = p.work->status();
  return !absl::IsAborted(s) && !absl::IsDeadlineExceeded(s);
}

// A finished operation's staged results still land in their tensors (a
// Work dropped before wait(), as a program that waits on a later barrier).
bool FinishedUnstaged(Pending& p) {
  if (!Finished(p)) return false;
  if (p.work != nullptr && p.work->status().ok()) (void)p.Unstage();
  return true;
}

void ReapOrphans() {
  auto& orphans = Orphans();
  orphans.erase(std::remove_if(orphans.begin(), orphans.end(),
                               [](const std::unique_ptr<Pending>& p) {
                                 return FinishedUnstaged(*p);
                               }),
                orphans.end());
}

// Waits for `p` until `deadline`, with the GIL released, checking Python's
// signals every kSignalSlice. Polls like Work::wait (spin, then yield, then
// short sleeps) so that a short collective costs no sleep.
absl::Status WaitInterruptibly(Pending& p, absl::Time deadline) {
  const absl::Time start = absl::Now();
  absl::Time next_signal_check = start + kSignalSlice;
  for (int polls = 0;; ++polls) {
    bool done;
    { done = p.work->test(); }
    if (done) return p.work->status();
    if (polls < 256) continue;
    const absl::Time now = absl::Now();
    if (now >= deadline) {
      const absl::Status late = absl::DeadlineExceededError(absl::StrCat(
          p.work->name(), " on a ", p.comm->backend(),
          " communicator did not finish within ",
          absl::FormatDuration(deadline - start),
          "; the communicator is aborted (a peer never joined or is stuck)"));
      p.comm->abort(late.message());
      return late;
    }
    if (now >= next_signal_check) {
      next_signal_check = now + kSignalSlice;
      py::gil_scoped_acquire gil;
      if (PyErr_CheckSignals() != 0) {
        p.comm->abort(absl::StrCat(p.work->name(),
                                   " was interrupted by a Python signal "
                                   "(KeyboardInterrupt)"));
        throw py::error_already_set();
      }
    }
    if (now - start < absl::Milliseconds(5)) {
      sched_yield();
    } else {
      absl::SleepFor(absl::Microseconds(100));
    }
  }
}

absl::Time DeadlineOf(std::optional<double> timeout_s, absl::Duration dflt) {
  if (!timeout_s) {
    return dflt == absl::InfiniteDuration() ? absl::InfiniteFuture()
                                            : absl::Now() + dflt;
  }
  if (!std::isfinite(*timeout_s) || *timeout_s < 0) {
    RaiseStatus(absl::InvalidArgumentError(
        absl::StrCat("timeout: ", *timeout_s,
                     " is not a number of seconds >= 0 (or None)")));
  }
  return absl::Now() + absl::Seconds(*timeout_s);
}

// The Python Work: wait(timeout=None), is_completed(), test().
class PyWork {
 public:
  explicit PyWork(std::unique_ptr<Pending> p) : p_(std::move(p)) {}
  ~PyWork() {
    // Dropped before it finished (or aborted): the buffers must live on.
    if (p_ != nullptr && !FinishedUnstaged(*p_)) {
      Orphans().push_back(std::move(p_));
    }
  }

  // Blocks until done; True (as torch's Work.wait). Raises the operation's
  // error, TimeoutError past `timeout` seconds.
  // mu_ is only ever waited for without the GIL: a waiter re-takes the GIL
  // every few milliseconds (Ctrl-C), so a thread holding the GIL while it
  // waits for mu_ would deadlock with it.
  bool wait(std::optional<double> timeout) {
    absl::Time deadline = DeadlineOf(timeout, absl::InfiniteDuration());
    std::unique_lock<std::mutex> lock(mu_, std::defer_lock);
    absl::Status s;
    {
      py::gil_scoped_release nogil;
      lock.lock();
      s = WaitInterruptibly(*p_, deadline);
    }
    if (s.ok()) s = p_->Unstage();
    ThrowIfError(s);
    return true;
  }
  // Looks once: False while another thread waits on this Work.
  bool test() {
    std::unique_lock<std::mutex> lock(mu_, std::try_to_lock);
    if (!lock.owns_lock()) return false;
    if (!p_->work->test()) return false;
    ThrowIfError(p_->work->status());
    ThrowIfError(p_->Unstage());
    return true;
  }
  bool is_completed() {
    if (!p_->work->is_completed()) return false;
    std::unique_lock<std::mutex> lock(mu_, std::try_to_lock);
    if (lock.owns_lock() && p_->work->status().ok()) {
      ThrowIfError(p_->Unstage());
    }
    return true;
  }
  std::string name() const { return p_->work->name(); }
  bool done() const { return p_->work->is_completed(); }

 private:
  std::mutex mu_;
  std::unique_ptr<Pending> p_;
};

ReduceOp ParseOp(const std::string& op) {
  if (op == "sum") return ReduceOp::kSum;
  if (op == "prod" || op == "product") return ReduceOp::kProd;
  if (op == "min") return ReduceOp::kMin;
  if (op == "max") return ReduceOp::kMax;
  if (op == "avg" || op == "mean") return ReduceOp::kAvg;
  RaiseStatus(absl::InvalidArgumentError(
      absl::StrCat("op: '", op,
                   "' is not a reduction; expected \"sum\", \"prod\", "
                   "\"min\", \"max\" or \"avg\"")));
}

// A buffer checked against the group's backend.
// An operation that outlives the call (`async_op`) works on a copy of a
// torch host tensor (tensor_buffer.h: a resize_() would free its memory).
TensorBuffer Buffer(const Communicator& comm, const py::handle& obj,
                    const char* what, bool writable, bool async_op) {
  TensorBuffer b = TensorBuffer::From(obj, what, writable);
  const bool nccl = comm.backend() == "nccl";
  if (b.on_cuda() != nccl) {
    RaiseStatus(absl::InvalidArgumentError(absl::StrCat(
        what, ": a ", b.on_cuda() ? "CUDA" : "host", " tensor on a ",
        comm.backend(), " communicator; ",
        nccl ? "NCCL takes CUDA tensors" : "MPI and Gloo take host memory")));
  }
  if (async_op) b.Stage();
  return b;
}

void SameType(const TensorBuffer& a, const TensorBuffer& b, const char* op) {
  if (a.type() != b.type()) {
    RaiseStatus(absl::InvalidArgumentError(
        absl::StrCat(op, ": output is ", a.Describe(), " but input is ",
                     b.Describe(), "; both must have the same element type")));
  }
}

// Starts the operation (GIL released), then either waits (blocking) or returns
// a Work. `buffers` stay alive until the operation finished.
py::object Launch(const std::shared_ptr<Communicator>& comm,
                  const std::function<Communicator::WorkOr()>& start,
                  std::vector<TensorBuffer> buffers, bool async_op) {
  if (!Orphans().empty()) ReapOrphans();
  auto p = std::make_unique<Pending>();
  p->comm = comm;
  p->buffers = std::move(buffers);
  const absl::Time deadline = DeadlineOf(std::nullopt, comm->timeout());
  // One release of the GIL for the start and, when blocking, the wait.
  absl::Status s;
  try {
    py::gil_scoped_release nogil;
    absl::StatusOr<std::shared_ptr<Work>> work = start();
    if (!work.ok()) {
      s = work.status();
    } else {
      p->work = *std::move(work);
      if (!async_op) s = WaitInterruptibly(*p, deadline);
    }
  } catch (py::error_already_set&) {
    Orphans().push_back(std::move(p));  // interrupted: buffers live on
    throw;
  }
  // Timed out or aborted in flight: the backend may still write the buffers.
  if (!s.ok() && !Finished(*p)) Orphans().push_back(std::move(p));
  ThrowIfError(s);
  if (async_op) return py::cast(std::make_unique<PyWork>(std::move(p)));
  return py::none();
}

using CommPtr = std::shared_ptr<Communicator>;

py::object AllReduce(const CommPtr& c, py::handle t, const std::string& op,
                     bool async_op) {
  std::vector<TensorBuffer> bufs;
  bufs.push_back(Buffer(*c, t, "tensor", true, async_op));
  Operation o;
  o.kind = OpKind::kAllReduce;
  o.send = o.recv = bufs[0].data();
  o.count = bufs[0].count();
  o.type = bufs[0].type();
  o.op = ParseOp(op);
  return Launch(
      c, [&] { return c->start(std::move(o)); }, std::move(bufs), async_op);
}

py::object Broadcast(const CommPtr& c, py::handle t, int src, bool async_op) {
  std::vector<TensorBuffer> bufs;
  bufs.push_back(Buffer(*c, t, "tensor", true, async_op));
  Operation o;
  o.kind = OpKind::kBroadcast;
  o.recv = bufs[0].data();
  o.count = bufs[0].count();
  o.type = bufs[0].type();
  o.root = src;
  return Launch(
      c, [&] { return c->start(std::move(o)); }, std::move(bufs), async_op);
}

// all_gather, reduce_scatter and all_to_all: out and inp whose lengths the
// group size relates.
py::object TwoBuffers(const CommPtr& c, OpKind kind, const char* name,
                      py::handle out, py::handle inp, const std::string& op,
                      bool async_op) {
  std::vector<TensorBuffer> bufs;
  bufs.push_back(Buffer(*c, out, "out", true, async_op));
  bufs.push_back(Buffer(*c, inp, "inp", false, async_op));
  SameType(bufs[0], bufs[1], name);
  const size_t n = static_cast<size_t>(c->size());
  const size_t out_n = bufs[0].count(), in_n = bufs[1].count();
  Operation o;
  o.kind = kind;
  o.send = bufs[1].data();
  o.recv = bufs[0].data();
  o.type = bufs[0].type();
  o.op = ParseOp(op);
  std::string expected;
  if (kind == OpKind::kAllGather) {
    o.count = in_n;
    if (out_n != in_n * n) {
      expected = absl::StrCat("out to hold group size (", n, ") x ", in_n,
                              " = ", in_n * n, " elements");
    }
  } else if (kind == OpKind::kReduceScatter) {
    o.count = out_n;
    if (in_n != out_n * n) {
      expected = absl::StrCat("inp to hold group size (", n, ") x ", out_n,
                              " = ", out_n * n, " elements");
    }
  } else {
    o.count = in_n / n;
    if (in_n != out_n || in_n % n != 0) {
      expected = absl::StrCat(
          "out and inp of the same length, a multiple of the group size (", n,
          ")");
    }
  }
  if (!expected.empty()) {
    RaiseStatus(absl::InvalidArgumentError(
        absl::StrCat(name, ": out is ", bufs[0].Describe(), " and inp is ",
                     bufs[1].Describe(), "; expected ", expected)));
  }
  return Launch(
      c, [&] { return c->start(std::move(o)); }, std::move(bufs), async_op);
}

// reduce, gather and scatter: a rooted operation whose buffer on the other
// side of the root may be None elsewhere (gather's out, scatter's inp,
// reduce's out).
py::object Rooted(const CommPtr& c, OpKind kind, const char* name,
                  py::handle out, py::handle inp, int root,
                  const std::string& op, bool async_op) {
  const bool at_root = root == c->rank();
  std::vector<TensorBuffer> bufs;
  const bool out_at_root_only = kind != OpKind::kScatter;
  const bool need_out = !out_at_root_only || at_root;
  const bool need_inp = kind != OpKind::kScatter || at_root;
  if (need_out || !out.is_none()) {
    bufs.push_back(Buffer(*c, out, "out", true, async_op));
  }
  if (need_inp || !inp.is_none()) {
    bufs.push_back(Buffer(*c, inp, "inp", false, async_op));
  }
  if (bufs.size() == 2) SameType(bufs[0], bufs[1], name);
  const TensorBuffer* o_buf = need_out || !out.is_none() ? &bufs[0] : nullptr;
  const TensorBuffer* i_buf =
      need_inp || !inp.is_none() ? &bufs[bufs.size() - 1] : nullptr;
  const size_t n = static_cast<size_t>(c->size());
  Operation o;
  o.kind = kind;
  o.root = root;
  o.op = ParseOp(op);
  o.type = (o_buf != nullptr ? o_buf : i_buf)->type();
  o.send = need_inp ? i_buf->data() : nullptr;
  o.recv = need_out ? o_buf->data() : nullptr;
  std::string expected;
  if (kind == OpKind::kReduce) {
    o.count = i_buf->count();
    if (at_root && o_buf->count() != o.count) {
      expected =
          absl::StrCat("out of the same length as inp (", i_buf->count(), ")");
    }
  } else if (kind == OpKind::kGather) {
    o.count = i_buf->count();
    if (at_root && o_buf->count() != o.count * n) {
      expected = absl::StrCat("out to hold group size (", n, ") x ", o.count,
                              " = ", o.count * n, " elements");
    }
  } else {
    o.count = o_buf->count();
    if (at_root && i_buf->count() != o.count * n) {
      expected = absl::StrCat("inp to hold group size (", n, ") x ", o.count,
                              " = ", o.count * n, " elements");
    }
  }
  if (!expected.empty()) {
    RaiseStatus(absl::InvalidArgumentError(
        absl::StrCat(name, ": out is ", o_buf->Describe(), " and inp is ",
                     i_buf->Describe(), "; expected ", expected)));
  }
  return Launch(
      c, [&] { return c->start(std::move(o)); }, std::move(bufs), async_op);
}

// all_to_all with a count per peer (PyTorch's all_to_all_single with split
// sizes): out_counts[i] elements from rank i, in_counts[i] to rank i.
py::object AllToAllV(const CommPtr& c, py::handle out,
                     std::vector<size_t> out_counts, py::handle inp,
                     std::vector<size_t> in_counts, bool async_op) {
  std::vector<TensorBuffer> bufs;
  bufs.push_back(Buffer(*c, out, "out", true, async_op));
  bufs.push_back(Buffer(*c, inp, "inp", false, async_op));
  SameType(bufs[0], bufs[1], "all_to_all_v");
  Operation o;
  o.kind = OpKind::kAllToAllV;
  o.send = bufs[1].data();
  o.recv = bufs[0].data();
  o.type = bufs[0].type();
  o.send_counts = std::move(in_counts);
  o.recv_counts = std::move(out_counts);
  return Launch(
      c, [&] { return c->start(std::move(o)); }, std::move(bufs), async_op);
}

int PeerOf(const CommPtr& c, int peer, bool global) {
  if (!global) return peer;
  return Unwrap(c->group_rank(peer));
}

py::object PointToPoint(const CommPtr& c, py::handle t, int peer, bool send,
                        bool global, bool async_op) {
  std::vector<TensorBuffer> bufs;
  bufs.push_back(Buffer(*c, t, "tensor", !send, async_op));
  const int p = PeerOf(c, peer, global);
  void* data = bufs[0].data();
  const size_t count = bufs[0].count();
  const DataType type = bufs[0].type();
  auto start = [&]() -> Communicator::WorkOr {
    if (send) return c->isend(data, count, type, p);
    return c->irecv(data, count, type, p);
  };
  return Launch(c, start, std::move(bufs), async_op);
}

py::object Barrier(const CommPtr& c, bool async_op) {
  return Launch(
      c, [&] { return c->ibarrier(); }, {}, async_op);
}

}  // namespace

py::object WrapCommunicator(std::shared_ptr<Communicator> comm) {
  return py::cast(std::move(comm));
}

void RegisterCommunicator(py::module_& m) {
  py::class_<PyWork>(m, "Work",
                     "An operation started with async_op=True (or an i* "
                     "method). wait(timeout=None) blocks, GIL released; past "
                     "`timeout` seconds it raises TimeoutError and aborts the "
                     "communicator.")
      .def("wait", &PyWork::wait, py::arg("timeout") = py::none())
      .def("test", &PyWork::test)
      .def("is_completed", &PyWork::is_completed)
      .def_property_readonly("name", &PyWork::name)
      .def("__repr__", [](const PyWork& w) {
        return absl::StrCat("vemesh.Work(", w.name(),
                            w.done() ? ", completed)" : ", running)");
      });

  auto cls = py::class_<Communicator, std::shared_ptr<Communicator>>(
      m, "Communicator",
      "One group of ranks (a mesh dimension's group). Ranks are group ranks "
      "unless said otherwise. Holds the group alive: it outlives the mesh it "
      "came from.");
  cls.def("rank", &Communicator::rank)
      .def("size", &Communicator::size)
      .def("ranks",
           [](const Communicator& c) {
             auto r = c.ranks();
             return std::vector<int>(r.begin(), r.end());
           })
      .def("global_rank", &Communicator::global_rank)
      .def("group_rank",
           [](const Communicator& c, int64_t global) {
             return Unwrap(c.group_rank(global));
           })
      .def_property_readonly(
          "backend",
          [](const Communicator& c) { return std::string(c.backend()); })
      .def(
          "set_timeout",
          [](Communicator& c, std::optional<double> seconds) {
            if (!seconds) {
              c.set_timeout(absl::InfiniteDuration());
              return;
            }
            DeadlineOf(seconds, absl::ZeroDuration());  // checks the value
            c.set_timeout(absl::Seconds(*seconds));
          },
          py::arg("seconds"))
      .def("timeout",
           [](const Communicator& c) -> std::optional<double> {
             if (c.timeout() == absl::InfiniteDuration()) return std::nullopt;
             return absl::ToDoubleSeconds(c.timeout());
           })
      .def(
          "abort",
          [](Communicator& c, const std::string& reason) { c.abort(reason); },
          py::arg("reason") = "abort() was called")
      .def("aborted", &Communicator::aborted)
      .def("all_reduce", &AllReduce, py::arg("tensor"), py::arg("op") = "sum",
           py::arg("async_op") = false)
      .def("broadcast", &Broadcast, py::arg("tensor"), py::arg("src") = 0,
           py::arg("async_op") = false)
      .def(
          "all_gather",
          [](const CommPtr& c, py::handle out, py::handle inp, bool a) {
            return TwoBuffers(c, OpKind::kAllGather, "all_gather", out, inp,
                              "sum", a);
          },
          py::arg("out"), py::arg("inp"), py::arg("async_op") = false)
      .def(
          "reduce_scatter",
          [](const CommPtr& c, py::handle out, py::handle inp,
             const std::string& op, bool a) {
            return TwoBuffers(c, OpKind::kReduceScatter, "reduce_scatter", out,
                              inp, op, a);
          },
          py::arg("out"), py::arg("inp"), py::arg("op") = "sum",
          py::arg("async_op") = false)
      .def(
          "all_to_all",
          [](const CommPtr& c, py::handle out, py::handle inp, bool a) {
            return TwoBuffers(c, OpKind::kAllToAll, "all_to_all", out, inp,
                              "sum", a);
          },
          py::arg("out"), py::arg("inp"), py::arg("async_op") = false)
      .def(
          "reduce",
          [](const CommPtr& c, py::handle out, py::handle inp, int dst,
             const std::string& op, bool a) {
            return Rooted(c, OpKind::kReduce, "reduce", out, inp, dst, op, a);
          },
          py::arg("out"), py::arg("inp"), py::arg("dst"), py::arg("op") = "sum",
          py::arg("async_op") = false,
          "The reduction of every rank's inp into out at group rank dst (out "
          "may be None elsewhere; out and inp are distinct buffers).")
      .def(
          "gather",
          [](const CommPtr& c, py::handle out, py::handle inp, int dst,
             bool a) {
            return Rooted(c, OpKind::kGather, "gather", out, inp, dst, "sum",
                          a);
          },
          py::arg("out"), py::arg("inp"), py::arg("dst"),
          py::arg("async_op") = false,
          "Every rank's inp, in rank order, into out at group rank dst (out "
          "may be None elsewhere).")
      .def(
          "scatter",
          [](const CommPtr& c, py::handle out, py::handle inp, int src,
             bool a) {
            return Rooted(c, OpKind::kScatter, "scatter", out, inp, src, "sum",
                          a);
          },
          py::arg("out"), py::arg("inp"), py::arg("src"),
          py::arg("async_op") = false,
          "Block i of inp at group rank src into out at rank i (inp may be "
          "None elsewhere).")
      .def("all_to_all_v", &AllToAllV, py::arg("out"), py::arg("out_counts"),
           py::arg("inp"), py::arg("in_counts"), py::arg("async_op") = false,
           "all_to_all with a count per peer: in_counts[i] elements of inp "
           "(in rank order) to rank i, out_counts[i] from rank i into out.")
      .def(
          "send",
          [](const CommPtr& c, py::handle t, int dst, bool global, bool a) {
            return PointToPoint(c, t, dst, true, global, a);
          },
          py::arg("tensor"), py::arg("dst"), py::kw_only(),
          py::arg("global_rank") = false, py::arg("async_op") = false)
      .def(
          "recv",
          [](const CommPtr& c, py::handle t, int src, bool global, bool a) {
            return PointToPoint(c, t, src, false, global, a);
          },
          py::arg("tensor"), py::arg("src"), py::kw_only(),
          py::arg("global_rank") = false, py::arg("async_op") = false)
      .def(
          "subgroup",
          [](const CommPtr& c, const std::string& name,
             std::vector<int> members) -> CommPtr {
            std::shared_ptr<GlooCommunicator> gloo = GlooCommunicator::Of(c);
            if (gloo == nullptr) {
              RaiseStatus(absl::InvalidArgumentError(absl::StrCat(
                  "subgroup '", name,
                  "': a group of some members only is "
                  "made on a Gloo group; this one is ",
                  c->backend(), " (make it a mesh dimension instead)")));
            }
            absl::StatusOr<std::shared_ptr<GlooCommunicator>> out;
            {
              py::gil_scoped_release nogil;
              out = gloo->subgroup(name, std::move(members));
            }
            return Unwrap(std::move(out));
          },
          py::arg("name"), py::arg("members"),
          "Collective over `members` only (group ranks, in the new group's "
          "order, this rank among them; the same `name`, fresh within this "
          "group, on each): a Gloo group of those ranks. Gloo groups only.")
      .def("barrier", &Barrier, py::arg("async_op") = false)
      // The C++ spellings of the asynchronous forms.
      .def(
          "iall_reduce",
          [](const CommPtr& c, py::handle t, const std::string& op) {
            return AllReduce(c, t, op, true);
          },
          py::arg("tensor"), py::arg("op") = "sum")
      .def(
          "ibroadcast",
          [](const CommPtr& c, py::handle t, int src) {
            return Broadcast(c, t, src, true);
          },
          py::arg("tensor"), py::arg("src") = 0)
      .def(
          "iall_gather",
          [](const CommPtr& c, py::handle out, py::handle inp) {
            return TwoBuffers(c, OpKind::kAllGather, "all_gather", out, inp,
                              "sum", true);
          },
          py::arg("out"), py::arg("inp"))
      .def(
          "ireduce_scatter",
          [](const CommPtr& c, py::handle out, py::handle inp,
             const std::string& op) {
            return TwoBuffers(c, OpKind::kReduceScatter, "reduce_scatter", out,
                              inp, op, true);
          },
          py::arg("out"), py::arg("inp"), py::arg("op") = "sum")
      .def(
          "iall_to_all",
          [](const CommPtr& c, py::handle out, py::handle inp) {
            return TwoBuffers(c, OpKind::kAllToAll, "all_to_all", out, inp,
                              "sum", true);
          },
          py::arg("out"), py::arg("inp"))
      .def(
          "isend",
          [](const CommPtr& c, py::handle t, int dst, bool global) {
            return PointToPoint(c, t, dst, true, global, true);
          },
          py::arg("tensor"), py::arg("dst"), py::kw_only(),
          py::arg("global_rank") = false)
      .def(
          "irecv",
          [](const CommPtr& c, py::handle t, int src, bool global) {
            return PointToPoint(c, t, src, false, global, true);
          },
          py::arg("tensor"), py::arg("src"), py::kw_only(),
          py::arg("global_rank") = false)
      .def("ibarrier", [](const CommPtr& c) { return Barrier(c, true); })
      .def("__repr__", [](const Communicator& c) {
        return absl::StrCat("vemesh.Communicator(", c.backend(), ", rank ",
                            c.rank(), " of ", c.size(), ")");
      });
}

}  // namespace vemesh::python
