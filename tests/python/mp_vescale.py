"""veScale's DDP, DistributedOptimizer and Megatron-style TP layers
(vemesh.torch) on 4 ranks, under torchrun (Gloo) or mpirun (MPI). Every rank
runs the same pytest session, and every result is checked against one
process doing the same computation whole (float64, so the comparisons are
tight):

  torchrun --standalone --nproc_per_node=4 --redirects 1 --tee 1 mp_vescale.py
  mpirun -n 4 python3 mp_vescale.py
"""
import copy
import os
import runpy
import sys

import pytest

import vemesh
from vemesh import VESCALE_DEVICE_MESH

torch = pytest.importorskip("torch")
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from vemesh.torch import (  # noqa: E402
    DDP, ColumnParallelLinear, DistributedOptimizer, Replicate,
    RowParallelLinear, Shard, ShardedState, parallelize_module)

WORLD = 4
TIMEOUT = 60.0  # seconds: a lost rank fails the test instead of hanging it
F64 = torch.float64
TIGHT = dict(rtol=1e-12, atol=1e-12)


@pytest.fixture(autouse=True)
def fresh_registry():
    VESCALE_DEVICE_MESH.reset()
    yield
    VESCALE_DEVICE_MESH.reset()


def init(shape, names):
    return VESCALE_DEVICE_MESH.init_device_mesh(
        "cpu", shape, mesh_dim_names=names, timeout=TIMEOUT)


def rank():
    return VESCALE_DEVICE_MESH.get_rank()


def assert_close(got, want, **tol):
    torch.testing.assert_close(got, want, **(tol or TIGHT))


def still_works(comm):
    """The group is still usable (no rank left behind by an error)."""
    t = torch.ones(3, dtype=F64)
    comm.all_reduce(t)
    assert t.tolist() == [float(comm.size())] * 3


def randn(*shape, seed):
    return torch.randn(*shape, dtype=F64,
                       generator=torch.Generator().manual_seed(seed))


TP_MESHES = [((WORLD,), ("TP",)), ((2, 2), ("DP", "TP"))]


# -- tensor-parallel layers against a dense torch.nn.Linear ------------------


@pytest.mark.parametrize("mesh", TP_MESHES, ids=["tp4", "dp2xtp2"])
@pytest.mark.parametrize("gather_output", [False, True])
def test_column_parallel_linear_equals_dense(mesh, gather_output):
    init(*mesh)
    tp = VESCALE_DEVICE_MESH.get_tensor_parallel_dim_groups()
    t, n = tp.rank(), 12 // tp.size()
    cols = slice(t * n, (t + 1) * n)
    torch.manual_seed(3)
    dense = nn.Linear(8, 12, dtype=F64)
    torch.manual_seed(3)
    col = ColumnParallelLinear(8, 12, gather_output=gather_output, dtype=F64)
    assert torch.equal(col.weight, dense.weight[cols])
    assert torch.equal(col.bias, dense.bias[cols])

    x = randn(5, 8, seed=1).requires_grad_()
    xd = x.detach().clone().requires_grad_()
    w_out = randn(5, 12, seed=2)
    y, yd = col(x), dense(xd)
    if gather_output:
        assert_close(y, yd)
        (y * w_out).sum().backward()
    else:
        assert_close(y, yd[:, cols])
        (y * w_out[:, cols]).sum().backward()  # this rank's part of the loss
    (yd * w_out).sum().backward()
    assert_close(x.grad, xd.grad)  # the partial input gradients, all-reduced
    assert_close(col.weight.grad, dense.weight.grad[cols])
    assert_close(col.bias.grad, dense.bias.grad[cols])


