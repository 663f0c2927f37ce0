"""Multi-process tests of the vemesh Python module: 4 ranks, launched by
torchrun (env://, Gloo) or mpirun (MPI). Every rank runs the same pytest
session over this file, so the collectives line up test by test:

  torchrun --standalone --nproc_per_node=4 --redirects 1 --tee 1 mp_collectives.py
  mpirun -n 4 python3 mp_collectives.py
"""
import gc
import os
import sys

import numpy as np
import pytest

import vemesh
from vemesh import VESCALE_DEVICE_MESH

try:
    import torch
except ImportError:  # pragma: no cover
    torch = None

WORLD = 4
TIMEOUT = 60.0  # seconds: a lost rank fails the test instead of hanging it


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


# -- veScale's test_api.py, restated (its 4-rank cases) ---------------------


def test_vescale_initialize():
    init((2, 2), ("DP", "TP"))
    assert VESCALE_DEVICE_MESH.get().mesh.tolist() == [[0, 1], [2, 3]]
    assert VESCALE_DEVICE_MESH.get() == VESCALE_DEVICE_MESH.get()
    second = VESCALE_DEVICE_MESH.get(device_type="cpu", mesh_shape=(2, 2),
                                     mesh_dim_names=("dp", "tp"))
    assert VESCALE_DEVICE_MESH.get().mesh.tolist() == second.mesh.tolist()


def test_vescale_basic_properties():
    init((2, 2), ("DP", "TP"))
    r = VESCALE_DEVICE_MESH
    assert r.shape == [2, 2]
    assert r.ndim == 2
    assert r.size() == 4 and r.size(0) == 2 and r.size(1) == 2
    assert "PP" not in r.mesh_dim_names
    dp, tp = r["DP"].mesh.tolist(), r["TP"].mesh.tolist()
    coordinate = r.get_coordinate()
    if rank() == 0:
        assert (dp, tp, coordinate) == ([0, 2], [0, 1], [0, 0])
    if rank() == 2:
        assert (dp, tp, coordinate) == ([0, 2], [2, 3], [1, 0])


def test_vescale_basic_utils():
    init((2, 2), ("DP", "TP"))
    r = VESCALE_DEVICE_MESH
    assert r.get_local_rank() == rank()  # one host: the local rank
    assert r.get_strategy_size(0) == r.get_strategy_size("DP")
    assert r.get_strategy_size("TP") == 2
    assert r.lookup_rank("TP") == r.get_strategy_coordinate()[1]
    assert r.lookup_rank("DP") == r.get_strategy_coordinate()[0]
    assert r.get_strategy_coordinate(local_rank=0) == [0, 0]
    assert r.get_strategy_coordinate(local_rank=3) == [1, 1]


def test_vescale_process_groups():
    # veScale's (PP, DP, TP) = (2, 1, 4) at 8 ranks, halved: (2, 1, 2).
    init((2, 1, 2), ("PP", "DP", "TP"))
    tp = VESCALE_DEVICE_MESH.get_tensor_parallel_dim_groups()
    dp = VESCALE_DEVICE_MESH.get_data_parallel_dim_groups()
    me = rank()
    assert tp.ranks() == [me - me % 2, me - me % 2 + 1]
    assert dp.ranks() == [me]
    init((2, 2), ("DP", "TP"))
    tp = VESCALE_DEVICE_MESH.get_tensor_parallel_dim_groups()
    dp = VESCALE_DEVICE_MESH.get_data_parallel_dim_groups()
    assert tp.ranks() == [me - me % 2, me - me % 2 + 1]
    assert dp.ranks() == [me % 2, me % 2 + 2]


def test_vescale_stage_query_and_peers():
    init((2, 1, 2), ("PP", "DP", "TP"))
    r = VESCALE_DEVICE_MESH
    assert r.is_first_stage() == (r.get_pipeline_parallel_rank() == 0)
    assert r.is_last_stage() == (
        r.get_pipeline_parallel_rank() == r.get_strategy_size("PP") - 1)
    pp = r.get_pipeline_parallel_dim_groups()
    act = np.full(5, float(rank()), np.float32)
    if r.is_first_stage():
        pp.send(act, r.get_next_stage_peer(), global_rank=True)
    else:
        got = np.zeros(5, np.float32)
        pp.recv(got, r.get_prev_stage_peer(), global_rank=True)
        assert got.tolist() == [float(rank() - 2)] * 5


# -- PyTorch's DeviceMesh names ---------------------------------------------


