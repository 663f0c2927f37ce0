"""vemesh.torch.elastic: torch modules and optimizers on the elastic mesh.

The pieces a torch training loop on ``vemesh.elastic`` needs beyond the
mesh itself (docs/TORCH.md, "Fault tolerance for torch models")::

    import vemesh.torch.elastic as vte

    el = VESCALE_DEVICE_MESH.elastic()
    progress = {"step": el.last_recovery.resume_step, "samples": 0}
    vte.register_state(el, model, optimizer, progress=progress)
    el.sync_state()                               # a joiner receives it all here
    replicate = el.get_group("DP_REPLICATE")      # built once, kept across epochs
    ...
    loss.backward()
    vte.all_reduce_gradients(model, [shard, replicate], op="sum")

``register_state`` registers the model's and the optimizer's state dicts
(``state_dict`` / ``load_state_dict``, as torchft's Manager takes them) and a
dict of counters (step, data position) with the elastic mesh: the library sends
them to every replica that joins, before any step commits, and compares their
fingerprint across the replicas (a difference raises naming the replicas).
The module and the optimizer are loaded in place: the objects the caller (and
any wrapper built on them) holds stay the ones that train.

The groups are vemesh Communicators (``el.get_group(dim)``): the same object
in every epoch, so a wrapper built once on one (vemesh.torch's DDP, FSDP and
ProcessGroups take a Communicator) keeps training after a shrink and a grow.
"""

from typing import Iterable, MutableMapping, Optional, Sequence

import torch
import torch.nn as nn

__all__ = ["register_state", "all_reduce_gradients"]


def _load_progress(progress: MutableMapping):
    def load(value):
        progress.clear()
        progress.update(value)
    return load


def register_state(el, model: Optional[nn.Module] = None,
                   optimizer: Optional[torch.optim.Optimizer] = None, *,
                   progress: Optional[MutableMapping] = None,
                   prefix: str = "") -> None:
    """Registers ``model``'s and ``optimizer``'s state dicts and the dict
    ``progress`` (numbers: step, data position, ...; updated in place on a
    joiner) with the elastic mesh ``el``, under ``prefix`` + "model",
    "optimizer" and "progress". Call it on every rank, before
    ``el.sync_state()``."""
    if model is not None:
        if not isinstance(model, nn.Module):
            raise TypeError(f"model: expected a torch.nn.Module, got {type(model).__name__}")
        el.register_state_dict_fn(prefix + "model", model.state_dict,
                                  model.load_state_dict)
    if optimizer is not None:
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError("optimizer: expected a torch.optim.Optimizer, got "
                            f"{type(optimizer).__name__}")
        el.register_state_dict_fn(prefix + "optimizer", optimizer.state_dict,
                                  optimizer.load_state_dict)
    if progress is not None:
        if not isinstance(progress, MutableMapping):
            raise TypeError("progress: expected a dict, got "
                            f"{type(progress).__name__}")
        el.register_state_dict_fn(prefix + "progress", lambda: dict(progress),
                                  _load_progress(progress))


def all_reduce_gradients(model: nn.Module, groups: Sequence, *,
                         op: str = "sum", scale: Optional[float] = None) -> None:
    """Reduces the gradients of ``model``'s parameters over each of ``groups``
    in turn (vemesh Communicators; the replica's own groups first, the
    replicate group last, as the elastic loop's rule asks), as one flat
    bucket per dtype, then multiplies them by ``scale`` if given. Raises the
    group's error (UNAVAILABLE, ABORTED, TimeoutError when a replica is
    lost): pass it to ``end_step``."""
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    by_dtype = {}
    for g in grads:
        by_dtype.setdefault(g.dtype, []).append(g)
    for same in by_dtype.values():
        flat = torch.cat([g.reshape(-1) for g in same]).contiguous()
        for group in groups:
            group.all_reduce(flat, op=op)
        if scale is not None:
            flat.mul_(scale)
        at = 0
        for g in same:
            n = g.numel()
            g.copy_(flat[at:at + n].view_as(g))
            at += n