@pytest.mark.parametrize("mesh", TP_MESHES, ids=["tp4", "dp2xtp2"])
@pytest.mark.parametrize("input_is_parallel", [True, False])
def test_row_parallel_linear_equals_dense(mesh, input_is_parallel):
    init(*mesh)
    tp = VESCALE_DEVICE_MESH.get_tensor_parallel_dim_groups()
    t, n = tp.rank(), 12 // tp.size()
    cols = slice(t * n, (t + 1) * n)
    torch.manual_seed(4)
    dense = nn.Linear(12, 6, dtype=F64)
    torch.manual_seed(4)
    row = RowParallelLinear(12, 6, input_is_parallel=input_is_parallel,
                            dtype=F64)
    assert torch.equal(row.weight, dense.weight[:, cols])
    assert torch.equal(row.bias, dense.bias)

    full = randn(5, 12, seed=5)
    x = (full[:, cols] if input_is_parallel else full).clone().requires_grad_()
    xd = full.clone().requires_grad_()
    w_out = randn(5, 6, seed=6)
    y, yd = row(x), dense(xd)
    assert_close(y, yd)
    (y * w_out).sum().backward()
    (yd * w_out).sum().backward()
    assert_close(x.grad, xd.grad[:, cols] if input_is_parallel else xd.grad)
    assert_close(row.weight.grad, dense.weight.grad[:, cols])
    assert_close(row.bias.grad, dense.bias.grad)


def test_column_then_row_mlp_equals_dense_and_from_dense():
    init((WORLD,), ("TP",))
    t = rank()
    torch.manual_seed(7)
    fc1, fc2 = nn.Linear(8, 16, dtype=F64), nn.Linear(16, 8, dtype=F64)
    col = ColumnParallelLinear.from_dense(fc1)
    row = RowParallelLinear.from_dense(fc2, input_is_parallel=True)
    x = randn(3, 8, seed=8).requires_grad_()
    xd = x.detach().clone().requires_grad_()
    y = row(torch.tanh(col(x)))
    yd = fc2(torch.tanh(fc1(xd)))
    assert_close(y, yd)
    y.pow(2).sum().backward()
    yd.pow(2).sum().backward()
    assert_close(x.grad, xd.grad)
    assert_close(col.weight.grad, fc1.weight.grad[4 * t:4 * t + 4])
    assert_close(row.weight.grad, fc2.weight.grad[:, 4 * t:4 * t + 4])
    assert_close(row.bias.grad, fc2.bias.grad)
    twin = copy.deepcopy(col)  # an EMA copy: the same group, its own weights
    assert twin.tp_group is col.tp_group
    assert twin.weight.data_ptr() != col.weight.data_ptr()
    assert_close(twin(x), col(x))


def test_parallelize_module_with_vescale_plan():
    init((2, 2), ("DP", "TP"))
    t = VESCALE_DEVICE_MESH.get_tensor_parallel_rank()
    torch.manual_seed(9)
    mlp = nn.Sequential(nn.Linear(4, 8, dtype=F64), nn.ReLU(),
                        nn.Linear(8, 4, dtype=F64))
    x = randn(6, 4, seed=10)
    want = mlp(x).detach()
    w1, w2 = mlp[0].weight.detach().clone(), mlp[2].weight.detach().clone()
    plan = {"parameter": {r"0\.(weight|bias)": [Shard(0)],
                          "2.weight": [Shard(1)], "2.bias": [Replicate()]},
            "forward": {"0.input": [[Replicate()]],
                        "2.output": [[Replicate()]]}}
    tp_mlp = parallelize_module(mlp, VESCALE_DEVICE_MESH["TP"], plan)
    assert isinstance(tp_mlp[0], ColumnParallelLinear)
    assert isinstance(tp_mlp[2], RowParallelLinear)
    assert tp_mlp[2].input_is_parallel and not tp_mlp[0].gather_output
    assert torch.equal(tp_mlp[0].weight, w1[4 * t:4 * t + 4])
    assert torch.equal(tp_mlp[2].weight, w2[:, 4 * t:4 * t + 4])
    assert_close(tp_mlp(x), want)


# -- veScale's DDP ------------------------------------------------------------


def make_model(seed=11, dtype=F64):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 10, dtype=dtype), nn.Tanh(),
                         nn.Linear(10, 7, dtype=dtype), nn.Tanh(),
                         nn.Linear(7, 3, dtype=dtype))


def batches(steps, n=16, seed=12):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(n, 6, dtype=F64, generator=g),
             torch.randn(n, 3, dtype=F64, generator=g)) for _ in range(steps)]


def local(batch, dp_rank, dp_size):
    n = batch.shape[0] // dp_size
    return batch[dp_rank * n:(dp_rank + 1) * n]