def test_pytorch_device_mesh():
    mesh = vemesh.init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"),
                                   timeout=TIMEOUT)
    me = mesh.get_rank()
    assert mesh.shape == (2, 2) and mesh.ndim == 2 and mesh.size() == 4
    assert mesh.mesh_dim_names == ("dp", "tp")
    assert mesh.get_coordinate() == [me // 2, me % 2]
    assert mesh.get_local_rank("tp") == me % 2
    assert mesh["tp"].get_local_rank() == me % 2
    assert mesh[("tp", "dp")].mesh.tolist() == [[0, 2], [1, 3]]
    assert mesh.get_group("dp").ranks() == [me % 2, me % 2 + 2]
    flat = mesh.flatten(("dp", "tp"), "dp_tp")
    assert flat.mesh.tolist() == [0, 1, 2, 3]
    assert mesh["dp_tp"].get_group().size() == 4
    un = mesh.unflatten("dp", (2, 1), ("a", "b"))
    assert un.mesh_dim_names == ("a", "b", "tp")
    assert un.get_group("a").ranks() == mesh.get_group("dp").ranks()


# -- Collectives on numpy arrays --------------------------------------------


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.int64])
def test_numpy_collectives(dtype):
    mesh = vemesh.init_device_mesh("cpu", (WORLD,), timeout=TIMEOUT)
    g = mesh.get_group()
    me, n = g.rank(), g.size()
    a = np.arange(6, dtype=dtype) + me
    g.all_reduce(a)
    assert a.tolist() == (np.arange(6) * n + sum(range(n))).tolist()
    b = np.full(3, me, dtype)
    g.broadcast(b, src=2)
    assert b.tolist() == [2, 2, 2]
    out = np.zeros(2 * n, dtype)
    g.all_gather(out, np.full(2, me, dtype))
    assert out.tolist() == [r for r in range(n) for _ in range(2)]
    inp = np.arange(2 * n, dtype=dtype)
    rs = np.zeros(2, dtype)
    g.reduce_scatter(rs, inp, op="max")
    assert rs.tolist() == [2 * me, 2 * me + 1]
    send = np.array([10 * me + j for j in range(n)], dtype)
    recv = np.zeros(n, dtype)
    g.all_to_all(recv, send)
    assert recv.tolist() == [10 * j + me for j in range(n)]
    ring = np.zeros(4, dtype)
    w = g.irecv(ring, (me - 1) % n)
    g.send(np.full(4, me, dtype), (me + 1) % n)
    assert w.wait(timeout=TIMEOUT)
    assert ring.tolist() == [(me - 1) % n] * 4
    g.barrier()


def test_async_forms():
    g = vemesh.init_device_mesh("cpu", (WORLD,), timeout=TIMEOUT).get_group()
    a = np.ones(1024, np.float32)
    works = [g.all_reduce(a, async_op=True)]
    works[0].wait(timeout=TIMEOUT)
    b = np.ones(16, np.float64)
    w = g.iall_reduce(b, op="avg")
    assert w.wait() is True and b.tolist() == [1.0] * 16
    g.ibarrier().wait(timeout=TIMEOUT)
    assert a.tolist() == [float(WORLD)] * 1024


# -- torch tensors (DLPack, zero-copy) --------------------------------------


@pytest.mark.skipif(torch is None, reason="torch (python3-torch) not installed")
@pytest.mark.parametrize("dtype", ["float32", "float64", "int32", "int64",
                                   "bfloat16", "float16"])
def test_torch_collectives_in_place(dtype):
    dt = getattr(torch, dtype)
    g = vemesh.init_device_mesh("cpu", (WORLD,), timeout=TIMEOUT).get_group()
    me, n = g.rank(), g.size()
    t = torch.arange(8, dtype=dt) + me
    ptr = t.data_ptr()
    g.all_reduce(t)
    assert t.data_ptr() == ptr
    assert t.tolist() == (torch.arange(8) * n + sum(range(n))).to(dt).tolist()
    out = torch.zeros(n * 2, dtype=dt)
    g.all_gather(out, torch.full((2,), me, dtype=dt))
    assert out.tolist() == torch.tensor(
        [r for r in range(n) for _ in range(2)], dtype=dt).tolist()
    rs = torch.zeros(2, dtype=dt)
    g.reduce_scatter(rs, torch.ones(2 * n, dtype=dt))
    assert rs.tolist() == [float(n)] * 2 or rs.tolist() == [n] * 2
    p = torch.zeros(3, dtype=dt)
    if me == 0:
        g.send(torch.full((3,), 7, dtype=dt), 1)
    if me == 1:
        g.recv(p, 0)
        assert p.tolist() == torch.full((3,), 7, dtype=dt).tolist()


# -- DP x TP training loop equals the serial run -----------------------------


def serial_step(w1, w2, x, y, lr):
    h = np.maximum(x @ w1, 0.0)
    out = h @ w2
    g_out = 2.0 * (out - y) / x.shape[0]
    g_w2 = h.T @ g_out
    g_h = (g_out @ w2.T) * (h > 0)
    g_w1 = x.T @ g_h
    return w1 - lr * g_w1, w2 - lr * g_w2


