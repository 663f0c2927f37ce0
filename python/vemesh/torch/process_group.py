"""Mesh groups as torch ProcessGroups.

Any vemesh communicator - a mesh dimension's group, a flattening's, a
registry role's - as a ``torch.distributed.ProcessGroup``, so that
``torch.distributed`` calls and torch's own DistributedDataParallel run on
it::

    import torch.distributed as dist
    import vemesh
    from vemesh.torch import as_process_group

    mesh = vemesh.init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    dp = as_process_group(mesh, "dp")            # or mesh.get_group("dp")
    dist.all_reduce(grad, group=dp)              # vemesh's all_reduce, in place
    work = dist.all_gather_into_tensor(out, shard, group=dp, async_op=True)
    work.wait()
    model = torch.nn.parallel.DistributedDataParallel(model, process_group=dp)

``ProcessGroupVemesh`` subclasses torch 1.13's ``ProcessGroup`` through its
pybind trampoline: ``dist.*`` calls its methods from Python and DDP's reducer
from C++. Every method starts vemesh operations on the tensors' own memory
(DLPack, no copy for CPU tensors; list forms such as ``all_gather`` into a
list go through one scratch buffer) and returns a ``vemesh.torch.Work``.

What it does, by torch's name: allreduce, allreduce_coalesced, broadcast,
reduce, allgather, _allgather_base (all_gather_into_tensor),
allgather_coalesced, gather, scatter, reduce_scatter, _reduce_scatter_base
(reduce_scatter_tensor), alltoall_base (all_to_all_single, split sizes
too), alltoall, barrier, send and recv. Reductions: SUM, PRODUCT, MIN, MAX
and AVG; dtypes: float32, float64, float16, bfloat16, int64, int32, int8 and
uint8. Anything else (BAND, PREMUL_SUM, bool tensors, recv without a source,
tags) is a ValueError naming it.

Bad input on one rank is an exception on every rank of the group, never a
hang: Gloo groups compare every rank's operation before moving data
(vemesh's Gloo agreement), MPI groups compare here first (one small
all_gather per collective), and a rank whose own arguments are refused
before they reach the communicator still takes part in the collective (a
barrier, or its refusal in the comparison), so that the others fail at once
too. Point to point: a receive of another size than the send fails at the
receiver; a send or receive refused here raises on its rank only (its peer
waits until the group's timeout, as torch's would).

torch's registry: ``as_process_group`` records the group the way
``dist.new_group`` does (its ranks, name and backend "vemesh"), so that
``dist.broadcast(src=)``, ``send``/``recv`` and ``get_process_group_ranks``
translate global ranks. No default group is needed for that; torch 1.13
needs one only where it asks for the caller's global rank itself:
``dist.get_rank(group)`` (use ``pg.rank()``), ``gather`` and ``scatter``
(``init_process_group`` first: its "vemesh" backend, see
vemesh/torch/backend.py, or any other).
"""

import itertools
import threading

import torch
from torch.distributed import distributed_c10d as _c10d
from torch._C._distributed_c10d import ProcessGroup, ReduceOp

from .work import Work

__all__ = ["ProcessGroupVemesh", "as_process_group", "BACKEND"]

# The backend's name in torch's registry (get_backend(pg)).
BACKEND = "vemesh"

_OPS = {
    ReduceOp.RedOpType.SUM: "sum",
    ReduceOp.RedOpType.PRODUCT: "prod",
    ReduceOp.RedOpType.MIN: "min",
    ReduceOp.RedOpType.MAX: "max",
    ReduceOp.RedOpType.AVG: "avg",
}

# What a vemesh communicator moves (vemesh.DataType), by torch dtype.
_DTYPES = {
    torch.float32: "float32", torch.float64: "float64",
    torch.float16: "float16", torch.bfloat16: "bfloat16",
    torch.int64: "int64", torch.int32: "int32", torch.int8: "int8",
    torch.uint8: "uint8",
}
_DTYPE_CODES = {d: i + 1 for i, d in enumerate(_DTYPES)}
_DTYPE_NAMES = {code: _DTYPES[d] for d, code in _DTYPE_CODES.items()}

