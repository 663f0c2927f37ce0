"""One-process tests of the vemesh Python module (pytest).

veScale's asserted values for its 8-rank cases are checked on "meta" meshes
(layout only), with the launcher rank set through RANK: the registry answers
them without communicating. The multi-process cases are mp_collectives.py.
"""
import gc
import os
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import vemesh
from vemesh import VESCALE_DEVICE_MESH

try:
    import torch  # noqa: F811
except ImportError:  # pragma: no cover
    torch = None


@pytest.fixture(autouse=True)
def fresh_registry():
    VESCALE_DEVICE_MESH.reset()
    yield
    VESCALE_DEVICE_MESH.reset()


def meta_init(monkeypatch, rank, shape, names):
    monkeypatch.setenv("RANK", str(rank))
    VESCALE_DEVICE_MESH.init_device_mesh("meta", shape, mesh_dim_names=names)


# -- veScale's test_api.py, restated (values from its 8-rank cases) ---------


def test_vescale_strategy_rank(monkeypatch):
    meta_init(monkeypatch, 7, (2, 2, 2), ("PP", "DP", "TP"))
    r = VESCALE_DEVICE_MESH
    assert (r.get_pipeline_parallel_rank(), r.get_data_parallel_rank(),
            r.get_tensor_parallel_rank()) == (1, 1, 1)
    meta_init(monkeypatch, 0, (4, 1, 2), ("PP", "DP", "TP"))
    assert (r.get_pipeline_parallel_rank(), r.get_data_parallel_rank(),
            r.get_tensor_parallel_rank()) == (0, 0, 0)
    meta_init(monkeypatch, 7, (4, 1, 2), ("PP", "DP", "TP"))
    assert (r.get_pipeline_parallel_rank(), r.get_data_parallel_rank(),
            r.get_tensor_parallel_rank()) == (3, 0, 1)


def test_vescale_strategy_mesh(monkeypatch):
    meta_init(monkeypatch, 6, (2, 2, 2), ("PP", "DP", "TP"))
    r = VESCALE_DEVICE_MESH
    assert r.get_tensor_parallel_mesh().mesh.tolist() == [6, 7]
    assert r.get_data_parallel_mesh().mesh.tolist() == [4, 6]
    # veScale's test asserts [6, 7] for PP; its documentation (and vemesh,
    # docs/VESCALE_COMPAT.md) gives the PP group of rank 6: [2, 6].
    assert r.get_pipeline_parallel_mesh().mesh.tolist() == [2, 6]


def test_vescale_global_meshes(monkeypatch):
    meta_init(monkeypatch, 0, (4, 1, 2), ("PP", "DP", "TP"))
    r = VESCALE_DEVICE_MESH
    assert [m.mesh.tolist() for m in r.get_global_tensor_parallel_meshes()] == [
        [0, 1], [2, 3], [4, 5], [6, 7]]
    assert [m.mesh.tolist() for m in r.get_global_pipeline_parallel_meshes()] == [
        [[0, 1]], [[2, 3]], [[4, 5]], [[6, 7]]]


@pytest.mark.parametrize("rank", range(8))
def test_vescale_stage_query(monkeypatch, rank):
    meta_init(monkeypatch, rank, (4, 1, 2), ("PP", "DP", "TP"))
    r = VESCALE_DEVICE_MESH
    assert r.is_first_stage() == (r.get_pipeline_parallel_rank() == 0)
    assert r.is_last_stage() == (
        r.get_pipeline_parallel_rank() == r.get_strategy_size("PP") - 1)


