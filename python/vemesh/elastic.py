"""vemesh.elastic: a replicate dimension that shrinks and grows under a Python training loop.

The C++ elastic mesh (vemesh/elastic/elastic_mesh.h, docs/ELASTIC.md) from
Python, in the shape of torchft's Manager: each replica is its own launch
(torchrun or mpirun), the replicas meet through a Redis, a lost replica ends
the step on every member, the survivors go on with one replica fewer, and a
replica launched again receives the training state from a live one before any
step commits::

    import vemesh
    from vemesh import VESCALE_DEVICE_MESH

    vemesh.init_device_mesh("cpu", (3, 2), mesh_dim_names=("DP_REPLICATE", "DP_SHARD"),
        elastic=vemesh.ElasticOptions(store="redis://10.0.0.5:6379", replica=k,
                                      replica_dim="DP_REPLICATE"))
    el = VESCALE_DEVICE_MESH.elastic()              # this module's ElasticMesh
    progress = {"step": el.last_recovery.resume_step}
    el.register_state_dict_fn("model", model.state_dict, model.load_state_dict)
    el.register_state_dict_fn("optim", opt.state_dict, opt.load_state_dict)
    el.register_state_dict_fn("progress", lambda: progress, progress.update)
    el.sync_state()                                 # a joiner receives the state here
    replicate = el.get_group("DP_REPLICATE")        # the same object in every epoch
    while progress["step"] < steps:
        try:
            train_step(progress["step"])            # DP_SHARD ops before DP_REPLICATE ops
            error = None
        except Exception as e:                      # a lost replica, or a bug
            error = e
        v = el.end_step(error)                      # collective: the same verdict everywhere
        if v.committed:
            opt.step(); progress["step"] += 1
        if v.recover:
            r = el.recover(progress["step"])        # raises the job's end, if any
            print(r)                                # the recovery record
            if r.evicted:
                break

docs/TORCH.md ("Fault tolerance for torch models") explains each line.

State. ``register_state_dict_fn(name, state_dict, load_state_dict)`` takes
torchft's pair: ``state_dict()`` returns a (nested) dict, list or tuple of
torch tensors, numpy arrays, numbers, strings, bytes and None, or ``bytes``
as is; the library serialises it (``encode``: a canonical byte form, so equal
states have equal fingerprints), sends it to the replicas that lack it and
calls their ``load_state_dict`` with the decoded value (torch tensors come
back as CPU torch tensors, numpy arrays as numpy arrays). ``register_state_bytes``
registers a fixed-size CPU buffer (a numpy array or torch CPU tensor,
C-contiguous) that is sent from and received into in place.

Threads and the GIL. ``end_step``, ``recover`` and ``sync_state`` release the
GIL while they communicate; the state callbacks are called on the same thread,
inside those calls (``end_step`` only for the periodic fingerprint,
``ElasticOptions.fingerprint_every``), with the GIL taken back for each call.
Nothing calls into Python from another thread. So a callback must not wait for
another Python thread that waits on the training thread, and must not call the
elastic mesh itself.

Errors. A step's exception is passed to ``end_step``; a lost member
(``vemesh.Error`` with code ``UNAVAILABLE`` or ``ABORTED``, ``TimeoutError``)
sends the survivors into recovery. Any other exception (a bug, a shape error)
is retried through ``ElasticOptions.max_step_retries`` recoveries, then
``recover`` raises on every rank (``vemesh.Error`` naming the replica and the
code), chained (``__cause__``) to this rank's own exception when it had one.
States that differ across replicas raise ``vemesh.Error`` with code
``DATA_LOSS`` naming the replicas and their fingerprints.
"""

import io
import struct
import sys
from typing import Any, Callable, Optional

import numpy as np

from . import _C

__all__ = [
    "ElasticMesh", "ElasticOptions", "Recovery", "StepVerdict", "encode",
    "decode", "status_of", "get",
]