# Operation kinds of the agreement (MPI groups), with the names messages use.
_KINDS = ["barrier", "broadcast", "all_reduce", "reduce", "all_gather",
          "reduce_scatter", "gather", "scatter", "all_to_all"]
_KIND_CODES = {k: i + 1 for i, k in enumerate(_KINDS)}
_OP_CODES = {name: i + 1 for i, name in enumerate(sorted(set(_OPS.values())))}
_OP_NAMES = {code: name for name, code in _OP_CODES.items()}
_ROOTED = ("broadcast", "reduce", "gather", "scatter")
_REDUCING = ("all_reduce", "reduce", "reduce_scatter")


class _Refused(ValueError):
    """Arguments this rank refuses before the communicator sees them."""


class ProcessGroupVemesh(ProcessGroup):
    """A torch ProcessGroup over one vemesh Communicator.

    ``group``: a ``vemesh.Communicator`` (``mesh.get_group("dp")``,
    ``VESCALE_DEVICE_MESH.get_data_parallel_dim_groups()``). Its rank and
    size are the group's; global ranks are ``group.ranks()``. Made directly it
    is not in torch's registry: ``as_process_group`` makes and records one.
    """

    def __init__(self, group, name=None):
        super().__init__(group.rank(), group.size())
        self._comm = group
        self._group_name = name or f"vemesh{list(group.ranks())}"
        self._timeout = group.timeout()
        # Gloo compares every rank's operation itself; MPI does not (a
        # mismatch is MPI_ERR_TRUNCATE, fatal), so this group does.
        self._agree = group.backend == "mpi" and group.size() > 1

    # -- identity -----------------------------------------------------------

    def getBackendName(self):  # noqa: N802 (the trampoline's C++ name)
        return BACKEND

    def _get_backend_name(self):
        return BACKEND

    def name(self):
        return BACKEND

    @property
    def communicator(self):
        """The vemesh.Communicator this group runs on."""
        return self._comm

    @property
    def group_name(self):
        return self._group_name

    def ranks(self):
        """The global ranks of the group, by group rank."""
        return list(self._comm.ranks())

    def __repr__(self):
        return (f"ProcessGroupVemesh({self._group_name}, {self._comm.backend}, "
                f"rank {self.rank()} of {self.size()})")

    # -- collectives --------------------------------------------------------

    def allreduce(self, tensors, opts=None):
        def plan():
            t = _one(tensors, "allreduce", "tensors")
            op = _reduce_op(opts, "allreduce")
            self._check(t, "tensor")
            return (_summary("all_reduce", t, op=op),
                    lambda: self._work("all_reduce", [self._comm.all_reduce(
                        _data(t), op=op, async_op=True)], [t]))
        return self._collective("all_reduce", plan)

    def allreduce_coalesced(self, tensors, opts=None):
        def plan():
            ts = _list(tensors, "allreduce_coalesced", "tensors")
            op = _reduce_op(opts, "allreduce_coalesced")
            for t in ts:
                self._check(t, "tensors[i]")
            _same_dtype(ts, "allreduce_coalesced")
            flat = torch.cat([t.reshape(-1) for t in ts]) if ts else None

            def finish():
                _unflatten_into(flat, ts)

            def start():
                if flat is None:
                    return self._work("all_reduce", [], [])
                return self._work("all_reduce_coalesced", [
                    self._comm.all_reduce(flat, op=op, async_op=True)],
                    ts, finish)
            return _summary("all_reduce", flat, op=op), start
        return self._collective("all_reduce", plan)

    def broadcast(self, tensors, opts=None):
        def plan():
            t = _one(tensors, "broadcast", "tensors")
            root = self._root(getattr(opts, "rootRank", 0), "broadcast")
            if getattr(opts, "rootTensor", 0) != 0:
                raise _Refused("broadcast: rootTensor must be 0 (one tensor "
                               "per rank)")
            self._check(t, "tensor")
            return (_summary("broadcast", t, root=root),
                    lambda: self._work("broadcast", [self._comm.broadcast(
                        _data(t), src=root, async_op=True)], [t]))
        return self._collective("broadcast", plan)

    def reduce(self, tensors, opts=None):
        def plan():
            t = _one(tensors, "reduce", "tensors")
            op = _reduce_op(opts, "reduce")
            root = self._root(getattr(opts, "rootRank", 0), "reduce")
            self._check(t, "tensor")

            def start():
                if root == self.rank():
                    # vemesh reduces into a buffer apart from the input.
                    w = self._comm.reduce(_data(t), t.detach().clone(), root,
                                          op=op, async_op=True)
                else:
                    w = self._comm.reduce(None, _data(t), root, op=op,
                                          async_op=True)
                return self._work("reduce", [w], [t])
            return _summary("reduce", t, op=op, root=root), start
        return self._collective("reduce", plan)

    def allgather(self, output_tensors, input_tensors, opts=None):
        def plan():
            outs = _one(output_tensors, "allgather", "output_tensors",
                        is_list=True)
            t = _one(input_tensors, "allgather", "input_tensors")
            self._check(t, "input tensor")
            self._blocks(outs, t, "allgather", "output list")
            flat = torch.empty(self.size() * t.numel(), dtype=t.dtype)

            def finish():
                _unflatten_into(flat, outs)
            return (_summary("all_gather", t),
                    lambda: self._work("all_gather", [self._comm.all_gather(
                        flat, _data(t), async_op=True)], outs, finish))
        return self._collective("all_gather", plan)

    def _allgather_base(self, output, input, opts=None):  # noqa: A002
        def plan():
            self._check(input, "input")
            self._check(output, "output")
            _same_dtype([output, input], "all_gather_into_tensor")
            if output.numel() != self.size() * input.numel():
                raise _Refused(
                    f"all_gather_into_tensor: output has {output.numel()} "
                    f"elements: expected group size ({self.size()}) x "
                    f"{input.numel()} = {self.size() * input.numel()}")
            return (_summary("all_gather", input),
                    lambda: self._work("all_gather", [self._comm.all_gather(
                        _data(output), _data(input), async_op=True)],
                        [output]))
        return self._collective("all_gather", plan)

    def allgather_coalesced(self, output_lists, input_list, opts=None):
        def plan():
            ins = _list(input_list, "allgather_coalesced", "input_list")
            outs = _list(output_lists, "allgather_coalesced", "output_lists")
            if len(outs) != self.size():
                raise _Refused(
                    f"allgather_coalesced: {len(outs)} output lists: expected "
                    f"one per rank of the group ({self.size()})")
            for t in ins:
                self._check(t, "input_list[i]")
            _same_dtype(ins, "allgather_coalesced")
            for per_rank in outs:
                if [o.numel() for o in per_rank] != [t.numel() for t in ins]:
                    raise _Refused(
                        "allgather_coalesced: every output list must match "
                        "input_list's sizes")
            flat_in = torch.cat([t.reshape(-1) for t in ins])
            flat = torch.empty(self.size() * flat_in.numel(),
                               dtype=flat_in.dtype)

            def finish():
                _unflatten_into(flat, [o for per_rank in outs
                                       for o in per_rank])
            return (_summary("all_gather", flat_in),
                    lambda: self._work("allgather_coalesced", [
                        self._comm.all_gather(flat, flat_in, async_op=True)],
                        [o for per_rank in outs for o in per_rank], finish))
        return self._collective("all_gather", plan)

    def gather(self, output_tensors, input_tensors, opts=None):
        def plan():
            t = _one(input_tensors, "gather", "input_tensors")
            root = self._root(getattr(opts, "rootRank", 0), "gather")
            self._check(t, "input tensor")
            if root == self.rank():
                outs = _one(output_tensors, "gather", "output_tensors",
                            is_list=True)
                self._blocks(outs, t, "gather", "gather_list")
                flat = torch.empty(self.size() * t.numel(), dtype=t.dtype)

                def start():
                    return self._work("gather", [self._comm.gather(
                        flat, _data(t), root, async_op=True)], outs,
                        lambda: _unflatten_into(flat, outs))
            else:
                def start():
                    return self._work("gather", [self._comm.gather(
                        None, _data(t), root, async_op=True)], [])
            return _summary("gather", t, root=root), start
        return self._collective("gather", plan)

    def scatter(self, output_tensors, input_tensors, opts=None):
        def plan():
            t = _one(output_tensors, "scatter", "output_tensors")
            root = self._root(getattr(opts, "rootRank", 0), "scatter")
            self._check(t, "output tensor")
            if root == self.rank():
                ins = _one(input_tensors, "scatter", "input_tensors",
                           is_list=True)
                self._blocks(ins, t, "scatter", "scatter_list")
                flat = torch.cat([x.reshape(-1) for x in ins])
            else:
                flat = None
            return (_summary("scatter", t, root=root),
                    lambda: self._work("scatter", [self._comm.scatter(
                        _data(t), flat, root, async_op=True)], [t]))
        return self._collective("scatter", plan)

    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        def plan():
            t = _one(output_tensors, "reduce_scatter", "output_tensors")
            ins = _one(input_tensors, "reduce_scatter", "input_tensors",
                       is_list=True)
            op = _reduce_op(opts, "reduce_scatter")
            self._check(t, "output tensor")
            self._blocks(ins, t, "reduce_scatter", "input list")
            flat = torch.cat([x.reshape(-1) for x in ins])
            return (_summary("reduce_scatter", t, op=op),
                    lambda: self._work("reduce_scatter", [
                        self._comm.reduce_scatter(_data(t), flat, op=op,
                                                  async_op=True)], [t]))
        return self._collective("reduce_scatter", plan)

    def _reduce_scatter_base(self, output, input, opts=None):  # noqa: A002
        def plan():
            op = _reduce_op(opts, "reduce_scatter_tensor")
            self._check(output, "output")
            self._check(input, "input")
            _same_dtype([output, input], "reduce_scatter_tensor")
            if input.numel() != self.size() * output.numel():
                raise _Refused(
                    f"reduce_scatter_tensor: input has {input.numel()} "
                    f"elements: expected group size ({self.size()}) x "
                    f"{output.numel()} = {self.size() * output.numel()}")
            return (_summary("reduce_scatter", output, op=op),
                    lambda: self._work("reduce_scatter", [
                        self._comm.reduce_scatter(_data(output), _data(input),
                                                  op=op, async_op=True)],
                        [output]))
        return self._collective("reduce_scatter", plan)

    def alltoall_base(self, output, input, output_split_sizes,  # noqa: A002
                      input_split_sizes, opts=None):
        def plan():
            self._check(output, "output")
            self._check(input, "input")
            _same_dtype([output, input], "all_to_all_single")
            n = self.size()
            # Always the counted form: a rank that gives split sizes and one
            # that leaves them out (equal) then still pair up.
            out_counts = _split_counts(output, output_split_sizes, n,
                                       "output_split_sizes")
            in_counts = _split_counts(input, input_split_sizes, n,
                                      "input_split_sizes")
            return (_summary("all_to_all", input, send=in_counts,
                             recv=out_counts, n=n),
                    lambda: self._work("all_to_all", [
                        self._comm.all_to_all_v(_data(output), out_counts,
                                                _data(input), in_counts,
                                                async_op=True)], [output]))
        return self._collective("all_to_all", plan)

    def alltoall(self, output_tensors, input_tensors, opts=None):
        def plan():
            n = self.size()
            outs = _list(output_tensors, "all_to_all", "output_tensor_list")
            ins = _list(input_tensors, "all_to_all", "input_tensor_list")
            if len(outs) != n or len(ins) != n:
                raise _Refused(
                    f"all_to_all: {len(outs)} output and {len(ins)} input "
                    f"tensors: expected one per rank of the group ({n}) each")
            for t in outs + ins:
                self._check(t, "tensor list entry")
            _same_dtype(outs + ins, "all_to_all")
            in_counts = [t.numel() for t in ins]
            out_counts = [t.numel() for t in outs]
            flat_in = torch.cat([t.reshape(-1) for t in ins])
            flat = torch.empty(sum(out_counts), dtype=flat_in.dtype)
            return (_summary("all_to_all", flat_in, send=in_counts,
                             recv=out_counts, n=n),
                    lambda: self._work("all_to_all", [
                        self._comm.all_to_all_v(flat, out_counts, flat_in,
                                                in_counts, async_op=True)],
                        outs, lambda: _unflatten_into(flat, outs)))
        return self._collective("all_to_all", plan)

    def barrier(self, opts=None):
        def plan():
            if getattr(opts, "device_ids", None):
                raise _Refused("barrier: device_ids is NCCL's; a vemesh group "
                               "takes none")
            return (_summary("barrier", None),
                    lambda: self._work("barrier", [self._comm.barrier(
                        async_op=True)], []))
        return self._collective("barrier", plan)

    def monitored_barrier(self, opts=None, wait_all_ranks=False):
        return self.barrier(opts)

    # -- point to point -----------------------------------------------------

    def send(self, tensors, dstRank, tag=0):  # noqa: N803 (torch's names)
        t = _one(tensors, "send", "tensors")
        _no_tag(tag, "send")
        self._peer(dstRank, "send")
        self._check(t, "tensor")
        return self._work("send", [self._comm.send(_data(t), dstRank,
                                                   async_op=True)], [t])

    def recv(self, tensors, srcRank, tag=0):  # noqa: N803 (torch's names)
        t = _one(tensors, "recv", "tensors")
        _no_tag(tag, "recv")
        self._peer(srcRank, "recv")
        self._check(t, "tensor")
        return self._work("recv", [self._comm.recv(_data(t), srcRank,
                                                   async_op=True)], [t],
                          source_rank=srcRank)

    def recv_anysource(self, tensors, tag=0):
        raise ValueError(
            "recv without src (recv_anysource) is not supported on a vemesh "
            "group: a vemesh receive names its source rank")

    def _start_coalescing(self):
        raise ValueError("coalescing (NCCL's batch_isend_irecv) is not "
                         "supported on a vemesh group")

    def _end_coalescing(self, reqs):
        raise ValueError("coalescing (NCCL's batch_isend_irecv) is not "
                         "supported on a vemesh group")

    # -- inside -------------------------------------------------------------

    def _work(self, name, works, result, finish=None, source_rank=-1):
        return Work(name, works, result, finish, self._timeout, source_rank)

    def _collective(self, kind, plan):
        """Checks this rank's arguments (``plan`` raises _Refused, or gives
        the agreement summary and the start), agrees where the backend does
        not, then starts. A refusal still takes part, so that every rank
        fails together."""
        try:
            summary, start = plan()
        except _Refused as refused:
            self._fail_together(kind, refused)
            raise
        if self._agree:
            self._agreement(kind, summary)
        return start()

    def _fail_together(self, kind, refused):
        if self._agree:
            try:
                self._agreement(kind, None)
            except ValueError:
                pass  # the others' message; this rank raises its own
        elif self._comm.backend == "gloo" and self.size() > 1:
            # Any operation but theirs: Gloo's agreement fails on every rank.
            try:
                self._comm.barrier()
            except ValueError:
                pass

    def _agreement(self, kind, summary):
        """One all_gather of every rank's summary (None: this rank refused
        its arguments); a ValueError on every rank when they differ."""
        n = self.size()
        mine = summary if summary is not None else _refused_summary(n)
        if len(mine) != 8 + 2 * n:
            mine = mine + [0] * (8 + 2 * n - len(mine))
        mine = torch.tensor(mine, dtype=torch.int64)
        every = torch.empty(n * mine.numel(), dtype=torch.int64)
        self._comm.all_gather(every, mine)
        rows = every.view(n, -1).tolist()
        for r in range(n):
            if rows[r][5]:
                raise ValueError(
                    f"{kind}: rank {r} of the group refused its arguments "
                    f"(its own error says why); every rank of the group "
                    f"raises")
        for r in range(1, n):
            if rows[r][:6] != rows[0][:6]:
                raise ValueError(
                    f"{kind} (every rank of the group must pass the same "
                    f"operation, count, type, op and root): rank {r} has "
                    f"{_describe(rows[r])}, rank 0 has {_describe(rows[0])}")
        if rows[0][0] == _KIND_CODES["all_to_all"] and rows[0][6]:
            for a in range(n):
                for b in range(n):
                    sent, expected = rows[a][8 + b], rows[b][8 + n + a]
                    if sent != expected:
                        raise ValueError(
                            f"{kind} (every rank of the group must pass the "
                            f"same count list): rank {a} sends {sent} "
                            f"elements to rank {b}, which expects {expected}")

    def _check(self, t, what):
        if not isinstance(t, torch.Tensor):
            raise _Refused(f"{what}: expected a torch.Tensor, got "
                           f"{type(t).__name__}")
        if t.dtype not in _DTYPES:
            raise _Refused(
                f"{what}: dtype {t.dtype} is not supported on a vemesh group; "
                f"expected one of {', '.join(str(d) for d in _DTYPES)}")
        cuda = t.device.type == "cuda"
        nccl = self._comm.backend == "nccl"
        if t.device.type not in ("cpu", "cuda") or cuda != nccl:
            raise _Refused(
                f"{what}: a {t.device} tensor on a {self._comm.backend} "
                f"group; " + ("NCCL takes CUDA tensors" if nccl else
                              "MPI and Gloo take CPU tensors"))
        if not t.is_contiguous():
            raise _Refused(f"{what}: the tensor is not contiguous; pass "
                           f"tensor.contiguous()")

    def _blocks(self, tensors, like, op, what):
        if len(tensors) != self.size():
            raise _Refused(f"{op}: {what} has {len(tensors)} tensors: "
                           f"expected one per rank of the group "
                           f"({self.size()})")
        for i, x in enumerate(tensors):
            if not isinstance(x, torch.Tensor):
                raise _Refused(f"{op}: {what}[{i}] is not a tensor")
            if x.dtype != like.dtype or x.numel() != like.numel():
                raise _Refused(
                    f"{op}: {what}[{i}] is {x.dtype}[{x.numel()}]: expected "
                    f"{like.dtype}[{like.numel()}] like this rank's tensor")

    def _root(self, root, op):
        if not isinstance(root, int) or not 0 <= root < self.size():
            raise _Refused(f"{op}: root {root} is outside the group of "
                           f"{self.size()} ranks (0..{self.size() - 1})")
        return root

    def _peer(self, peer, op):
        if not isinstance(peer, int) or not 0 <= peer < self.size():
            raise _Refused(f"{op}: peer {peer} is outside the group of "
                           f"{self.size()} ranks (0..{self.size() - 1})")