def test_dp_tp_training_equals_serial():
    # 2-layer MLP: w1 split by columns and w2 by rows over TP (Megatron's
    # column / row parallel), the batch split over DP; float64 throughout.
    init((2, 2), ("DP", "TP"))
    r = VESCALE_DEVICE_MESH
    dp, tp = r.get_data_parallel_dim_groups(), r.get_tensor_parallel_dim_groups()
    d_in, d_h, d_out, batch, lr = 8, 16, 4, 12, 0.05
    rng = np.random.default_rng(7)
    w1 = rng.standard_normal((d_in, d_h)) / 4
    w2 = rng.standard_normal((d_h, d_out)) / 4
    xs = [rng.standard_normal((batch, d_in)) for _ in range(5)]
    ys = [rng.standard_normal((batch, d_out)) for _ in range(5)]
    sw1, sw2 = w1.copy(), w2.copy()
    for x, y in zip(xs, ys):
        sw1, sw2 = serial_step(sw1, sw2, x, y, lr)

    t, d = r.get_tensor_parallel_rank(), r.get_data_parallel_rank()
    cols = slice(t * d_h // 2, (t + 1) * d_h // 2)
    rows = slice(d * batch // 2, (d + 1) * batch // 2)
    lw1, lw2 = w1[:, cols].copy(), w2[cols, :].copy()
    for x, y in zip(xs, ys):
        xb, yb = x[rows], y[rows]
        h = np.maximum(xb @ lw1, 0.0)
        out = np.ascontiguousarray(h @ lw2)
        tp.all_reduce(out)  # row-parallel output: sum of partials
        g_out = 2.0 * (out - yb) / batch  # global batch mean
        g_w2 = np.ascontiguousarray(h.T @ g_out)
        g_h = (g_out @ lw2.T) * (h > 0)
        g_w1 = np.ascontiguousarray(xb.T @ g_h)
        dp.all_reduce(g_w1)
        dp.all_reduce(g_w2, async_op=True).wait(timeout=TIMEOUT)
        lw1 -= lr * g_w1
        lw2 -= lr * g_w2
    np.testing.assert_allclose(lw1, sw1[:, cols], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(lw2, sw2[cols, :], rtol=1e-12, atol=1e-12)


# -- Errors and ownership ---------------------------------------------------


def test_errors_carry_the_message():
    g = vemesh.init_device_mesh("cpu", (WORLD,), timeout=TIMEOUT).get_group()
    with pytest.raises(ValueError, match="expected out to hold group size"):
        g.all_gather(np.zeros(3, np.float32), np.zeros(1, np.float32))
    with pytest.raises(ValueError, match="root|src|outside|group"):
        g.broadcast(np.zeros(1, np.float32), src=WORLD)
    with pytest.raises(KeyError):
        VESCALE_DEVICE_MESH.init_device_mesh("cpu", (2, 2),
                                             mesh_dim_names=("DP", "TP"))
        VESCALE_DEVICE_MESH.get_strategy_size("EP")
    g.barrier()


def test_communicator_outlives_mesh_and_registry():
    init((2, 2), ("DP", "TP"))
    tp = VESCALE_DEVICE_MESH.get_tensor_parallel_dim_groups()
    mesh = vemesh.init_device_mesh("cpu", (WORLD,), timeout=TIMEOUT)
    world = mesh.get_group()
    del mesh
    VESCALE_DEVICE_MESH.reset()
    gc.collect()
    a = np.ones(4)
    tp.all_reduce(a)
    world.all_reduce(a)
    assert a.tolist() == [8.0] * 4


# Left alive on purpose: interpreter shutdown with live communicators.
_LIVE = []


def test_zz_keep_live_communicators_for_shutdown():
    init((2, 2), ("DP", "TP"))
    _LIVE.append(VESCALE_DEVICE_MESH.get_data_parallel_dim_groups())
    _LIVE.append(vemesh.init_device_mesh("cpu", (WORLD,), timeout=TIMEOUT))
    _LIVE.append(_LIVE[-1].get_group())
    VESCALE_DEVICE_MESH.init_device_mesh("cpu", (WORLD,),
                                         mesh_dim_names=("DP",),
                                         timeout=TIMEOUT)


def test_zzz_wait_timeout_raises_timeout_error():
    # Last: a timed-out wait aborts its communicator, and an aborted Gloo
    # group closes its connections, which the other groups may share.
    g = vemesh.init_device_mesh("cpu", (WORLD,), timeout=TIMEOUT).get_group()
    buf = np.zeros(4, np.float32)
    w = g.irecv(buf, (g.rank() + 1) % g.size())  # nobody sends
    with pytest.raises(TimeoutError, match="did not finish within"):
        w.wait(timeout=0.3)
    assert g.aborted()


if __name__ == "__main__":
    code = pytest.main(["-q", "-p", "no:cacheprovider", "-x", __file__]
                       + sys.argv[1:])
    who = os.environ.get("RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "?"))
    print(f"rank {who}: pytest exit {int(code)}", flush=True)
    sys.exit(int(code))
