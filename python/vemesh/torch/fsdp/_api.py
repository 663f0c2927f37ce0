"""FullyShardedDataParallel: PyTorch's FSDP API over vemesh communicators.

The wrapper owns the per-model state (``_RootState``): the groups, the units
(``_param_group.FlatParamUnit``), the pass counter, the end-of-backward
callback and the prefetch order. Non-root units are driven by forward
(pre-)hooks on their modules; the root unit by ``forward`` itself.
"""

import collections
import contextlib
import enum
import hashlib
import math
import warnings

import torch
import torch.nn as nn

from . import _state_dict
from ._collectives import (DigestCheck, FsdpError, FsdpGroups,
                           agreement_groups, elastic_replicate, exchange,
                           first_difference, raise_if_any_failed)
from ._param_group import (FREED, FlatParamUnit, ParamInfo, Reshard,
                           pack_saved, unpack_saved)
from .wrap import plan_units


FlatParamShard = collections.namedtuple(
    "FlatParamShard", ["tensor", "params", "begin", "end", "replica"])


class ShardingStrategy(enum.Enum):
    """PyTorch's names. FULL_SHARD: parameters, gradients and optimizer
    state sharded, parameters gathered for forward and again for backward.
    SHARD_GRAD_OP: gathered once, kept from forward to backward. NO_SHARD:
    replicated (DDP's all_reduce). HYBRID_SHARD: FULL_SHARD inside the shard
    group (mesh dim 1), replicated over the replicate group (mesh dim 0);
    _HYBRID_SHARD_ZERO2 the same with SHARD_GRAD_OP inside."""
    FULL_SHARD = 1
    SHARD_GRAD_OP = 2
    NO_SHARD = 3
    HYBRID_SHARD = 4
    _HYBRID_SHARD_ZERO2 = 5


class BackwardPrefetch(enum.Enum):
    """When the next unit's all_gather starts in backward: before the
    current unit's gradient computation (BACKWARD_PRE) or after it
    (BACKWARD_POST); None: when it is needed."""
    BACKWARD_PRE = 1
    BACKWARD_POST = 2


class StateDictType(enum.Enum):
    FULL_STATE_DICT = 1
    LOCAL_STATE_DICT = 2
    SHARDED_STATE_DICT = 3


class StateDictConfig:

    def __init__(self, offload_to_cpu=False):
        self.offload_to_cpu = offload_to_cpu  # tensors are on the CPU already


class FullStateDictConfig(StateDictConfig):

    def __init__(self, offload_to_cpu=False, rank0_only=False):
        super().__init__(offload_to_cpu)
        self.rank0_only = rank0_only


class ShardedStateDictConfig(StateDictConfig):
    pass


class CPUOffload:

    def __init__(self, offload_params=False):
        self.offload_params = offload_params


def _strategy(value):
    if isinstance(value, ShardingStrategy):
        return value
    if value is None:
        return ShardingStrategy.FULL_SHARD
    if isinstance(value, str) and value.upper() in ShardingStrategy.__members__:
        return ShardingStrategy[value.upper()]
    names = ", ".join(ShardingStrategy.__members__)
    raise FsdpError(f"sharding_strategy is {value!r}; expected a "
                    f"ShardingStrategy ({names})")


def _tensor_signature(obj, where, out):
    """`where: dtype[*, d1, ...]` for every tensor in `obj` (batch size free)."""
    if isinstance(obj, torch.Tensor):
        dims = ["*"] + [str(d) for d in obj.shape[1:]] if obj.dim() else []
        out.append(f"{where}: {str(obj.dtype).replace('torch.', '')}"
                   f"[{', '.join(dims)}]")
    elif isinstance(obj, (tuple, list)):
        for i, x in enumerate(obj):
            _tensor_signature(x, f"{where}[{i}]", out)
    elif isinstance(obj, dict):
        for k, x in obj.items():
            _tensor_signature(x, f"{where}[{k!r}]", out)