@pytest.mark.parametrize("overlap,bucket_size", [(True, 40000000), (True, 30),
                                                  (False, 30)])
def test_ddp_equals_one_process(overlap, bucket_size):
    init((WORLD,), ("DP",))
    dp = VESCALE_DEVICE_MESH.get_data_parallel_dim_groups()
    ddp = DDP(make_model(), VESCALE_DEVICE_MESH["DP"],
              overlap_grad_reduce=overlap, bucket_size=bucket_size)
    if overlap and bucket_size == 30:
        assert len(ddp.grad_buffers[F64].buckets) > 2
    ref = make_model()
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    for x, y in batches(3):
        opt.zero_grad(set_to_none=True)
        ref_opt.zero_grad(set_to_none=True)
        F.mse_loss(ddp(local(x, dp.rank(), dp.size())),
                   local(y, dp.rank(), dp.size())).backward()
        ddp.finish_grad_sync()  # veScale's explicit call: a no-op here
        F.mse_loss(ref(x), y).backward()
        for p, q in zip(ddp.module.parameters(), ref.parameters()):
            assert p.grad.data_ptr() == p.main_grad.data_ptr()
            assert_close(p.grad, q.grad)
        opt.step()
        ref_opt.step()
    for p, q in zip(ddp.module.parameters(), ref.parameters()):
        assert_close(p, q)


def test_ddp_no_sync_accumulates_then_averages():
    init((WORLD,), ("DP",))
    me = rank()
    ddp = DDP(make_model(), VESCALE_DEVICE_MESH, bucket_size=25)  # its DP
    ref = make_model()
    (x1, y1), (x2, y2) = batches(2)
    with ddp.no_sync():
        F.mse_loss(ddp(local(x1, me, WORLD)), local(y1, me, WORLD)).backward()
    F.mse_loss(ddp(local(x2, me, WORLD)), local(y2, me, WORLD)).backward()
    (F.mse_loss(ref(x1), y1) + F.mse_loss(ref(x2), y2)).backward()
    for p, q in zip(ddp.module.parameters(), ref.parameters()):
        assert_close(p.grad, q.grad)


def test_ddp_starts_from_dp_rank_0s_values():
    mesh = vemesh.init_device_mesh("cpu", (2, 2), mesh_dim_names=("DP", "TP"),
                                   timeout=TIMEOUT)
    dp = mesh.get_group("DP")
    ddp = DDP(make_model(seed=100 + mesh.get_rank()), mesh)  # its "DP"
    want = make_model(seed=100 + dp.ranks()[0])
    for p, q in zip(ddp.module.parameters(), want.parameters()):
        assert torch.equal(p, q)


def test_ddp_bfloat16_accumulates_in_float32():
    init((WORLD,), ("DP",))
    me = rank()
    ddp = DDP(make_model(dtype=torch.bfloat16), VESCALE_DEVICE_MESH["DP"])
    gb = ddp.grad_buffers[torch.bfloat16]
    assert gb.dtype == torch.float32
    ref = make_model(dtype=torch.bfloat16)
    x, y = batches(1)[0]
    x, y = x.to(torch.bfloat16), y.to(torch.bfloat16)
    # (torch 1.13 has no bfloat16 mse_loss on CPU)
    (ddp(local(x, me, WORLD)) - local(y, me, WORLD)).pow(2).mean().backward()
    (ref(x) - y).pow(2).mean().backward()
    for p, q in zip(ddp.module.parameters(), ref.parameters()):
        assert p.main_grad.dtype == torch.float32 and p.grad.dtype == p.dtype
        assert_close(p.main_grad, q.grad.float(), rtol=0.05, atol=0.02)


# -- veScale's DistributedOptimizer (ZeRO) -----------------------------------


def train(model, opt, data, dp_rank, dp_size, steps=None):
    for x, y in data[:steps]:
        opt.zero_grad()
        F.mse_loss(model(local(x, dp_rank, dp_size)),
                   local(y, dp_rank, dp_size)).backward()
        opt.step()


def reference(steps, groups=None, **adam):
    ref = make_model()
    params = ref.parameters() if groups is None else groups(ref)
    opt = torch.optim.Adam(params, **adam)
    train(ref, opt, batches(steps), 0, 1)
    return ref, opt