# -- as_process_group: the registered group of a communicator ---------------

_GROUPS = {}
_GROUPS_LOCK = threading.Lock()
_COUNT = itertools.count()


def as_process_group(group, mesh_dim=None):
    """The torch ProcessGroup of a vemesh group, recorded in torch's registry.

    ``group``: a ``vemesh.Communicator``, or a ``vemesh.DeviceMesh`` with
    ``mesh_dim`` (a name or index; None on a 1-D mesh), as
    ``DeviceMesh.get_group`` takes. The same communicator gives the same
    ProcessGroup (torch keys its registry by the object). Usable wherever
    torch takes a group: ``dist.all_reduce(t, group=pg)``,
    ``DistributedDataParallel(model, process_group=pg)``.
    """
    if hasattr(group, "get_group") and hasattr(group, "mesh_dim_names"):
        group = group.get_group(mesh_dim)
    elif mesh_dim is not None:
        raise ValueError("as_process_group: mesh_dim is for a DeviceMesh; "
                         f"got a {type(group).__name__}")
    if not hasattr(group, "all_reduce") or not hasattr(group, "ranks"):
        raise TypeError("as_process_group: expected a vemesh.Communicator or "
                        f"a vemesh.DeviceMesh, got {type(group).__name__}")
    with _GROUPS_LOCK:
        pg = _GROUPS.get(group)
        if pg is None:
            pg = ProcessGroupVemesh(
                group, name=f"vemesh:{next(_COUNT)}:{list(group.ranks())}")
            _GROUPS[group] = pg
        if pg not in _c10d._pg_map:  # new, or destroy_process_group'd
            _register(pg)
    return pg


