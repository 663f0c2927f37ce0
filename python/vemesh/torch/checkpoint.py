"""vemesh.torch.checkpoint: torch models and optimizers in vemesh checkpoints.

A DDP, FSDP/HSDP, ZeRO or tensor-parallel job saves its model and
``torch.optim`` state with ``vemesh.checkpoint`` (the C++ format: safetensors
shards and a manifest), and a job on another mesh with another strategy loads
it, bit-identical::

    from vemesh.torch import checkpoint as tc

    tc.save(model, optimizer, checkpoint_id="/ckpt", process_group=mesh,
            step=step)                          # DDP: replicas written once
    ...                                         # another job, another mesh:
    info = tc.load(model, optimizer, checkpoint_id="/ckpt",
                   process_group=mesh4, shards=fsdp_shards)
    info.step                                   # the step saved

Names are the serial model's, whatever the parallelism (those
``torch.distributed.checkpoint.state_dict`` gives, and the C++ library's,
vemesh/strategies/state_dict.h, so examples/train_nd's checkpoints read the
same):

- ``<fqn>``: a parameter or persistent buffer (DDP's ``module.`` and the
  wrapper names ``_fsdp_wrapped_module``, ``_checkpoint_wrapped_module`` and
  ``_orig_mod`` left out);
- ``<fqn>.<key>``: the optimizer state of that parameter, ``exp_avg``,
  ``exp_avg_sq`` (Adam, AdamW), ``momentum_buffer`` (SGD), ...: state that
  has the parameter's elements is laid out as the parameter is;
- ``<fqn>.step``: the step count, an int64 scalar (torch keeps it as a float
  tensor; counts are exact); other scalar state is a float64 scalar.

The optimizers' hyperparameters (``lr``, ``betas``, ``weight_decay``...:
the numbers of each param group) are kept in the manifest's metadata as
``torch.optim.<i>.param_groups`` (JSON) and restored by ``load`` when the
optimizer has as many param groups. ``optimizers`` is one optimizer or a
list; optimizer state that does not exist yet (no step taken) is created
before a load (one step at lr 0 on zero gradients, as
torch.distributed.checkpoint does), so that it can be filled in place.

**Sharded parameters: the contract for FSDP, HSDP, ZeRO and TP.** Plain
parameters (one process, DDP: every replica the same) need no description.
A parameter a rank holds only part of is described by ``shards``, a list of
``ParamShard(tensor, pieces, values=True)``:

- ``tensor``: the local tensor the module holds and the optimizer steps (an
  FSDP unit's flat shard, a ZeRO shard of the flattened parameters, a TP
  column block). The optimizer's state of ``tensor`` is cut the same way.
- ``pieces``: which parts of which serial parameters it holds, each a
  ``Piece(name, global_shape, offset, start=0, numel=None)``:

  - flat (``offset`` an int): elements ``[start, start + numel)`` of
    ``tensor`` (row-major; ``numel=None``: to its end) are elements
    ``[offset, offset + numel)`` of the row-major flattened parameter
    ``name`` of ``global_shape``. ``flat_pieces(params, begin, end)`` gives
    the pieces of a rank holding elements ``[begin, end)`` of the
    concatenation of ``params`` (``(name, shape)`` in flattening order;
    padding past the last one is allowed and not saved): FSDP's
    FlatParameter shard, a ZeRO bucket. A row shard of a 2-D weight
    (rows ``r0..r1``) is the flat piece ``offset = r0 * columns``.
  - a box (``offset`` a tuple, one per dimension): ``tensor`` itself, in its
    shape, is the box of ``name`` at those offsets (TP's column or row
    blocks; ``row_piece(name, global_shape, row)`` for rows). One piece per
    tensor, ``start`` 0.

  Ranks that hold the same piece (HSDP's replicas over the first mesh
  dimension) describe it the same; it is written once.
- ``values``: True when ``tensor`` holds the parameter values (FSDP: they
  exist only there; the model's own parameters of those names are skipped).
  False when it is a copy of the model's parameters that only carries the
  optimizer state (ZeRO-1's main shards: values come from the model, whole;
  after a load, refresh the copy from the model).

``tensor`` must be contiguous (flat pieces are views of it, which a load
writes in place). A ``vemesh.torch.fsdp.FullyShardedDataParallel`` model
describes its own shards (its ``flat_shards()``): pass it with no
``shards``. Another FSDP or ZeRO implementation builds this list from its
own flattening (global shapes and offsets) and calls ``save`` / ``load``;
``get_state_dict`` / ``set_state_dict`` give the state dicts themselves (to
add entries, or to save them with ``vemesh.checkpoint.save``).

Errors are those of ``vemesh.checkpoint``, on every rank: a model of another
shape, dtype or with names the checkpoint lacks, a missing or damaged
checkpoint. A bad description (a piece outside its tensor, an optimizer
parameter neither in the model nor in ``shards``) is a ValueError.
"""