class _RootState:
    """What one FullyShardedDataParallel instance keeps (not a Module)."""

    def __init__(self):
        self.units = []
        self.root_unit = None
        self.pass_id = 0
        self.summoned = False  # inside summon_full_params
        self.finish_queued = False
        self.forward_order = []
        self.order_index = {}
        self.recording = True
        self.gathered_bytes = 0
        self.peak_gathered_bytes = 0
        self.state_dict_type = StateDictType.FULL_STATE_DICT
        self.state_dict_config = FullStateDictConfig()

    # -- forward ------------------------------------------------------------

    def pre_forward(self, unit):
        if self.recording and id(unit) not in self.order_index:
            self.order_index[id(unit)] = len(self.forward_order)
            self.forward_order.append(unit)
        unit.pre_forward()
        if self.forward_prefetch and not self.recording:
            i = self.order_index.get(id(unit))
            if i is not None and i + 1 < len(self.forward_order):
                self.forward_order[i + 1].start_unshard()

    def start_input_check(self, args, kwargs):
        """check_inputs: every rank's inputs described as `where: dtype[*,
        sizes]` (the batch dimension free), their digests all_gathered
        without waiting (over one group of every rank; without one, the
        detailed exchange at once). Returns what finish_input_check takes."""
        sig = []
        _tensor_signature(list(args), "input", sig)
        _tensor_signature(kwargs, "kwargs", sig)
        mine = "; ".join(sig)
        if self.groups.world is None:
            self.agree_on_inputs(mine)
            return None
        return mine, DigestCheck(self.groups.world, mine)

    def finish_input_check(self, started):
        if started is None:
            return
        mine, check = started
        if not check.same():  # every rank sees it: the details, agreed
            self.agree_on_inputs(mine)

    def agree_on_inputs(self, mine):
        """Every rank's input description; raises on every rank if one
        differs from the first rank's."""
        records = exchange(self.groups.agree, {"rank": self.rank, "sig": mine})
        for r in records:
            if r["sig"] != records[0]["sig"]:
                theirs, first = first_difference(r["sig"], records[0]["sig"],
                                                 "; ")
                raise FsdpError(
                    f"FullyShardedDataParallel.forward: rank {r['rank']} "
                    f"passed {theirs or 'no tensors'} but rank "
                    f"{records[0]['rank']} passed {first or 'no tensors'}; "
                    "every rank must pass tensors of the same dtype and "
                    "sizes (the batch dimension may differ)")

    # -- backward -----------------------------------------------------------

    def prefetch_before(self, unit, post):
        """Starts gathering the unit that ran before `unit` in forward (the
        next one backward needs): under BACKWARD_PRE when `unit`'s gradient
        reaches its outputs, under BACKWARD_POST when its backward is done
        (`post`)."""
        if self.backward_prefetch != (BackwardPrefetch.BACKWARD_POST if post
                                      else BackwardPrefetch.BACKWARD_PRE):
            return
        i = self.order_index.get(id(unit))
        if i:
            prev = self.forward_order[i - 1]
            if prev.status == FREED:
                prev.start_unshard()

    def queue_finish_backward(self):
        if not self.finish_queued:
            self.finish_queued = True
            torch.autograd.Variable._execution_engine.queue_callback(
                self.finish_backward)

    def finish_backward(self):
        """End of backward: every unit's reduce_scatter waited for, its
        replicate all_reduce started (in unit order on every rank), then
        all waited for and averaged into the shards' .grad.

        A replicate all_reduce that fails (a replica lost on the elastic
        mesh) starts no further one, but every shard-group operation is
        still waited for, every unit resharded and no gradient accumulated;
        then its error is raised (out of ``backward()``: the step's error
        for ``el.end_step``), leaving the wrapper ready for the next step.
        """
        self.finish_queued = False
        self.recording = False
        started, error = [], None
        try:
            for unit in self.units:
                total = unit.wait_reduce_scatter()
                if total is None:
                    continue
                work = None
                if unit.groups.replicate is not None and error is None:
                    try:
                        work = unit.groups.replicate.all_reduce(total,
                                                                async_op=True)
                    except Exception as e:  # noqa: BLE001 (raised below)
                        error = e
                started.append((unit, total, work))
            for unit, total, work in started:
                if work is not None:
                    try:
                        work.wait()
                    except Exception as e:  # noqa: BLE001 (raised below)
                        error = error or e
            if error is None:
                for unit, total, _ in started:
                    unit.accumulate_grad(total)
        finally:
            for unit in self.units:
                unit.reductions = []
                unit.backward_pending = 0
                unit.reshard()
        if error is not None:
            raise error


