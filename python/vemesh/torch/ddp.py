"""veScale's DistributedDataParallel for torch modules, over a vemesh DP group.

veScale's (and Megatron's) DDP with its name and arguments:

    from vemesh import VESCALE_DEVICE_MESH
    from vemesh.torch import DDP
    model = DDP(model, VESCALE_DEVICE_MESH["DP"])   # or a DeviceMesh / Communicator
    loss = model(x).sum(); loss.backward()           # gradients averaged over DP

The gradients of the wrapped module's parameters live in one flat buffer per
parameter dtype, laid out back to front (the order backward produces them)
and cut into buckets of about ``bucket_size`` elements, each padded to a
multiple of the DP size. A hook on each parameter's gradient accumulator
moves the gradient into the buffer; when a bucket's last gradient arrives its
all-reduce (average over DP) starts at once, asynchronously, on the vemesh
communicator, on the buffer itself (zero-copy), while backward goes on.
Buckets start strictly in order, so every rank issues the same sequence of
collectives. At the end of backward (or at ``finish_grad_sync()``, veScale's
explicit call, which is then a no-op) every bucket is waited for.

After backward, ``param.grad`` and ``param.main_grad`` (veScale's name) are
the same view of the buffer, holding the DP average: any torch.optim
optimizer steps on them, and they accumulate across backward passes as
torch's own gradients do (``zero_grad`` as usual; ``no_sync()`` skips the
averaging for gradient accumulation, as torch's DDP). With
``use_distributed_optimizer=True`` each bucket is reduce-scattered instead
into a separate 1/DP-size tensor, the average of this rank's shard, which
is all the DistributedOptimizer (ZeRO) reads (``averaged_grad``); the buffer
keeps this rank's own accumulated gradients, so passes accumulate there
too. 16-bit parameters with
``accumulate_allreduce_grads_in_fp32`` (the default) accumulate and average
in float32 ``main_grad`` (``param.grad`` is None during backward and a
copy in the parameter's dtype afterwards); that buffer is zeroed by
``zero_grad()`` / ``zero_grad_buffer()`` / the DistributedOptimizer.

At construction every DP rank checks that the module has the same parameters
and buffers (names, dtypes, shapes) as the others, one small all-gather, and
raises the same ValueError on every rank otherwise; then DP rank 0's values
are broadcast to the others (as torch's DDP does), so replicas start equal
whatever each rank's seed was.

Differences from veScale (which works on DTensors): ``module_to_enforce`` is
accepted and not needed (a parameter that got no gradient is simply reduced
at the end of backward); ``param_to_ignore`` leaves those parameters' torch
gradients alone (not averaged); the forward adds no collective, so a module
that raises on one rank only leaves its peers waiting in the gradient
reduction until the group's timeout (``init_device_mesh(timeout=...)``).
"""

import contextlib

import torch
from torch.autograd import Variable

from ._agreement import agree
from ._group import comm_device, resolve_group

__all__ = ["DistributedDataParallel", "DDP", "GradBuffer"]

_LOW_PRECISION = (torch.float16, torch.bfloat16)


class _Bucket:
    """A contiguous run of one GradBuffer, reduced as one collective."""

    def __init__(self, buffer, index, start, end, params):
        self.buffer = buffer
        self.index = index
        self.start, self.end = start, end
        self.params = params
        self.pending = set()
        self.ready = False
        self.work = None
        # reduce-scatter's output: this rank's shard's average (it may not
        # alias the buffer, and the buffer keeps the local sums).
        self.shard_out = None

    @property
    def data(self):
        return self.buffer.data[self.start:self.end]

    def shard_range(self, rank, size):
        """The elements [lo, hi) of the buffer that DP rank ``rank`` owns."""
        n = (self.end - self.start) // size
        return self.start + rank * n, self.start + (rank + 1) * n


