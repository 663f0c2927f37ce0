"""veScale's DistributedOptimizer (ZeRO) for torch modules wrapped in vemesh's DDP.

    from vemesh.torch import DDP, DistributedOptimizer
    model = DDP(model, VESCALE_DEVICE_MESH["DP"], use_distributed_optimizer=True)
    optimizer = DistributedOptimizer(torch.optim.Adam, models=[model],
                                     optimizer_kwargs={"lr": 0.01})
    for x, y in data:
        optimizer.zero_grad()
        model(x, y).backward()
        optimizer.step()

Each DDP gradient bucket splits into DP-size equal shards (DDP pads the
buckets for it); DP rank r owns shard r of every bucket, so it owns a
contiguous piece of some parameters. The wrapped torch optimizer (an
optimizer class plus ``optimizer_kwargs``, or an optimizer already built
over the model's parameters, as veScale takes either) is given, in place of
each parameter, the piece this rank owns: it keeps optimizer state (Adam's
moments) for about 1/DP of the parameters and steps only those. ``step()``
then all-gathers the updated parameters, bucket by bucket, over the DP group.
That equals one process for optimizers whose update is elementwise (SGD,
Adam, AdamW, ...), not for one that looks at a whole parameter (LAMB).

Zero-copy where the dtypes allow: at construction the models' parameters
are moved into one flat buffer per dtype with the gradient buffer's layout
(``param.data`` becomes a view of it), each owned piece is a view of that
buffer and its gradient a view of DDP's average (its reduce-scatter output,
or its buffer), and the all-gather
writes straight into the parameters. 16-bit parameters whose DDP gradients
are float32 (DDP's default) get float32 master pieces (veScale's
``grad_to_fp32``), copied into the parameters after each step.

The gradients read are DDP's averages: with ``use_distributed_optimizer=True``
DDP reduce-scatters (each rank receives only its shard, half the traffic of
an all-reduce); with False it all-reduces and this optimizer reads its shard
of the full average (veScale raises there; both are ZeRO-1 here).

``step()`` first finishes the models' gradient reduction (veScale's
``finish_grad_sync()``, a no-op when backward already did it), clips the
gradients when ``clip_grad > 0`` (the global 2-norm over DP, and over TP for
Megatron-style tensor-parallel layers, whose replicated parameters count
once), steps, and gathers; ``overlap_param_gather=True`` leaves the gathers
running until the next forward of a model (or ``state_dict()``). Parameters
that got no gradient get a zero gradient (they are reduced all the same).

State dicts: ``state_dict()`` is this rank's: per parameter name, the
optimizer state of the piece it owns, each tensor a ``ShardedState`` (the
flat elements ``[offset, offset + local.numel())`` of a parameter of
``global_shape``), scalars (Adam's ``step``) as they are, and the
``param_groups`` with parameter names. ``full_state_dict()`` (collective
over DP) gathers the same with whole, parameter-shaped tensors, what
``torch.optim`` keeps in one process. ``load_state_dict`` takes either: a
sharded one from the same DP layout, or a full one from any.
"""

import dataclasses
import math

import torch

from ._agreement import agree, gather_texts
from ._group import comm_device
from .ddp import DistributedDataParallel

__all__ = ["DistributedOptimizer", "ShardedState"]


@dataclasses.dataclass
class ShardedState:
    """One rank's piece of a parameter-shaped optimizer state tensor (veScale's
    OptimizerStateSpec, on the flattened parameter): ``local`` is the flat
    elements ``[offset, offset + local.numel())`` of a tensor of
    ``global_shape``."""

    local: torch.Tensor
    offset: int
    global_shape: torch.Size


@dataclasses.dataclass
class _Piece:
    """The piece of one parameter that this DP rank owns."""

    key: str  # the parameter's name in state dicts
    model: DistributedDataParallel
    param: torch.nn.Parameter  # the model's parameter
    buffer: object  # its DDP GradBuffer
    bucket: object
    lo: int  # [lo, hi) in the flat buffers
    hi: int
    offset: int  # where lo is in the flattened parameter
    shard: torch.nn.Parameter  # what the torch optimizer steps


