"""veScale's ``parallelize_module`` for the plans that Megatron's layers express.

veScale turns a torch-native module into a DModule by a sharding plan on
DTensors; for its linear layers this is exactly Megatron's tensor
parallelism, which vemesh.torch has without DTensors. So the plan of
veScale's own MLP example runs unchanged:

    from vemesh.torch import parallelize_module, Shard, Replicate
    plan = {
        "parameter": {"fc1.weight": [Shard(0)], "fc1.bias": [Shard(0)],
                      "fc2.weight": [Shard(1)], "fc2.bias": [Replicate()]},
        "forward": {"fc1.input": [[Replicate()]], "fc2.output": [[Replicate()]]},
    }
    mlp = parallelize_module(mlp, VESCALE_DEVICE_MESH["TP"], plan)

Each ``torch.nn.Linear`` whose weight the plan shards becomes, in place, this
rank's shard of it (its current values: ``from_dense``):

- weight ``[Shard(0)]`` (bias ``[Shard(0)]`` or none): ColumnParallelLinear,
  its output sharded on the last dimension, or gathered when the forward plan
  says ``"<name>.output": [[Replicate()]]``;
- weight ``[Shard(1)]`` (bias ``[Replicate()]``, unplanned, or none):
  RowParallelLinear, its output summed over TP (Replicate); its input taken
  as sharded (the column layer's output) unless the forward plan says
  ``"<name>.input": [[Replicate()]]``.

Plan keys are regular expressions over the fully qualified names, as
veScale's. Parameters the plan leaves out stay replicated. Anything else a
DTensor plan can say (other modules, Partial, sequence-parallel Shard of an
activation) raises NotImplementedError naming the entry; an entry that
matches nothing raises ValueError.
"""

import re

import torch

from ._group import resolve_group
from .tensor_parallel import ColumnParallelLinear, RowParallelLinear

__all__ = ["parallelize_module", "Shard", "Replicate", "Partial"]


class Shard:
    """veScale's (and DTensor's) Shard(dim) placement."""

    def __init__(self, dim):
        self.dim = dim

    def __eq__(self, other):
        return isinstance(other, Shard) and other.dim == self.dim

    def __hash__(self):
        return hash(("Shard", self.dim))

    def __repr__(self):
        return f"Shard({self.dim})"


class Replicate:
    """veScale's (and DTensor's) Replicate() placement."""

    def __eq__(self, other):
        return isinstance(other, Replicate)

    def __hash__(self):
        return hash("Replicate")

    def __repr__(self):
        return "Replicate()"


class Partial:
    """veScale's Partial() placement (named for messages; not supported)."""

    def __eq__(self, other):
        return isinstance(other, Partial)

    def __hash__(self):
        return hash("Partial")

    def __repr__(self):
        return "Partial()"


def _placement(entry, key):
    """The one placement of a 1-D plan entry ([p]) or None (no op)."""
    if entry is None:
        return None
    if isinstance(entry, (Shard, Replicate, Partial)):
        return entry
    entry = list(entry)
    if len(entry) != 1:
        raise NotImplementedError(
            f"parallelize_module: {key}: {entry} has {len(entry)} placements; "
            f"the TP mesh is 1-D, so one is expected")
    return entry[0]


def _activation(entry, key):
    """The placement of a forward plan entry ([[p]]: the first argument's)."""
    if entry is None:
        return None
    entry = list(entry)
    if not entry:
        return None
    if len(entry) > 1 and any(e is not None for e in entry[1:]):
        raise NotImplementedError(
            f"parallelize_module: {key}: placements for more than one "
            f"argument; a linear layer has one input and one output")
    first = entry[0]
    if isinstance(first, (Shard, Replicate, Partial)):
        return first
    return _placement(first, key)