class GradBuffer:
    """The flat gradient storage of the parameters of one dtype.

    ``param_index_map[param] = (start, end, bucket_index)``: where each
    parameter's gradient lives in ``data`` (``param.main_grad`` is that view).
    Buckets are padded to a multiple of the DP size so that each splits into
    equal DP shards (the DistributedOptimizer's)."""

    def __init__(self, param_dtype, grad_dtype, params, dp_size, bucket_size,
                 device=None):
        self.param_dtype = param_dtype
        self.dtype = grad_dtype
        self.grad_is_param_grad = grad_dtype == param_dtype
        self.params = list(params)
        self.param_index_map = {}
        self.buckets = []
        layout = []  # (start, end, [params]) per bucket
        offset, start, members = 0, 0, []
        for p in self.params:
            self.param_index_map[p] = (offset, offset + p.numel(), len(layout))
            offset += p.numel()
            members.append(p)
            if bucket_size is not None and offset - start >= bucket_size:
                offset = -(-offset // dp_size) * dp_size
                layout.append((start, offset, members))
                start, members = offset, []
        if members:
            offset = -(-offset // dp_size) * dp_size
            layout.append((start, offset, members))
        self.numel = offset
        self.data = torch.zeros(self.numel, dtype=grad_dtype, device=device)
        for i, (s, e, ps) in enumerate(layout):
            self.buckets.append(_Bucket(self, i, s, e, ps))
        for p in self.params:
            s, e, _ = self.param_index_map[p]
            p.main_grad = self.data[s:e].view(p.shape)

    def bucket_of(self, param):
        return self.buckets[self.param_index_map[param][2]]


def _is_view_of(grad, main_grad):
    return (grad is not None and grad.data_ptr() == main_grad.data_ptr()
            and grad.shape == main_grad.shape and grad.dtype == main_grad.dtype)


class DistributedDataParallel(torch.nn.Module):
    """veScale's DDP: see the module. Arguments as veScale's:

    Args:
        module: the torch.nn.Module to replicate.
        data_pg_or_device_mesh: the DP group: a vemesh.DeviceMesh
            (``VESCALE_DEVICE_MESH["DP"]``; an N-D mesh gives its "DP"
            dimension, else its first), a vemesh.Communicator, or None for
            VESCALE_DEVICE_MESH's DP group.
        accumulate_allreduce_grads_in_fp32: 16-bit parameters' gradients
            are accumulated and averaged in float32 (``main_grad``).
        overlap_grad_reduce: start each bucket's reduction during backward;
            False reduces everything, in one bucket, at the end.
        use_distributed_optimizer: reduce-scatter (each rank gets its shard's
            average) for the DistributedOptimizer, instead of all-reduce.
        disable_bucketing: one bucket for everything.
        bucket_size: elements per bucket (at least; a bucket ends at a
            parameter's end).
        module_to_enforce: accepted for veScale's signature; not needed.
        param_to_ignore: names of parameters left out of the averaging.
    """

    def __init__(self, module, data_pg_or_device_mesh=None,
                 accumulate_allreduce_grads_in_fp32=True,
                 overlap_grad_reduce=True, use_distributed_optimizer=False,
                 disable_bucketing=False, bucket_size=40000000,
                 module_to_enforce=None, param_to_ignore=None, **kwargs):
        super().__init__()
        comm = resolve_group(data_pg_or_device_mesh, "DP", "DDP")
        # Bad arguments are agreed with the layout, so that a rank whose
        # arguments alone are bad does not leave its peers waiting.
        error = None
        if not isinstance(module, torch.nn.Module):
            error = f"the module is a {type(module).__name__}, not a torch.nn.Module"
        elif bucket_size is not None and (
                isinstance(bucket_size, bool) or not isinstance(bucket_size, int)
                or bucket_size < 1):
            error = (f"bucket_size={bucket_size!r}; expected a positive number "
                     f"of elements or None")
        named = list(module.named_parameters()) if error is None else []
        ignore = set(param_to_ignore or ())
        unknown = sorted(ignore - {n for n, _ in named})
        if error is None and unknown:
            error = (f"param_to_ignore names {unknown}, which are not "
                     f"parameters of the module")
        self.module = module
        self.data_parallel_group = comm
        self.data_parallel_world_size = comm.size()
        self.data_parallel_rank = comm.rank()
        self.data_parallel_ranks = comm.ranks()  # global ranks
        self.overlap_grad_reduce = bool(overlap_grad_reduce)
        self.use_distributed_optimizer = bool(use_distributed_optimizer)
        if not self.overlap_grad_reduce or disable_bucketing:
            bucket_size = None
        self.bucket_size = bucket_size
        self._check_and_broadcast(named, error)

        # Grad buffers per parameter dtype, parameters back to front.
        by_dtype = {}
        self.param_to_name = {}
        self.ignored_params = []
        for name, p in named:
            if not p.requires_grad:
                continue
            if name in ignore:
                self.ignored_params.append(p)
                continue
            self.param_to_name[p] = name
            by_dtype.setdefault(p.dtype, []).append(p)
        self.grad_buffers = {}
        for dtype, params in by_dtype.items():
            devices = sorted({str(p.device) for p in params})
            if len(devices) > 1:
                raise ValueError(f"DDP: the {dtype} parameters are on "
                                 f"{devices}; expected one device")
            grad_dtype = (torch.float32 if accumulate_allreduce_grads_in_fp32
                          and dtype in _LOW_PRECISION else dtype)
            self.grad_buffers[dtype] = GradBuffer(
                dtype, grad_dtype, reversed(params),
                self.data_parallel_world_size, bucket_size, params[0].device)
        self._buffer_of = {p: gb for gb in self.grad_buffers.values()
                           for p in gb.params}
        size = self.data_parallel_world_size
        if self.use_distributed_optimizer and size > 1:
            for gb in self.grad_buffers.values():
                for b in gb.buckets:
                    b.shard_out = torch.zeros((b.end - b.start) // size,
                                              dtype=gb.dtype,
                                              device=gb.data.device)
        self._buckets = [b for gb in self.grad_buffers.values()
                         for b in gb.buckets]
        self._next_launch = 0
        self._in_backward = False
        self._syncing = False
        self._sync_enabled = True
        self._got_grad = set()

        # A hook on each parameter's gradient accumulator (kept alive here).
        self._grad_accs = []
        with torch.enable_grad():
            for p in self.param_to_name:
                acc = p.expand_as(p).grad_fn.next_functions[0][0]
                acc.register_hook(self._make_param_hook(p))
                self._grad_accs.append(acc)

    # -- construction ------------------------------------------------------

    def _check_and_broadcast(self, named, error):
        comm = self.data_parallel_group
        state = named + (list(self.module.named_buffers()) if error is None
                         else [])
        layout = "; ".join(f"{n} {t.dtype} {list(t.shape)}" for n, t in state)
        count = sum(t.numel() for _, t in state)
        what = ("DDP: the arguments and the module's parameters and buffers "
                "(name, dtype, shape)")
        if comm.size() > 1:
            agree(comm, what,
                  f"{len(state)} tensors of {count} elements: {layout}",
                  error, role="DP")
        elif error is not None:
            raise (TypeError if "not a torch.nn.Module" in error
                   else ValueError)(f"DDP: {error}")
        if comm.size() == 1:
            return
        # DP rank 0's values everywhere: one broadcast per dtype.
        by_dtype = {}
        for _, t in state:
            by_dtype.setdefault(t.dtype, []).append(t)
        device = comm_device(comm)
        with torch.no_grad():
            for tensors in by_dtype.values():
                flat = torch.cat([t.detach().reshape(-1).to(device)
                                  for t in tensors])
                comm.broadcast(flat, src=0)
                offset = 0
                for t in tensors:
                    t.copy_(flat[offset:offset + t.numel()].view_as(t))
                    offset += t.numel()

    # -- backward ----------------------------------------------------------

    def _make_param_hook(self, param):
        def param_hook(*unused):
            self._on_grad(param)
        return param_hook

    def _start_backward(self):
        self._in_backward = True
        self._syncing = self._sync_enabled
        self._got_grad = set()
        self._next_launch = 0
        for b in self._buckets:
            b.pending = set(b.params)
            b.ready = False
            b.work = None
        # A gradient that is not its buffer view (None after
        # zero_grad(set_to_none=True), or assigned): its region restarts
        # from zero, so a stale value is never reduced.
        for gb in self.grad_buffers.values():
            if gb.grad_is_param_grad:
                for p in gb.params:
                    if not _is_view_of(p.grad, p.main_grad):
                        p.main_grad.zero_()
        Variable._execution_engine.queue_callback(self._end_of_backward)

    def _on_grad(self, param):
        if not self._in_backward:
            self._start_backward()
        gb = self._buffer_of[param]
        grad = param.grad
        if gb.grad_is_param_grad:
            if grad is not None and not _is_view_of(grad, param.main_grad):
                param.main_grad.copy_(grad)
            param.grad = param.main_grad
        elif grad is not None:
            param.main_grad.add_(grad)
            param.grad = None
        self._got_grad.add(param)
        if self._syncing and self.overlap_grad_reduce:
            bucket = gb.bucket_of(param)
            bucket.pending.discard(param)
            if not bucket.pending:
                bucket.ready = True
                self._launch_ready()

    def _launch_ready(self):
        # Strictly in bucket order: every rank issues the same sequence.
        while (self._next_launch < len(self._buckets)
               and self._buckets[self._next_launch].ready):
            self._launch(self._buckets[self._next_launch])
            self._next_launch += 1

    def _launch(self, bucket):
        comm = self.data_parallel_group
        if comm.size() == 1:
            return
        data = bucket.data
        if self.use_distributed_optimizer:
            bucket.work = comm.reduce_scatter(bucket.shard_out, data,
                                              op="avg", async_op=True)
        else:
            bucket.work = comm.all_reduce(data, op="avg", async_op=True)

    def _end_of_backward(self):
        try:
            if self._syncing:
                self.finish_grad_sync()
        finally:
            self._in_backward = False

    def start_grad_sync(self, *unused):
        """Starts the reduction of every bucket not started yet (veScale's
        call; backward does it by itself)."""
        if not self._in_backward:
            return
        for b in self._buckets:
            b.ready = True
        self._launch_ready()

    def finish_grad_sync(self):
        """Waits for every bucket's reduction (starting those not started);
        after it the gradients are the DP average. Backward calls it at its
        end, so calling it again (veScale's explicit call) does nothing."""
        if not self._in_backward:
            return
        try:
            self.start_grad_sync()
            comm = self.data_parallel_group
            timeout = comm.timeout()
            for b in self._buckets:
                if b.work is None:
                    continue
                work, b.work = b.work, None
                work.wait(timeout=timeout)
            for gb in self.grad_buffers.values():
                if gb.grad_is_param_grad or self.use_distributed_optimizer:
                    continue
                for p in gb.params:
                    if p in self._got_grad:
                        p.grad = p.main_grad.to(p.dtype)
        finally:
            self._in_backward = False

    @contextlib.contextmanager
    def no_sync(self):
        """Backward passes inside accumulate gradients without averaging them
        (torch DDP's no_sync); the first backward after it averages the sum."""
        previous = self._sync_enabled
        self._sync_enabled = False
        try:
            yield
        finally:
            self._sync_enabled = previous

    def averaged_grad(self, buffer, bucket, lo, hi):
        """The DP average of the gradient elements [lo, hi) of ``buffer``,
        inside this rank's shard of ``bucket`` (what the DistributedOptimizer
        reads): a view of the reduce-scatter's output, or of the buffer."""
        if bucket.shard_out is None:
            return buffer.data[lo:hi]
        start, _ = bucket.shard_range(self.data_parallel_rank,
                                      self.data_parallel_world_size)
        return bucket.shard_out[lo - start:hi - start]

    def zero_grad_buffer(self, zero_buffer=True):
        """Zeros the gradient buffers (veScale's call, once per iteration;
        the DistributedOptimizer's and this module's zero_grad call it)."""
        if zero_buffer:
            for gb in self.grad_buffers.values():
                gb.data.zero_()
                for b in gb.buckets:
                    if b.shard_out is not None:
                        b.shard_out.zero_()

    def zero_grad(self, set_to_none=False):
        super().zero_grad(set_to_none)
        self.zero_grad_buffer()

    # -- forward and state -------------------------------------------------

    def forward(self, *inputs, **kwargs):
        return self.module(*inputs, **kwargs)

    def state_dict(self, *args, destination=None, prefix="", keep_vars=False):
        """The wrapped module's state dict (keys without "module.", as
        veScale's)."""
        return self.module.state_dict(*args, destination=destination,
                                      prefix=prefix, keep_vars=keep_vars)

    def load_state_dict(self, state_dict, strict=True):
        return self.module.load_state_dict(state_dict, strict=strict)


DDP = DistributedDataParallel