def adam_groups(model):
    return [{"params": list(model[0].parameters()), "lr": 0.02},
            {"params": [p for m in (model[2], model[4])
                        for p in m.parameters()]}]


@pytest.mark.parametrize("use_distributed_optimizer", [True, False])
@pytest.mark.parametrize("built", [False, True], ids=["class", "instance"])
def test_distributed_optimizer_equals_adam(use_distributed_optimizer, built):
    init((WORLD,), ("DP",))
    me = rank()
    model = DDP(make_model(), VESCALE_DEVICE_MESH["DP"], bucket_size=40,
                use_distributed_optimizer=use_distributed_optimizer)
    if built:
        opt = DistributedOptimizer(
            torch.optim.Adam(adam_groups(model.module), lr=0.01), [model])
        ref, _ = reference(5, adam_groups, lr=0.01)
    else:
        opt = DistributedOptimizer(torch.optim.Adam, models=[model],
                                   optimizer_kwargs={"lr": 0.01})
        ref, _ = reference(5, lr=0.01)
    train(model, opt, batches(5), me, WORLD)
    for p, q in zip(model.module.parameters(), ref.parameters()):
        assert_close(p, q, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("use_distributed_optimizer", [True, False])
def test_distributed_optimizer_steps_on_accumulated_passes(
        use_distributed_optimizer):
    # Two backward passes (the second one reduced) between zero_grad and
    # step: the step sees the average of their sum, as one process's Adam.
    init((WORLD,), ("DP",))
    me = rank()
    model = DDP(make_model(), VESCALE_DEVICE_MESH["DP"], bucket_size=40,
                use_distributed_optimizer=use_distributed_optimizer)
    opt = DistributedOptimizer(torch.optim.Adam, models=[model],
                               optimizer_kwargs={"lr": 0.01})
    ref = make_model()
    ref_opt = torch.optim.Adam(ref.parameters(), lr=0.01)
    data = batches(4)
    for (x1, y1), (x2, y2) in zip(data[0::2], data[1::2]):
        opt.zero_grad()
        F.mse_loss(model(local(x1, me, WORLD)), local(y1, me, WORLD)).backward()
        F.mse_loss(model(local(x2, me, WORLD)), local(y2, me, WORLD)).backward()
        opt.step()
        ref_opt.zero_grad()
        (F.mse_loss(ref(x1), y1) + F.mse_loss(ref(x2), y2)).backward()
        ref_opt.step()
    for p, q in zip(model.module.parameters(), ref.parameters()):
        assert_close(p, q, rtol=1e-10, atol=1e-12)


def test_optimizer_state_per_rank_is_one_dp_th():
    init((WORLD,), ("DP",))
    dp = VESCALE_DEVICE_MESH.get_data_parallel_dim_groups()
    model = DDP(make_model(), VESCALE_DEVICE_MESH["DP"], bucket_size=40,
                use_distributed_optimizer=True)
    opt = DistributedOptimizer(torch.optim.Adam, models=[model],
                               optimizer_kwargs={"lr": 0.01})
    train(model, opt, batches(1), rank(), WORLD)
    total = sum(p.numel() for p in model.parameters())
    mine = sum(v.numel() for st in opt.state.values() for v in st.values()
               if v.dim() > 0)
    gb = model.grad_buffers[F64]
    padding = gb.numel - total
    # Adam's two moments for about 1/DP of the parameters; together, all.
    assert abs(mine - 2 * total / WORLD) <= 2 * padding + 2 * len(gb.buckets)
    everyone = torch.tensor([mine], dtype=torch.int64)
    dp.all_reduce(everyone)
    assert everyone.item() == 2 * total


def test_state_dicts_round_trip_and_reshard():
    init((WORLD,), ("DP",))
    me = rank()
    data = batches(5)

    def build(dp_mesh):
        m = DDP(make_model(), dp_mesh, bucket_size=40,
                use_distributed_optimizer=True)
        return m, DistributedOptimizer(torch.optim.Adam, models=[m],
                                       optimizer_kwargs={"lr": 0.01})

    model, opt = build(VESCALE_DEVICE_MESH["DP"])
    train(model, opt, data, me, WORLD, steps=3)
    sharded, full = opt.state_dict(), opt.full_state_dict()
    assert any(isinstance(v, ShardedState) for st in sharded["state"].values()
               for v in st.values())
    # The full state is one process's torch.optim.Adam state, by name.
    ref, ref_opt = reference(3, lr=0.01)
    names = [n for n, _ in ref.named_parameters()]
    for i, name in enumerate(names):
        want = ref_opt.state_dict()["state"][i]
        for k in ("exp_avg", "exp_avg_sq"):
            assert_close(full["state"][name][k], want[k], rtol=1e-10,
                         atol=1e-14)
        assert full["state"][name]["step"].item() == want["step"].item()
    params = [p.detach().clone() for p in model.module.parameters()]
    train(model, opt, data[3:], me, WORLD)  # the run to match

    for saved in (sharded, full):
        again, again_opt = build(VESCALE_DEVICE_MESH["DP"])
        with torch.no_grad():
            for p, q in zip(again.module.parameters(), params):
                p.copy_(q)
        again_opt.load_state_dict(saved)
        train(again, again_opt, data[3:], me, WORLD)
        for p, q in zip(again.module.parameters(), model.module.parameters()):
            assert torch.equal(p, q)

    # The full state dict loads at another DP size: (2, 2) replicas of DP=2.
    init((2, 2), ("DP", "X"))
    dp2 = VESCALE_DEVICE_MESH.get_data_parallel_rank()
    other, other_opt = build(VESCALE_DEVICE_MESH["DP"])
    with torch.no_grad():
        for p, q in zip(other.module.parameters(), params):
            p.copy_(q)
    other_opt.load_state_dict(full)
    with pytest.raises(ValueError, match="load a full_state_dict"):
        other_opt.load_state_dict(sharded)  # pieces of DP=4's layout
    train(other, other_opt, data[3:], dp2, 2)
    for p, q in zip(other.module.parameters(), model.module.parameters()):
        assert_close(p, q, rtol=1e-10, atol=1e-12)


def test_clip_grad_equals_clip_grad_norm():
    init((WORLD,), ("DP",))
    me = rank()
    model = DDP(make_model(), VESCALE_DEVICE_MESH["DP"], bucket_size=40,
                use_distributed_optimizer=True)
    opt = DistributedOptimizer(torch.optim.Adam, models=[model],
                               clip_grad=0.05, optimizer_kwargs={"lr": 0.01})
    ref = make_model()
    ref_opt = torch.optim.Adam(ref.parameters(), lr=0.01)
    for x, y in batches(3):
        opt.zero_grad()
        F.mse_loss(model(local(x, me, WORLD)), local(y, me, WORLD)).backward()
        norm = opt.step()
        ref_opt.zero_grad()
        F.mse_loss(ref(x), y).backward()
        want = torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.05)
        ref_opt.step()
        assert norm == pytest.approx(want.item(), rel=1e-10)
    for p, q in zip(model.module.parameters(), ref.parameters()):
        assert_close(p, q, rtol=1e-9, atol=1e-12)