ElasticOptions = _C.ElasticOptions
Recovery = _C.Recovery
StepVerdict = _C.StepVerdict

# The codes that mean a member was lost (the elastic mesh's own rule).
_MEMBERSHIP_CODES = ("UNAVAILABLE", "ABORTED", "DEADLINE_EXCEEDED")


def status_of(error: Optional[BaseException]):
    """A step's exception as the (code, message) end_step takes; None for none.

    ``vemesh.Error`` keeps its ``code``; ``TimeoutError`` is DEADLINE_EXCEEDED,
    ``ValueError`` INVALID_ARGUMENT, ``KeyError`` NOT_FOUND; anything else is
    INTERNAL (not a lost member: retried, then the job's end)."""
    if error is None:
        return None
    text = f"{type(error).__name__}: {error}"
    if isinstance(error, _C.Error):
        return (getattr(error, "code", "UNKNOWN") or "UNKNOWN", text)
    if isinstance(error, TimeoutError):
        return ("DEADLINE_EXCEEDED", text)
    if isinstance(error, ValueError):
        return ("INVALID_ARGUMENT", text)
    if isinstance(error, KeyError):
        return ("NOT_FOUND", text)
    return ("INTERNAL", text)


# --- The state's byte form --------------------------------------------------
#
# One tag byte per value, then its payload (little endian): canonical, so
# two equal states encode to equal bytes (the fingerprint compares bytes).
# Dicts keep their order (torch's state dicts are ordered the same on every
# replica); tensors carry dtype and shape.

_I64 = struct.Struct("<q")
_F64 = struct.Struct("<d")


def _put_str(out, s: str):
    b = s.encode("utf-8")
    out.write(_I64.pack(len(b)))
    out.write(b)


def _torch():
    return sys.modules.get("torch")


def _encode(out, v):
    torch = _torch()
    if v is None:
        out.write(b"N")
    elif v is True or v is False:
        out.write(b"T" if v else b"F")
    elif isinstance(v, (int, np.integer)) and not isinstance(v, bool):
        out.write(b"i")
        _put_str(out, str(int(v)))
    elif isinstance(v, (float, np.floating)):
        out.write(b"f")
        out.write(_F64.pack(float(v)))
    elif isinstance(v, str):
        out.write(b"s")
        _put_str(out, v)
    elif isinstance(v, (bytes, bytearray)):
        out.write(b"b")
        out.write(_I64.pack(len(v)))
        out.write(bytes(v))
    elif torch is not None and isinstance(v, torch.Tensor):
        t = v.detach().to("cpu").contiguous()
        dtype = str(t.dtype).replace("torch.", "")
        if t.dtype == torch.bfloat16:
            raw = t.view(torch.int16).numpy().tobytes()
        else:
            raw = t.numpy().tobytes()
        out.write(b"P")
        _put_str(out, dtype)
        out.write(_I64.pack(t.dim()))
        for d in t.shape:
            out.write(_I64.pack(d))
        out.write(_I64.pack(len(raw)))
        out.write(raw)
    elif isinstance(v, np.ndarray):
        a = np.ascontiguousarray(v)
        out.write(b"A")
        _put_str(out, a.dtype.str)
        out.write(_I64.pack(a.ndim))
        for d in a.shape:
            out.write(_I64.pack(d))
        raw = a.tobytes()
        out.write(_I64.pack(len(raw)))
        out.write(raw)
    elif isinstance(v, dict):
        out.write(b"d")
        out.write(_I64.pack(len(v)))
        for k, x in v.items():
            _encode(out, k)
            _encode(out, x)
    elif isinstance(v, (list, tuple)):
        out.write(b"l" if isinstance(v, list) else b"t")
        out.write(_I64.pack(len(v)))
        for x in v:
            _encode(out, x)
    else:
        raise TypeError(
            f"state value of type {type(v).__name__} cannot be carried: expected "
            "a torch tensor, numpy array, number, str, bytes, None, or a dict, "
            "list or tuple of them")


