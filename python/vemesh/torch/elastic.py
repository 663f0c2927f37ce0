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

``ElasticCheckpointer`` saves the model and optimizer every N committed steps
(vemesh.torch.checkpoint, from one replica: DP rank 0 of the epoch) and
restores them when the whole job is launched again::

    ck = vte.ElasticCheckpointer(el, model, optimizer, checkpoint_id="/ckpt",
                                 every=100, progress=progress, replica_group=shard)
    ck.restore()          # before el.sync_state(); a no-op on a joiner
    ...
    v = el.end_step(error)
    if v.committed:
        optimizer.step(); progress["step"] += 1
        ck.maybe_save(v)

The groups are vemesh Communicators (``el.get_group(dim)``): the same object
in every epoch, so a wrapper built once on one (vemesh.torch's DDP, FSDP and
ProcessGroups take a Communicator) keeps training after a shrink and a grow.
"""

import json
from typing import Any, MutableMapping, Optional, Sequence

import torch
import torch.nn as nn

import vemesh.checkpoint as _vc
from . import checkpoint as _tc

from .elastic_ddp import ElasticDDP, ReplicateHookState, replicate_comm_hook  # noqa: F401

__all__ = ["register_state", "all_reduce_gradients", "ElasticCheckpointer",
           "ElasticDDP", "ReplicateHookState", "replicate_comm_hook",
           "local_state_fns"]


def _load_progress(progress: MutableMapping):
    def load(value):
        progress.clear()
        progress.update(value)
    return load


def local_state_fns(module: nn.Module):
    """``(state_dict, load_state_dict)`` of ``module``'s own tensors on this
    rank: its parameters and buffers by name, as they are (a vemesh FSDP's
    flat shards, not the gathered parameters), loaded in place. No
    collective: what register_state uses for vemesh's FSDP, whose
    ``state_dict()`` gathers over the shard group (the elastic mesh sends
    each rank's entries to the joiner's rank with the same coordinate)."""
    def state_dict():
        out = {n: p.detach() for n, p in module.named_parameters()}
        out.update({"buffer:" + n: b.detach()
                    for n, b in module.named_buffers()})
        return out

    def load_state_dict(value):
        mine = state_dict()
        if list(value) != list(mine):
            raise ValueError(
                "local state: received entries "
                f"{list(value)[:4]}... but this rank has {list(mine)[:4]}...")
        with torch.no_grad():
            for name, t in mine.items():
                src = value[name]
                if src.shape != t.shape or src.dtype != t.dtype:
                    raise ValueError(
                        f"local state: '{name}' received {src.dtype}"
                        f"{list(src.shape)}, this rank has {t.dtype}"
                        f"{list(t.shape)}")
                t.copy_(src)
    return state_dict, load_state_dict


def _is_vemesh_fsdp(model) -> bool:
    from .fsdp import FullyShardedDataParallel
    return isinstance(model, FullyShardedDataParallel)


def register_state(el, model: Optional[nn.Module] = None,
                   optimizer: Optional[torch.optim.Optimizer] = None, *,
                   progress: Optional[MutableMapping] = None,
                   prefix: str = "") -> None:
    """Registers ``model``'s and ``optimizer``'s state dicts and the dict
    ``progress`` (numbers: step, data position, ...; updated in place on a
    joiner) with the elastic mesh ``el``, under ``prefix`` + "model",
    "optimizer" and "progress". Call it on every rank, before
    ``el.sync_state()``. A vemesh FullyShardedDataParallel is registered
    by its local shards (``local_state_fns``); its optimizer's state is
    local already. An ElasticDDP's module may be passed, or the wrapper."""
    if model is not None:
        if not isinstance(model, nn.Module):
            raise TypeError(f"model: expected a torch.nn.Module, got {type(model).__name__}")
        if _is_vemesh_fsdp(model):  # its shards, without a collective
            el.register_state_dict_fn(prefix + "model", *local_state_fns(model))
        else:
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


