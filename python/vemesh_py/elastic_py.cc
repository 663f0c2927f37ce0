#include "elastic_py.h"

#include <pybind11/stl.h>

#include <cmath>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "errors.h"
#include "tensor_buffer.h"
#include "vemesh/comm/data_type.h"
#include "vemesh/registry/ve_device_mesh.h"

namespace py = pybind11;

namespace vemesh::python {
namespace {

bool Finalizing() {
#if PY_VERSION_HEX >= 0x030D0000
  return !Py_IsInitialized() || Py_IsFinalizing();
#else
  return !Py_IsInitialized() || _Py_IsFinalizing();
#endif
}

// A Python object that the elastic mesh keeps (a state callback, the
// buffer it last returned): released under the GIL from whichever thread
// drops the mesh, or leaked once the interpreter is going away.
template <typename T>
class HeldUnderGil {
 public:
  explicit HeldUnderGil(T value) : value_(std::move(value)) {}
  HeldUnderGil(const HeldUnderGil&) = delete;
  HeldUnderGil& operator=(const HeldUnderGil&) = delete;
  ~HeldUnderGil() {
    if (Finalizing()) {
      new T(std::move(value_));  // leaked: no Python calls after finalisation
      return;
    }
    py::gil_scoped_acquire gil;
    T gone = std::move(value_);
  }
  T& get() { return value_; }

