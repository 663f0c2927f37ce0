"""vemesh groups as torch ProcessGroups (vemesh.torch.as_process_group), on 4
ranks under torchrun (Gloo groups) or mpirun (MPI groups), one pytest
session per launch: every torch.distributed collective with group=pg equals
the one-process answer, async Works, torch's DDP equals one process, and bad
input raises on every rank. No torch default group is made here.

  torchrun --standalone --nproc_per_node=4 --redirects 1 --tee 1 mp_torch_process_group.py
  mpirun -n 4 python3 mp_torch_process_group.py
"""
import os
import sys
import time

import pytest

import vemesh
from vemesh import VESCALE_DEVICE_MESH

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

from vemesh.torch import ProcessGroupVemesh, as_process_group  # noqa: E402

WORLD = 4
TIMEOUT = 60.0
DTYPES = [torch.float32, torch.float64, torch.int32, torch.int64,
          torch.bfloat16, torch.float16, torch.int8, torch.uint8]


@pytest.fixture(scope="module")
def mesh():
    return vemesh.init_device_mesh("cpu", (WORLD,), timeout=TIMEOUT)


@pytest.fixture(scope="module")
def pg(mesh):
    return as_process_group(mesh)


@pytest.fixture(scope="module")
def mesh2d():
    return vemesh.init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"),
                                   timeout=TIMEOUT)


def per_rank(r, n=6, dtype=torch.float64):
    """Rank r's input: small integers, exact in every dtype."""
    return (torch.arange(n) % 5 + r).to(dtype)


# -- the group in torch's registry ------------------------------------------


def test_registered_like_new_group(mesh, pg):
    assert isinstance(pg, dist.ProcessGroup)
    assert isinstance(pg, ProcessGroupVemesh)
    assert as_process_group(mesh.get_group()) is pg
    assert pg.rank() == mesh.get_rank() and pg.size() == WORLD
    assert dist.get_backend(pg) == "vemesh"
    assert dist.get_world_size(pg) == WORLD
    assert dist.get_process_group_ranks(pg) == list(range(WORLD))
    assert not dist.is_initialized()  # no default group was needed


def test_mesh_dims_flattening_and_roles_are_groups(mesh2d):
    me = mesh2d.get_rank()
    dp = as_process_group(mesh2d, "dp")
    tp = as_process_group(mesh2d["tp"])
    flat = as_process_group(mesh2d.flatten(("dp", "tp"), "dp_tp"))
    VESCALE_DEVICE_MESH.init_device_mesh("cpu", (2, 2),
                                         mesh_dim_names=("DP", "TP"),
                                         timeout=TIMEOUT)
    role = as_process_group(VESCALE_DEVICE_MESH.get_data_parallel_dim_groups())
    assert dist.get_process_group_ranks(dp) == [me % 2, me % 2 + 2]
    assert dist.get_process_group_ranks(tp) == [me - me % 2, me - me % 2 + 1]
    assert dist.get_process_group_ranks(role) == [me % 2, me % 2 + 2]
    for g, ranks in ((dp, [me % 2, me % 2 + 2]),
                     (tp, [me - me % 2, me - me % 2 + 1]),
                     (flat, list(range(WORLD))), (role, [me % 2, me % 2 + 2])):
        t = torch.full((3,), float(me))
        dist.all_reduce(t, group=g)
        assert t.tolist() == [float(sum(ranks))] * 3
        # src is a global rank, translated through the registry.
        b = torch.full((2,), float(me))
        dist.broadcast(b, src=ranks[-1], group=g)
        assert b.tolist() == [float(ranks[-1])] * 2
    VESCALE_DEVICE_MESH.reset()


# -- every collective, against the one-process answer -----------------------