class ElasticCheckpointer:
    """Periodic checkpoints of an elastic job, and a whole-job restart.

    ``maybe_save(verdict)`` (after a committed step's optimizer step): every
    ``every`` committed steps, the replica that is DP rank 0 of the epoch
    saves ``model`` and ``optimizer`` (vemesh.torch.checkpoint.save, at step
    ``progress["step"]``, ``progress`` in the metadata) collectively over
    ``replica_group``, the group of the replica's own ranks (the other
    dimensions of the mesh: on a ("DP_REPLICATE", "DP_SHARD") mesh the
    DP_SHARD group, the default there). The other replicas go on training:
    one copy of the state is enough. A step that asks for recovery saves
    nothing (the groups are between epochs).

    ``background=True`` (the default): the save is started in the
    background (vemesh.checkpoint.AsyncSaver, one per replica over its own
    group): ``maybe_save`` copies the state and returns, a thread writes it
    while training goes on, and the next ``maybe_save`` call (the next
    committed step, on every replica that holds one in flight) commits it
    atomically (every shard durable, then the manifest, then ``latest``);
    ``committed_step`` is then its step. ``finish()`` commits the last one
    (call it after the loop). A job killed with a save in flight restarts
    from the previous committed one. ``background=False``: each save is
    written and committed inside ``maybe_save`` (the other replicas wait
    for it at the next step's all_reduce).

    ``restore()`` (before ``el.sync_state()``): on a replica that founds the
    job (``el.last_recovery.receives_state`` false) loads the newest
    checkpoint in ``checkpoint_id``, if any, into ``model`` and
    ``optimizer`` and ``progress``; returns its step, or None. Every
    founding replica loads the same one, so the fingerprint comparison in
    sync_state agrees; a replica that joins a running job receives the live
    state instead (never a checkpoint over it).
    """

    def __init__(self, el, model: nn.Module, optimizer: torch.optim.Optimizer,
                 *, checkpoint_id: str, every: int,
                 progress: Optional[MutableMapping] = None,
                 replica_group: Any = None, keep_last: int = 2,
                 background: bool = True):
        if not isinstance(every, int) or every <= 0:
            raise ValueError(f"every: {every!r} is not a number of steps > 0")
        if replica_group is None:
            mesh = el.mesh
            replicate_dim = el.replicate_dim
            others = [d for d in mesh.mesh_dim_names if d != replicate_dim]
            if len(others) != 1:
                raise ValueError(
                    "replica_group: the mesh has dimensions "
                    f"{mesh.mesh_dim_names}; pass the group of the replica's "
                    "own ranks (all dimensions but "
                    f"{replicate_dim}, e.g. a flattening of them)")
            replica_group = el.get_group(others[0])
        self.el = el
        self.model = model
        self.optimizer = optimizer
        self.checkpoint_id = checkpoint_id
        self.every = every
        self.progress = progress if progress is not None else {"step": 0}
        self.replica_group = replica_group
        self.keep_last = keep_last
        # Collective over the replica's own group: every replica (a joiner
        # too) builds its saver here, its ranks together.
        self._saver = _vc.AsyncSaver(replica_group) if background else None
        self._in_flight_step: Optional[int] = None
        self.committed_step: Optional[int] = None

    def _commit(self) -> None:
        if self._in_flight_step is not None:
            step, self._in_flight_step = self._in_flight_step, None
            self._saver.wait()
            self.committed_step = step

    def maybe_save(self, verdict) -> bool:
        """Commits the background save in flight, if any; then saves if the
        step committed, needs no recovery, and ``progress["step"]`` is a
        multiple of ``every``, on DP rank 0 of the replicate dimension.
        Returns whether this rank started (or, not in the background, made)
        a save."""
        self._commit()
        step = int(self.progress["step"])
        if not verdict.committed or verdict.recover or step % self.every:
            return False
        if self.el.get_group(self.el.replicate_dim).rank() != 0:
            return False
        _tc.save(self.model, [self.optimizer], checkpoint_id=self.checkpoint_id,
                 process_group=self.replica_group, step=step,
                 metadata={"vemesh.elastic.progress": json.dumps(dict(self.progress))},
                 keep_last=self.keep_last, saver=self._saver)
        if self._saver is not None:
            self._in_flight_step = step
        else:
            self.committed_step = step
        return True

    def finish(self) -> None:
        """Commits the background save in flight (after the loop)."""
        self._commit()

    def restore(self) -> Optional[int]:
        """Loads the newest checkpoint on a founding replica (see the class);
        the step it holds, or None."""
        if self.el.last_recovery.receives_state:
            return None
        if _vc.latest_step(self.checkpoint_id) is None:
            return None
        info = _tc.load(self.model, [self.optimizer],
                        checkpoint_id=self.checkpoint_id,
                        process_group=self.replica_group)
        saved = info.metadata.get("vemesh.elastic.progress")
        if saved is not None:
            self.progress.update(json.loads(saved))
        self.progress["step"] = int(info.step)
        return int(info.step)