def encode(state: Any) -> bytes:
    """The canonical bytes of a state value (see the module's docstring)."""
    out = io.BytesIO()
    _encode(out, state)
    return out.getvalue()


class _Reader:
    def __init__(self, data: bytes):
        self.data = memoryview(data)
        self.at = 0

    def take(self, n: int) -> memoryview:
        if n < 0 or self.at + n > len(self.data):
            raise ValueError(f"state bytes truncated at offset {self.at} "
                             f"(wanted {n} more of {len(self.data)})")
        b = self.data[self.at:self.at + n]
        self.at += n
        return b

    def i64(self) -> int:
        return _I64.unpack(self.take(8))[0]

    def str(self) -> str:
        return bytes(self.take(self.i64())).decode("utf-8")


def _decode(r: _Reader):
    tag = bytes(r.take(1))
    if tag == b"N":
        return None
    if tag in (b"T", b"F"):
        return tag == b"T"
    if tag == b"i":
        return int(r.str())
    if tag == b"f":
        return _F64.unpack(r.take(8))[0]
    if tag == b"s":
        return r.str()
    if tag == b"b":
        return bytes(r.take(r.i64()))
    if tag in (b"P", b"A"):
        dtype = r.str()
        shape = tuple(r.i64() for _ in range(r.i64()))
        raw = r.take(r.i64())
        if tag == b"A":
            return np.frombuffer(raw, dtype=np.dtype(dtype)).copy().reshape(shape)
        import torch  # a torch tensor was sent: torch is the caller's
        if dtype == "bfloat16":
            a = np.frombuffer(raw, dtype=np.int16).copy()
            return torch.from_numpy(a).view(torch.bfloat16).reshape(shape)
        if dtype not in _NP_OF:
            raise ValueError(f"state bytes: torch dtype {dtype} is not carried")
        a = np.frombuffer(raw, dtype=_NP_OF[dtype]).copy()
        return torch.from_numpy(a).reshape(shape)
    if tag == b"d":
        n = r.i64()
        out = {}
        for _ in range(n):
            k = _decode(r)
            out[k] = _decode(r)
        return out
    if tag in (b"l", b"t"):
        items = [_decode(r) for _ in range(r.i64())]
        return items if tag == b"l" else tuple(items)
    raise ValueError(f"state bytes: unknown tag {tag!r} at offset {r.at - 1}")


# torch dtype name -> numpy dtype (the ones numpy has).
_NP_OF = {
    "float64": np.float64, "float32": np.float32, "float16": np.float16,
    "int64": np.int64, "int32": np.int32, "int16": np.int16, "int8": np.int8,
    "uint8": np.uint8, "bool": np.bool_, "complex64": np.complex64, "complex128": np.complex128,
}


def decode(data: bytes) -> Any:
    """The value ``encode`` made (tensors are fresh CPU copies)."""
    r = _Reader(data)
    v = _decode(r)
    if r.at != len(r.data):
        raise ValueError(f"state bytes: {len(r.data) - r.at} bytes left over")
    return v


# --- The mesh ----------------------------------------------------------------