import json
import math
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple, Union

import numpy as np
import torch

from .. import checkpoint as _vc

__all__ = ["Piece", "ParamShard", "flat_pieces", "row_piece",
           "get_state_dict", "set_state_dict", "save", "load"]

_WRAPPER_NAMES = ("_fsdp_wrapped_module", "_checkpoint_wrapped_module",
                  "_orig_mod")
_PARAM_GROUPS_KEY = "torch.optim.{}.param_groups"


class Piece(NamedTuple):
    """A part of serial parameter ``name`` held in a local tensor: flat
    (``offset`` an int) or a box (``offset`` a tuple); see the module
    docstring."""
    name: str
    global_shape: Tuple[int, ...]
    offset: Union[int, Tuple[int, ...]]
    start: int = 0
    numel: Optional[int] = None


class ParamShard(NamedTuple):
    """A local tensor (what the module holds and the optimizer steps) and
    the pieces of serial parameters it holds."""
    tensor: torch.Tensor
    pieces: Sequence[Piece]
    values: bool = True


def flat_pieces(params: Sequence[Tuple[str, Sequence[int]]], begin: int,
                end: int) -> List[Piece]:
    """The pieces of a rank holding elements ``[begin, end)`` of the
    row-major concatenation of ``params`` ((name, shape) in order): local
    element 0 is element ``begin``. Elements past the last parameter
    (padding) belong to no piece."""
    if begin < 0 or end < begin:
        raise ValueError(f"flat_pieces: [{begin}, {end}) is not a range")
    pieces, at = [], 0
    for name, shape in params:
        shape = tuple(int(n) for n in shape)
        n = math.prod(shape)
        lo, hi = max(begin, at), min(end, at + n)
        if lo < hi:
            pieces.append(Piece(name, shape, lo - at, lo - begin, hi - lo))
        at += n
    return pieces


def row_piece(name: str, global_shape: Sequence[int], row: int) -> Piece:
    """A box piece: the local tensor is rows ``row..`` of ``name``."""
    shape = tuple(int(n) for n in global_shape)
    return Piece(name, shape, (int(row),) + (0,) * (len(shape) - 1))


# -- naming ------------------------------------------------------------------


def _unwrap(model):
    # DDP (torch's and vemesh.torch's) hold the model as .module.
    while (model is not None and hasattr(model, "module")
           and type(model).__name__ in ("DistributedDataParallel", "DDP")):
        model = model.module
    return model


def _clean(name: str) -> str:
    return ".".join(p for p in name.split(".") if p not in _WRAPPER_NAMES)


def _model_tensors(model) -> Dict[str, torch.Tensor]:
    """Parameters and persistent buffers by serial name (tied ones once)."""
    out: Dict[str, torch.Tensor] = {}
    if model is None:
        return out
    seen = set()
    for name, p in model.named_parameters():
        if id(p) not in seen:
            seen.add(id(p))
            out[_clean(name)] = p
    for mod_name, mod in model.named_modules():
        skip = getattr(mod, "_non_persistent_buffers_set", set())
        for b_name, b in mod._buffers.items():
            if b is None or b_name in skip or id(b) in seen:
                continue
            seen.add(id(b))
            out[_clean(f"{mod_name}.{b_name}" if mod_name else b_name)] = b
    return out


