"""One FSDP unit: a module's parameters as one flat, sharded parameter.

A unit owns the parameters of its module's subtree that no nested unit owns.
At wrap time they are flattened in order into one vector, padded with zeros
to a multiple of the shard group size S, and each rank keeps its 1/S slice as
the unit's ``_flat_param`` (an ``nn.Parameter`` registered on the unit's
module: what ``parameters()`` yields and the optimizer steps). The original
parameters are removed from their modules; while the unit is gathered, their
attributes are views into the gathered vector::

    flat (padded):  [ w1.flatten() | b1 | w2.flatten() | ... | 0 0 ]
    rank r keeps:             [r*n, (r+1)*n),  n = padded / S

Forward: ``pre_forward`` all_gathers the shards into ``full`` (or waits for a
prefetch), and runs it through ``_Unshard`` — an autograd Function whose
output aliases ``full`` and whose backward receives the whole flat gradient
once every use of the unit's views is done: the post-backward point, where
the gradient is reduce-scattered (S > 1) or all-reduced (NO_SHARD), without
waiting (the root waits for all of them when backward ends).

Resharding frees ``full``'s storage (``storage().resize_(0)``: every view
shares it) and points the module attributes at empty placeholders, since a
view of freed storage must never be read. A FULL_SHARD unit reshards after
its forward and is gathered again before its backward, by a hook on its
outputs (with the next unit's gather prefetched) or, as a safety net, when
autograd unpacks a saved view of it.
"""

import enum

import torch

# The state of a unit's gathered copy (units of one shard rank have none).
FREED, GATHERING, GATHERED = "freed", "gathering", "gathered"


class ParamInfo:
    """One original parameter: where it lives and where it sits in the flat
    vector. ``owners`` lists every (module, attribute) that held it (tied
    weights) and ``names`` their qualified names."""

    def __init__(self, param, owners, names):
        self.shape = param.shape
        self.numel = param.numel()
        self.owners = owners
        self.names = names
        self.offset = 0


class _Unshard(torch.autograd.Function):
    """Identity on the gathered flat vector; its backward is the unit's
    post-backward hook (the flat gradient, summed over every view)."""

    @staticmethod
    def forward(ctx, flat_param, unit):
        ctx.unit = unit
        return unit.full_tensor().detach()

    @staticmethod
    def backward(ctx, grad_full):
        ctx.unit.post_backward(grad_full)
        return None, None


class Reshard(enum.Enum):
    AFTER_FORWARD = "after_forward"  # FULL_SHARD, HYBRID_SHARD
    AFTER_BACKWARD = "after_backward"  # SHARD_GRAD_OP, _HYBRID_SHARD_ZERO2