def test_vescale_worked_example(monkeypatch):
    # The registry header's example: rank 5 of PP=2, DP=2, TP=2.
    meta_init(monkeypatch, 5, (2, 2, 2), ("PP", "DP", "TP"))
    r = VESCALE_DEVICE_MESH
    assert r.get_strategy_size("TP") == 2
    assert r.get_strategy_coordinate() == [1, 0, 1]
    assert r.get_strategy_coordinate(3) == [0, 1, 1]
    assert r.get_strategy_coordinate(local_rank=3) == [0, 1, 1]
    assert r.lookup_rank("DP") == 0
    assert r.get_prev_stage_peer() == 1
    assert r.get_next_stage_peer() is None
    assert r.get_next_stage_peer(wrap=True) == 1
    stage, peer, mesh = r.get_prev_stage()
    assert (stage, peer, mesh.mesh.tolist()) == (0, 1, [[0, 1], [2, 3]])
    assert r.shape == [2, 2, 2] and r.ndim == 3 and r.size() == 8
    assert r.size(0) == 2 and r.size("TP") == 2
    assert r["TP"].mesh.tolist() == [4, 5]
    assert r[("DP", "TP")].mesh.tolist() == [[4, 5], [6, 7]]
    assert r.is_last_stage() and not r.is_first_stage()


def test_check_uniqueness(monkeypatch):
    meta_init(monkeypatch, 0, (2, 2), ("DP", "TP"))
    with pytest.raises(vemesh.Error) as e:
        VESCALE_DEVICE_MESH.init_device_mesh("meta", (2, 2),
                                             mesh_dim_names=("DP", "TP"),
                                             check_uniqueness=True)
    assert e.value.code == "ALREADY_EXISTS"


def test_get_with_kwargs_initialises(monkeypatch):
    monkeypatch.setenv("RANK", "3")
    m = VESCALE_DEVICE_MESH.get(device_type="meta", mesh_shape=(2, 2),
                                mesh_dim_names=("dp", "tp"))
    assert m.mesh.tolist() == [[0, 1], [2, 3]]
    assert VESCALE_DEVICE_MESH.get() == m
    assert VESCALE_DEVICE_MESH.get_tensor_parallel_rank() == 1


# -- Errors: the documented mapping, the C++ message ------------------------


def test_before_init_is_vemesh_error():
    with pytest.raises(vemesh.Error) as e:
        VESCALE_DEVICE_MESH.get_tensor_parallel_rank()
    assert e.value.code == "FAILED_PRECONDITION"
    assert "init_device_mesh" in str(e.value)
    assert isinstance(e.value, RuntimeError)


def test_unknown_dim_is_key_error(monkeypatch):
    meta_init(monkeypatch, 0, (2, 2), ("DP", "TP"))
    with pytest.raises(KeyError) as e:
        VESCALE_DEVICE_MESH.get_strategy_size("EP")
    assert e.value.args[0] == (
        "mesh dimension 'EP' does not exist: expected one of [DP, TP]")


def test_bad_shape_is_value_error():
    with pytest.raises(ValueError) as e:
        vemesh.init_device_mesh("meta", (2, 0))
    assert str(e.value) == (
        "mesh dimension 1 ('TP') has size 0: expected a size >= 1")


def test_meta_mesh_shrink_and_abort():
    m = vemesh.init_device_mesh("meta", (3, 2), mesh_dim_names=("DP", "TP"))
    m.abort()  # nothing to abort: no error
    small = m.shrink("DP", [1])
    assert small.mesh_dim_names == ("DP", "TP")
    assert small.size() == 4
    with pytest.raises(ValueError) as e:
        m.shrink("DP", [0, 1, 2])
    assert "excluding all 3" in str(e.value)


def one_rank_group():
    return vemesh.init_device_mesh("cpu", (1,), mesh_dim_names=("w",)).get_group()


def test_buffer_checks():
    g = one_rank_group()
    with pytest.raises(ValueError, match="not C-contiguous"):
        g.all_reduce(np.zeros((4, 4), np.float32)[:, 0])
    with pytest.raises(ValueError, match="read-only"):
        a = np.zeros(4, np.float32)
        a.setflags(write=False)
        g.all_reduce(a)
    with pytest.raises(ValueError, match="not supported"):
        g.all_reduce(np.zeros(4, np.complex64))
    with pytest.raises(ValueError, match="not a reduction"):
        g.all_reduce(np.zeros(4, np.float32), op="median")
    with pytest.raises(ValueError, match="same element type"):
        g.all_gather(np.zeros(4, np.float32), np.zeros(4, np.float64))
    with pytest.raises(ValueError, match="group size"):
        g.all_gather(np.zeros(3, np.float32), np.zeros(4, np.float32))
    with pytest.raises(ValueError, match="avg"):
        g.all_reduce(np.zeros(4, np.int32), op="avg")
    with pytest.raises(TypeError, match="numpy array"):
        g.all_reduce([1.0, 2.0])
    with pytest.raises(ValueError, match="timeout"):
        g.iall_reduce(np.zeros(1, np.float32)).wait(timeout=-1)


