"""Issue 45 from Python on 8 ranks (mpirun or torchrun): an attention mesh
and an expert mesh over the same ranks in one VESCALE_DEVICE_MESH
(init_device_mesh(mesh_name=...), mesh_name= on the getters), a role only
the other mesh has raising, a shared communicator, one mesh reset while the
other keeps working, and DeviceMesh.concatenate (PyTorch's _concatenate).
Expected ranks are row-major arithmetic done here.

  mpirun -n 8 python3 mp_named_meshes.py
"""
import os
import sys

import pytest

import vemesh
from vemesh import VESCALE_DEVICE_MESH as REG

WORLD = 8


def coord(rank, shape):
    out = []
    for s in reversed(shape):
        out.append(rank % s)
        rank //= s
    return out[::-1]


def group(rank, shape, d):
    c = coord(rank, shape)
    out = []
    for i in range(shape[d]):
        c[d] = i
        r = 0
        for k, s in zip(c, shape):
            r = r * s + k
        out.append(r)
    return out


@pytest.fixture(autouse=True)
def fresh_registry():
    REG.reset_all()
    yield
    REG.reset_all()


def init_both():
    REG.init_device_mesh("cpu", (2, 2, 2), mesh_dim_names=("PP", "DP", "TP"))
    REG.init_device_mesh("cpu", (2, 1, 4), mesh_dim_names=("PP", "EDP", "EP"),
                         mesh_name="experts")


def test_getters_on_both_meshes():
    init_both()
    me = REG.get_rank()
    assert REG.mesh_names() == ["experts"]
    assert REG.get_role_size("EP", mesh_name="experts") == 4
    assert REG.get_role_rank("EP", mesh_name="experts") == me % 4
    assert REG.get_strategy_coordinate(mesh_name="experts") == \
        coord(me, (2, 1, 4))
    assert REG.get_strategy_coordinate(5, mesh_name="experts") == [1, 0, 1]
    assert REG.lookup_rank("EP", mesh_name="experts") == me % 4
    assert REG.size(mesh_name="experts") == 8
    assert REG.get(mesh_name="experts").shape == (2, 1, 4)
    assert list(REG.get_role_mesh("EP", mesh_name="experts").mesh) == \
        group(me, (2, 1, 4), 2)
    ep = REG.get_role_dim_groups("EP", mesh_name="experts")
    assert list(ep.ranks()) == group(me, (2, 1, 4), 2)
    assert REG.get_pipeline_parallel_rank(mesh_name="experts") == me // 4
    assert REG.get_next_stage_peer(wrap=True, mesh_name="experts") == \
        (me + 4) % 8
    # The default mesh answers as before.
    assert REG.get_tensor_parallel_rank() == me % 2
    assert REG.get_data_parallel_rank() == (me // 2) % 2


def test_a_role_of_the_other_mesh_raises():
    init_both()
    with pytest.raises(RuntimeError, match="'experts'"):
        REG.get_role_size("EP")
    with pytest.raises(RuntimeError, match="default mesh"):
        REG.get_data_parallel_dim_groups(mesh_name="experts")
    with pytest.raises(LookupError, match=r"\[default, experts\]"):
        REG.get_role_size("EP", mesh_name="expert")


def test_reset_one_mesh_leaves_the_other():
    init_both()
    me = REG.get_rank()
    pp = REG.get_pipeline_parallel_dim_groups()
    # The group cache: PP spans the same ranks in both meshes.
    assert REG.get_pipeline_parallel_dim_groups(mesh_name="experts").ranks() == \
        pp.ranks()
    REG.reset(mesh_name="experts")
    assert not REG.is_initialized(mesh_name="experts")
    assert REG.is_initialized()
    REG.init_device_mesh("cpu", (2, 1, 4), mesh_dim_names=("PP", "EDP", "EP"),
                         mesh_name="experts")
    REG.reset()
    ep = REG.get_role_dim_groups("EP", mesh_name="experts")
    assert list(ep.ranks()) == group(me, (2, 1, 4), 2)


def test_concatenate():
    mesh = vemesh.init_device_mesh("cpu", (2, 2, 2),
                                   mesh_dim_names=("dp", "cp", "tp"))
    me = mesh.get_rank()
    dp_cp = vemesh.DeviceMesh.concatenate([mesh["dp"], mesh["cp"]])
    assert dp_cp.mesh_dim_names == ("dp", "cp")
    tp_cp = vemesh.DeviceMesh._concatenate([mesh["tp"], mesh["cp"]])
    c = coord(me, (2, 2, 2))
    assert [r for r in tp_cp.mesh.flatten()] == \
        [c[0] * 4 + cp * 2 + tp for tp in range(2) for cp in range(2)]
    with pytest.raises(ValueError, match="overlapping"):
        vemesh.DeviceMesh.concatenate([mesh["dp"], mesh["dp"]])


if __name__ == "__main__":
    code = pytest.main(["-q", "-p", "no:cacheprovider", "-x", __file__]
                       + sys.argv[1:])
    who = os.environ.get("RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "?"))
    print(f"rank {who}: pytest exit {int(code)}", flush=True)
    sys.exit(int(code))