class ElasticMesh:
    """The registry's elastic mesh: ``VESCALE_DEVICE_MESH.elastic()``.

    Valid until ``VESCALE_DEVICE_MESH.reset()`` or another init_device_mesh
    (then every call raises ``vemesh.Error`` FAILED_PRECONDITION)."""

    def __init__(self, handle):
        self._h = handle
        # This rank's last step exception that was not a lost member: the
        # cause of the job's end if recover() ends it.
        self._step_error: Optional[BaseException] = None

    # State (torchft's Manager.register_state_dict_fn).
    def register_state_dict_fn(self, name: str, state_dict: Callable[[], Any],
                               load_state_dict: Callable[[Any], Any]) -> None:
        """Registers entry ``name``: ``state_dict()`` gives its value (a state
        dict, or bytes), ``load_state_dict(value)`` replaces it. The same names
        on every rank, before ``sync_state``."""
        if not callable(state_dict) or not callable(load_state_dict):
            raise TypeError(f"state '{name}': state_dict and load_state_dict "
                            "must be callables")

        def save() -> bytes:
            v = state_dict()
            if isinstance(v, (bytes, bytearray, memoryview)):
                return b"B" + bytes(v)
            return b"E" + encode(v)

        def load(data: bytes) -> None:
            if data[:1] == b"B":
                load_state_dict(data[1:])
            else:
                load_state_dict(decode(data[1:]))

        self._h.register_state_dict_fn(name, save, load)

    def register_state_bytes(self, name: str, buffer: Callable[[], Any]) -> None:
        """Registers entry ``name`` as the live bytes of ``buffer()`` (a numpy
        array or torch CPU tensor, C-contiguous, the same size on every
        replica): sent from, received into and fingerprinted in place."""
        self._h.register_state_bytes(name, buffer)

    def sync_state(self) -> None:
        """Collective, once after registering: a joiner receives the state
        here; every rank compares the state fingerprints."""
        self._h.sync_state()

    # The loop.
    def end_step(self, error: Optional[BaseException] = None) -> StepVerdict:
        """Collective over the job, once per step: this rank's step exception
        (None if it succeeded) -> the verdict (``committed``, ``recover``)."""
        status = status_of(error)
        if status is not None and status[0] not in _MEMBERSHIP_CODES:
            self._step_error = error
        verdict = self._h.end_step(status)
        if verdict.committed:
            self._step_error = None  # the failures in a row are over
        return verdict

    def recover(self, committed_steps: int) -> Recovery:
        """Collective over the survivors: the next epoch (the state carried to
        the members that lack it). Raises when the job must end (a failure
        that is not a lost member, max_step_retries times in a row; the store
        lost; too few replicas), chained to this rank's own step exception."""
        try:
            r = self._h.recover(int(committed_steps))
        except Exception as e:
            cause, self._step_error = self._step_error, None
            if cause is not None and e.__cause__ is None:
                raise e from cause
            raise
        return r

    # What the mesh is now.
    @property
    def last_recovery(self) -> Recovery:
        return self._h.last_recovery()

    @property
    def epoch(self) -> int:
        return self._h.epoch()

    @property
    def replica(self) -> int:
        return self._h.replica()

    @property
    def has_state(self) -> bool:
        return self._h.has_state()

    def mark_stateless(self) -> None:
        self._h.mark_stateless()

    @property
    def replicate_dim(self) -> str:
        """The elastic dimension's name (ElasticOptions.replica_dim)."""
        return self._h.replica_dim()

    @property
    def mesh(self):
        """The current epoch's full mesh (a new object every epoch)."""
        return self._h.mesh()

    def get_group(self, dim: str):
        """The long-lived group of dimension ``dim`` (a vemesh.Communicator):
        the same object in every epoch, reconfigured with each; between a
        failed step and recover() its operations raise UNAVAILABLE."""
        return self._h.mesh().get_group(dim)

    def __repr__(self) -> str:
        if not self._h.is_current():
            return "<vemesh.elastic.ElasticMesh (gone)>"
        return (f"<vemesh.elastic.ElasticMesh replica {self.replica}, "
                f"epoch {self.epoch}, {self.mesh}>")


_current: Optional[ElasticMesh] = None


def get() -> Optional[ElasticMesh]:
    """The elastic mesh of the registry's current init, or None (not
    elastic, not initialised). The same object until the next init."""
    global _current
    if _current is not None and _current._h.is_current():
        return _current
    h = _C.VESCALE_DEVICE_MESH._elastic()
    _current = None if h is None else ElasticMesh(h)
    return _current


# veScale's spelling, as in C++: VESCALE_DEVICE_MESH.elastic().
_C.VeDeviceMesh.elastic = lambda self: get()
