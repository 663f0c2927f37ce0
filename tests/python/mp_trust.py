"""Issue 44 on 2 ranks, under mpirun (MPI) and torchrun (Gloo): one rank's
mistake is an exception on every rank, never a crash or a job-wide abort.

  mpirun -n 2 python3 mp_trust.py
  torchrun --standalone --nproc_per_node=2 --redirects 1 --tee 1 mp_trust.py

- Mismatched dtypes or counts in a collective (under mpirun Open MPI used to
  end the job: MPI_ERR_TRUNCATE on MPI_COMM_WORLD): ValueError on every
  rank naming both, and the group goes on.
- A torch tensor resize_()d while an async operation on it runs (its memory
  freed under MPI: SIGSEGV in MPI_Test): the operation works on a copy; the
  wait raises naming the resize; the other rank's result is right.
"""
import time

import numpy as np
import pytest

import vemesh

try:
    import torch
except ImportError:  # pragma: no cover
    torch = None

TIMEOUT = 60.0


@pytest.fixture(scope="module")
def group():
    mesh = vemesh.init_device_mesh("cpu", (2,), timeout=TIMEOUT)
    return mesh.get_group()


def expect_mismatch(fn, *texts):
    with pytest.raises(ValueError) as e:
        fn()
    for t in texts:
        assert t in str(e.value), str(e.value)


def test_mismatched_dtypes_raise_on_every_rank(group):
    me = group.rank()
    a = np.ones(8, np.float32 if me == 0 else np.float64)
    expect_mismatch(lambda: group.all_reduce(a), "rank 1 has all_reduce of 8 "
                    "float64", "rank 0 has all_reduce of 8 float32")
    b = np.ones(8 if me == 0 else 16, np.float32)
    expect_mismatch(lambda: group.all_reduce(b), "16 float32")
    ok = np.ones(4, np.float32)
    group.all_reduce(ok)
    assert ok.tolist() == [2.0] * 4


@pytest.mark.skipif(torch is None, reason="torch (python3-torch) not installed")
def test_torch_dtype_mismatch_async_raises_on_every_rank(group):
    me = group.rank()
    t = torch.ones(8, dtype=torch.float32 if me == 0 else torch.bfloat16)
    w = group.all_reduce(t, async_op=True)
    expect_mismatch(lambda: w.wait(timeout=TIMEOUT), "bfloat16")
    assert t.tolist() == [1.0] * 8  # untouched
    u = torch.ones(8)
    group.all_reduce(u)
    assert u.tolist() == [2.0] * 8


@pytest.mark.skipif(torch is None, reason="torch (python3-torch) not installed")
def test_resize_during_async_op_never_crashes(group):
    me = group.rank()
    n = 1 << 22  # 16 MiB of float32: allocated by mmap, unmapped when freed
    for _ in range(3):
        t = torch.ones(n)
        if me == 1:
            time.sleep(0.3)  # rank 0's operation is in flight meanwhile
        w = group.all_reduce(t, async_op=True)
        if me == 0:
            t.resize_(4 * n)  # frees the memory the operation was given
            t.fill_(7.0)
            with pytest.raises(RuntimeError, match="resized"):
                w.wait(timeout=TIMEOUT)
            assert float(t[0]) == 7.0 and float(t[-1]) == 7.0
        else:
            assert w.wait(timeout=TIMEOUT)
            assert float(t.min()) == 2.0 and float(t.max()) == 2.0
        group.barrier()
    # An async operation whose tensor keeps its shape: the result is there
    # once wait() or test() saw it complete.
    t = torch.full((1000,), float(me + 1))
    w = group.all_reduce(t, async_op=True)
    assert w.wait(timeout=TIMEOUT)
    assert t.tolist() == [3.0] * 1000
    out = torch.zeros(4)
    w = group.all_gather(out, torch.full((2,), float(me)), async_op=True)
    deadline = time.time() + TIMEOUT
    while not w.test() and time.time() < deadline:  # test() drives MPI
        time.sleep(0.001)
    assert w.is_completed()
    assert out.tolist() == [0.0, 0.0, 1.0, 1.0]


if __name__ == "__main__":
    import os
    import sys
    code = pytest.main(["-q", "-p", "no:cacheprovider", __file__]
                       + sys.argv[1:])
    who = os.environ.get("RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "?"))
    print(f"rank {who}: pytest exit {int(code)}", flush=True)
    sys.exit(int(code))