def _register(pg):
    """What dist.new_group records of a group it made."""
    _c10d._pg_map[pg] = (BACKEND, None)
    _c10d._pg_names[pg] = pg.group_name
    _c10d._pg_group_ranks[pg] = {g: r for r, g in enumerate(pg.ranks())}


# -- helpers -----------------------------------------------------------------


def _data(t):
    """The tensor vemesh reads and writes: the same memory; torch refuses
    DLPack on a tensor that requires grad, so without autograd."""
    return t.detach() if t.requires_grad else t


def _one(tensors, op, what, is_list=False):
    """torch passes a list with one entry per device: one here."""
    if isinstance(tensors, torch.Tensor) and not is_list:
        return tensors
    if not isinstance(tensors, (list, tuple)) or len(tensors) != 1:
        count = len(tensors) if isinstance(tensors, (list, tuple)) else "?"
        raise _Refused(f"{op}: {what} has {count} entries: a vemesh group "
                       f"takes one (one device per rank)")
    one = tensors[0]
    if is_list:
        return _list(one, op, what + "[0]")
    return one


def _list(tensors, op, what):
    if not isinstance(tensors, (list, tuple)):
        raise _Refused(f"{op}: {what} must be a list of tensors")
    return list(tensors)


def _same_dtype(tensors, op):
    dtypes = {t.dtype for t in tensors}
    if len(dtypes) > 1:
        raise _Refused(f"{op}: the tensors have dtypes "
                       f"{sorted(str(d) for d in dtypes)}: expected one")