class FlatParamUnit:

    def __init__(self, module, path, infos, params, groups, reshard, state):
        self.module = module
        self.path = path  # qualified name of the unit's module ('' = root)
        self.infos = infos
        self.groups = groups
        self.reshard_policy = reshard
        self.state = state  # the root's _RootState (pass ids, callbacks)
        self.dtype = params[0].dtype
        offset = 0
        for info in infos:
            info.offset = offset
            offset += info.numel
        self.numel = offset
        s = groups.shard_size
        self.padded = -(-self.numel // s) * s
        self.shard_numel = self.padded // s
        self.shard_offset = groups.shard_rank * self.shard_numel
        self.split_sizes = [i.numel for i in infos]
        if self.padded > self.numel:
            self.split_sizes.append(self.padded - self.numel)

        with torch.no_grad():
            flat = torch.cat([p.detach().reshape(-1) for p in params] + [
                torch.zeros(self.padded - self.numel, dtype=self.dtype)])
            shard = flat[self.shard_offset:self.shard_offset +
                         self.shard_numel].clone()
        del flat
        self.flat_param = torch.nn.Parameter(
            shard, requires_grad=params[0].requires_grad)
        for info in infos:
            for mod, attr in info.owners:
                del mod._parameters[attr]
        module.register_parameter("_flat_param", self.flat_param)

        self.sharded = groups.shard is not None
        if self.sharded:
            self.full = torch.empty(self.padded, dtype=self.dtype)
            self.full.storage().resize_(0)
            self.status = FREED
        else:  # one shard rank: the shard is the whole vector
            self.full = None
            self.status = GATHERED
        self.work = None  # the all_gather in flight
        self.gathered_pass = -1
        self.backward_pending = 0  # _Unshard outputs whose backward is due
        self.reductions = []  # (gradient shard, Work or None) per backward
        self.placeholder = torch.empty(0, dtype=self.dtype)
        self._set_attrs(None)

    # -- gathering ----------------------------------------------------------

    def full_tensor(self):
        return self.full if self.sharded else self.flat_param.detach()

    def start_unshard(self):
        """Starts the all_gather of the shards (nothing if one is in flight
        or done in this pass)."""
        if not self.sharded or self.status == GATHERING:
            return
        if self.status == GATHERED and self.gathered_pass == self.state.pass_id:
            return
        if self.status == FREED:
            self.full.storage().resize_(self.padded)
            self.state.gathered_bytes += self.padded * self.full.element_size()
            self.state.peak_gathered_bytes = max(
                self.state.peak_gathered_bytes, self.state.gathered_bytes)
        self.work = self.groups.shard.all_gather(
            self.full, self.flat_param.detach(), async_op=True)
        self.status = GATHERING
        self.gathered_pass = self.state.pass_id

    def unshard(self):
        """The gathered vector, current for this pass, when this returns."""
        self.start_unshard()
        if self.status == GATHERING:
            work, self.work = self.work, None
            work.wait()
            self.status = GATHERED

    def reshard(self):
        if not self.sharded or self.status == FREED:
            return
        if self.status == GATHERING:  # never free memory being written
            work, self.work = self.work, None
            work.wait()
        self.full.storage().resize_(0)
        self.state.gathered_bytes -= self.padded * self.full.element_size()
        self.status = FREED
        self._set_attrs(None)

    def _set_attrs(self, full):
        """Points the module attributes at views of `full`, or at empty
        placeholders (None) while the storage is freed."""
        if full is None:
            for info in self.infos:
                for mod, attr in info.owners:
                    mod.__dict__[attr] = self.placeholder
            return
        chunks = full.split(self.split_sizes)
        for info, chunk in zip(self.infos, chunks):
            view = chunk.view(info.shape)
            for mod, attr in info.owners:
                mod.__dict__[attr] = view

    def expose_params(self, full):
        """``summon_full_params``: the original parameters, whole, become
        registered ``nn.Parameter`` views of ``full`` again (so
        ``named_parameters()`` yields them under their own names, as in
        PyTorch) and ``_flat_param`` is unregistered meanwhile."""
        chunks = full.split(self.split_sizes)
        for info, chunk in zip(self.infos, chunks):
            param = torch.nn.Parameter(chunk.view(info.shape),
                                       self.flat_param.requires_grad)
            for mod, attr in info.owners:
                mod.__dict__.pop(attr, None)
                mod._parameters[attr] = param  # tied owners share it
        del self.module._parameters["_flat_param"]

    def hide_params(self):
        """Undoes ``expose_params``: ``_flat_param`` registered again, the
        original parameters plain attributes (placeholders until the next
        gather)."""
        for info in self.infos:
            for mod, attr in info.owners:
                mod._parameters.pop(attr, None)
        self.module._parameters["_flat_param"] = self.flat_param
        self._set_attrs(None if self.sharded else self.full_tensor())

    # -- forward ------------------------------------------------------------

    def pre_forward(self):
        self.unshard()
        if torch.is_grad_enabled() and self.flat_param.requires_grad:
            full = _Unshard.apply(self.flat_param, self)
            full._vemesh_fsdp_unit = self  # found by the saved-tensor hook
            self.backward_pending += 1
        else:
            full = self.full_tensor().detach()
        self._set_attrs(full)

    def post_forward(self, output, is_root):
        if torch.is_grad_enabled() and self.flat_param.requires_grad:
            _register_on_tensors(output, self.pre_backward_hook)
        if self.reshard_policy == Reshard.AFTER_FORWARD and not is_root:
            self.reshard()

    # -- backward -----------------------------------------------------------

    def pre_backward_hook(self, grad):
        self.state.queue_finish_backward()
        self.unshard()
        self.state.prefetch_before(self, post=False)
        return None

    def post_backward(self, grad_full):
        """The unit's whole flat gradient (local batch): reduced without
        waiting; the root's end-of-backward callback finishes it."""
        self.state.queue_finish_backward()
        grad = grad_full.contiguous()
        if self.sharded:
            out = torch.empty(self.shard_numel, dtype=grad.dtype)
            work = self.groups.shard.reduce_scatter(out, grad, async_op=True)
            self.reductions.append((out, work, grad))
        else:
            self.reductions.append((grad, None, None))
        self.backward_pending -= 1
        if self.backward_pending <= 0:
            self.backward_pending = 0
            self.reshard()
        self.state.prefetch_before(self, post=True)

    def wait_reduce_scatter(self):
        """Waits for this backward's reduce_scatters; returns the summed
        gradient shard (None if the unit had no backward). The caller
        all-reduces it over the replicate group."""
        reductions, self.reductions = self.reductions, []
        total = None
        for out, work, _ in reductions:
            if work is not None:
                work.wait()
            total = out if total is None else total.add_(out)
        return total

    def accumulate_grad(self, total):
        total.div_(self.groups.world_size)
        g = self.flat_param.grad
        if g is None:
            self.flat_param.grad = total
        else:
            g.add_(total)


def _register_on_tensors(obj, hook):
    """`hook` on every tensor in `obj` (nested tuples, lists, dicts) that
    requires grad."""
    if isinstance(obj, torch.Tensor):
        if obj.requires_grad:
            obj.register_hook(hook)
    elif isinstance(obj, (tuple, list)):
        for x in obj:
            _register_on_tensors(x, hook)
    elif isinstance(obj, dict):
        for x in obj.values():
            _register_on_tensors(x, hook)


class _SavedView:
    __slots__ = ("unit", "tensor")

    def __init__(self, unit, tensor):
        self.unit = unit
        self.tensor = tensor


def pack_saved(t):
    """saved_tensors_hooks pack: a view of a unit's gathered vector is
    remembered with its unit (a FULL_SHARD unit frees the storage after
    forward)."""
    base = t._base
    unit = getattr(base, "_vemesh_fsdp_unit", None) if base is not None \
        else None
    if unit is None or not unit.sharded:
        return t
    return _SavedView(unit, t)


def unpack_saved(saved):
    """saved_tensors_hooks unpack: gathers the unit first if its storage was
    freed (normally the output hook did already)."""
    if isinstance(saved, _SavedView):
        saved.unit.unshard()
        return saved.tensor
    return saved
