"""torch.distributed and vemesh in one torchrun job, in either order, with no
configuration (issue 41, item 5): init_process_group("gloo") and
vemesh.init_device_mesh share MASTER_ADDR:MASTER_PORT without colliding,
both work, and DDP on torch's Gloo group and on a vemesh group train the
same model to the same parameters.

  torchrun --standalone --nproc_per_node=4 --redirects 1 --tee 1 \
      mp_torch_both.py --order torch_first   (or vemesh_first)
"""
import os
import sys

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

import vemesh  # noqa: E402
from vemesh.torch import as_process_group  # noqa: E402

WORLD = 4
TIMEOUT = 60.0
# Set by --order (through the environment: pytest imports this file anew).
ORDER = os.environ.get("VEMESH_TEST_ORDER", "torch_first")


def train(process_group, steps=3):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(),
                                torch.nn.Linear(8, 2)).double()
    ddp = torch.nn.parallel.DistributedDataParallel(
        model, process_group=process_group)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.2)
    g = torch.Generator().manual_seed(3)
    me = process_group.rank() if process_group is not None else \
        dist.get_rank()
    for _ in range(steps):
        x = torch.randn(8, 4, generator=g, dtype=torch.float64)
        y = torch.randn(8, 2, generator=g, dtype=torch.float64)
        opt.zero_grad()
        sl = slice(2 * me, 2 * me + 2)
        torch.nn.functional.mse_loss(ddp(x[sl]), y[sl]).backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


def test_one_job_both_libraries():
    if "RANK" not in os.environ:
        pytest.skip("env:// (torchrun) only")
    if ORDER == "torch_first":
        dist.init_process_group("gloo")
        mesh = vemesh.init_device_mesh("cpu", (WORLD,), timeout=TIMEOUT)
    else:
        mesh = vemesh.init_device_mesh("cpu", (WORLD,), timeout=TIMEOUT)
        dist.init_process_group("gloo")
    me = dist.get_rank()
    assert mesh.get_rank() == me == int(os.environ["RANK"])
    assert dist.get_backend() == "gloo"
    a = torch.full((3,), float(me))
    dist.all_reduce(a)                       # torch's Gloo
    b = torch.full((3,), float(me))
    mesh.get_group().all_reduce(b)           # vemesh's
    assert a.tolist() == b.tolist() == [6.0] * 3
    on_torch = train(None)
    on_vemesh = train(as_process_group(mesh))
    for p, q in zip(on_torch, on_vemesh):
        torch.testing.assert_close(p, q, rtol=1e-12, atol=1e-12)
    # Later groups of either library still meet: a new vemesh mesh, a new
    # torch group.
    mesh2 = vemesh.init_device_mesh("cpu", (2, 2), mesh_dim_names=("a", "b"),
                                    timeout=TIMEOUT)
    sub = dist.new_group([0, 1])
    t = torch.ones(2)
    mesh2.get_group("a").all_reduce(t)
    assert t.tolist() == [2.0, 2.0]
    if me < 2:
        dist.all_reduce(t, group=sub)
        assert t.tolist() == [4.0, 4.0]
    dist.barrier()


if __name__ == "__main__":
    args = sys.argv[1:]
    if "--order" in args:
        i = args.index("--order")
        ORDER = os.environ["VEMESH_TEST_ORDER"] = args[i + 1]
        del args[i:i + 2]
    assert ORDER in ("torch_first", "vemesh_first"), ORDER
    code = pytest.main(["-q", "-p", "no:cacheprovider", "-x", __file__] + args)
    who = os.environ.get("RANK", "?")
    print(f"rank {who} ({ORDER}): pytest exit {int(code)}", flush=True)
    sys.exit(int(code))
