"""vemesh.checkpoint: sharded checkpoints of state dicts that load onto any mesh.

torch.distributed.checkpoint's names over vemesh's C++ checkpoint
(vemesh/checkpoint/, docs/USER_GUIDE.md "Checkpoints"): every rank saves the
pieces it holds, and another job (another mesh, world size or sharding)
loads them, each rank reading only the bytes it needs, bit-identical::

    import vemesh.checkpoint as vc

    mesh = vemesh.init_device_mesh("cpu", (2, 4), mesh_dim_names=("dp", "fsdp"))
    r = mesh.get_local_rank("fsdp")
    state = {
        "w": vc.Shard(w_rows, global_shape=(16, 12), offsets=(4 * r, 0)),
        "flat": vc.FlatShard(chunk, global_shape=(16, 12), offset=48 * r),
        "b": bias,          # a whole tensor (replicas are written once)
        "step": 100,        # Python numbers: 0-d tensors in the checkpoint
    }
    vc.save(state, checkpoint_id="/ckpt", process_group=mesh, step=100)

    # Another job, another decomposition: fills the tensors in place.
    want = {"w": vc.Shard(w_cols, global_shape=(16, 12), offsets=(0, 6 * r)),
            "b": torch.empty(12), "step": 0}
    info = vc.load(want, checkpoint_id="/ckpt", process_group=mesh4)
    info.step, info.metadata, want["step"]          # 100, {...}, 100

The values of a state dict (nested dicts are flattened, keys joined by "."):

- a torch CPU tensor or numpy array: the whole tensor (its shape is the
  global shape). Every rank that holds it adds the same; Save writes it once.
- ``Shard(tensor, global_shape, offsets)``: this rank holds the box of the
  global tensor at ``offsets`` whose lengths are ``tensor.shape`` (row or
  column shards, tensor parallelism; C++ ``StateDict::Add``).
- ``FlatShard(tensor, global_shape, offset)``: this rank holds elements
  ``[offset, offset + tensor.numel())`` of the row-major flattened global
  tensor (FSDP and ZeRO flat shards; C++ ``FlatRangeToBoxes``).
- a list of ``Shard`` and ``FlatShard``: several pieces of one tensor that
  this rank holds (they must not overlap).
- a Python ``int``, ``float`` or ``bool`` (or numpy scalar): a 0-d tensor;
  ``load`` replaces it in the dict (numbers are not filled in place).

dtypes: float32, float64, bfloat16, float16, int64, int32, uint8 (and bool,
stored as uint8). Tensors that are not contiguous, or on a GPU, are copied to
host memory for the call (``load`` copies the result back).

``save``, ``load`` and ``load_full`` are collective over ``process_group``:
a ``vemesh.DeviceMesh`` (all its ranks; an N-D mesh is flattened, a cached
collective), a ``vemesh.Communicator`` (MPI or Gloo, not NCCL), an object
with a ``_vemesh_communicator()`` method (vemesh.torch's ProcessGroups), or
None: the registry's mesh (``VESCALE_DEVICE_MESH``). Bad input on any rank (a
value of another type, another dtype or shape than the checkpoint's, a
missing, truncated or corrupted file) is the same exception on every rank,
its message naming the rank, the tensor and the file: ``ValueError`` for bad
arguments, ``KeyError`` for a missing checkpoint or tensor, ``vemesh.Error``
(``.code``: ``FAILED_PRECONDITION`` for another shape or dtype, ``DATA_LOSS``
for a damaged file) otherwise. The format (safetensors shards and a JSON
manifest) is the C++ library's: C++ programs (examples/train_nd) and Python
read each other's checkpoints.
"""

import collections
import dataclasses
import os
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

import numpy as np

from . import _C

__all__ = [
    "Shard", "FlatShard", "LoadInfo", "TensorInfo", "Metadata", "save", "load",
    "load_full", "read_metadata", "latest_step", "AsyncSaver",
]

_checkpoint = _C._checkpoint


