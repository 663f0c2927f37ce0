"""Megatron-style tensor-parallel linear layers over a vemesh TP group.

``ColumnParallelLinear(in, out)`` keeps rows ``out/T * t .. out/T * (t+1)``
of the full ``out x in`` weight on TP rank ``t`` of ``T`` (the output's last
dimension is split); ``RowParallelLinear(in, out)`` keeps columns ``in/T *
t ..`` (the input's last dimension is split) and sums the partial outputs.
A column layer followed by a row layer (an MLP, attention's projections)
needs one all-reduce forward and one backward:

    from vemesh.torch import ColumnParallelLinear, RowParallelLinear
    fc1 = ColumnParallelLinear(1024, 4096)                      # gather_output=False
    fc2 = RowParallelLinear(4096, 1024, input_is_parallel=True)
    y = fc2(torch.relu(fc1(x)))                                  # == dense fc2(relu(fc1(x)))

The group is ``tp_group``: a vemesh.Communicator, a DeviceMesh (its "TP"
dimension, or its only one) or None, VESCALE_DEVICE_MESH's TP group.

Autograd, as Megatron's mappings (torch.autograd.Function), each a public
function here:

- copy_to_tensor_parallel_region: forward identity, backward all-reduce
  (the column layer's input: each rank's input gradient is a partial sum);
- reduce_from_tensor_parallel_region: forward all-reduce, backward identity
  (the row layer's partial outputs);
- gather_from_tensor_parallel_region: forward all-gather along the last
  dimension, backward keeps this rank's slice (``gather_output=True``);
- scatter_to_tensor_parallel_region: forward keeps this rank's slice,
  backward all-gathers (``input_is_parallel=False``).

Weights are initialised as ``torch.nn.Linear(in, out)`` initialises the full
layer (same RNG draws: seed every TP rank alike) and each rank keeps its
shard, so the layer equals a dense ``torch.nn.Linear`` made after the same
``torch.manual_seed``; ``from_dense(linear)`` shards an existing one. The
row layer's bias is whole on every rank, added once after the sum.

Collectives run on the communicator on the tensors themselves (DLPack,
zero-copy; host tensors for Gloo and MPI, CUDA tensors for NCCL). Bad input
raises the same ValueError on every TP rank, never a hang: the sizes are
checked where the layer is made (``out_features`` / ``in_features`` not
divisible by the TP size; arguments or initial weights that differ across
TP ranks) and, before each forward's collectives, the input's dtype and
shape are agreed over the group with one small all-gather
(``check_inputs=False`` skips it).
"""

import zlib

import torch
import torch.nn.functional as F

from ._agreement import agree
from ._group import SharedGroup, resolve_group

__all__ = [
    "ColumnParallelLinear",
    "RowParallelLinear",
    "copy_to_tensor_parallel_region",
    "reduce_from_tensor_parallel_region",
    "gather_from_tensor_parallel_region",
    "scatter_to_tensor_parallel_region",
]


def _all_gather_last_dim(x, comm):
    # vemesh gathers whole blocks in rank order: (T, ..., n) -> (..., T * n).
    # (DLPack exports no tensor that requires grad: the data is what moves.)
    x = x.detach().contiguous()
    out = torch.empty((comm.size(),) + tuple(x.shape), dtype=x.dtype,
                      device=x.device)
    comm.all_gather(out, x)
    return out.movedim(0, -2).reshape(*x.shape[:-1], comm.size() * x.shape[-1])


def _slice_last_dim(x, comm):
    n = x.shape[-1] // comm.size()
    return x.narrow(-1, comm.rank() * n, n).contiguous()


def _all_reduced(x, comm):
    out = x.detach().clone(memory_format=torch.contiguous_format)
    comm.all_reduce(out)
    return out


class _CopyToTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, comm):
        ctx.comm = comm
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return _all_reduced(grad, ctx.comm), None


class _ReduceFromTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, comm):
        return _all_reduced(x, comm)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class _GatherFromTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, comm):
        ctx.comm = comm
        return _all_gather_last_dim(x, comm)

    @staticmethod
    def backward(ctx, grad):
        return _slice_last_dim(grad, ctx.comm), None


class _ScatterToTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, comm):
        ctx.comm = comm
        return _slice_last_dim(x, comm)

    @staticmethod
    def backward(ctx, grad):
        return _all_gather_last_dim(grad, ctx.comm), None


def copy_to_tensor_parallel_region(x, comm):
    """Identity forward; all-reduce of the gradient over ``comm`` backward."""
    return x if comm.size() == 1 else _CopyToTP.apply(x, comm)


def reduce_from_tensor_parallel_region(x, comm):
    """All-reduce (sum) over ``comm`` forward; identity backward."""
    return x if comm.size() == 1 else _ReduceFromTP.apply(x, comm)