@pytest.mark.skipif(torch is None, reason="torch (python3-torch) not installed")
def test_torch_in_place_every_dtype():
    g = one_rank_group()
    for dt in (torch.float32, torch.float64, torch.int32, torch.int64,
               torch.bfloat16, torch.float16):
        t = torch.arange(6, dtype=dt)
        ptr = t.data_ptr()
        g.all_reduce(t, op="max")
        assert t.data_ptr() == ptr
        assert t.tolist() == list(range(6))
    with pytest.raises(ValueError, match="not contiguous"):
        g.all_reduce(torch.zeros(4, 4).t())


@pytest.mark.skipif(torch is None or not torch.cuda.is_available(),
                    reason="no CUDA device here: CUDA tensors through NCCL "
                           "are not tested on this machine")
def test_cuda_tensor_on_host_group_is_refused():
    g = one_rank_group()
    with pytest.raises(ValueError, match="CUDA"):
        g.all_reduce(torch.zeros(4, device="cuda"))


def test_communicator_outlives_mesh():
    mesh = vemesh.init_device_mesh("cpu", (1,), mesh_dim_names=("w",))
    g = mesh.get_group()
    del mesh
    gc.collect()
    a = np.ones(3)
    g.all_reduce(a)
    assert a.tolist() == [1.0, 1.0, 1.0]
    VESCALE_DEVICE_MESH.init_device_mesh("cpu", (1,), mesh_dim_names=("DP",))
    dp = VESCALE_DEVICE_MESH.get_data_parallel_dim_groups()
    VESCALE_DEVICE_MESH.reset()
    gc.collect()
    dp.barrier()
    dp.all_reduce(a)


def test_work_wait_and_dropped_work():
    g = one_rank_group()
    a = np.ones(8, np.float32)
    w = g.iall_reduce(a)
    assert w.wait(timeout=10.0) is True
    assert w.is_completed()
    g.all_reduce(a, async_op=True)  # dropped at once: must not crash
    gc.collect()
    g.barrier()


def run_child(code, timeout=60):
    env = dict(os.environ)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)],
                          env=env, capture_output=True, text=True,
                          timeout=timeout)


def test_ctrl_c_interrupts_a_blocked_wait():
    # A receive nobody answers; SIGINT after 0.5 s must raise
    # KeyboardInterrupt promptly, then the process exits cleanly.
    r = run_child("""
        import os, signal, threading, time
        import numpy as np, vemesh
        # A shell's background job starts with SIGINT ignored: Python's
        # handler back, as in an interactive run.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        g = vemesh.init_device_mesh("cpu", (1,)).get_group()
        threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT)).start()
        t0 = time.monotonic()
        try:
            g.recv(np.zeros(4, np.float32), 0)
        except KeyboardInterrupt:
            print("interrupted after %.2f s, aborted=%s" %
                  (time.monotonic() - t0, g.aborted()))
    """)
    assert r.returncode == 0, r.stderr
    assert "interrupted after" in r.stdout and "aborted=True" in r.stdout


def test_shutdown_with_live_communicators():
    r = run_child("""
        import numpy as np, vemesh
        from vemesh import VESCALE_DEVICE_MESH as V
        V.init_device_mesh("cpu", (1, 1), mesh_dim_names=("DP", "TP"))
        keep = [V.get_data_parallel_dim_groups(), V.get_tensor_parallel_mesh()]
        mesh = vemesh.init_device_mesh("cpu", (1,))
        g = mesh.get_group()
        cycle = [g]; cycle.append(cycle)          # freed by the last GC
        w = g.iall_reduce(np.ones(4))            # a live Work too
        print("exiting")
    """)
    assert r.returncode == 0, r.stderr
    assert "exiting" in r.stdout