class Shard:
    """A box of a global tensor that this rank holds: ``tensor`` is the part
    at ``offsets`` (one per dimension) whose lengths are ``tensor.shape``."""

    __slots__ = ("tensor", "global_shape", "offsets")

    def __init__(self, tensor, global_shape: Sequence[int],
                 offsets: Sequence[int]):
        self.tensor = tensor
        self.global_shape = tuple(int(n) for n in global_shape)
        self.offsets = tuple(int(n) for n in offsets)

    def __repr__(self):
        return (f"Shard({_describe(self.tensor)}, global_shape="
                f"{self.global_shape}, offsets={self.offsets})")


class FlatShard:
    """A flat run of a global tensor that this rank holds: ``tensor`` (any
    shape, read row-major) is elements ``[offset, offset + tensor's numel)``
    of the row-major flattened tensor of ``global_shape``."""

    __slots__ = ("tensor", "global_shape", "offset")

    def __init__(self, tensor, global_shape: Sequence[int], offset: int):
        self.tensor = tensor
        self.global_shape = tuple(int(n) for n in global_shape)
        self.offset = int(offset)

    def __repr__(self):
        return (f"FlatShard({_describe(self.tensor)}, global_shape="
                f"{self.global_shape}, offset={self.offset})")


LoadInfo = collections.namedtuple(
    "LoadInfo", ["step", "path", "metadata", "job", "mesh"], defaults=("", ""))
LoadInfo.__doc__ = ("What load read: the checkpoint's step, its step "
                    "directory, its metadata (a dict of str), the job that "
                    "saved it and the saving mesh as described (\"\" when "
                    "not named).")


@dataclasses.dataclass(frozen=True)
class TensorInfo:
    """One tensor of a checkpoint: its safetensors dtype name ("F32", ...),
    global shape, the bytes its saved pieces hold and the pieces (dicts of
    offsets, lengths, file, offset, length)."""
    dtype: str
    shape: Tuple[int, ...]
    bytes: int
    pieces: Tuple[dict, ...]


@dataclasses.dataclass(frozen=True)
class Metadata:
    """What a checkpoint holds, without its data (read_metadata)."""
    step: int
    path: str
    world_size: int
    metadata: Dict[str, str]
    tensors: Dict[str, TensorInfo]
    files: Dict[str, int]  # shard file name -> size in bytes


# -- process groups ----------------------------------------------------------


def _communicator(process_group):
    """The vemesh.Communicator a save or load runs over."""
    if process_group is None:
        reg = _C.VESCALE_DEVICE_MESH
        if not reg.is_initialized():
            raise ValueError(
                "process_group: None and VESCALE_DEVICE_MESH is not "
                "initialized; pass process_group= (a vemesh.DeviceMesh or "
                "Communicator holding every rank that saves or loads)")
        process_group = reg.get()
    if isinstance(process_group, _C.Communicator):
        return process_group
    if isinstance(process_group, _C.DeviceMesh):
        if process_group.ndim == 1:
            return process_group.get_group()
        return process_group.flatten().get_group()
    hook = getattr(process_group, "_vemesh_communicator", None)
    if callable(hook):
        return _communicator(hook())
    raise TypeError(
        f"process_group: expected a vemesh.DeviceMesh, vemesh.Communicator, "
        f"a vemesh.torch ProcessGroup or None, got "
        f"{type(process_group).__name__}")


# -- state dicts to entries --------------------------------------------------


def _is_torch_tensor(x) -> bool:
    return (type(x).__module__.split(".")[0] == "torch"
            and hasattr(x, "detach") and hasattr(x, "__dlpack__"))


def _describe(x) -> str:
    if _is_torch_tensor(x):
        return f"torch.Tensor({x.dtype}, {tuple(x.shape)}, {x.device})"
    if isinstance(x, np.ndarray):
        return f"numpy.ndarray({x.dtype}, {x.shape})"
    return type(x).__name__