def parallelize_module(module, device_mesh=None, sharding_plan=None, *,
                       is_model_sharded=False, factory=False):
    """Shards ``module``'s linear layers over the TP group of ``device_mesh``
    as ``sharding_plan`` says (see the module); returns the module (a new one
    when ``module`` itself is the planned Linear)."""
    if is_model_sharded or factory:
        raise NotImplementedError("parallelize_module: is_model_sharded and "
                                  "factory are veScale DTensor options")
    comm = resolve_group(device_mesh, "TP", "parallelize_module")
    plan = dict(sharding_plan or {})
    unknown = sorted(set(plan) - {"parameter", "forward"})
    if unknown:
        raise ValueError(f"parallelize_module: sharding_plan keys {unknown}; "
                         f"expected 'parameter' and 'forward'")
    param_plan = dict(plan.get("parameter") or {})
    fwd_plan = dict(plan.get("forward") or {})

    params = dict(module.named_parameters())
    placement = {}
    for pattern, entry in param_plan.items():
        hits = [n for n in params if re.fullmatch(pattern, n)]
        if not hits:
            raise ValueError(f"parallelize_module: parameter plan entry "
                             f"{pattern!r} matches no parameter of the module "
                             f"(it has {sorted(params)[:8]}...)")
        for n in hits:
            placement[n] = _placement(entry, pattern)
    modules = dict(module.named_modules())
    activation = {}
    for pattern, entry in fwd_plan.items():
        base, _, what = pattern.rpartition(".")
        if what not in ("input", "output", "weight"):
            raise ValueError(f"parallelize_module: forward plan entry "
                             f"{pattern!r}; expected '<module>.input', "
                             f"'<module>.output' or '<module>.weight'")
        hits = [n for n in modules if re.fullmatch(base, n)]
        if not hits:
            raise ValueError(f"parallelize_module: forward plan entry "
                             f"{pattern!r} matches no submodule")
        for n in hits:
            activation[(n, what)] = (_activation(entry, pattern), pattern)

    converted = {}
    for name, sub in modules.items():
        prefix = f"{name}." if name else ""
        w = placement.get(prefix + "weight")
        b = placement.get(prefix + "bias")
        if w is None or w == Replicate():
            if b is not None and b != Replicate():
                raise NotImplementedError(
                    f"parallelize_module: {prefix}bias is {b} but "
                    f"{prefix}weight is replicated")
            continue
        if not isinstance(sub, torch.nn.Linear):
            raise NotImplementedError(
                f"parallelize_module: {prefix}weight is planned {w} but "
                f"{name or 'the module'} is a {type(sub).__name__}; only "
                f"torch.nn.Linear is sharded here")
        dim = w.dim % 2 if isinstance(w, Shard) else None
        out_p = activation.get((name, "output"), (None, None))
        in_p = activation.get((name, "input"), (None, None))
        if dim == 0:
            if sub.bias is not None and b != Shard(0) and b != Shard(-1):
                raise NotImplementedError(
                    f"parallelize_module: {prefix}weight is Shard(0) (column "
                    f"parallel), so {prefix}bias must be [Shard(0)], not {b}")
            _only(in_p, (None, Replicate()), "a column layer's input")
            _only(out_p, (None, Replicate(), Shard(-1)), "its output")
            new = ColumnParallelLinear.from_dense(
                sub, comm, gather_output=out_p[0] == Replicate())
        elif dim == 1:
            if b is not None and b != Replicate():
                raise NotImplementedError(
                    f"parallelize_module: {prefix}weight is Shard(1) (row "
                    f"parallel), so {prefix}bias must be [Replicate()], not "
                    f"{b}")
            _only(in_p, (None, Replicate(), Shard(-1)), "a row layer's input")
            _only(out_p, (None, Replicate()), "its output")
            new = RowParallelLinear.from_dense(
                sub, comm, input_is_parallel=in_p[0] != Replicate())
        else:
            raise NotImplementedError(
                f"parallelize_module: {prefix}weight is planned {w}; a "
                f"linear layer's weight is [Shard(0)], [Shard(1)] or "
                f"[Replicate()]")
        converted[name] = new
    for (name, what), (p, pattern) in activation.items():
        if name not in converted and p not in (None, Replicate()):
            raise NotImplementedError(
                f"parallelize_module: forward plan entry {pattern!r} is {p} "
                f"on a module that is not tensor parallel here")
    if "" in converted:
        return converted[""]
    for name, new in converted.items():
        parent_name, _, child = name.rpartition(".")
        setattr(modules[parent_name], child, new)
    return module


def _only(planned, allowed, what):
    placement, pattern = planned
    if placement is not None and placement not in allowed:
        raise NotImplementedError(
            f"parallelize_module: forward plan entry {pattern!r} is "
            f"{placement}; {what} may be {[a for a in allowed if a]}")
