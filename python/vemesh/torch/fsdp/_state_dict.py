"""State dicts of an FSDP model: full (gathered) or sharded (this rank's).

Keys are the wrapped module's own (``net1.weight``, never
``_fsdp_wrapped_module.`` or ``_flat_param``), in the order
``module.state_dict()`` gave before wrapping, tied weights under each name.
Buffers are not sharded: both kinds carry them as the module holds them.

- ``StateDictType.FULL_STATE_DICT``: every parameter whole, gathered from
  the shards (one all_gather per unit, every rank takes part; with
  ``FullStateDictConfig(rank0_only=True)`` only the mesh's first rank
  returns the dict, the others ``{}``).
- ``StateDictType.SHARDED_STATE_DICT``: no communication; each parameter as
  a ``FlatShard``: the elements of the flattened parameter this rank holds
  (``tensor``, 1-D, possibly empty), where they start (``offset``), the
  parameter's ``global_shape`` and which copy this is (``replica``: ranks of one
  shard coordinate in other replicas of HYBRID_SHARD hold equal copies; 0
  is the one to write). Flat ranges make a checkpoint a byte range per rank.

``load_state_dict`` takes either kind under its type. A full dict needs no
communication (each rank copies its range); a sharded one must come from the
same mesh and strategy (the offsets must match). Problems found on any rank
(a missing or unexpected key, a tensor of another size, a shard saved
elsewhere) raise on every rank before anything is written.
"""

import collections

import torch

from ._collectives import FsdpError, exchange, raise_if_any_failed


try:  # vemesh.checkpoint's flat piece, so a sharded dict saves as it is
    from ...checkpoint import FlatShard as _CheckpointFlatShard
except ImportError:  # a build without vemesh.checkpoint
    _CheckpointFlatShard = object


class FlatShard(_CheckpointFlatShard):
    """This rank's part of one parameter: ``tensor`` (1-D) is elements
    ``[offset, offset + tensor.numel())`` of the row-major flattened
    parameter of ``global_shape``; ``replica`` numbers equal copies
    (HYBRID_SHARD's replicate coordinate; 0 is the one to write). The fields
    of ``vemesh.checkpoint.FlatShard``, which it is where that exists."""

    if _CheckpointFlatShard is object:
        __slots__ = ("tensor", "global_shape", "offset", "replica")
    else:
        __slots__ = ("replica",)

    def __init__(self, tensor, global_shape, offset, replica=0):
        self.tensor = tensor
        self.global_shape = tuple(int(n) for n in global_shape)
        self.offset = int(offset)
        self.replica = int(replica)

    @property
    def dtype(self):
        return self.tensor.dtype

    def __repr__(self):
        return (f"FlatShard({self.tensor.numel()} x {self.dtype}, "
                f"global_shape={self.global_shape}, offset={self.offset}, "
                f"replica={self.replica})")


def _is_flat_param_key(key):
    return key == "_flat_param" or key.endswith("._flat_param")


def _live_entries(st):
    """Buffers and anything else the wrapped module itself still saves (not
    the units' parameters, which summon_full_params registers meanwhile as
    views of memory freed on its exit)."""
    live = st.module.state_dict()
    params = {k for k, where in st.keys if where is not None}
    return collections.OrderedDict(
        (k, v) for k, v in live.items()
        if not _is_flat_param_key(k) and k not in params)


def _param_range(unit, info):
    """This rank's elements of `info`'s parameter: (start in the shard,
    start in the parameter, count)."""
    lo = max(unit.shard_offset, info.offset)
    hi = min(unit.shard_offset + unit.shard_numel, info.offset + info.numel)
    if hi <= lo:
        return 0, min(max(unit.shard_offset - info.offset, 0), info.numel), 0
    return lo - unit.shard_offset, lo - info.offset, hi - lo


def full_state_dict(st, rank0_only):
    out = collections.OrderedDict()
    gathered = {}
    for unit in st.units:
        if unit.sharded:
            full = torch.empty(unit.padded, dtype=unit.dtype)
            unit.groups.shard.all_gather(full, unit.flat_param.detach())
        else:
            full = unit.flat_param.detach()
        gathered[id(unit)] = full
    live = _live_entries(st)
    for key, where in st.keys:
        if where is None:
            if key in live:
                out[key] = live.pop(key)
            continue
        unit, info = where
        full = gathered[id(unit)]
        out[key] = full[info.offset:info.offset + info.numel].view(
            info.shape).clone()
    out.update(live)  # buffers registered after wrapping
    if rank0_only and not st.is_first_rank:
        return collections.OrderedDict()
    return out