def _flatten(state_dict: Mapping, prefix: str = ""):
    """(name, container, key, value) per leaf, nested dicts joined by '.'."""
    for key, value in state_dict.items():
        if not isinstance(key, str):
            raise TypeError(f"state_dict key {key!r} under '{prefix}' is a "
                            f"{type(key).__name__}; keys must be str")
        name = prefix + key
        if isinstance(value, Mapping):
            yield from _flatten(value, name + ".")
        else:
            yield name, state_dict, key, value


class _Staged:
    """One array handed to C++, and how a load's result gets back to the
    caller's object when the array is a staging copy."""

    __slots__ = ("array", "shape", "writeback")

    def __init__(self, array, shape, writeback=None):
        self.array = array
        self.shape = tuple(int(n) for n in shape)
        self.writeback = writeback


def _stage_torch(t, for_load: bool) -> _Staged:
    import torch
    t = t.detach()  # shares the memory; torch refuses DLPack on grad tensors
    wanted = torch.uint8 if t.dtype == torch.bool else t.dtype
    if t.device.type == "cpu" and t.is_contiguous() and wanted == t.dtype:
        return _Staged(t, t.shape)
    copy = t.to(device="cpu", dtype=wanted,
                memory_format=torch.contiguous_format, copy=True)
    return _Staged(copy, t.shape, (lambda: t.copy_(copy)) if for_load else None)


def _stage_numpy(a: np.ndarray, name: str, for_load: bool) -> _Staged:
    if for_load and not a.flags.writeable:
        raise ValueError(f"tensor '{name}': the array is read-only; load "
                         "writes into it in place")
    if a.dtype == np.bool_:
        copy = a.astype(np.uint8)
        back = (lambda: np.copyto(a, copy.astype(np.bool_))) if for_load else None
        return _Staged(copy, a.shape, back)
    if a.flags.c_contiguous:
        return _Staged(a, a.shape)
    copy = np.ascontiguousarray(a)
    return _Staged(copy, a.shape, (lambda: np.copyto(a, copy)) if for_load else None)


def _stage_array(x, name: str, for_load: bool) -> _Staged:
    if _is_torch_tensor(x):
        return _stage_torch(x, for_load)
    if isinstance(x, np.ndarray):
        return _stage_numpy(x, name, for_load)
    raise TypeError(f"tensor '{name}': {type(x).__name__} is not a torch "
                    "tensor or numpy array")


def _stage_number(container, key, value, name: str, for_load: bool) -> _Staged:
    if isinstance(value, (bool, np.bool_)):
        array = np.array(value, dtype=np.uint8)
        kind = bool
    elif isinstance(value, np.generic):
        array = np.array(value)
        kind = type(value)
    elif isinstance(value, int):
        array = np.array(value, dtype=np.int64)
        kind = int
    else:
        array = np.array(value, dtype=np.float64)
        kind = float
    back = None
    if for_load:
        def back():
            container[key] = kind(array[()])
    return _Staged(array, (), back)


_NUMBERS = (bool, int, float, np.bool_, np.integer, np.floating)


def _piece_entry(name: str, piece, s: _Staged):
    if isinstance(piece, Shard):
        return (name, s.array, list(piece.global_shape), list(piece.offsets),
                list(s.shape), None)
    return (name, s.array, list(piece.global_shape), None, None, piece.offset)


def _entries(state_dict: Mapping, for_load: bool):
    """The C++ entries of `state_dict` and the write-backs a load runs."""
    if not isinstance(state_dict, Mapping):
        raise TypeError(f"state_dict: expected a dict, got "
                        f"{type(state_dict).__name__}")
    entries, writebacks = [], []
    for name, container, key, value in _flatten(state_dict):
        pieces = value if isinstance(value, (list, tuple)) else None
        if pieces is not None:
            for i, piece in enumerate(pieces):
                if not isinstance(piece, (Shard, FlatShard)):
                    raise TypeError(
                        f"tensor '{name}': item {i} of its list is a "
                        f"{type(piece).__name__}; a list holds this rank's "
                        "Shard and FlatShard pieces of one tensor")
                s = _stage_array(piece.tensor, name, for_load)
                entries.append(_piece_entry(name, piece, s))
                if s.writeback is not None:
                    writebacks.append(s.writeback)
            continue
        if isinstance(value, (Shard, FlatShard)):
            s = _stage_array(value.tensor, name, for_load)
            entry = _piece_entry(name, value, s)
        elif isinstance(value, _NUMBERS):
            s = _stage_number(container, key, value, name, for_load)
            entry = (name, s.array, [], [], [], None)
        else:
            s = _stage_array(value, name, for_load)
            entry = (name, s.array, list(s.shape), [0] * len(s.shape),
                     list(s.shape), None)
        entries.append(entry)
        if s.writeback is not None:
            writebacks.append(s.writeback)
    return entries, writebacks