 private:
  T value_;
};

absl::Duration Seconds(double s, const char* what) {
  if (!std::isfinite(s) || s <= 0) {
    RaiseStatus(absl::InvalidArgumentError(absl::StrCat(
        "ElasticOptions.", what, ": ", s, " is not a number of seconds > 0")));
  }
  return absl::Seconds(s);
}

// "UNAVAILABLE" -> kUnavailable; an unknown name is ValueError.
absl::StatusCode CodeFromName(const std::string& name) {
  for (int c = 1; c <= 16; ++c) {
    const auto code = static_cast<absl::StatusCode>(c);
    if (absl::StatusCodeToString(code) == name) return code;
  }
  RaiseStatus(absl::InvalidArgumentError(
      absl::StrCat("status code '", name,
                   "' is not an absl status code name (UNAVAILABLE, "
                   "ABORTED, DEADLINE_EXCEEDED, INTERNAL, ...)")));
}

// A Python exception raised by a state callback, as the status the
// elastic mesh fails the transfer (or the fingerprint) with.
absl::Status FromPython(py::error_already_set& e, const std::string& name,
                        const char* what) {
  const absl::StatusCode code = e.matches(PyExc_ValueError)
                                    ? absl::StatusCode::kInvalidArgument
                                    : absl::StatusCode::kInternal;
  return absl::Status(
      code, absl::StrCat("state '", name, "': ", what, " raised ", e.what()));
}

// ElasticOptions::replica_dim of the registry's last elastic init (the
// C++ mesh does not answer it). Under the GIL.
std::string& ReplicaDim() {
  static auto* dim = new std::string();
  return *dim;
}

// The registry's elastic mesh of one init.
struct ElasticHandle {
  ElasticMesh* mesh;
  std::string replica_dim;  // ElasticOptions::replica_dim of its init
  ElasticMesh& get() const {
    if (VeDeviceMesh::Instance().elastic() != mesh) {
      RaiseStatus(absl::FailedPreconditionError(
          "this elastic mesh is gone: VESCALE_DEVICE_MESH was reset or "
          "initialised again; ask VESCALE_DEVICE_MESH.elastic() for the "
          "current one"));
    }
    return *mesh;
  }
};

double Secs(absl::Duration d) { return absl::ToDoubleSeconds(d); }

py::object OptionalCode(const absl::Status& s) {
  if (s.ok()) return py::none();
  return py::str(absl::StatusCodeToString(s.code()));
}

void RegisterStateDictFn(const ElasticHandle& h, const std::string& name,
                         py::function state_dict,
                         py::function load_state_dict) {
  auto save = std::make_shared<HeldUnderGil<py::function>>(state_dict);
  auto load = std::make_shared<HeldUnderGil<py::function>>(load_state_dict);
  ReplicaState::StateDictFn out = [save,
                                   name]() -> absl::StatusOr<std::string> {
    py::gil_scoped_acquire gil;
    try {
      py::object bytes = save->get()();
      Py_buffer view;
      if (PyObject_GetBuffer(bytes.ptr(), &view, PyBUF_C_CONTIGUOUS) != 0) {
        PyErr_Clear();
        return absl::InvalidArgumentError(absl::StrCat(
            "state '", name, "': state_dict returned a ",
            std::string(py::str(bytes.get_type().attr("__name__"))),
            ", expected bytes (or another contiguous buffer)"));
      }
      std::string copy(static_cast<const char*>(view.buf),
                       static_cast<size_t>(view.len));
      PyBuffer_Release(&view);
      return copy;
    } catch (py::error_already_set& e) {
      return FromPython(e, name, "state_dict");
    }
  };
  ReplicaState::LoadStateDictFn in =
      [load, name](absl::string_view bytes) -> absl::Status {
    py::gil_scoped_acquire gil;
    try {
      // A bytes object of its own (one copy): the callee may keep views.
      load->get()(py::bytes(bytes.data(), bytes.size()));
      return absl::OkStatus();
    } catch (py::error_already_set& e) {
      return FromPython(e, name, "load_state_dict");
    }
  };
  ThrowIfError(
      h.get().register_state_dict_fn(name, std::move(out), std::move(in)));
}

// The live bytes of a numpy array or a torch CPU tensor, sent from and
// received into in place.
void RegisterStateBytes(const ElasticHandle& h, const std::string& name,
                        py::function bytes) {
  // Called once now, so that a bad callback raises here, not in recover().
  {
    TensorBuffer b = TensorBuffer::From(bytes(), name.c_str(), true);
    if (b.on_cuda()) {
      RaiseStatus(absl::InvalidArgumentError(absl::StrCat(
          "state '", name, "': ", b.Describe(),
          " is on a GPU; the elastic state is host memory "
          "(register a CPU copy, or use register_state_dict_fn)")));
    }
  }
  struct Live {
    py::function fn;
    std::unique_ptr<TensorBuffer> last;  // keeps the returned buffer alive
  };
  auto live = std::make_shared<HeldUnderGil<Live>>(Live{bytes, nullptr});
  ReplicaState::BytesFn fn = [live, name]() -> absl::Span<char> {
    py::gil_scoped_acquire gil;
    try {
      Live& l = live->get();
      auto b = std::make_unique<TensorBuffer>(
          TensorBuffer::From(l.fn(), name.c_str(), true));
      l.last = std::move(b);
      return absl::MakeSpan(static_cast<char*>(l.last->data()),
                            l.last->count() * SizeOf(l.last->type()));
    } catch (py::error_already_set& e) {
      // No status to return here: an empty span fails the transfer (sizes
      // differ); the reason goes to stderr.
      e.restore();
      PyErr_WriteUnraisable(py::str(absl::StrCat("state '", name, "'")).ptr());
      return {};
    }
  };
  ThrowIfError(h.get().register_state_bytes(name, std::move(fn)));
}

StepVerdict EndStep(const ElasticHandle& h, const py::object& status) {
  absl::Status s;
  if (!status.is_none()) {
    auto t = status.cast<std::pair<std::string, std::string>>();
    const absl::StatusCode code = CodeFromName(t.first);
    if (code != absl::StatusCode::kOk) s = absl::Status(code, t.second);
  }
  ElasticMesh& el = h.get();
  absl::StatusOr<StepVerdict> v;
  {
    py::gil_scoped_release nogil;
    v = el.end_step(s);
  }
  return Unwrap(std::move(v));
}

}  // namespace

void NoteElasticInit(const ElasticOptions& options) {
  ReplicaDim() = options.replica_dim;
}

std::optional<ElasticOptions> ElasticOptionsFrom(const py::handle& elastic) {
  if (elastic.is_none()) return std::nullopt;
  if (py::isinstance<ElasticOptions>(elastic)) {
    return elastic.cast<ElasticOptions>();
  }
  if (py::isinstance<py::dict>(elastic)) {
    py::object cls = py::module_::import("vemesh._C").attr("ElasticOptions");
    return cls(**elastic.cast<py::dict>()).cast<ElasticOptions>();
  }
  PyErr_SetString(
      PyExc_TypeError,
      absl::StrCat("elastic: expected a vemesh.ElasticOptions or a dict of "
                   "its fields, got ",
                   std::string(py::str(elastic.get_type().attr("__name__"))))
          .c_str());
  throw py::error_already_set();
}

void RegisterElastic(py::module_& m) {
  py::class_<ElasticOptions>(
      m, "ElasticOptions",
      "The elastic mesh's options (C++ vemesh::ElasticOptions; "
      "docs/ELASTIC.md). Durations are seconds.")
      .def(py::init([](std::string store, int replica, std::string replica_dim,
                       std::string job, int min_replicas, double heartbeat_ttl,
                       double op_timeout, double recovery_timeout,
                       double form_timeout, int max_step_retries,
                       int fingerprint_every, std::string descriptor,
                       std::string gloo_host, bool data_plane_detection) {
             ElasticOptions o;
             o.store = std::move(store);
             o.replica = replica;
             o.replica_dim = std::move(replica_dim);
             o.job = std::move(job);
             o.min_replicas = min_replicas;
             o.heartbeat_ttl = Seconds(heartbeat_ttl, "heartbeat_ttl");
             o.op_timeout = Seconds(op_timeout, "op_timeout");
             o.recovery_timeout = Seconds(recovery_timeout, "recovery_timeout");
             o.form_timeout = Seconds(form_timeout, "form_timeout");
             if (max_step_retries < 0 || fingerprint_every < 0) {
               RaiseStatus(absl::InvalidArgumentError(
                   absl::StrCat("ElasticOptions: max_step_retries (",
                                max_step_retries, ") and fingerprint_every (",
                                fingerprint_every, ") must be >= 0")));
             }
             o.max_step_retries = max_step_retries;
             o.fingerprint_every = fingerprint_every;
             o.descriptor = std::move(descriptor);
             o.gloo_host = std::move(gloo_host);
             o.data_plane_detection = data_plane_detection;
             return o;
           }),
           py::kw_only(), py::arg("store"), py::arg("replica"),
           py::arg("replica_dim") = "DP", py::arg("job") = "default",
           py::arg("min_replicas") = 1, py::arg("heartbeat_ttl") = 1.0,
           py::arg("op_timeout") = 5.0, py::arg("recovery_timeout") = 60.0,
           py::arg("form_timeout") = 10.0, py::arg("max_step_retries") = 2,
           py::arg("fingerprint_every") = 0, py::arg("descriptor") = "",
           py::arg("gloo_host") = "", py::arg("data_plane_detection") = true)
      .def_readonly("store", &ElasticOptions::store)
      .def_readonly("replica", &ElasticOptions::replica)
      .def_readonly("replica_dim", &ElasticOptions::replica_dim)
      .def_readonly("job", &ElasticOptions::job)
      .def_readonly("min_replicas", &ElasticOptions::min_replicas)
      .def_property_readonly(
          "heartbeat_ttl",
          [](const ElasticOptions& o) { return Secs(o.heartbeat_ttl); })
      .def_property_readonly(
          "op_timeout",
          [](const ElasticOptions& o) { return Secs(o.op_timeout); })
      .def_property_readonly(
          "recovery_timeout",
          [](const ElasticOptions& o) { return Secs(o.recovery_timeout); })
      .def_property_readonly(
          "form_timeout",
          [](const ElasticOptions& o) { return Secs(o.form_timeout); })
      .def_readonly("max_step_retries", &ElasticOptions::max_step_retries)
      .def_readonly("fingerprint_every", &ElasticOptions::fingerprint_every)
      .def_readonly("descriptor", &ElasticOptions::descriptor)
      .def_readonly("gloo_host", &ElasticOptions::gloo_host)
      .def_readonly("data_plane_detection",
                    &ElasticOptions::data_plane_detection)
      .def("__repr__", [](const ElasticOptions& o) {
        return absl::StrCat("ElasticOptions(store='", o.store,
                            "', replica=", o.replica, ", replica_dim='",
                            o.replica_dim, "', job='", o.job, "')");
      });

  py::class_<StepVerdict>(m, "StepVerdict",
                          "end_step's answer: committed (the step's updates "
                          "stand) and recover (call recover() next).")
      .def_readonly("committed", &StepVerdict::committed)
      .def_readonly("recover", &StepVerdict::recover)
      .def("__repr__", [](const StepVerdict& v) {
        return absl::StrCat(
            "StepVerdict(committed=", v.committed ? "True" : "False",
            ", recover=", v.recover ? "True" : "False", ")");
      });

  py::class_<Recovery>(m, "Recovery",
                       "What recover() decided (C++ vemesh::Recovery); "
                       "str() is FormatRecovery's one line. Times in "
                       "seconds.")
      .def_readonly("evicted", &Recovery::evicted)
      .def_readonly("epoch", &Recovery::epoch)
      .def_readonly("dp_size", &Recovery::dp_size)
      .def_readonly("dp_rank", &Recovery::dp_rank)
      .def_readonly("replicas", &Recovery::replicas)
      .def_readonly("resume_step", &Recovery::resume_step)
      .def_readonly("receives_state", &Recovery::receives_state)
      .def_readonly("state_carried", &Recovery::state_carried)
      .def_property_readonly(
          "detect_time", [](const Recovery& r) { return Secs(r.detect_time); })
      .def_property_readonly(
          "agree_time", [](const Recovery& r) { return Secs(r.agree_time); })
      .def_property_readonly(
          "build_time", [](const Recovery& r) { return Secs(r.build_time); })
      .def_property_readonly(
          "state_time", [](const Recovery& r) { return Secs(r.state_time); })
      .def_property_readonly(
          "step_code",
          [](const Recovery& r) { return OptionalCode(r.step_status); })
      .def_property_readonly(
          "step_message",
          [](const Recovery& r) -> py::object {
            if (r.step_status.ok()) return py::none();
            return py::str(std::string(r.step_status.message()));
          })
      .def("__str__", &FormatRecovery)
      .def("__repr__", [](const Recovery& r) {
        return absl::StrCat("<vemesh.Recovery ", FormatRecovery(r), ">");
      });
  m.def("format_recovery", &FormatRecovery, py::arg("recovery"),
        "FormatRecovery: the recovery record as one log line.");

  py::class_<ElasticHandle>(
      m, "_ElasticMesh",
      "The registry's elastic mesh (C++ vemesh::ElasticMesh). Use "
      "vemesh.elastic.ElasticMesh, which wraps it.")
      .def("end_step", &EndStep, py::arg("status") = py::none(),
           "Collective over the job: this rank's step status (None, or "
           "(code name, message)) -> StepVerdict.")
      .def(
          "recover",
          [](const ElasticHandle& h, int64_t committed_steps) {
            ElasticMesh& el = h.get();
            absl::StatusOr<Recovery> r;
            {
              py::gil_scoped_release nogil;
              r = el.recover(committed_steps);
            }
            return Unwrap(std::move(r));
          },
          py::arg("committed_steps"))
      .def("sync_state",
           [](const ElasticHandle& h) {
             ElasticMesh& el = h.get();
             absl::Status s;
             {
               py::gil_scoped_release nogil;
               s = el.sync_state();
             }
             ThrowIfError(s);
           })
      .def("register_state_dict_fn", &RegisterStateDictFn, py::arg("name"),
           py::arg("state_dict"), py::arg("load_state_dict"))
      .def("register_state_bytes", &RegisterStateBytes, py::arg("name"),
           py::arg("bytes"))
      .def("mesh", [](const ElasticHandle& h) { return h.get().mesh(); })
      .def("last_recovery",
           [](const ElasticHandle& h) { return h.get().last_recovery(); })
      .def("epoch", [](const ElasticHandle& h) { return h.get().epoch(); })
      .def("has_state",
           [](const ElasticHandle& h) { return h.get().has_state(); })
      .def("mark_stateless",
           [](const ElasticHandle& h) { h.get().mark_stateless(); })
      .def("replica", [](const ElasticHandle& h) { return h.get().replica(); })
      .def("replica_dim", [](const ElasticHandle& h) { return h.replica_dim; })
      .def("is_current", [](const ElasticHandle& h) {
        return VeDeviceMesh::Instance().elastic() == h.mesh;
      });
  m.attr("EXIT_REPLICA_LOST") = kExitReplicaLost;
}

py::object CurrentElastic() {
  ElasticMesh* el = VeDeviceMesh::Instance().elastic();
  if (el == nullptr) return py::none();
  return py::cast(ElasticHandle{el, ReplicaDim()});
}

}  // namespace vemesh::python