def test_dp_x_tp_with_clipping_equals_one_process():
    # TP layers' norms add over TP; the replicated row bias counts once.
    init((2, 2), ("DP", "TP"))
    d = VESCALE_DEVICE_MESH.get_data_parallel_rank()
    t = VESCALE_DEVICE_MESH.get_tensor_parallel_rank()
    torch.manual_seed(13)
    fc1, fc2 = nn.Linear(6, 8, dtype=F64), nn.Linear(8, 3, dtype=F64)
    ref = nn.Sequential(fc1, nn.ReLU(), fc2)
    tp_model = nn.Sequential(ColumnParallelLinear.from_dense(fc1), nn.ReLU(),
                             RowParallelLinear.from_dense(
                                 fc2, input_is_parallel=True))
    model = DDP(tp_model, VESCALE_DEVICE_MESH["DP"],
                use_distributed_optimizer=True)
    opt = DistributedOptimizer(torch.optim.Adam, [model], clip_grad=0.1,
                               optimizer_kwargs={"lr": 0.01})
    ref_opt = torch.optim.Adam(ref.parameters(), lr=0.01)
    for x, y in batches(3):
        opt.zero_grad()
        F.mse_loss(model(local(x, d, 2)), local(y, d, 2)).backward()
        norm = opt.step()
        ref_opt.zero_grad()
        F.mse_loss(ref(x), y).backward()
        want = torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.1)
        ref_opt.step()
        assert norm == pytest.approx(want.item(), rel=1e-10)
    assert_close(model.module[0].weight, fc1.weight[4 * t:4 * t + 4],
                 rtol=1e-9, atol=1e-12)
    assert_close(model.module[2].weight, fc2.weight[:, 4 * t:4 * t + 4],
                 rtol=1e-9, atol=1e-12)
    assert_close(model.module[2].bias, fc2.bias, rtol=1e-9, atol=1e-12)