class FullyShardedDataParallel(nn.Module):
    """PyTorch's FullyShardedDataParallel on a vemesh mesh (CPU tensors).

    ``FSDP(module, device_mesh=mesh, sharding_strategy=...)`` shards
    ``module``'s parameters per unit (``auto_wrap_policy`` picks the units;
    the module itself is the last) over the mesh: a 1-D mesh, or a 2-D
    (replicate, shard) mesh. ``parameters()`` then yields each unit's local
    shard, which any ``torch.optim`` optimizer steps. Beyond PyTorch:
    ``check_inputs`` (default True) agrees on the inputs' dtypes and sizes
    before each forward, so a rank with different inputs raises on every
    rank instead of leaving the others waiting in an all_gather.
    """

    def __init__(self, module, process_group=None, sharding_strategy=None,
                 cpu_offload=None, auto_wrap_policy=None,
                 backward_prefetch=BackwardPrefetch.BACKWARD_PRE,
                 mixed_precision=None, ignored_modules=None,
                 param_init_fn=None, device_id=None, sync_module_states=False,
                 forward_prefetch=False, limit_all_gathers=True,
                 use_orig_params=False, ignored_states=None, device_mesh=None,
                 check_inputs=True):
        super().__init__()
        agree = agreement_groups(device_mesh, process_group)
        # On vemesh.elastic's mesh the replicate group is the long-lived
        # elastic one: construction agrees and broadcasts inside the replica
        # only (a replica launched again builds its FSDP while the others
        # train; the replicas' states are made equal by el.sync_state and
        # compared by its fingerprint).
        elastic = elastic_replicate(agree)
        if elastic is not None:
            agree = [g for g in agree if g is not elastic]
            if not agree:
                raise FsdpError(
                    "FullyShardedDataParallel: on vemesh.elastic's mesh the "
                    "replicate dimension is elastic; shard over another "
                    "dimension: HYBRID_SHARD on a (replicate, shard) mesh")
        st = _RootState()
        st.rank = agree[0].global_rank()
        st.check_inputs = bool(check_inputs)
        st.forward_prefetch = bool(forward_prefetch)
        st.backward_prefetch = backward_prefetch
        object.__setattr__(self, "_fsdp", st)

        plan, err = None, ""
        try:
            strategy = _strategy(sharding_strategy)
            if elastic is not None and strategy not in (
                    ShardingStrategy.HYBRID_SHARD,
                    ShardingStrategy._HYBRID_SHARD_ZERO2):
                raise FsdpError(
                    f"sharding_strategy {strategy.name} on vemesh.elastic's "
                    "mesh: only HYBRID_SHARD and _HYBRID_SHARD_ZERO2 (shard "
                    "inside a replica, all_reduce over the elastic "
                    "replicate group) are supported there")
            self._check_arguments(module, strategy, device_mesh, process_group,
                                  agree, cpu_offload, mixed_precision,
                                  param_init_fn, device_id, use_orig_params,
                                  ignored_states, backward_prefetch)
            plan = _Plan(module, auto_wrap_policy, ignored_modules)
        except FsdpError as e:
            err = str(e)
        except Exception as e:  # a user policy's, say: still agreed first
            err = f"{type(e).__name__}: {e}"
        summary = "" if plan is None else (
            f"strategy={strategy.name};check_inputs={st.check_inputs};"
            f"forward_prefetch={st.forward_prefetch};"
            f"backward_prefetch={backward_prefetch};"
            f"sync_module_states={bool(sync_module_states)};{plan.summary}")
        values = "" if plan is None or sync_module_states else plan.fingerprint()
        records = exchange(agree, {"rank": st.rank, "err": err,
                                   "sig": summary, "values": values})
        what = "FullyShardedDataParallel"
        raise_if_any_failed(records, st.rank, what)
        first = records[0]
        st.is_first_rank = first["rank"] == st.rank
        for r in records:
            if r["sig"] != first["sig"]:
                theirs, ours = first_difference(r["sig"], first["sig"])
                raise FsdpError(
                    f"{what}: rank {r['rank']} wraps a different model or "
                    f"passed other arguments than rank {first['rank']}: "
                    f"'{theirs}' on rank {r['rank']}, '{ours}' on rank "
                    f"{first['rank']}")
        differ = [r["rank"] for r in records if r["values"] != first["values"]]
        if differ:
            # PyTorch would shard a mix of every rank's values (and let
            # HSDP replicas drift apart); the first rank's are taken instead.
            warnings.warn(
                f"{what}: the parameters of rank{'s' if len(differ) > 1 else ''}"
                f" {', '.join(map(str, differ[:8]))} differ from rank "
                f"{first['rank']}'s (same shapes, other values): rank "
                f"{first['rank']}'s are broadcast to every rank. Seed every "
                "rank alike, or pass sync_module_states=True to ask for "
                "this", stacklevel=2)
            sync_module_states = True
        if sync_module_states:
            _broadcast_module(module, agree)

        st.strategy = strategy
        st.groups = FsdpGroups.from_args(device_mesh, process_group, strategy,
                                         agree, elastic)
        st.module = module
        self._fsdp_wrapped_module = module
        reshard = (Reshard.AFTER_BACKWARD if strategy in (
            ShardingStrategy.SHARD_GRAD_OP,
            ShardingStrategy._HYBRID_SHARD_ZERO2) else Reshard.AFTER_FORWARD)
        info_of = {}
        for unit_module, path, params, infos in plan.units:
            unit = FlatParamUnit(unit_module, path, infos, params, st.groups,
                                 reshard, st)
            st.units.append(unit)
            for info in infos:
                info_of[id(info)] = (unit, info)
            if unit_module is module:
                st.root_unit = unit
            else:
                unit_module.register_forward_pre_hook(
                    lambda m, inp, u=unit: st.pre_forward(u))
                unit_module.register_forward_hook(
                    lambda m, inp, out, u=unit: u.post_forward(out, False))
        st.keys = [(k, None if i is None else info_of[id(i)])
                   for k, i in plan.keys]
        st.use_saved_tensor_hooks = any(u.sharded for u in st.units)

    @staticmethod
    def _check_arguments(module, strategy, device_mesh, process_group, agree,
                         cpu_offload, mixed_precision, param_init_fn,
                         device_id, use_orig_params, ignored_states,
                         backward_prefetch):
        if not isinstance(module, nn.Module):
            raise FsdpError(f"module is a {type(module).__name__}; "
                            "expected a torch.nn.Module")
        hybrid = strategy in (ShardingStrategy.HYBRID_SHARD,
                              ShardingStrategy._HYBRID_SHARD_ZERO2)
        if device_mesh is not None:
            names = ", ".join(device_mesh.mesh_dim_names)
            shape = tuple(device_mesh.shape)
            if device_mesh.ndim not in (1, 2):
                raise FsdpError(
                    f"device_mesh has {device_mesh.ndim} dimensions "
                    f"{shape} ({names}); expected a 1-D mesh or a 2-D "
                    "(replicate, shard) mesh (slice one: mesh['dp'] or "
                    "mesh[('replicate', 'shard')])")
            if hybrid and device_mesh.ndim != 2:
                raise FsdpError(
                    f"{strategy.name} needs a 2-D device_mesh "
                    f"(replicate, shard); this one is 1-D {shape} ({names}): "
                    "use init_device_mesh('cpu', (replicas, shards)) or "
                    "FULL_SHARD")
        elif hybrid and not (isinstance(process_group, (tuple, list)) and
                             len(process_group) == 2):
            raise FsdpError(
                f"{strategy.name} with process_group= takes the pair "
                "(shard_group, replicate_group)")
        elif not hybrid and isinstance(process_group, (tuple, list)):
            raise FsdpError(
                f"{strategy.name} takes one process_group; a pair "
                "(shard_group, replicate_group) is for HYBRID_SHARD")
        for g in agree:
            if g.size() > 1 and g.backend == "nccl":
                raise FsdpError(
                    "the mesh's groups are NCCL; this FSDP moves "
                    "CPU tensors: init_device_mesh('cpu', ...)")
        if mixed_precision is not None:
            raise FsdpError("mixed_precision is not supported: "
                            "parameters, gradients and reductions keep the "
                            "parameters' dtype")
        if cpu_offload is not None and getattr(cpu_offload, "offload_params",
                                               False):
            raise FsdpError("CPUOffload(offload_params=True): the "
                            "parameters are on the CPU already")
        if param_init_fn is not None:
            raise FsdpError("param_init_fn is not supported: build "
                            "the module with real (CPU) parameters")
        if device_id not in (None, "cpu") and device_id != torch.device("cpu"):
            raise FsdpError(f"device_id={device_id!r}: only the CPU "
                            "is supported (leave it out)")
        if use_orig_params:
            raise FsdpError("use_orig_params=True is not supported: "
                            "parameters() yields each unit's flat shard")
        if ignored_states is not None:
            raise FsdpError("ignored_states is not supported: use "
                            "ignored_modules")
        if backward_prefetch is not None and not isinstance(
                backward_prefetch, BackwardPrefetch):
            raise FsdpError(f"backward_prefetch is "
                            f"{backward_prefetch!r}; expected a "
                            "BackwardPrefetch or None")

    # -- nn.Module ------------------------------------------------------------

    def __getattr__(self, name):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self._modules["_fsdp_wrapped_module"], name)

    def __getitem__(self, key):
        return self._fsdp_wrapped_module.__getitem__(key)

    @property
    def module(self):
        """The wrapped module (PyTorch's FSDP.module)."""
        return self._fsdp_wrapped_module

    @property
    def sharding_strategy(self):
        return self._fsdp.strategy

    def forward(self, *args, **kwargs):
        st = self._fsdp
        st.pass_id += 1
        if st.check_inputs:
            # The check's gather overlaps the root unit's; a rank with other
            # inputs raises (on every rank) before any unit computes.
            started = st.start_input_check(args, kwargs)
            if st.root_unit is not None:
                st.root_unit.start_unshard()
            try:
                st.finish_input_check(started)
            except FsdpError:
                if st.root_unit is not None:
                    st.root_unit.reshard()
                raise
        hooks = (torch.autograd.graph.saved_tensors_hooks(
            pack_saved, unpack_saved) if st.use_saved_tensor_hooks else
            contextlib.nullcontext())
        with hooks:
            if st.root_unit is not None:
                st.pre_forward(st.root_unit)
            out = self._fsdp_wrapped_module(*args, **kwargs)
            if st.root_unit is not None:
                st.root_unit.post_forward(out, True)
        if not torch.is_grad_enabled():
            for unit in st.units:  # no backward will come to free them
                unit.reshard()
        return out

    # -- state dicts ----------------------------------------------------------

    def state_dict(self, *args, destination=None, prefix="", keep_vars=False):
        st = self._fsdp
        if st.state_dict_type == StateDictType.SHARDED_STATE_DICT:
            sd = _state_dict.sharded_state_dict(st)
        else:
            sd = _state_dict.full_state_dict(
                st, getattr(st.state_dict_config, "rank0_only", False))
        if destination is None and not prefix:
            return sd
        dest = destination if destination is not None else type(sd)()
        for k, v in sd.items():
            dest[prefix + k] = v
        return dest

    def load_state_dict(self, state_dict, strict=True):
        st = self._fsdp
        return _state_dict.load_state_dict(
            st, state_dict, strict,
            st.state_dict_type == StateDictType.SHARDED_STATE_DICT)

    @staticmethod
    def optim_state_dict(model, optim):
        """Collective under FULL_STATE_DICT: `optim`'s state by original
        parameter name (PyTorch's layout), whole parameters' state under
        FULL_STATE_DICT, FlatShards under SHARDED_STATE_DICT."""
        st = FullyShardedDataParallel._root_state(model)
        return _state_dict.optim_state_dict(
            st, optim, st.state_dict_type == StateDictType.SHARDED_STATE_DICT,
            getattr(st.state_dict_config, "rank0_only", False))

    @staticmethod
    def optim_state_dict_to_load(model, optim, optim_state_dict):
        """A dict from ``optim_state_dict`` (any mesh or strategy if full,
        this one if sharded) as ``optim.load_state_dict`` takes it here."""
        st = FullyShardedDataParallel._root_state(model)
        return _state_dict.optim_state_dict_to_load(
            st, optim, optim_state_dict,
            st.state_dict_type == StateDictType.SHARDED_STATE_DICT)

    @staticmethod
    def _root_state(model):
        roots = FullyShardedDataParallel.fsdp_modules(model)
        if len(roots) != 1:
            raise FsdpError(f"expected one FullyShardedDataParallel in the "
                            f"model, found {len(roots)}")
        return roots[0]._fsdp

    @staticmethod
    def set_state_dict_type(module, state_dict_type, state_dict_config=None):
        """Sets the kind of state dict every FSDP instance in `module`
        gives and takes; returns the previous (type, config)."""
        _state_dict.check_state_dict_type(state_dict_type)
        if state_dict_config is None:
            state_dict_config = (
                ShardedStateDictConfig()
                if state_dict_type == StateDictType.SHARDED_STATE_DICT else
                FullStateDictConfig())
        prev = None
        for m in FullyShardedDataParallel.fsdp_modules(module):
            st = m._fsdp
            prev = prev or (st.state_dict_type, st.state_dict_config)
            st.state_dict_type, st.state_dict_config = (state_dict_type,
                                                        state_dict_config)
        return prev

    @staticmethod
    @contextlib.contextmanager
    def state_dict_type(module, state_dict_type, state_dict_config=None):
        """``with FSDP.state_dict_type(model, StateDictType.X): ...``"""
        saved = [(m, m._fsdp.state_dict_type, m._fsdp.state_dict_config)
                 for m in FullyShardedDataParallel.fsdp_modules(module)]
        FullyShardedDataParallel.set_state_dict_type(module, state_dict_type,
                                                     state_dict_config)
        try:
            yield
        finally:
            for m, t, c in saved:
                m._fsdp.state_dict_type, m._fsdp.state_dict_config = t, c

    @staticmethod
    def fsdp_modules(module, root_only=False):
        return [m for m in module.modules()
                if isinstance(m, FullyShardedDataParallel)]

    # -- utilities ------------------------------------------------------------

    @staticmethod
    @contextlib.contextmanager
    def summon_full_params(module, recurse=True, writeback=True,
                           rank0_only=False, offload_to_cpu=False,
                           with_grads=False):
        """Collective: inside, every wrapped parameter is whole (gathered)
        and registered again under its own name, as in PyTorch:
        ``model.named_parameters()`` yields ``net1.weight``, not the
        units' ``_flat_param``; on exit this rank's part is written back
        (``writeback``) and the units are resharded."""
        # Nested inside another summon_full_params of the same model: its
        # parameters are whole already (nothing to do, as in PyTorch).
        roots = [m for m in FullyShardedDataParallel.fsdp_modules(module)
                 if not m._fsdp.summoned]
        exposed = []  # undone on exit, also when a gather fails midway
        try:
            for m in roots:
                st = m._fsdp
                st.pass_id += 1  # a fresh gather
                st.summoned = True
                for unit in st.units:
                    unit.unshard()
                    unit.expose_params(unit.full_tensor())
                    exposed.append(unit)
            yield
        finally:
            with torch.no_grad():
                for m in roots:
                    m._fsdp.summoned = False
                for unit in exposed:
                    unit.hide_params()
                    if writeback and unit.sharded:
                        unit.flat_param.detach().copy_(
                            unit.full[unit.shard_offset:unit.shard_offset +
                                      unit.shard_numel])
                for m in roots:
                    for unit in m._fsdp.units:
                        unit.reshard()

    def named_parameters(self, *args, **kwargs):
        """As ``nn.Module``'s; inside ``summon_full_params`` the wrapper's
        ``_fsdp_wrapped_module.`` prefix is left out (PyTorch's names)."""
        strip = self._fsdp.summoned
        for name, param in super().named_parameters(*args, **kwargs):
            yield (name.replace("_fsdp_wrapped_module.", "") if strip else
                   name), param

    def clip_grad_norm_(self, max_norm, norm_type=2.0):
        """Collective: clips the sharded gradients by their total norm over
        the whole model (one all_reduce over the shard group); returns the
        total norm."""
        st = self._fsdp
        norm_type = float(norm_type)
        grads = [u.flat_param.grad for u in st.units
                 if u.flat_param.grad is not None]
        dtype = grads[0].dtype if grads else torch.float32
        if norm_type == math.inf:
            local = max((g.abs().max() for g in grads if g.numel()),
                        default=torch.tensor(0.0, dtype=dtype))
            total = local.reshape(1).to(dtype).clone()
            if st.groups.shard is not None:
                st.groups.shard.all_reduce(total, op="max")
            total = total[0]
        else:
            local = sum((g.abs().pow(norm_type).sum() for g in grads),
                        torch.tensor(0.0, dtype=dtype))
            total = local.reshape(1).clone()
            if st.groups.shard is not None:
                st.groups.shard.all_reduce(total)
            total = total[0].pow(1.0 / norm_type)
        coef = float(max_norm) / (float(total) + 1e-6)
        if coef < 1:
            for g in grads:
                g.mul_(coef)
        return total

    def flat_shards(self):
        """Each unit's shard as checkpoints describe it: ``tensor`` (the
        unit's flat shard, what the optimizer steps), ``params`` ((name,
        shape) in flattening order) and this rank's elements ``[begin,
        end)`` of their concatenation (``end`` may pass the last parameter:
        padding), ``replica`` (0 on the copy to write). For
        ``vemesh.torch.checkpoint``: ``ParamShard(s.tensor,
        flat_pieces(s.params, s.begin, s.end))``."""
        return [FlatParamShard(u.flat_param,
                               [(i.names[0], tuple(i.shape)) for i in u.infos],
                               u.shard_offset, u.shard_offset + u.shard_numel,
                               u.groups.replicate_rank)
                for u in self._fsdp.units]

    def memory_usage(self):
        """Bytes this rank holds: parameter shards, their gradients, and
        what is gathered now / was at most (``peak_gathered``)."""
        st = self._fsdp
        shards = sum(u.flat_param.numel() * u.flat_param.element_size()
                     for u in st.units)
        grads = sum(u.flat_param.grad.numel() * u.flat_param.element_size()
                    for u in st.units if u.flat_param.grad is not None)
        return {"shards": shards, "grads": grads,
                "gathered": st.gathered_bytes,
                "peak_gathered": st.peak_gathered_bytes}


