"""torch.distributed.init_process_group("vemesh") under torchrun, 4 ranks,
one pytest session: the default group is vemesh's world, every
torch.distributed call on it (gather and scatter too, which need a default
group), dist.new_group of some ranks, DDP without a process_group, and vemesh
meshes and a Gloo group beside it in the same job.

  torchrun --standalone --nproc_per_node=4 --redirects 1 --tee 1 mp_torch_init.py
"""
import os
import sys

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

import vemesh  # noqa: E402
from vemesh.torch import ProcessGroupVemesh, as_process_group  # noqa: E402

WORLD = 4
TIMEOUT = 60.0


def test_init_process_group_vemesh():
    if "RANK" not in os.environ:
        pytest.skip("env:// (torchrun) only")
    dist.init_process_group("vemesh")
    assert dist.is_initialized()
    assert dist.get_backend() == "vemesh"
    assert isinstance(dist.group.WORLD, ProcessGroupVemesh)
    assert dist.get_rank() == int(os.environ["RANK"])
    assert dist.get_world_size() == WORLD


def test_default_group_collectives():
    me, n = dist.get_rank(), WORLD
    t = torch.full((5,), float(me))
    dist.all_reduce(t)
    assert t.tolist() == [6.0] * 5
    b = torch.full((3,), float(me), dtype=torch.float64)
    dist.broadcast(b, src=1)
    assert b.tolist() == [1.0] * 3
    gathered = [torch.empty(2) for _ in range(n)] if me == 2 else None
    dist.gather(torch.full((2,), float(me)), gather_list=gathered, dst=2)
    if me == 2:
        assert [g.tolist() for g in gathered] == [[float(k)] * 2
                                                  for k in range(n)]
    got = torch.empty(3, dtype=torch.int64)
    parts = [torch.full((3,), 10 * k, dtype=torch.int64) for k in range(n)]
    dist.scatter(got, scatter_list=parts if me == 0 else None, src=0)
    assert got.tolist() == [10 * me] * 3
    objs = ["a", {"b": 1}, None] if me == 3 else [None, None, None]
    dist.broadcast_object_list(objs, src=3)
    assert objs == ["a", {"b": 1}, None]
    gathered_objs = [None] * n if me == 0 else None
    dist.gather_object(("rank", me), gathered_objs, dst=0)
    if me == 0:
        assert gathered_objs == [("rank", k) for k in range(n)]
    r = torch.full((4,), float(me + 1))
    dist.reduce(r, dst=0, op=dist.ReduceOp.PRODUCT)
    if me == 0:
        assert r.tolist() == [24.0] * 4
    out = torch.empty(n)
    dist.all_to_all_single(out, torch.tensor([float(10 * me + j)
                                              for j in range(n)]))
    assert out.tolist() == [float(10 * j + me) for j in range(n)]
    dist.barrier()


def test_new_group_of_some_ranks():
    me = dist.get_rank()
    odd = dist.new_group([1, 3])
    whole = dist.new_group()
    if me in (1, 3):
        assert isinstance(odd, ProcessGroupVemesh)
        assert odd.size() == 2 and dist.get_rank(odd) == [1, 3].index(me)
        t = torch.full((2,), float(me))
        dist.all_reduce(t, group=odd)
        assert t.tolist() == [4.0, 4.0]
        dist.broadcast(t, src=3, group=odd)
    else:
        assert odd == dist.GroupMember.NON_GROUP_MEMBER
    t = torch.ones(3)
    dist.all_reduce(t, group=whole)
    assert t.tolist() == [4.0] * 3
    gloo = dist.new_group([0, 2], backend="gloo")  # torch's own, same store
    if me in (0, 2):
        t = torch.full((1,), float(me))
        dist.all_reduce(t, group=gloo)
        assert t.tolist() == [2.0]


def test_ddp_on_the_default_group_equals_one_process():
    def model_of(seed):
        torch.manual_seed(seed)
        return torch.nn.Sequential(torch.nn.Linear(6, 12), torch.nn.ReLU(),
                                   torch.nn.Linear(12, 3)).double()
    g = torch.Generator().manual_seed(5)
    data = [(torch.randn(8, 6, generator=g, dtype=torch.float64),
             torch.randn(8, 3, generator=g, dtype=torch.float64))
            for _ in range(3)]
    ref = model_of(0)
    ref_opt = torch.optim.Adam(ref.parameters(), lr=0.01)
    for x, y in data:
        ref_opt.zero_grad()
        torch.nn.functional.mse_loss(ref(x), y).backward()
        ref_opt.step()
    me = dist.get_rank()
    model = model_of(me)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.Adam(ddp.parameters(), lr=0.01)
    for x, y in data:
        opt.zero_grad()
        sl = slice(2 * me, 2 * me + 2)
        torch.nn.functional.mse_loss(ddp(x[sl]), y[sl]).backward()
        opt.step()
    for p, want in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p.detach(), want.detach(), rtol=1e-12,
                                   atol=1e-12)


def test_vemesh_meshes_in_the_same_job():
    mesh = vemesh.init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"),
                                   timeout=TIMEOUT)
    me = dist.get_rank()
    assert mesh.get_rank() == me
    dp = as_process_group(mesh, "dp")
    assert dist.get_rank(dp) == me // 2  # a default group exists now
    t = torch.full((2,), float(me))
    dist.all_reduce(t, group=dp)
    assert t.tolist() == [float(2 * (me % 2) + 2)] * 2


if __name__ == "__main__":
    code = pytest.main(["-q", "-p", "no:cacheprovider", "-x", __file__]
                       + sys.argv[1:])
    who = os.environ.get("RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "?"))
    print(f"rank {who}: pytest exit {int(code)}", flush=True)
    sys.exit(int(code))