def test_overlap_param_gather_equals_adam():
    init((WORLD,), ("DP",))
    model = DDP(make_model(), VESCALE_DEVICE_MESH["DP"], bucket_size=40,
                use_distributed_optimizer=True)
    opt = DistributedOptimizer(torch.optim.Adam, models=[model],
                               overlap_param_gather=True,
                               optimizer_kwargs={"lr": 0.01})
    train(model, opt, batches(4), rank(), WORLD)
    opt.state_dict()  # waits for the last gathers
    ref, _ = reference(4, lr=0.01)
    for p, q in zip(model.module.parameters(), ref.parameters()):
        assert_close(p, q, rtol=1e-10, atol=1e-12)


# -- veScale's README snippet (tests/python/vescale_readme.py) ---------------


def test_vescale_readme_snippet():
    here = os.path.dirname(os.path.abspath(__file__))
    script = runpy.run_path(os.path.join(here, "vescale_readme.py"),
                            run_name="vescale_readme")
    script["main"]()


# -- bad input: the same Python exception on every rank, never a hang --------


def test_features_not_divisible_by_tp_size():
    init((WORLD,), ("TP",))
    with pytest.raises(ValueError, match="out_features=6 is not divisible by "
                                         "the TP group's size 4"):
        ColumnParallelLinear(8, 6)
    with pytest.raises(ValueError, match="in_features=10 is not divisible"):
        RowParallelLinear(10, 8)
    with pytest.raises(ValueError, match="out_features=6 is not divisible"):
        parallelize_module(nn.Sequential(nn.Linear(4, 6)),
                           VESCALE_DEVICE_MESH["TP"],
                           {"parameter": {"0.weight": [Shard(0)],
                                          "0.bias": [Shard(0)]}})
    still_works(VESCALE_DEVICE_MESH.get_tensor_parallel_dim_groups())


def test_tp_input_of_another_dtype_on_one_rank():
    init((WORLD,), ("TP",))
    tp = VESCALE_DEVICE_MESH.get_tensor_parallel_dim_groups()
    torch.manual_seed(0)
    col = ColumnParallelLinear(8, 12, gather_output=True)  # float32
    x = torch.ones(2, 8, dtype=F64 if rank() == 1 else torch.float32)
    with pytest.raises(ValueError, match=r"ColumnParallelLinear forward: on "
                                         r"TP rank 1 \(global rank 1\): the "
                                         r"input is torch.float64"):
        col(x)
    still_works(tp)


def test_tp_input_of_another_size_on_one_rank():
    init((WORLD,), ("TP",))
    tp = VESCALE_DEVICE_MESH.get_tensor_parallel_dim_groups()
    torch.manual_seed(0)
    row = RowParallelLinear(8, 4)
    x = torch.ones(3 if rank() == 2 else 2, 8)
    with pytest.raises(ValueError, match=r"must be the same on every TP rank: "
                                         r"TP rank 2 \(global rank 2\) has "
                                         r"input torch.float32 \[3, 8\]"):
        row(x)
    with pytest.raises(ValueError, match="expected its last dimension to be 2"):
        RowParallelLinear(8, 4, input_is_parallel=True)(torch.ones(2, 8))
    still_works(tp)