def _optimizers(optimizers) -> List[torch.optim.Optimizer]:
    if optimizers is None:
        return []
    if isinstance(optimizers, torch.optim.Optimizer):
        return [optimizers]
    out = list(optimizers)
    for i, o in enumerate(out):
        if not isinstance(o, torch.optim.Optimizer):
            raise TypeError(f"optimizers[{i}]: expected a torch.optim."
                            f"Optimizer, got {type(o).__name__}")
    return out


def _check_shards(shards) -> List[ParamShard]:
    out = []
    for i, s in enumerate(shards or ()):
        if not isinstance(s, ParamShard):
            raise TypeError(f"shards[{i}]: expected a ParamShard, got "
                            f"{type(s).__name__}")
        t = s.tensor
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"shards[{i}].tensor: expected a torch.Tensor, "
                            f"got {type(t).__name__}")
        if not t.is_contiguous():
            raise ValueError(f"shards[{i}].tensor: {tuple(t.shape)} is not "
                             "contiguous; flat pieces are views of it")
        for j, p in enumerate(s.pieces):
            if not isinstance(p, Piece):
                raise TypeError(f"shards[{i}].pieces[{j}]: expected a Piece, "
                                f"got {type(p).__name__}")
            if isinstance(p.offset, tuple):
                if len(s.pieces) != 1 or p.start != 0 or p.numel not in (
                        None, t.numel()):
                    raise ValueError(
                        f"shards[{i}].pieces[{j}] ('{p.name}'): a box piece "
                        f"is the whole local tensor (one piece, start 0)")
            else:
                n = t.numel() - p.start if p.numel is None else p.numel
                if p.start < 0 or n < 0 or p.start + n > t.numel():
                    raise ValueError(
                        f"shards[{i}].pieces[{j}] ('{p.name}'): elements "
                        f"[{p.start}, {p.start + n}) are outside the local "
                        f"tensor's {t.numel()}")
        out.append(s)
    return out


def _layout(tensor: torch.Tensor, piece: Piece):
    """`tensor` (the shard's tensor or its optimizer state) as the
    vemesh.checkpoint value of `piece`."""
    if isinstance(piece.offset, tuple):
        return _vc.Shard(tensor, piece.global_shape, piece.offset)
    flat = tensor.detach().view(-1)
    n = flat.numel() - piece.start if piece.numel is None else piece.numel
    return _vc.FlatShard(flat[piece.start:piece.start + n], piece.global_shape,
                         piece.offset)


class _Plan:
    """Who holds what: serial names of the model's tensors, of each
    optimizer parameter (with its pieces, or None for a whole one)."""

    def __init__(self, model, optimizers, shards):
        self.model = _unwrap(model)
        self.optimizers = _optimizers(optimizers)
        if not shards and hasattr(self.model, "flat_shards"):
            # vemesh.torch.fsdp describes its own shards: nothing to glue.
            shards = [ParamShard(s.tensor, flat_pieces(s.params, s.begin,
                                                       s.end))
                      for s in self.model.flat_shards()]
        self.shards = _check_shards(shards)
        self.by_id = {id(s.tensor): s for s in self.shards}
        # FSDP's values live in the shards; ZeRO's (values=False) in the model.
        sharded_names = {p.name for s in self.shards if s.values
                         for p in s.pieces}
        self.model_tensors = {
            name: t for name, t in _model_tensors(self.model).items()
            if id(t) not in self.by_id and name not in sharded_names}
        whole = {id(t): name for name, t in self.model_tensors.items()}
        # Per optimizer: [(param, name or None, shard or None)].
        self.params = []
        for i, opt in enumerate(self.optimizers):
            rows = []
            for g, group in enumerate(opt.param_groups):
                for k, p in enumerate(group["params"]):
                    if id(p) in self.by_id:
                        rows.append((p, None, self.by_id[id(p)]))
                    elif id(p) in whole:
                        rows.append((p, whole[id(p)], None))
                    else:
                        raise ValueError(
                            f"optimizers[{i}]: parameter {k} of param group "
                            f"{g} ({tuple(p.shape)}) is neither a parameter "
                            "of the model nor the tensor of one of `shards`")
            self.params.append(rows)