def _error(e: BaseException) -> Tuple[str, str]:
    """(absl code name, message) of an exception found before a collective
    call, which C++ agrees on with the other ranks and raises everywhere as
    the same exception type."""
    if isinstance(e, KeyError):
        return "NOT_FOUND", str(e.args[0]) if e.args else str(e)
    if isinstance(e, _C.Error):
        return getattr(e, "code", "UNKNOWN"), getattr(e, "message", str(e))
    if isinstance(e, (ValueError, TypeError)):
        return "INVALID_ARGUMENT", str(e)
    return "INVALID_ARGUMENT", f"{type(e).__name__}: {e}"


def _checkpoint_dir(checkpoint_id) -> str:
    if not isinstance(checkpoint_id, (str, os.PathLike)):
        raise TypeError(f"checkpoint_id: expected a directory path (str or "
                        f"os.PathLike), got {type(checkpoint_id).__name__}")
    path = os.fspath(checkpoint_id)
    if isinstance(path, bytes):
        path = os.fsdecode(path)
    if not path:
        raise ValueError("checkpoint_id: empty path")
    return path


# -- the calls ---------------------------------------------------------------


def save(state_dict: Mapping, *, checkpoint_id, process_group=None,
         step: int = 0, metadata: Optional[Mapping[str, str]] = None,
         keep_last: int = 2, job: str = "", mesh: str = "") -> None:
    """Collective: every rank saves what its ``state_dict`` holds into the
    directory ``checkpoint_id`` (``<dir>/step-<step>/``: a safetensors shard
    per rank and ``manifest.json``, the commit point; ``<dir>/latest`` names
    it). Pieces several ranks hold are written once. ``metadata`` (str to
    str, rank 0's) is kept in the manifest; the newest ``keep_last`` steps
    are kept. Saving a step again writes ``step-<S>.1``: the old one stays
    loadable until the new one is committed.

    ``job`` (printable ASCII, at most 255 bytes) names the job saving: one
    directory, one job (the first named save claims ``<dir>/owner``; another
    job's save there is refused naming both, and a save naming no job goes
    only into an unowned directory). ``mesh`` describes the saving mesh
    ("DP=2,TP=4") for ``vemesh checkpoint inspect``."""
    _save(state_dict, checkpoint_id, process_group, step, metadata, keep_last,
          job=job, mesh=mesh)


def _text_option(name: str, value) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{name}: expected a str, got {type(value).__name__}")
    return value


def _save(state_dict, checkpoint_id, process_group, step, metadata, keep_last,
          error: Optional[BaseException] = None, *, job: str = "",
          mesh: str = ""):
    """save, with an `error` found by the caller (vemesh.torch.checkpoint)
    that is raised on every rank instead."""
    path = _checkpoint_dir(checkpoint_id)
    job, mesh = _text_option("job", job), _text_option("mesh", mesh)
    group = _communicator(process_group)
    entries, meta, err = _save_arguments(state_dict, step, metadata,
                                         keep_last, error)
    _checkpoint.save(entries, path, group, int(step), keep_last, meta,
                     job=job, mesh=mesh, error=err)