@pytest.mark.parametrize("dtype", DTYPES)
def test_all_reduce_every_op(pg, dtype):
    me = pg.rank()
    inputs = [per_rank(r, dtype=torch.float64) for r in range(WORLD)]
    expected = {
        dist.ReduceOp.SUM: sum(inputs),
        dist.ReduceOp.MIN: torch.stack(inputs).min(0).values,
        dist.ReduceOp.MAX: torch.stack(inputs).max(0).values,
        dist.ReduceOp.PRODUCT: torch.stack(inputs).prod(0),
    }
    if dtype in (torch.int8, torch.uint8):
        expected.pop(dist.ReduceOp.PRODUCT)  # overflows
    for op, want in expected.items():
        t = per_rank(me, dtype=dtype)
        ptr = t.data_ptr()
        dist.all_reduce(t, op=op, group=pg)
        assert t.data_ptr() == ptr  # in place, no copy
        assert t.to(torch.float64).tolist() == want.tolist(), op
    if dtype.is_floating_point:
        t = per_rank(me, dtype=dtype)
        dist.all_reduce(t, op=dist.ReduceOp.AVG, group=pg)
        assert t.to(torch.float64).tolist() == (sum(inputs) / WORLD).tolist()


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bfloat16])
def test_broadcast_reduce_and_gathers(pg, dtype):
    me, n = pg.rank(), WORLD
    b = per_rank(me, dtype=dtype)
    dist.broadcast(b, src=3, group=pg)
    assert b.tolist() == per_rank(3, dtype=dtype).tolist()

    r = per_rank(me, dtype=dtype)
    dist.reduce(r, dst=1, group=pg)
    if me == 1:
        assert r.tolist() == sum(per_rank(k, dtype=torch.float64)
                                 for k in range(n)).to(dtype).tolist()
    else:
        assert r.tolist() == per_rank(me, dtype=dtype).tolist()  # untouched

    outs = [torch.empty(6, dtype=dtype) for _ in range(n)]
    dist.all_gather(outs, per_rank(me, dtype=dtype), group=pg)
    assert [o.tolist() for o in outs] == [
        per_rank(k, dtype=dtype).tolist() for k in range(n)]

    flat = torch.empty(n * 6, dtype=dtype)
    dist.all_gather_into_tensor(flat, per_rank(me, dtype=dtype), group=pg)
    assert flat.tolist() == torch.cat(
        [per_rank(k, dtype=dtype) for k in range(n)]).tolist()
    flat2 = torch.empty(n, 6, dtype=dtype)
    dist._all_gather_base(flat2, per_rank(me, dtype=dtype), group=pg)
    assert flat2.reshape(-1).tolist() == flat.tolist()

    lists = [[torch.empty(2, dtype=dtype), torch.empty(3, dtype=dtype)]
             for _ in range(n)]
    dist.all_gather_coalesced(
        lists, [torch.full((2,), me, dtype=dtype),
                torch.full((3,), 10 + me, dtype=dtype)], group=pg)
    assert [[x.tolist() for x in lst] for lst in lists] == [
        [[k, k], [10 + k] * 3] for k in range(n)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.int32, torch.float16])
def test_reduce_scatters(pg, dtype):
    me, n = pg.rank(), WORLD
    inp = [torch.full((3,), 10 * me + k, dtype=dtype) for k in range(n)]
    out = torch.empty(3, dtype=dtype)
    dist.reduce_scatter(out, inp, group=pg)
    assert out.tolist() == [sum(10 * r + me for r in range(n))] * 3

    flat_in = torch.cat(inp)
    out2 = torch.empty(3, dtype=dtype)
    dist.reduce_scatter_tensor(out2, flat_in, op=dist.ReduceOp.MAX, group=pg)
    assert out2.tolist() == [10 * (n - 1) + me] * 3
    out3 = torch.empty(3, dtype=dtype)
    dist._reduce_scatter_base(out3, flat_in, group=pg)
    assert out3.tolist() == out.tolist()


def test_all_to_all(pg):
    me, n = pg.rank(), WORLD
    inp = torch.tensor([10 * me + j for j in range(n)], dtype=torch.float32)
    out = torch.empty(n)
    dist.all_to_all_single(out, inp, group=pg)
    assert out.tolist() == [10 * j + me for j in range(n)]
    # Uneven splits of rows of 2: rank i sends i+1 rows to each peer.
    rows_in = [me + 1] * n
    rows_out = [j + 1 for j in range(n)]
    x = torch.arange(sum(rows_in) * 2, dtype=torch.int64).reshape(-1, 2) \
        + 1000 * me
    y = torch.empty(sum(rows_out), 2, dtype=torch.int64)
    dist.all_to_all_single(y, x, output_split_sizes=rows_out,
                           input_split_sizes=rows_in, group=pg)
    want = []
    for j in range(n):
        src = torch.arange((j + 1) * n * 2).reshape(-1, 2) + 1000 * j
        want.append(src[me * (j + 1):(me + 1) * (j + 1)])
    assert y.tolist() == torch.cat(want).tolist()
    outs = [torch.empty(j + 1) for j in range(n)]
    ins = [torch.full((me + 1,), float(10 * me + j)) for j in range(n)]
    dist.all_to_all(outs, ins, group=pg)
    assert [o.tolist() for o in outs] == [[float(10 * j + me)] * (j + 1)
                                          for j in range(n)]