def _put(sd, name, value):
    """Adds a piece; a second piece of one tensor on this rank makes a list."""
    if name not in sd:
        sd[name] = value
    elif isinstance(sd[name], list):
        sd[name].append(value)
    else:
        sd[name] = [sd[name], value]


def _state_entries(opt, param, name, shard, optim_sd):
    """Optimizer state of one parameter into `optim_sd`."""
    state = opt.state.get(param, {})
    names = [name] if shard is None else [p.name for p in shard.pieces]
    if not names:  # a shard of padding only: nothing of the model
        return
    for key, value in state.items():
        if value is None:  # SGD before its first momentum step
            continue
        scalar = (not isinstance(value, torch.Tensor)) or value.dim() == 0
        if scalar:
            number = value.item() if isinstance(value, torch.Tensor) else value
            if key == "step":
                number = int(number)
            elif not isinstance(number, (int, float)):
                raise ValueError(f"optimizer state '{key}' of '{names[0]}' "
                                 f"is a {type(number).__name__}; expected a "
                                 "number")
            else:
                number = float(number)
            for n in names:
                optim_sd[f"{n}.{key}"] = number
            continue
        if value.numel() != param.numel():
            raise ValueError(
                f"optimizer state '{key}' of '{names[0]}' has "
                f"{value.numel()} elements, its parameter {param.numel()}: "
                "only per-element and scalar state is saved")
        if shard is None:
            optim_sd[f"{name}.{key}"] = value
        else:
            for p in shard.pieces:
                _put(optim_sd, f"{p.name}.{key}", _layout(value, p))


def _build(plan: _Plan):
    model_sd, optim_sd = dict(plan.model_tensors), {}
    for s in plan.shards:
        if s.values:
            for p in s.pieces:
                _put(model_sd, p.name, _layout(s.tensor, p))
    for opt, rows in zip(plan.optimizers, plan.params):
        for param, name, shard in rows:
            _state_entries(opt, param, name, shard, optim_sd)
    return model_sd, optim_sd


def get_state_dict(model, optimizers=(), *, shards=()
                   ) -> Tuple[Dict[str, object], Dict[str, object]]:
    """(model state dict, optimizer state dict), as vemesh.checkpoint takes
    them: live tensors (whole, ``Shard`` or ``FlatShard``: no copies; a load
    writes them in place) keyed by the serial names above, scalar state as
    Python numbers (which ``set_state_dict`` gives back to the optimizers).
    torch.distributed.checkpoint.state_dict's name."""
    return _build(_Plan(model, optimizers, shards))


def set_state_dict(model, optimizers=(), *, model_state_dict=None,
                   optim_state_dict, shards=()) -> None:
    """After ``vemesh.checkpoint.load`` into dicts from ``get_state_dict``:
    gives the loaded scalar state (step counts) back to the optimizers
    (tensors were loaded in place). A flat shard holding several parameters
    has one step: the largest of theirs."""
    del model_state_dict  # its tensors were written in place
    _apply_scalars(_Plan(model, optimizers, shards), optim_state_dict)


def _apply_scalars(plan: "_Plan", optim_sd) -> None:
    for opt, rows in zip(plan.optimizers, plan.params):
        for param, name, shard in rows:
            state = opt.state.get(param)
            if not state:
                continue
            names = [name] if shard is None else [p.name for p in shard.pieces]
            for key, old in list(state.items()):
                if old is None or (isinstance(old, torch.Tensor)
                                   and old.dim() != 0):
                    continue
                got = [optim_sd[f"{n}.{key}"] for n in names
                       if f"{n}.{key}" in optim_sd]
                if not got:
                    continue
                if isinstance(old, torch.Tensor):
                    old.fill_(max(got))
                else:
                    state[key] = type(old)(max(got))


def _numbers(group: dict) -> dict:
    """The hyperparameters of a param group that are numbers (or tuples of
    numbers): what load restores."""
    out = {}
    for k, v in group.items():
        if k == "params" or isinstance(v, bool):
            continue
        if isinstance(v, (int, float)):
            out[k] = v
        elif (isinstance(v, tuple) and v
              and all(isinstance(x, (int, float)) and not isinstance(x, bool)
                      for x in v)):
            out[k] = list(v)
    return out