class AsyncSaver:
    """Saves in the background (C++ vemesh/checkpoint/async_saver.h).

    ``start(state_dict, checkpoint_id=..., step=...)`` (collective over
    ``process_group``, like ``save``) commits the save in flight if any,
    then copies this rank's pieces and returns: the tensors may change at
    once. A thread writes and fsyncs this rank's shard file while training
    goes on; ``wait()`` (or the next ``start``) commits it over
    ``process_group`` itself (every rank's file durable, then rank 0's
    manifest, then ``latest``): a save not waited for is not a checkpoint,
    and a job killed meanwhile restarts from the previous one. Call start
    and wait on the thread that uses the group, with none of its
    operations in flight (the writer thread never communicates; an elastic
    mesh's groups cannot be split off). Errors are raised on every rank by
    the call that finds them.
    """

    def __init__(self, process_group=None):
        self._group = _communicator(process_group)
        self._saver = _checkpoint.AsyncSaver(self._group)

    @property
    def in_flight(self) -> bool:
        """A save was started and not yet committed."""
        return self._saver.in_flight

    def start(self, state_dict: Mapping, *, checkpoint_id, step: int = 0,
              metadata: Optional[Mapping[str, str]] = None,
              keep_last: int = 2, job: str = "", mesh: str = "") -> None:
        """``save``'s arguments (``job`` and ``mesh`` as there)."""
        self._start(state_dict, checkpoint_id, step, metadata, keep_last,
                    job=job, mesh=mesh)

    def _start(self, state_dict, checkpoint_id, step, metadata, keep_last,
               error: Optional[BaseException] = None, *, job: str = "",
               mesh: str = ""):
        path = _checkpoint_dir(checkpoint_id)
        job, mesh = _text_option("job", job), _text_option("mesh", mesh)
        entries, meta, err = _save_arguments(state_dict, step, metadata,
                                             keep_last, error)
        self._saver.start(entries, path, int(step), keep_last, meta, job=job,
                          mesh=mesh, error=err)

    def wait(self) -> None:
        """Commits the save in flight (collective); nothing if none."""
        self._saver.wait()


def _save_arguments(state_dict, step, metadata, keep_last, error):
    """(entries, metadata, error) as the C++ save takes them; an error found
    here is agreed with the other ranks there."""
    if isinstance(step, bool) or not isinstance(step, (int, np.integer)):
        raise TypeError(f"step: expected an int, got {type(step).__name__}")
    if isinstance(keep_last, bool) or not isinstance(keep_last, int) or keep_last < 1:
        raise ValueError(f"keep_last: {keep_last!r}; expected an int >= 1")
    if error is not None:
        return [], {}, _error(error)
    err, entries, meta = None, [], {}
    try:
        entries, _ = _entries(state_dict, for_load=False)
        for k, v in (metadata or {}).items():
            if not isinstance(k, str) or not isinstance(v, str):
                raise TypeError(f"metadata: {k!r}: {v!r}; keys and values "
                                "must be str")
            meta[k] = v
    except Exception as e:  # noqa: BLE001  (raised on every rank in C++)
        err = _error(e)
    return entries, meta, err


def load(state_dict: Mapping, *, checkpoint_id, process_group=None,
         step: Optional[int] = None, job: str = "") -> LoadInfo:
    """Collective: fills every tensor of ``state_dict`` (whole, ``Shard`` or
    ``FlatShard``, as described there) in place from the checkpoint in
    ``checkpoint_id`` (the one ``latest`` names, or the newest of ``step``),
    whatever mesh and sharding saved it; Python numbers in the dict are
    replaced. Every element must be covered by the saved pieces, and every
    tensor must have the checkpoint's dtype and global shape. Returns the
    checkpoint's step, directory, metadata, job and mesh. Given ``job``,
    the checkpoint must have been saved by that job (an error naming both
    jobs otherwise)."""
    return _load(state_dict, checkpoint_id, process_group, step, job=job)