def test_barrier_send_recv_and_objects(pg):
    me, n = pg.rank(), WORLD
    dist.barrier(group=pg)
    got = torch.zeros(4)
    req = dist.irecv(got, src=(me - 1) % n, group=pg)
    dist.send(torch.full((4,), float(me)), dst=(me + 1) % n, group=pg)
    req.wait()
    assert got.tolist() == [float((me - 1) % n)] * 4
    if me == 0:
        dist.isend(torch.arange(3.0), dst=2, group=pg).wait()
    elif me == 2:
        r = torch.zeros(3)
        dist.recv(r, src=0, group=pg)
        assert r.tolist() == [0.0, 1.0, 2.0]
    objs = [None] * n
    dist.all_gather_object(objs, {"rank": me}, group=pg)
    assert objs == [{"rank": k} for k in range(n)]
    ts = [torch.full((2,), float(me)), torch.full((5,), 2.0 * me)]
    dist.all_reduce_coalesced(ts, group=pg)
    assert ts[0].tolist() == [6.0] * 2 and ts[1].tolist() == [12.0] * 5


def test_requires_grad_and_views_are_moved_in_place(pg):
    p = torch.nn.Parameter(torch.ones(4, 3))
    dist.all_reduce(p.data, group=pg)
    dist.all_reduce(p, group=pg)  # torch's gloo takes a parameter too
    assert p.detach().tolist() == [[16.0] * 3] * 4
    big = torch.zeros(4, 6)
    row = big[pg.rank()]  # a contiguous view
    row.fill_(1.0)
    dist.all_reduce(row, group=pg)
    assert big[pg.rank()].tolist() == [4.0] * 6


# -- async Works --------------------------------------------------------------


def test_async_works(pg):
    me = pg.rank()
    ts = [torch.full((1024,), float(me + i)) for i in range(4)]
    works = [dist.all_reduce(t, group=pg, async_op=True) for t in ts]
    assert all(isinstance(w, dist.Work) for w in works)
    for i, w in enumerate(works):
        assert w.wait() is True
        assert w.is_completed() and w.is_success()
        assert ts[i].tolist() == [float(6 + 4 * i)] * 1024
    t = torch.ones(8)
    fut = dist.all_reduce(t, group=pg, async_op=True).get_future()
    assert isinstance(fut, torch.futures.Future)
    doubled = fut.then(lambda f: f.value()[0] * 2)
    assert doubled.wait().tolist() == [8.0] * 8
    assert fut.value()[0] is t
    outs = [torch.empty(2) for _ in range(WORLD)]
    w = dist.all_gather(outs, torch.full((2,), float(me)), group=pg,
                        async_op=True)
    assert w.get_future().wait() == outs  # the list, filled
    assert [o[0].item() for o in outs] == [0.0, 1.0, 2.0, 3.0]
    w = dist.barrier(group=pg, async_op=True)
    w.wait()
    # The group's own methods, as torch's ProcessGroup has them.
    t = torch.ones(3)
    pg.allreduce([t]).wait()
    pg.allreduce([t], dist.ReduceOp.MAX).wait()
    assert t.tolist() == [4.0] * 3


def all_settled():
    """Every Work was waited for or had its future set: none is kept."""
    from vemesh.torch import work
    for _ in range(100):  # the completer settles just after set_result
        if not work._UNSETTLED:
            return True
        time.sleep(0.01)
    return False


# -- torch's DDP on a vemesh group equals one process ------------------------


def make_model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 16),
        torch.nn.Tanh(), torch.nn.Linear(16, 4)).double()


def batches(steps, size, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(size, 8, generator=g, dtype=torch.float64),
             torch.randn(size, 4, generator=g, dtype=torch.float64))
            for _ in range(steps)]


def one_process(steps, size, lr=0.1):
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    for x, y in batches(steps, size):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    return [p.detach() for p in model.parameters()]