class _Plan:
    """What wrapping will do, worked out before anything changes (so errors
    can be agreed first): units with their parameters, state dict keys."""

    def __init__(self, module, policy, ignored_modules):
        for m in module.modules():
            if isinstance(m, FullyShardedDataParallel):
                raise FsdpError(
                    "the module already holds a "
                    "FullyShardedDataParallel; nest units with "
                    "auto_wrap_policy instead")
        ignored_mods = set()
        for m in (ignored_modules or ()):
            ignored_mods.update(id(x) for x in m.modules())
        ignored_params = set()
        for m in (ignored_modules or ()):
            ignored_params.update(id(p) for p in m.parameters())
        names = {}
        for name, m in module.named_modules():
            names.setdefault(id(m), name)
        unit_modules, seen = [], set()
        for m in plan_units(module, policy, ignored_mods, ignored_params):
            if id(m) not in seen:
                seen.add(id(m))
                unit_modules.append(m)
        unit_ids = {id(m) for m in unit_modules}

        owner = {}  # id(param) -> (unit module path, first name)
        self.units = []
        self.params = []
        info_of_param = {}
        for um in unit_modules:
            path = names.get(id(um), "")
            entries = {}  # id(param) -> [param, owners, names]

            def visit(mod, prefix, um=um, path=path, entries=entries):
                for attr, p in mod._parameters.items():
                    if p is None or id(p) in ignored_params:
                        continue
                    name = prefix + attr
                    if id(p) in owner and owner[id(p)][0] != path:
                        raise FsdpError(
                            f"parameter '{owner[id(p)][1]}' is also "
                            f"'{name}', in another unit ('{path}'); tied "
                            "parameters must be in one unit (wrap their "
                            "common parent instead)")
                    owner.setdefault(id(p), (path, name))
                    e = entries.setdefault(id(p), [p, [], []])
                    if (mod, attr) not in e[1]:
                        e[1].append((mod, attr))
                        e[2].append(name)
                for cname, child in mod._modules.items():
                    if (child is None or id(child) in ignored_mods or
                            (id(child) in unit_ids and child is not um)):
                        continue
                    visit(child, prefix + cname + ".")

            visit(um, path + "." if path else "")
            if not entries:
                continue
            params = [e[0] for e in entries.values()]
            infos = [ParamInfo(p, owners, pnames)
                     for p, owners, pnames in entries.values()]
            for p, info in zip(params, infos):
                info_of_param[id(p)] = info
            self._check_unit(path, params, infos)
            self.units.append((um, path, params, infos))
            self.params.extend(params)
        self.keys = []
        for key, v in module.state_dict(keep_vars=True).items():
            self.keys.append((key, info_of_param.get(id(v))))
        parts = []
        for um, path, params, infos in self.units:
            parts.append(f"unit '{path}'")
            for p, info in zip(params, infos):
                parts.append(f"{info.names[0]}: "
                             f"{str(p.dtype).replace('torch.', '')}"
                             f"{list(p.shape)}"
                             f"{'' if p.requires_grad else ' frozen'}")
        self.summary = ";".join(parts)

    @staticmethod
    def _check_unit(path, params, infos):
        first = params[0]
        for p, info in zip(params, infos):
            if p.device.type != "cpu":
                raise FsdpError(f"parameter '{info.names[0]}' is on "
                                f"{p.device}; this FSDP takes CPU tensors")
            if not p.is_floating_point():
                raise FsdpError(f"parameter '{info.names[0]}' is "
                                f"{p.dtype}; expected a floating type")
            if p.dtype != first.dtype:
                raise FsdpError(
                    f"unit '{path}' mixes dtypes: "
                    f"'{infos[0].names[0]}' is {first.dtype} but "
                    f"'{info.names[0]}' is {p.dtype}; one unit flattens into "
                    "one tensor (cast the module, or wrap them apart with "
                    "auto_wrap_policy)")
            if p.requires_grad != first.requires_grad:
                raise FsdpError(
                    f"unit '{path}' mixes frozen and trainable "
                    f"parameters ('{infos[0].names[0]}' and "
                    f"'{info.names[0]}'); wrap them apart with "
                    "auto_wrap_policy")

    def fingerprint(self):
        h = hashlib.blake2b(digest_size=8)
        for p in self.params:
            data = p.detach().contiguous().reshape(-1)
            h.update(data.view(torch.uint8).numpy().tobytes())
        return h.hexdigest()


def _broadcast_module(module, agree):
    """sync_module_states: every parameter and buffer from the mesh's first
    rank, one broadcast per tensor and mesh dimension."""
    with torch.no_grad():
        tensors = list(module.parameters()) + list(module.buffers())
        for g in agree:
            for t in tensors:
                if g.size() > 1:
                    buf = t.detach()
                    if not buf.is_contiguous():
                        raise FsdpError("sync_module_states: a non-contiguous "
                                        "parameter or buffer")
                    g.broadcast(buf, src=0)