def _load(state_dict, checkpoint_id, process_group, step,
          error: Optional[BaseException] = None, *,
          job: str = "") -> LoadInfo:
    """load, with an `error` found by the caller, raised on every rank."""
    path = _checkpoint_dir(checkpoint_id)
    job = _text_option("job", job)
    group = _communicator(process_group)
    if step is not None and (isinstance(step, bool)
                             or not isinstance(step, (int, np.integer))):
        raise TypeError(f"step: expected an int or None, got "
                        f"{type(step).__name__}")
    entries, writebacks = [], []
    if error is None:
        try:
            entries, writebacks = _entries(state_dict, for_load=True)
        except Exception as e:  # noqa: BLE001  (raised on every rank below)
            error = e
    if error is not None:
        error = _error(error)
    r = _checkpoint.load(entries, path, group,
                         None if step is None else int(step), job=job,
                         error=error)
    for back in writebacks:
        back()
    return LoadInfo(r["step"], r["path"], dict(r["metadata"]), r["job"],
                    r["mesh"])


def read_metadata(checkpoint_id, *, step: Optional[int] = None) -> Metadata:
    """Not collective: what the checkpoint ``load`` would read holds (tensor
    names, dtypes, global shapes, saved pieces; step and metadata), from its
    manifest alone (read bounded: 256 MiB at most). KeyError when the
    directory holds no committed checkpoint."""
    m = _checkpoint.read_manifest(_checkpoint_dir(checkpoint_id), step)
    tensors = {
        name: TensorInfo(t["dtype"], tuple(t["shape"]), int(t["bytes"]),
                         tuple(t["pieces"]))
        for name, t in m["tensors"].items()
    }
    return Metadata(m["step"], m["path"], m["world_size"], dict(m["metadata"]),
                    tensors, dict(m["files"]))


def latest_step(checkpoint_id) -> Optional[int]:
    """Not collective: the step ``load`` would read, or None when the
    directory holds no committed checkpoint."""
    return _checkpoint.latest_step(_checkpoint_dir(checkpoint_id))


_NUMPY_DTYPES = {"F32": np.float32, "F64": np.float64, "F16": np.float16,
                 "I64": np.int64, "I32": np.int32, "U8": np.uint8}
_ITEMSIZE = {"F32": 4, "F64": 8, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "U8": 1}


def load_full(checkpoint_id, *, names: Optional[Sequence[str]] = None,
              process_group=None, step: Optional[int] = None
              ) -> Tuple[Dict[str, Any], LoadInfo]:
    """Collective: whole tensors (``names``, default all) of the checkpoint on
    every rank, as new numpy arrays (BF16 ones as torch tensors: numpy has
    no bfloat16), with the LoadInfo. What is allocated is bounded by the
    files: a tensor whose saved pieces hold fewer bytes than its shape needs
    is refused before any memory is spent."""
    path = _checkpoint_dir(checkpoint_id)
    group = _communicator(process_group)
    error, out, entries = None, {}, []
    try:
        meta = read_metadata(path, step=step)
        for name in (meta.tensors if names is None else names):
            if name not in meta.tensors:
                raise KeyError(f"tensor '{name}' is not in checkpoint "
                               f"'{meta.path}'")
            t = meta.tensors[name]
            need = int(np.prod(t.shape, dtype=np.float64)) * _ITEMSIZE[t.dtype]
            if need > t.bytes:
                raise ValueError(
                    f"tensor '{name}': {t.dtype} {list(t.shape)} needs {need} "
                    f"bytes but checkpoint '{meta.path}' holds {t.bytes} of "
                    f"it; not allocating")
            if t.dtype == "BF16":
                import torch
                out[name] = torch.empty(t.shape, dtype=torch.bfloat16)
            else:
                out[name] = np.empty(t.shape, dtype=_NUMPY_DTYPES[t.dtype])
        entries, _ = _entries(out, for_load=True)
        step = meta.step
    except Exception as e:  # noqa: BLE001  (raised on every rank below)
        error = _error(e)
    r = _checkpoint.load(entries, path, group, step, error=error)
    return out, LoadInfo(r["step"], r["path"], dict(r["metadata"]), r["job"],
                         r["mesh"])