@pytest.mark.parametrize("bucket_cap_mb", [25, 0.001])  # one, many buckets
def test_ddp_equals_one_process(pg, bucket_cap_mb):
    steps, size = 4, 16
    model = make_model(seed=pg.rank())  # DDP broadcasts rank 0's
    ddp = torch.nn.parallel.DistributedDataParallel(
        model, process_group=pg, bucket_cap_mb=bucket_cap_mb)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    me, local = pg.rank(), size // WORLD
    for x, y in batches(steps, size):
        opt.zero_grad()
        sl = slice(me * local, (me + 1) * local)
        torch.nn.functional.mse_loss(ddp(x[sl]), y[sl]).backward()
        opt.step()
    for p, want in zip(model.parameters(), one_process(steps, size)):
        torch.testing.assert_close(p.detach(), want, rtol=1e-12, atol=1e-12)
    assert all_settled()


def test_ddp_on_the_dp_dimension_of_a_2d_mesh(mesh2d):
    steps, size = 3, 8
    dp = as_process_group(mesh2d, "dp")
    model = make_model()
    ddp = torch.nn.parallel.DistributedDataParallel(
        model, process_group=dp, bucket_cap_mb=0.001)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    d = mesh2d.get_local_rank("dp")
    for x, y in batches(steps, size):
        opt.zero_grad()
        sl = slice(d * size // 2, (d + 1) * size // 2)
        torch.nn.functional.mse_loss(ddp(x[sl]), y[sl]).backward()
        opt.step()
    for p, want in zip(model.parameters(), one_process(steps, size)):
        torch.testing.assert_close(p.detach(), want, rtol=1e-12, atol=1e-12)


# -- bad input: an exception on every rank, never a hang ---------------------


def test_another_dtype_on_one_rank_raises_everywhere(pg):
    me = pg.rank()
    t = torch.ones(8, dtype=torch.float64 if me == 2 else torch.float32)
    with pytest.raises(ValueError, match="rank 2"):
        dist.all_reduce(t, group=pg)
    t = torch.ones(8)
    dist.all_reduce(t, group=pg)  # the group is still usable
    assert t.tolist() == [4.0] * 8


def test_another_size_on_one_rank_raises_everywhere(pg):
    me = pg.rank()
    t = torch.ones(10 if me == 1 else 8)
    with pytest.raises(ValueError, match="rank 1"):
        dist.broadcast(t, src=0, group=pg)
    # Rank 3's own tensors disagree (its output is too short for its input):
    # it refuses them, and the others fail at once with it.
    out = torch.empty(WORLD * 3)
    with pytest.raises(ValueError, match="expected group size" if me == 3
                       else "rank 3"):
        dist.all_gather_into_tensor(out, torch.ones(4 if me == 3 else 3),
                                    group=pg)
    dist.barrier(group=pg)


def test_a_dtype_vemesh_refuses_on_one_rank_raises_everywhere(pg):
    me = pg.rank()
    t = torch.ones(4, dtype=torch.int16 if me == 1 else torch.float32)
    with pytest.raises(ValueError) as raised:
        dist.all_reduce(t, group=pg)
    if me == 1:
        assert "torch.int16 is not supported" in str(raised.value)
    else:
        assert "rank 1" in str(raised.value)
    dist.barrier(group=pg)


def test_unsupported_ops_name_themselves(pg):
    with pytest.raises(ValueError, match="BAND"):
        dist.all_reduce(torch.ones(2, dtype=torch.int32),
                        op=dist.ReduceOp.BAND, group=pg)
    with pytest.raises(ValueError, match="recv_anysource"):
        dist.irecv(torch.zeros(1), group=pg)
    with pytest.raises(ValueError, match="tag"):
        dist.isend(torch.zeros(1), dst=0, group=pg, tag=7)
    dist.barrier(group=pg)


def test_p2p_of_another_size_raises_at_the_receiver(pg):
    me = pg.rank()
    if me == 0:
        dist.send(torch.ones(10), dst=1, group=pg)
    elif me == 1:
        with pytest.raises(ValueError, match="expected 8"):
            dist.recv(torch.zeros(8), src=0, group=pg)
    dist.barrier(group=pg)


if __name__ == "__main__":
    code = pytest.main(["-q", "-p", "no:cacheprovider", "-x", __file__]
                       + sys.argv[1:])
    who = os.environ.get("RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "?"))
    print(f"rank {who}: pytest exit {int(code)}", flush=True)
    sys.exit(int(code))