def test_tp_layers_that_differ_across_ranks():
    init((WORLD,), ("TP",))
    torch.manual_seed(0)
    with pytest.raises(ValueError, match="arguments must be the same on every "
                                         "TP rank: TP rank 3"):
        ColumnParallelLinear(8, 16 if rank() == 3 else 12)
    torch.manual_seed(rank())
    with pytest.raises(ValueError, match="initial weights.*seed"):
        RowParallelLinear(8, 4)
    still_works(VESCALE_DEVICE_MESH.get_tensor_parallel_dim_groups())


def test_a_bad_argument_on_one_rank_raises_on_every_rank():
    init((2, 2), ("DP", "TP"))
    me = rank()
    torch.manual_seed(0)
    if me in (2, 3):  # rank 2's TP group
        with pytest.raises(ValueError, match=r"on TP rank 0 \(global rank 2\): "
                                             r"out_features=7 is not divisible"):
            ColumnParallelLinear(8, 7 if me == 2 else 8)
    else:
        ColumnParallelLinear(8, 8)
    with pytest.raises(ValueError, match=r"\(name, dtype, shape\): on DP rank 1 "
                                         r"\(global rank [23]\): bucket_size=0"):
        DDP(make_model(), VESCALE_DEVICE_MESH["DP"],
            bucket_size=0 if me >= 2 else 100)
    model = DDP(make_model(), VESCALE_DEVICE_MESH["DP"])
    with pytest.raises(ValueError, match=r"DistributedOptimizer: on DP rank 0 "
                                         r"\(global rank [01]\): Adam\(params, "
                                         r"\*\*\{'lr': -1\.0\}\) raised"):
        DistributedOptimizer(torch.optim.Adam, [model], optimizer_kwargs={
            "lr": -1.0 if me < 2 else 0.1})
    still_works(VESCALE_DEVICE_MESH.get_data_parallel_dim_groups())
    still_works(VESCALE_DEVICE_MESH.get_tensor_parallel_dim_groups())


def test_ddp_module_of_another_size_or_dtype_on_one_rank():
    init((WORLD,), ("DP",))
    dp = VESCALE_DEVICE_MESH.get_data_parallel_dim_groups()
    me = rank()
    with pytest.raises(ValueError, match=r"DDP: the arguments and the module's "
                                         r"parameters and buffers .* must be "
                                         r"the same on every DP rank: DP rank 1"):
        DDP(nn.Linear(6, 11 if me == 1 else 10), VESCALE_DEVICE_MESH["DP"])
    model = make_model()
    with pytest.raises(ValueError, match=r"DP rank 2 \(global rank 2\) has .*"
                                         r"torch.float32"):
        DDP(model.float() if me == 2 else model, VESCALE_DEVICE_MESH["DP"])
    still_works(dp)


def test_bad_arguments_name_what_was_expected():
    init((WORLD,), ("DP",))
    with pytest.raises(TypeError, match="vemesh.torch.DDP first"):
        DistributedOptimizer(torch.optim.Adam, models=[make_model()])
    model = DDP(make_model(), VESCALE_DEVICE_MESH["DP"])
    stray = nn.Linear(2, 2)
    with pytest.raises(ValueError, match="no DDP model's gradient buffer"):
        DistributedOptimizer(torch.optim.SGD(stray.parameters(), lr=0.1),
                             [model])
    with pytest.raises(TypeError, match="expected a vemesh.DeviceMesh"):
        DDP(make_model(), "DP")
    with pytest.raises(ValueError, match="bucket_size=0"):
        DDP(make_model(), VESCALE_DEVICE_MESH["DP"], bucket_size=0)
    with pytest.raises(KeyError, match="ColumnParallelLinear: no group given, "
                                       "and VESCALE_DEVICE_MESH has no TP"):
        ColumnParallelLinear(4, 4)
    with pytest.raises(ValueError, match="matches no parameter"):
        parallelize_module(make_model(), VESCALE_DEVICE_MESH["DP"],
                           {"parameter": {"fc9.weight": [Shard(0)]}})
    still_works(VESCALE_DEVICE_MESH.get_data_parallel_dim_groups())


if __name__ == "__main__":
    code = pytest.main(["-q", "-p", "no:cacheprovider", "-x", __file__]
                       + sys.argv[1:])
    who = os.environ.get("RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "?"))
    print(f"rank {who}: pytest exit {int(code)}", flush=True)
    sys.exit(int(code))