def _init_optimizer_state(opt: torch.optim.Optimizer) -> None:
    """Creates the state of an optimizer that has not stepped: one step at
    lr 0 on zero gradients (the values it leaves are overwritten by the
    load); the gradients and learning rates are put back."""
    params = [p for g in opt.param_groups for p in g["params"]
              if p.requires_grad]
    if not params or all(opt.state.get(p) for p in params):
        return
    grads = [p.grad for p in params]
    lrs = [g.get("lr") for g in opt.param_groups]
    try:
        for p in params:
            p.grad = torch.zeros_like(p)
        for g in opt.param_groups:
            if "lr" in g:
                g["lr"] = 0.0
        opt.step()
    finally:
        for p, gr in zip(params, grads):
            p.grad = gr
        for g, lr in zip(opt.param_groups, lrs):
            if lr is not None:
                g["lr"] = lr


def save(model, optimizers=(), *, checkpoint_id, process_group=None,
         shards=(), step: int = 0, metadata: Optional[Dict[str, str]] = None,
         keep_last: int = 2, job: str = "", mesh: str = "",
         saver: "Optional[_vc.AsyncSaver]" = None) -> None:
    """Collective: ``model`` (and ``optimizers``' state) into
    ``checkpoint_id`` at ``step`` (vemesh.checkpoint.save, whose ``job`` and
    ``mesh`` these are), ``shards`` describing what this rank holds only
    part of (module docstring). ``saver`` (a vemesh.checkpoint.AsyncSaver
    over the same group): the save is started in the background instead
    (committed by its ``wait()`` or next start; ``process_group`` is then
    the saver's)."""
    error, merged, meta = None, {}, dict(metadata or {})
    try:
        plan = _Plan(model, optimizers, shards)
        merged = _merge(*_build(plan))
        for i, opt in enumerate(plan.optimizers):
            meta[_PARAM_GROUPS_KEY.format(i)] = json.dumps(
                [_numbers(g) for g in opt.param_groups], sort_keys=True)
    except Exception as e:  # noqa: BLE001  (raised on every rank)
        error = e  # raised on every rank by vemesh.checkpoint
    if saver is not None:
        saver._start(merged, checkpoint_id, step, meta, keep_last, error=error,
                     job=job, mesh=mesh)
        return
    _vc._save(merged, checkpoint_id, process_group, step, meta, keep_last,
              error=error, job=job, mesh=mesh)


def load(model, optimizers=(), *, checkpoint_id, process_group=None,
         shards=(), step: Optional[int] = None,
         job: str = "") -> "_vc.LoadInfo":
    """Collective: fills ``model`` (and ``optimizers``' state) in place
    from ``checkpoint_id``, whatever mesh and sharding saved it (by the job
    ``job`` when given); ``shards`` as for save. Restores the optimizers' numeric hyperparameters when they
    have as many param groups as the saved ones. Returns the LoadInfo."""
    error, merged, plan = None, {}, None
    try:
        plan = _Plan(model, optimizers, shards)
        for opt in plan.optimizers:
            _init_optimizer_state(opt)
        merged = _merge(*_build(plan))
    except Exception as e:  # noqa: BLE001  (raised on every rank)
        error = e
    info = _vc._load(merged, checkpoint_id, process_group, step, error=error,
                     job=job)
    _apply_scalars(plan, merged)
    for i, opt in enumerate(plan.optimizers):
        text = info.metadata.get(_PARAM_GROUPS_KEY.format(i))
        if text is None:
            continue
        groups = json.loads(text)
        if len(groups) != len(opt.param_groups):
            continue
        for group, saved in zip(opt.param_groups, groups):
            for k, v in saved.items():
                if k in group and not isinstance(group[k], bool):
                    group[k] = tuple(v) if isinstance(group[k], tuple) else v
    return info


def _merge(model_sd, optim_sd):
    both = dict(model_sd)
    for k, v in optim_sd.items():
        if k in both:
            raise ValueError(f"'{k}' is both a model tensor and optimizer "
                             "state")
        both[k] = v
    return both