def gather_from_tensor_parallel_region(x, comm):
    """All-gather along the last dimension forward; this rank's slice of the
    gradient backward."""
    return x if comm.size() == 1 else _GatherFromTP.apply(x, comm)


def scatter_to_tensor_parallel_region(x, comm):
    """This rank's slice of the last dimension forward (it must divide by the
    group size); all-gather of the gradient backward."""
    return x if comm.size() == 1 else _ScatterToTP.apply(x, comm)


def _crc(tensor):
    if tensor is None:
        return 0
    raw = tensor.detach().cpu().contiguous().view(torch.uint8).numpy()
    return zlib.crc32(raw.tobytes())


class _TensorParallelLinear(torch.nn.Module):
    """What the column and row layers share: the group, the checks, the
    shards of a full-size initialisation."""

    _split = None  # "out_features" or "in_features": the dimension divided

    def __init__(self, in_features, out_features, bias, flag, tp_group,
                 device, dtype, check_inputs, full=None):
        super().__init__()
        name = type(self).__name__
        self._flag = flag  # ("gather_output", False), ...
        setattr(self, *flag)
        self._group = SharedGroup(resolve_group(tp_group, "TP", name))
        self.tp_size = self.tp_group.size()
        self.tp_rank = self.tp_group.rank()
        self.in_features = in_features
        self.out_features = out_features
        self.check_inputs = check_inputs
        # A bad argument is agreed like any other, so that a rank whose
        # arguments alone are bad does not leave its peers waiting.
        error = None
        for arg, value in (("in_features", in_features),
                           ("out_features", out_features)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                error = error or f"{arg}={value!r}; expected a positive int"
        split = in_features if self._split == "in_features" else out_features
        if error is None and split % self.tp_size != 0:
            error = (f"{self._split}={split} is not divisible by the TP "
                     f"group's size {self.tp_size}; each TP rank keeps "
                     f"{self._split} / {self.tp_size} of the "
                     f"{'columns' if self._split == 'in_features' else 'rows'}")
        weight_dtype = (full[0].dtype if full is not None
                        else dtype or torch.get_default_dtype())
        if self.tp_size > 1:
            agree(self.tp_group, f"{name} arguments",
                  f"in_features={in_features}, out_features={out_features}, "
                  f"bias={bool(bias)}, {flag[0]}={flag[1]}, "
                  f"dtype={weight_dtype}", error, role="TP")
        elif error is not None:
            raise ValueError(f"{name}: {error}")
        if full is None:
            # torch.nn.Linear's own initialisation of the full layer (the same
            # RNG draws), then this rank's shard of it.
            full = torch.nn.Linear(in_features, out_features, bias=bias,
                                   dtype=dtype)
            full_weight, full_bias = full.weight.detach(), (
                full.bias.detach() if bias else None)
        else:
            full_weight, full_bias = full
        if self.tp_size > 1:
            agree(self.tp_group,
                  f"{name}: the full-size initial weights (seed torch's RNG "
                  f"alike on every TP rank, e.g. torch.manual_seed(0), before "
                  f"making the layer)",
                  f"crc32 {_crc(full_weight):08x}/{_crc(full_bias):08x}",
                  role="TP")
        weight, bias_shard = self._shard(full_weight, full_bias)
        self.weight = torch.nn.Parameter(
            weight.clone(memory_format=torch.contiguous_format).to(device))
        self.weight.tensor_model_parallel = True
        self.weight.partition_dim = 1 if self._split == "in_features" else 0
        self.weight._vemesh_tp_group = self._group
        if bias_shard is None:
            self.register_parameter("bias", None)
        else:
            self.bias = torch.nn.Parameter(
                bias_shard.clone(memory_format=torch.contiguous_format).to(device))
            self.bias.tensor_model_parallel = self._split == "out_features"
            self.bias.partition_dim = 0
            self.bias._vemesh_tp_group = self._group

    @property
    def tp_group(self):
        """The TP group's vemesh.Communicator."""
        return self._group.comm

    def extra_repr(self):
        return (f"in_features={self.in_features}, "
                f"out_features={self.out_features}, "
                f"bias={self._parameters.get('bias') is not None}, "
                f"{self._flag[0]}={self._flag[1]}, tp_size={self.tp_size}")

    def _check(self, x, expected_last, where):
        """Agrees the input over the TP group before any collective."""
        if not self.check_inputs or self.tp_size == 1:
            return
        error = None
        if not isinstance(x, torch.Tensor):
            error = f"the input is a {type(x).__name__}, not a torch.Tensor"
            text = "not a tensor"
        else:
            text = f"input {x.dtype} {list(x.shape)}"
            if x.dtype != self.weight.dtype:
                error = (f"the input is {x.dtype} {list(x.shape)} but the "
                         f"weight is {self.weight.dtype}")
            elif x.dim() == 0 or x.shape[-1] != expected_last:
                error = (f"the input is {x.dtype} {list(x.shape)}; expected "
                         f"its last dimension to be {expected_last} ({where})")
            elif x.device != self.weight.device:
                error = (f"the input is on {x.device}, the weight on "
                         f"{self.weight.device}")
        agree(self.tp_group, f"{type(self).__name__} forward", text, error,
              role="TP")


class ColumnParallelLinear(_TensorParallelLinear):
    """``y = x W^T + b`` with W's rows (the output features) split over TP.

    Args:
        in_features, out_features: the full layer's sizes; ``out_features``
            must divide by the TP size.
        bias: a bias, split as the rows.
        gather_output: all-gather the output (every rank gets all
            ``out_features``); False (Megatron's default) keeps this rank's
            ``out_features / T``, the input a RowParallelLinear expects.
        tp_group: see the module; default VESCALE_DEVICE_MESH's TP group.
        device, dtype: as torch.nn.Linear's.
        check_inputs: agree each input's dtype and shape over TP first.
    """

    _split = "out_features"

    def __init__(self, in_features, out_features, bias=True,
                 gather_output=False, tp_group=None, *, device=None,
                 dtype=None, check_inputs=True, _full=None):
        super().__init__(in_features, out_features, bias,
                         ("gather_output", bool(gather_output)), tp_group,
                         device, dtype, check_inputs, _full)

    @classmethod
    def from_dense(cls, linear, tp_group=None, gather_output=False, **kwargs):
        """This rank's shard of an existing torch.nn.Linear (its values, not
        its storage)."""
        return cls(linear.in_features, linear.out_features,
                   linear.bias is not None, gather_output, tp_group,
                   device=linear.weight.device, _full=_dense_weights(linear),
                   **kwargs)

    def _shard(self, weight, bias):
        n = self.out_features // self.tp_size
        rows = slice(self.tp_rank * n, (self.tp_rank + 1) * n)
        return weight[rows], None if bias is None else bias[rows]

    def forward(self, x):
        self._check(x, self.in_features, "in_features")
        x = copy_to_tensor_parallel_region(x, self.tp_group)
        y = F.linear(x, self.weight, self.bias)
        if self.gather_output:
            y = gather_from_tensor_parallel_region(y, self.tp_group)
        return y


class RowParallelLinear(_TensorParallelLinear):
    """``y = sum over TP of x_t W_t^T, + b`` with W's columns (the input
    features) split over TP.

    Args:
        in_features, out_features: the full layer's sizes; ``in_features``
            must divide by the TP size.
        bias: a bias, whole on every rank, added after the sum.
        input_is_parallel: the input is already this rank's
            ``in_features / T`` (a ColumnParallelLinear's output); False
            takes this rank's slice of a full input.
        tp_group: see the module; default VESCALE_DEVICE_MESH's TP group.
        device, dtype: as torch.nn.Linear's.
        check_inputs: agree each input's dtype and shape over TP first.
    """

    _split = "in_features"

    def __init__(self, in_features, out_features, bias=True,
                 input_is_parallel=False, tp_group=None, *, device=None,
                 dtype=None, check_inputs=True, _full=None):
        super().__init__(in_features, out_features, bias,
                         ("input_is_parallel", bool(input_is_parallel)),
                         tp_group, device, dtype, check_inputs, _full)

    @classmethod
    def from_dense(cls, linear, tp_group=None, input_is_parallel=False,
                   **kwargs):
        """This rank's shard of an existing torch.nn.Linear (its values, not
        its storage)."""
        return cls(linear.in_features, linear.out_features,
                   linear.bias is not None, input_is_parallel, tp_group,
                   device=linear.weight.device, _full=_dense_weights(linear),
                   **kwargs)

    def _shard(self, weight, bias):
        n = self.in_features // self.tp_size
        return weight[:, self.tp_rank * n:(self.tp_rank + 1) * n], bias

    def forward(self, x):
        if self.input_is_parallel:
            self._check(x, self.in_features // self.tp_size,
                        f"in_features / TP size = {self.in_features} / "
                        f"{self.tp_size}, input_is_parallel=True")
        else:
            self._check(x, self.in_features, "in_features")
            x = scatter_to_tensor_parallel_region(x, self.tp_group)
        y = reduce_from_tensor_parallel_region(F.linear(x, self.weight),
                                               self.tp_group)
        return y if self.bias is None else y + self.bias


def _dense_weights(linear):
    if not isinstance(linear, torch.nn.Linear):
        raise TypeError(f"from_dense: expected a torch.nn.Linear, got "
                        f"{type(linear).__name__}")
    return (linear.weight.detach().cpu(),
            None if linear.bias is None else linear.bias.detach().cpu())