def sharded_state_dict(st):
    out = collections.OrderedDict()
    live = _live_entries(st)
    for key, where in st.keys:
        if where is None:
            if key in live:
                out[key] = live.pop(key)
            continue
        unit, info = where
        start, offset, count = _param_range(unit, info)
        local = unit.flat_param.detach()[start:start + count].clone()
        out[key] = FlatShard(local, info.shape, offset,
                             unit.groups.replicate_rank)
    out.update(live)
    return out


def _describe(v):
    if isinstance(v, torch.Tensor):
        return f"a {str(v.dtype).replace('torch.', '')} tensor of shape " \
               f"{list(v.shape)}"
    if isinstance(v, FlatShard):
        return f"a FlatShard of {v.tensor.numel()} elements at {v.offset}"
    return f"a {type(v).__name__}"


def _check_param(key, unit, info, value, sharded):
    """What is wrong with `value` for this parameter, or None."""
    want = (f"{str(unit.dtype).replace('torch.', '')} of shape "
            f"{list(info.shape)}")
    if sharded:
        if not isinstance(value, FlatShard):
            return (f"'{key}' is {_describe(value)}; a SHARDED_STATE_DICT "
                    "holds FlatShards (load a full state dict under "
                    "FULL_STATE_DICT)")
        start, offset, count = _param_range(unit, info)
        if (tuple(value.global_shape) != tuple(info.shape) or
                value.offset != offset or value.tensor.numel() != count):
            return (f"'{key}' is elements [{value.offset}, "
                    f"{value.offset + value.tensor.numel()}) of shape "
                    f"{list(value.global_shape)}, but this rank holds [{offset}, "
                    f"{offset + count}) of shape {list(info.shape)}: it was "
                    "saved on another mesh or strategy (load a full state "
                    "dict instead)")
        value = value.tensor
    elif not isinstance(value, torch.Tensor):
        return f"'{key}' is {_describe(value)}; expected a tensor ({want})"
    elif tuple(value.shape) != tuple(info.shape):
        return f"'{key}' is {_describe(value)}; expected {want}"
    if value.is_floating_point() != unit.dtype.is_floating_point:
        return f"'{key}' is {_describe(value)}; expected {want}"
    return None


def load_state_dict(st, state_dict, strict, sharded):
    """Checks `state_dict` on every rank (agreed), then copies it in."""
    live = _live_entries(st)
    errors, missing, params, rest = [], [], [], collections.OrderedDict()
    known = set()
    for key, where in st.keys:
        known.add(key)
        if where is None:
            if key in state_dict:
                rest[key] = state_dict[key]
            elif key in live:
                missing.append(key)
            continue
        if key not in state_dict:
            missing.append(key)
            continue
        unit, info = where
        problem = _check_param(key, unit, info, state_dict[key], sharded)
        if problem:
            errors.append(problem)
        else:
            params.append((unit, info, state_dict[key]))
    for key, value in live.items():
        if key in state_dict and key not in known:
            rest[key] = state_dict[key]
            known.add(key)
    for key, value in rest.items():
        have = live.get(key)
        if (isinstance(have, torch.Tensor) and (
                not isinstance(value, torch.Tensor) or
                tuple(value.shape) != tuple(have.shape))):
            errors.append(f"'{key}' is {_describe(value)}; expected "
                          f"{_describe(have)}")
    unexpected = [k for k in state_dict if k not in known]
    if strict and (missing or unexpected):
        errors.insert(0, "keys do not match the model: "
                      f"missing {missing[:8]}, unexpected {unexpected[:8]}")
    err = "; ".join(errors[:4]) + (f" (and {len(errors) - 4} more)"
                                   if len(errors) > 4 else "")
    records = exchange(st.groups.agree, {"rank": st.rank, "err": err})
    raise_if_any_failed(records, st.rank, "FullyShardedDataParallel."
                        "load_state_dict")

    with torch.no_grad():
        for unit in st.units:
            unit.reshard()  # gathered copies would be stale
        for unit, info, value in params:
            start, offset, count = _param_range(unit, info)
            src = value.tensor if sharded else value.reshape(-1)[
                offset:offset + count]
            unit.flat_param.detach()[start:start + count].copy_(src)
    st.module.load_state_dict(rest, strict=False)
    return torch.nn.modules.module._IncompatibleKeys(missing, unexpected)


def check_state_dict_type(value):
    from ._api import StateDictType
    if not isinstance(value, StateDictType):
        raise FsdpError(
            f"state_dict_type is {value!r}; expected a StateDictType "
            "(FULL_STATE_DICT or SHARDED_STATE_DICT)")
    if value == StateDictType.LOCAL_STATE_DICT:
        raise FsdpError(
            "LOCAL_STATE_DICT is not supported: use SHARDED_STATE_DICT "
            "(this rank's elements of each parameter, by name)")
    return value


