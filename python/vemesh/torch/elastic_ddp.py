"""torch's own DistributedDataParallel on vemesh.elastic's mesh.

torch 1.13's DDP fixes its group's size when it is built (a ProcessGroup's
size is set at construction, and the reducer divides by it), and it
broadcasts parameters and buffers over that group at construction and
forward. On an elastic mesh the replicate dimension's size changes and a
replica launched again builds its DDP while the others train, so neither
can be torch's group. ``ElasticDDP`` (torchft's approach) gives torch's DDP
the replica's own group (the mesh's other dimensions, which never change)
and registers ``replicate_comm_hook``: each bucket is all-reduced over the
replica's group as backward produces it, and at the end of backward the
whole gradient is all-reduced over the elastic replicate group, one flat
tensor per dtype in the parameters' order, and divided by the two groups'
sizes read at that moment. (Not per bucket: torch lays its buckets out
again after the first iteration, so a replica launched again would reduce
other bucket contents than the survivors in its first step.)::

    import vemesh.torch.elastic as vte

    el = VESCALE_DEVICE_MESH.elastic()
    model = vte.ElasticDDP(model, el)          # once; keeps training across epochs
    vte.register_state(el, model.module, opt, progress=progress)
    el.sync_state()
    ...
    try:
        loss_fn(model(x), y).backward()        # raises the step's lost-member error
    except Exception as e:
        error = e
    v = el.end_step(error)

What it does with DDP's other uses of the group: construction's parameter
check and broadcast and the bucket rebuild run inside the replica (its ranks
build it together); a joiner's parameters come from ``el.sync_state``
(loaded in place into the same tensors), not from DDP. With
``broadcast_buffers`` (torch's default) each forward first broadcasts the
module's buffers from DP rank 0 of the replicate group, then torch's DDP
from the replica's rank 0: every rank runs with replica 0's buffers, as
torch's DDP over the whole job would.

Errors. A collective that fails (a replica lost) is not raised inside the
reducer (that would leave DDP expecting the rest of the reduction in its
next forward): the hook records it and the end-of-backward step, queued
behind the reducer's own callback, skips the replicate reduction and
raises it, so ``backward()`` raises the original ``vemesh.Error``
(UNAVAILABLE / ABORTED / TimeoutError) for ``el.end_step`` and the wrapper
is ready for the next step. A failure in the forward's buffer broadcast is
raised the same way, at backward.
"""

from typing import Any, Optional

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as _TorchDDP

from .process_group import as_process_group

__all__ = ["ElasticDDP", "ReplicateHookState", "replicate_comm_hook"]


def _replica_group(el):
    """The group of the replica's own ranks: the mesh's one dimension other
    than the elastic one; None on a 1-D mesh."""
    names = list(el.mesh.mesh_dim_names)
    others = [d for d in names if d != el.replicate_dim]
    if not others:
        return None
    if len(others) > 1:
        raise ValueError(
            f"ElasticDDP: the mesh has dimensions {names}; pass "
            "replica_group= (the group of the replica's own ranks, all "
            f"dimensions but {el.replicate_dim})")
    return el.get_group(others[0])


def _self_group():
    """A ProcessGroup of this rank alone (a replica of one rank)."""
    return dist.ProcessGroupGloo(dist.HashStore(), 0, 1)