def _reduce_op(opts, op):
    red = getattr(opts, "reduceOp", opts)
    if red is None:
        return "sum"
    kind = getattr(red, "op", red)  # a ReduceOp, or its RedOpType
    name = _OPS.get(kind)
    if name is None:
        raise _Refused(
            f"{op}: reduce op {getattr(kind, 'name', kind)} is not supported "
            f"on a vemesh group; expected SUM, PRODUCT, MIN, MAX or AVG")
    return name


def _no_tag(tag, op):
    if tag:
        raise _Refused(f"{op}: tag {tag}: a vemesh group matches sends and "
                       f"receives in order per peer; tag must be 0")


def _split_counts(t, splits, n, what):
    """Element counts per peer from dim-0 split sizes (empty: equal)."""
    rows = t.shape[0] if t.dim() > 0 else 1
    row = t.numel() // rows if rows else 0
    if not splits:
        if rows % n:
            raise _Refused(f"all_to_all_single: {rows} rows cannot be split "
                           f"equally over {n} ranks; give {what}")
        return [rows // n * row] * n
    splits = list(splits)
    if len(splits) != n or sum(splits) != rows or min(splits) < 0:
        raise _Refused(f"all_to_all_single: {what} {splits}: expected {n} "
                       f"sizes adding up to the tensor's {rows} rows")
    return [s * row for s in splits]


def _unflatten_into(flat, outs):
    offset = 0
    for o in outs:
        k = o.numel()
        o.copy_(flat[offset:offset + k].view(o.shape))
        offset += k


def _summary(kind, t, op=None, root=0, send=None, recv=None, n=0):
    """What the agreement compares: [kind, dtype, count, root, op, refused,
    count lists given, 0] then send and receive counts (all_to_all_v)."""
    head = [_KIND_CODES[kind],
            _DTYPE_CODES.get(t.dtype, 0) if t is not None else 0,
            t.numel() if t is not None and send is None else 0,
            root if kind in _ROOTED else 0,
            _OP_CODES[op] if op is not None else 0,
            0,
            1 if send is not None else 0,
            0]
    if send is None:
        return head
    return head + list(send) + list(recv)


def _refused_summary(n):
    return [0, 0, 0, 0, 0, 1, 0, 0] + [0] * (2 * n)


def _describe(row):
    kind = _KINDS[row[0] - 1] if 0 < row[0] <= len(_KINDS) else "?"
    if kind == "barrier":
        return kind
    text = f"{kind} of {row[2]} {_DTYPE_NAMES.get(row[1], '?')}"
    details = []
    if row[6]:
        details.append("its own count list")
    if kind in _REDUCING:
        details.append(f"op {_OP_NAMES.get(row[4], '?')}")
    if kind in _ROOTED:
        details.append(f"root {row[3]}")
    return text + (f" ({', '.join(details)})" if details else "")