# -- optimizer state ------------------------------------------------------------


def _unit_of(st, param):
    for unit in st.units:
        if unit.flat_param is param:
            return unit
    raise FsdpError(
        "optim_state_dict: the optimizer holds a parameter that is not one "
        "of this model's shards (build it on fsdp_model.parameters())")


def _per_element(unit, value):
    """Optimizer state with one value per shard element (exp_avg), not a
    scalar (step)."""
    return (isinstance(value, torch.Tensor) and
            value.shape == unit.flat_param.shape)


def optim_state_dict(st, optim, sharded, rank0_only):
    """The optimizer's state by original parameter name: per-element state
    (AdamW's exp_avg, exp_avg_sq) whole (full) or as FlatShards (sharded),
    anything else (step) as it is. PyTorch's FSDP.optim_state_dict layout:
    {"state": {name: {key: value}}, "param_groups": [{..., "params":
    [names]}]}."""
    state, groups = {}, []
    for group in optim.param_groups:
        names = []
        for p in group["params"]:
            unit = _unit_of(st, p)
            names.extend(i.names[0] for i in unit.infos)
            pstate = optim.state.get(p, {})
            split = {}
            for key, value in pstate.items():
                if not _per_element(unit, value):
                    split[key] = None
                    continue
                if sharded:
                    split[key] = value.detach()
                elif unit.sharded:
                    full = torch.empty(unit.padded, dtype=value.dtype)
                    unit.groups.shard.all_gather(full, value.detach()
                                                 .contiguous())
                    split[key] = full
                else:
                    split[key] = value.detach()
            for info in unit.infos:
                entry = {}
                for key, value in pstate.items():
                    v = split[key]
                    if v is None:
                        entry[key] = value.clone() if isinstance(
                            value, torch.Tensor) else value
                    elif sharded:
                        start, offset, count = _param_range(unit, info)
                        entry[key] = FlatShard(
                            v[start:start + count].clone(), info.shape,
                            offset, unit.groups.replicate_rank)
                    else:
                        entry[key] = v[info.offset:info.offset +
                                       info.numel].view(info.shape).clone()
                if entry:
                    state[info.names[0]] = entry
        groups.append({**{k: v for k, v in group.items() if k != "params"},
                       "params": names})
    if rank0_only and not sharded and not st.is_first_rank:
        return {}
    return {"state": state, "param_groups": groups}


def optim_state_dict_to_load(st, optim, osd, sharded):
    """`osd` (by name, full or sharded) as `optim.load_state_dict` takes it
    for this rank's shards. Checked on every rank (agreed) first."""
    errors = []
    out_state, out_groups, index = {}, [], 0
    saved_groups = {n: g for g in osd.get("param_groups", [])
                    for n in g.get("params", [])}
    for group in optim.param_groups:
        ids = []
        saved_group = None
        for p in group["params"]:
            unit = _unit_of(st, p)
            ids.append(index)
            parts, scalars = {}, {}
            for info in unit.infos:
                name = info.names[0]
                saved_group = saved_group or saved_groups.get(name)
                entry = osd.get("state", {}).get(name)
                if entry is None:
                    continue
                for key, value in entry.items():
                    if isinstance(value, FlatShard) or (
                            isinstance(value, torch.Tensor) and not sharded
                            and value.dim() > 0 and
                            value.numel() == info.numel and info.numel > 1):
                        problem = _check_param(f"{name}' state '{key}", unit,
                                               info, value, sharded)
                        if problem:
                            errors.append(problem)
                            continue
                        parts.setdefault(key, []).append((info, value))
                    else:
                        scalars[key] = value
            if parts or scalars:
                pstate = dict(scalars)
                for key, items in parts.items():
                    shard = torch.zeros(unit.shard_numel,
                                        dtype=items[0][1].dtype if not sharded
                                        else items[0][1].tensor.dtype)
                    for info, value in items:
                        start, offset, count = _param_range(unit, info)
                        src = (value.tensor if sharded else
                               value.reshape(-1)[offset:offset + count])
                        shard[start:start + count].copy_(src)
                    pstate[key] = shard
                out_state[index] = pstate
            index += 1
        hyper = {k: v for k, v in (saved_group or group).items()
                 if k != "params"}
        out_groups.append({**hyper, "params": ids})
    err = "; ".join(errors[:4])
    records = exchange(st.groups.agree, {"rank": st.rank, "err": err})
    raise_if_any_failed(records, st.rank,
                        "FullyShardedDataParallel.optim_state_dict_to_load")
    return {"state": out_state, "param_groups": out_groups}