class DistributedOptimizer:
    """veScale's DistributedOptimizer: see the module.

    Args:
        optimizer: a torch.optim.Optimizer class (built with
            ``optimizer_kwargs`` over the models' trainable parameters) or an
            instance already built over them (not yet stepped).
        models: the DDP-wrapped models (vemesh.torch.DDP), one DP group.
        clip_grad: clip the gradients to this global 2-norm (0: no clipping).
        overlap_param_gather: leave the parameter all-gathers running after
            step() until the next forward.
        grad_to_fp32: accepted for veScale's signature; master pieces take
            the dtype of DDP's gradients (float32 for 16-bit parameters when
            DDP accumulates in float32).
        optimizer_kwargs: the optimizer class's arguments (default {}).
    """

    def __init__(self, optimizer, models, clip_grad=0.0,
                 overlap_param_gather=False, grad_to_fp32=True,
                 optimizer_kwargs=None, **kwargs):
        if isinstance(models, DistributedDataParallel):
            models = [models]
        models = list(models)
        ddps = [m for m in models if isinstance(m, DistributedDataParallel)]
        if not ddps:
            raise TypeError("DistributedOptimizer: models holds no DDP-wrapped "
                            "model; wrap each in vemesh.torch.DDP first")
        comm = ddps[0].data_parallel_group
        names = {}
        for i, m in enumerate(ddps):
            for p, name in m.param_to_name.items():
                names[p] = name if len(models) == 1 else f"{i}.{name}"
        # A bad argument is agreed over DP like the optimizer's layout, so a
        # rank whose arguments alone are bad does not leave its peers waiting
        # in the first step's collectives.
        error, optimizer = self._checked(optimizer, models, clip_grad,
                                         optimizer_kwargs, names)
        layout = "" if error else (
            f"{type(optimizer).__name__} over {len(models)} model(s), groups "
            f"of {[len(g['params']) for g in optimizer.param_groups]} "
            f"parameters")
        if comm.size() > 1:
            agree(comm, "DistributedOptimizer", layout, error, role="DP")
        elif error is not None:
            raise ValueError(f"DistributedOptimizer: {error}")
        self.models = models
        self.data_parallel_group = comm
        self.data_parallel_world_size = comm.size()
        self.data_parallel_rank = comm.rank()
        self.clip_grad = float(clip_grad)
        self.overlap_param_gather = bool(overlap_param_gather)
        self.grad_to_fp32 = grad_to_fp32
        self.optimizer = optimizer
        self._group_keys = [[names[p] for p in group["params"]]
                            for group in optimizer.param_groups]

        self._pieces = []
        self._buffers = []  # (model, GradBuffer), in a fixed order
        rank, size = comm.rank(), comm.size()
        optimized = {p for group in optimizer.param_groups
                     for p in group["params"]}
        by_param = {}
        for m in models:
            for gb in m.grad_buffers.values():
                self._buffers.append((m, gb))
                self._adopt_parameters(gb)
                for b in gb.buckets:
                    lo, hi = b.shard_range(rank, size)
                    for p in b.params:
                        s, e, _ = gb.param_index_map[p]
                        a, z = max(lo, s), min(hi, e)
                        if a >= z or p not in optimized:
                            continue
                        view = gb.param_data[a:z]
                        shard = torch.nn.Parameter(
                            view if gb.dtype == gb.param_dtype
                            else view.to(gb.dtype))
                        piece = _Piece(names[p], m, p, gb, b, a, z, a - s,
                                       shard)
                        self._pieces.append(piece)
                        by_param[p] = piece
        for group in optimizer.param_groups:
            group["params"] = [by_param[p].shard for p in group["params"]
                               if p in by_param]
        self._works = []
        self._hooks = [m.register_forward_pre_hook(self._before_forward)
                       for m in models] if self.overlap_param_gather else []

    @staticmethod
    def _checked(optimizer, models, clip_grad, optimizer_kwargs, names):
        """(what is wrong or None, the torch optimizer)."""
        for i, m in enumerate(models):
            if not isinstance(m, DistributedDataParallel):
                return (f"models[{i}] is a {type(m).__name__}; wrap it in "
                        f"vemesh.torch.DDP first"), None
            if m.data_parallel_ranks != models[0].data_parallel_ranks:
                return (f"models[{i}]'s DP group has global ranks "
                        f"{m.data_parallel_ranks}, models[0]'s "
                        f"{models[0].data_parallel_ranks}; all must share "
                        f"one"), None
        if isinstance(clip_grad, bool) or not isinstance(
                clip_grad, (int, float)) or clip_grad < 0:
            return (f"clip_grad={clip_grad!r}; expected a number >= 0 (0: no "
                    f"clipping)"), None
        if isinstance(optimizer, type) and issubclass(optimizer,
                                                       torch.optim.Optimizer):
            params = [p for m in models for p in m.module.parameters()
                      if p.requires_grad]
            try:
                optimizer = optimizer(params, **(optimizer_kwargs or {}))
            except Exception as e:  # reported on every rank, not here alone
                return (f"{optimizer.__name__}(params, "
                        f"**{optimizer_kwargs!r}) raised "
                        f"{type(e).__name__}: {e}"), None
        elif not isinstance(optimizer, torch.optim.Optimizer):
            return (f"expected a torch.optim.Optimizer class or instance, got "
                    f"{optimizer!r}"), None
        elif optimizer.state:
            return ("the optimizer has state already (it was stepped); build "
                    "it fresh over the model's parameters"), None
        for g, group in enumerate(optimizer.param_groups):
            for p in group["params"]:
                if p not in names:
                    return (f"param_groups[{g}] holds a parameter of shape "
                            f"{list(p.shape)} that no DDP model's gradient "
                            f"buffer has (not in the models, frozen, or in "
                            f"DDP's param_to_ignore)"), None
        return None, optimizer

    @staticmethod
    def _adopt_parameters(gb):
        # The parameters move into one flat buffer laid out as the gradients.
        data = torch.zeros(gb.numel, dtype=gb.param_dtype,
                           device=gb.data.device)
        with torch.no_grad():
            for p in gb.params:
                s, e, _ = gb.param_index_map[p]
                data[s:e].copy_(p.detach().reshape(-1))
                p.data = data[s:e].view_as(p)
        gb.param_data = data

    # -- torch.optim.Optimizer's surface ------------------------------------

    @property
    def param_groups(self):
        return self.optimizer.param_groups

    @property
    def state(self):
        return self.optimizer.state

    def __repr__(self):
        return (f"DistributedOptimizer({type(self.optimizer).__name__}, DP "
                f"size {self.data_parallel_world_size}, "
                f"{sum(p.hi - p.lo for p in self._pieces)} parameter elements "
                f"on this rank)")

    def zero_grad(self, set_to_none=True):
        """Zeros the models' gradient buffers (veScale's zero_grad_buffer)."""
        for piece in self._pieces:
            piece.shard.grad = None
        for m in self.models:
            m.zero_grad_buffer()
            if set_to_none:
                for gb in m.grad_buffers.values():
                    for p in gb.params:
                        p.grad = None

    def step(self, closure=None):
        """Finishes the gradient reduction, clips (clip_grad > 0), steps this
        rank's pieces and all-gathers the parameters. Returns the gradient
        norm when clipping, else None."""
        if closure is not None:
            raise ValueError("DistributedOptimizer.step: closures are not "
                             "supported (the step is collective)")
        self._wait_param_gather()
        for m in self.models:
            m.finish_grad_sync()
        for piece in self._pieces:
            piece.shard.grad = piece.model.averaged_grad(
                piece.buffer, piece.bucket, piece.lo, piece.hi)
        grad_norm = self.clip_grad_norm(self.clip_grad) if self.clip_grad else None
        self.optimizer.step()
        with torch.no_grad():
            for piece in self._pieces:
                if piece.buffer.dtype != piece.buffer.param_dtype:
                    piece.buffer.param_data[piece.lo:piece.hi].copy_(piece.shard)
        self._gather_params()
        return grad_norm

    def clip_grad_norm(self, clip_grad):
        """Scales the gradients so that their global 2-norm is at most
        ``clip_grad`` (torch.nn.utils.clip_grad_norm_'s rule); returns the
        norm before. Collective over DP (and TP when the models have
        tensor-parallel layers)."""
        tp = None
        for m in self.models:
            for p in m.param_to_name:
                group = getattr(p, "_vemesh_tp_group", None)
                tp = group.comm if group is not None else tp
        total = torch.zeros(1, dtype=torch.float64,
                            device=comm_device(self.data_parallel_group))
        for piece in self._pieces:
            p = piece.param
            # A parameter replicated over TP counts on TP rank 0 only.
            if tp is None or getattr(p, "tensor_model_parallel", False) \
                    or tp.rank() == 0:
                g = piece.shard.grad.detach().double()
                total += (g * g).sum().to(total.device)
        self.data_parallel_group.all_reduce(total)
        if tp is not None and tp.size() > 1:
            tp.all_reduce(total)
        norm = math.sqrt(total.item())
        coefficient = clip_grad / (norm + 1e-6)
        if coefficient < 1.0:
            for piece in self._pieces:
                piece.shard.grad.mul_(coefficient)
        return norm

    # -- the parameter all-gather -------------------------------------------

    def _gather_params(self):
        comm = self.data_parallel_group
        if comm.size() == 1:
            return
        rank, size = comm.rank(), comm.size()
        for _, gb in self._buffers:
            for b in gb.buckets:
                lo, hi = b.shard_range(rank, size)
                mine = gb.param_data[lo:hi].clone()  # the output may not alias it
                work = comm.all_gather(gb.param_data[b.start:b.end], mine,
                                       async_op=True)
                self._works.append((work, mine))
        if not self.overlap_param_gather:
            self._wait_param_gather()

    def _wait_param_gather(self):
        works, self._works = self._works, []
        timeout = self.data_parallel_group.timeout()
        for work, _ in works:
            work.wait(timeout=timeout)

    def _before_forward(self, module, inputs):
        self._wait_param_gather()

    # -- state dicts ---------------------------------------------------------

    def _groups_for_state_dict(self):
        groups = []
        for g, group in enumerate(self.optimizer.param_groups):
            d = {k: v for k, v in group.items() if k != "params"}
            d["params"] = list(self._group_keys[g])
            groups.append(d)
        return groups

    def state_dict(self):
        """This rank's optimizer state: {"state": {name: {key: ShardedState
        or scalar}}, "param_groups": [{hyperparameters, "params": [names]}]}."""
        self._wait_param_gather()
        state = {}
        for piece in self._pieces:
            st = self.optimizer.state.get(piece.shard)
            if not st:
                continue
            n = piece.hi - piece.lo
            state[piece.key] = {
                k: ShardedState(v.detach().clone(), piece.offset,
                                piece.param.shape)
                if torch.is_tensor(v) and v.dim() > 0 and v.numel() == n
                else (v.detach().clone() if torch.is_tensor(v) else v)
                for k, v in st.items()}
        return {"state": state, "param_groups": self._groups_for_state_dict()}

    def full_state_dict(self):
        """Collective over DP: the whole optimizer state, tensors shaped as
        their parameters, on every rank (the state dict torch.optim keeps
        in one process, by parameter name). load_state_dict takes it at any
        DP size."""
        self._wait_param_gather()
        comm = self.data_parallel_group
        rank, size = comm.rank(), comm.size()
        # Which state entries exist: tensors (sharded) and scalars with their
        # dtypes, the union over the ranks (a rank may own no piece).
        tensors, scalars = set(), {}
        for piece in self._pieces:
            n = piece.hi - piece.lo
            for k, v in self.optimizer.state.get(piece.shard, {}).items():
                if torch.is_tensor(v) and v.dim() > 0 and v.numel() == n:
                    tensors.add(k)
                elif torch.is_tensor(v) and v.dim() == 0:
                    scalars[k] = str(v.dtype).replace("torch.", "")
                else:
                    raise ValueError(
                        f"DistributedOptimizer.full_state_dict: state "
                        f"{k!r} of {piece.key} is {type(v).__name__}; only "
                        f"parameter-shaped tensors and 0-d tensors gather")
        text = ",".join(sorted(tensors)) + ";" + ",".join(
            f"{k}:{v}" for k, v in sorted(scalars.items()))
        for t in gather_texts(comm, text):
            ts, ss = t.split(";")
            tensors.update(x for x in ts.split(",") if x)
            for x in ss.split(","):
                if x:
                    k, v = x.split(":")
                    scalars[k] = v
        tensors, scalar_keys = sorted(tensors), sorted(scalars)
        optimized = {key for keys in self._group_keys for key in keys}
        owned = {(piece.buffer, piece.param): piece for piece in self._pieces}
        state = {}
        owners = []  # (key, param, piece or None) in one order everywhere
        for _, gb in self._buffers:
            for b in gb.buckets:
                lo, hi = b.shard_range(rank, size)
                for k in tensors:
                    mine = torch.zeros(hi - lo, dtype=gb.dtype,
                                       device=gb.data.device)
                    for p in b.params:
                        piece = owned.get((gb, p))
                        st = self.optimizer.state.get(piece.shard) if piece else None
                        if st and k in st:
                            mine[piece.lo - lo:piece.hi - lo] = \
                                st[k].detach().reshape(-1)
                    full = torch.empty(b.end - b.start, dtype=gb.dtype,
                                       device=gb.data.device)
                    if size == 1:
                        full.copy_(mine)
                    else:
                        comm.all_gather(full, mine)
                    for p in b.params:
                        key = self._key_of(p)
                        if key not in optimized or p.numel() == 0:
                            continue
                        s, e, _ = gb.param_index_map[p]
                        state.setdefault(key, {})[k] = full[
                            s - b.start:e - b.start].view(p.shape).clone()
                for p in b.params:
                    if self._key_of(p) in optimized and p.numel() > 0:
                        owners.append((self._key_of(p), p,
                                       owned.get((gb, p))))
        if scalar_keys:
            # Each parameter's scalars come from the rank that owns its first
            # element: the others add zeros, so the sum is exact.
            values = torch.zeros(len(owners) * len(scalar_keys),
                                 dtype=torch.float64, device=comm_device(comm))
            for j, (key, p, piece) in enumerate(owners):
                if piece is None or piece.offset != 0:
                    continue
                st = self.optimizer.state.get(piece.shard, {})
                for i, k in enumerate(scalar_keys):
                    if k in st:
                        values[j * len(scalar_keys) + i] = float(st[k])
            if size > 1:
                comm.all_reduce(values)
            values = values.cpu()
            for j, (key, p, _) in enumerate(owners):
                for i, k in enumerate(scalar_keys):
                    state.setdefault(key, {})[k] = torch.tensor(
                        values[j * len(scalar_keys) + i].item(),
                        dtype=getattr(torch, scalars[k]))
        return {"state": state, "param_groups": self._groups_for_state_dict()}

    def _key_of(self, param):
        for i, m in enumerate(self.models):
            name = m.param_to_name.get(param)
            if name is not None:
                return name if len(self.models) == 1 else f"{i}.{name}"
        raise KeyError(param)

    def load_state_dict(self, state_dict):
        """Loads a state_dict() of the same DP layout or a full_state_dict()
        of any; the hyperparameters (lr, betas, ...) of each group too."""
        self._wait_param_gather()
        groups = state_dict.get("param_groups")
        if groups is None or "state" not in state_dict:
            raise ValueError("DistributedOptimizer.load_state_dict: expected "
                             "a dict with 'state' and 'param_groups' (from "
                             "state_dict() or full_state_dict())")
        if len(groups) != len(self._group_keys):
            raise ValueError(
                f"DistributedOptimizer.load_state_dict: the state dict has "
                f"{len(groups)} parameter groups, this optimizer "
                f"{len(self._group_keys)}")
        for g, (saved, mine) in enumerate(zip(groups, self._group_keys)):
            if list(saved["params"]) != mine:
                raise ValueError(
                    f"DistributedOptimizer.load_state_dict: param_groups[{g}] "
                    f"holds parameters {list(saved['params'])[:4]}..., this "
                    f"optimizer's {mine[:4]}...; expected the same names in "
                    f"the same order")
        current = self.optimizer.state_dict()
        shard_index = {}
        flat = [p for group in self.optimizer.param_groups
                for p in group["params"]]
        for i, shard in enumerate(flat):
            shard_index[shard] = i
        new_state = {}
        for piece in self._pieces:
            saved = state_dict["state"].get(piece.key)
            if not saved:
                continue
            new_state[shard_index[piece.shard]] = {
                k: self._local_part(piece, k, v) for k, v in saved.items()}
        new_groups = []
        for saved, group in zip(groups, current["param_groups"]):
            d = {k: v for k, v in saved.items() if k != "params"}
            d["params"] = group["params"]
            new_groups.append(d)
        self.optimizer.load_state_dict({"state": new_state,
                                        "param_groups": new_groups})

    @staticmethod
    def _local_part(piece, k, v):
        n = piece.hi - piece.lo
        where = (f"DistributedOptimizer.load_state_dict: state {k!r} of "
                 f"{piece.key}")
        if isinstance(v, ShardedState):
            if tuple(v.global_shape) != tuple(piece.param.shape):
                raise ValueError(f"{where} is for shape "
                                 f"{list(v.global_shape)}, the parameter is "
                                 f"{list(piece.param.shape)}")
            start = piece.offset - v.offset
            if start < 0 or start + n > v.local.numel():
                raise ValueError(
                    f"{where} holds elements [{v.offset}, "
                    f"{v.offset + v.local.numel()}) of the flattened "
                    f"parameter, this rank needs [{piece.offset}, "
                    f"{piece.offset + n}): load a full_state_dict() to change "
                    f"the DP size or layout")
            return v.local.reshape(-1)[start:start + n].clone()
        if torch.is_tensor(v) and v.dim() > 0:
            if v.numel() != piece.param.numel():
                raise ValueError(f"{where} has {v.numel()} elements, the "
                                 f"parameter {piece.param.numel()}")
            return v.reshape(-1)[piece.offset:piece.offset + n].clone()
        return v