class ReplicateHookState:
    """What ``replicate_comm_hook`` works with: the replica's own group
    (None for one rank), the elastic replicate group, the parameters whose
    gradients are averaged, and the step's first error."""

    def __init__(self, replica_group, replicate_group, params):
        self.replica_group = replica_group
        self.replicate_group = replicate_group
        self.params = [p for p in params if p.requires_grad]
        self.error: Optional[BaseException] = None
        self._finish_queued = False

    def start_step(self):
        self.error = None
        self._finish_queued = False

    def fail(self, error: BaseException):
        if self.error is None:
            self.error = error

    def queue_finish(self):
        # torch's reducer queues its own end-of-backward callback
        # (finalize_backward, which writes the buckets into param.grad)
        # after the last bucket's hook: a callback queued here would run
        # before it. This one queues finish() behind every callback queued
        # so far, the reducer's included.
        if not self._finish_queued:
            self._finish_queued = True
            engine = torch.autograd.Variable._execution_engine
            engine.queue_callback(lambda: engine.queue_callback(self.finish))

    def finish(self):
        """After the reducer: the gradients (summed over the replica's
        ranks and divided by its size) summed over the elastic replicate
        group, one flat tensor per dtype in the parameters' order, and
        divided by its size now; raises the step's first error."""
        if self.error is None:
            try:
                by_dtype = {}
                for p in self.params:
                    if p.grad is not None:
                        by_dtype.setdefault(p.grad.dtype, []).append(p.grad)
                n = self.replicate_group.size()
                for grads in by_dtype.values():
                    flat = torch.cat([g.reshape(-1) for g in grads])
                    self.replicate_group.all_reduce(flat)
                    flat.div_(n)
                    at = 0
                    for g in grads:
                        g.copy_(flat[at:at + g.numel()].view_as(g))
                        at += g.numel()
            except Exception as e:  # noqa: BLE001 (raised below)
                self.fail(e)
        if self.error is not None:
            raise self.error


def replicate_comm_hook(
        state: ReplicateHookState,
        bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook (``ddp.register_comm_hook(state, this)``):
    the bucket summed over the replica's group and divided by its size;
    at the end of backward (``state.finish``) the whole gradient is summed
    over the elastic replicate group and divided by its size as it is now.
    See the module docstring for why and for errors."""
    buf = bucket.buffer()
    replica = state.replica_group
    if replica is not None and replica.size() > 1:
        try:
            replica.all_reduce(buf)
        except Exception as e:  # noqa: BLE001 (raised at the end)
            state.fail(e)
        buf.div_(replica.size())
    state.queue_finish()
    fut = torch.futures.Future()
    fut.set_result(buf)
    return fut


class ElasticDDP(_TorchDDP):
    """``torch.nn.parallel.DistributedDataParallel`` on an elastic mesh
    ``el`` (``VESCALE_DEVICE_MESH.elastic()``): built once, it trains
    across shrinks and grows. ``replica_group``: the group of the replica's
    own ranks (default: the mesh's non-elastic dimension; none on a 1-D
    mesh). Other keyword arguments are torch's (not ``process_group``)."""

    def __init__(self, module: torch.nn.Module, el, *,
                 replica_group: Any = None, broadcast_buffers: bool = True,
                 **kwargs):
        if "process_group" in kwargs:
            raise ValueError(
                "ElasticDDP: process_group is chosen here (the replica's own "
                "group); pass replica_group= to name it")
        if replica_group is None:
            replica_group = _replica_group(el)
        pg = (as_process_group(replica_group) if replica_group is not None
              else _self_group())
        super().__init__(module, process_group=pg,
                         broadcast_buffers=broadcast_buffers, **kwargs)
        self._elastic = ReplicateHookState(
            replica_group, el.get_group(el.replicate_dim), module.parameters())
        self.register_comm_hook(self._elastic, replicate_comm_hook)

    @property
    def elastic_state(self) -> ReplicateHookState:
        return self._elastic

    def forward(self, *inputs, **kwargs):
        st = self._elastic
        st.start_step()
        if self.broadcast_buffers and torch.is_grad_enabled():
            self._broadcast_buffers_over_replicas()
        return super().forward(*inputs, **kwargs)

    def _broadcast_buffers_over_replicas(self):
        st = self._elastic
        buffers = [b for n, b in self.module.named_buffers()
                   if n not in self.parameters_to_ignore]
        if not buffers or st.replicate_group.size() <= 1:
            return
        try:
            with torch.no_grad():
                for b in buffers:
                    st.replicate_group.broadcast(b.detach(), src=0)
        except Exception as e:  # noqa: BLE001 (raised at backward)
            st.fail(e)
