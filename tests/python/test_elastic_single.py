"""vemesh.elastic in one process: the state's byte form, the options and
bad input (tests/python/elastic_torch.sh runs the elastic job itself)."""

import numpy as np
import pytest

import vemesh
from vemesh import VESCALE_DEVICE_MESH
from vemesh.elastic import decode, encode, status_of

torch = pytest.importorskip("torch")


def test_round_trip_nested_state():
    state = {
        "w": torch.arange(6, dtype=torch.float64).reshape(2, 3),
        "h": torch.ones(3, dtype=torch.float16), "b": torch.tensor([True, False]),
        "bf": torch.full((2,), 1.5, dtype=torch.bfloat16),
        "step": torch.tensor(7.0), "i": torch.arange(3),
        "np": np.arange(4, dtype=np.int32),
        "groups": [{"lr": 0.01, "betas": (0.9, 0.999), "foreach": None,
                    "params": [0, 1], "amsgrad": False}],
        3: "int key", "raw": b"\x00\x01", "big": 2**70,
    }
    data = encode(state)
    got = decode(data)
    assert encode(got) == data
    assert list(got) == list(state)
    for k in ("w", "h", "b", "bf", "step", "i"):
        assert got[k].dtype == state[k].dtype and torch.equal(got[k], state[k])
    assert got["np"].dtype == np.int32 and (got["np"] == state["np"]).all()
    assert got["groups"][0]["betas"] == (0.9, 0.999)
    assert isinstance(got["groups"][0]["betas"], tuple)
    assert got[3] == "int key" and got["raw"] == b"\x00\x01" and got["big"] == 2**70


def test_equal_states_encode_equal_and_models_load_in_place():
    torch.manual_seed(0)
    a = torch.nn.Linear(3, 2).double()
    opt = torch.optim.AdamW(a.parameters())
    a(torch.randn(4, 3, dtype=torch.float64)).sum().backward()
    opt.step()
    b = torch.nn.Linear(3, 2).double()
    opt_b = torch.optim.AdamW(b.parameters())
    weight = b.weight
    b.load_state_dict(decode(encode(a.state_dict())))
    opt_b.load_state_dict(decode(encode(opt.state_dict())))
    assert b.weight is weight  # loaded in place
    assert encode(b.state_dict()) == encode(a.state_dict())
    assert encode(opt_b.state_dict()) == encode(opt.state_dict())
    # A different value is a different byte form (and fingerprint).
    with torch.no_grad():
        b.weight[0, 0] += 1e-12
    assert encode(b.state_dict()) != encode(a.state_dict())


def test_bad_state_values_and_bytes():
    with pytest.raises(TypeError, match="object cannot be carried"):
        encode({"x": object()})
    data = encode({"w": torch.zeros(4)})
    with pytest.raises(ValueError, match="truncated"):
        decode(data[:-3])
    with pytest.raises(ValueError, match="left over"):
        decode(data + b"N")


def test_step_status_codes():
    assert status_of(None) is None
    assert status_of(TimeoutError("t"))[0] == "DEADLINE_EXCEEDED"
    assert status_of(ValueError("v"))[0] == "INVALID_ARGUMENT"
    assert status_of(RuntimeError("shape"))[0] == "INTERNAL"
    e = vemesh.Error("gone")
    e.code = "UNAVAILABLE"
    assert status_of(e) == ("UNAVAILABLE", "Error: gone")


def test_options():
    o = vemesh.ElasticOptions(store="redis://127.0.0.1:6379", replica=2,
                              replica_dim="DP_REPLICATE", heartbeat_ttl=0.5,
                              op_timeout=2.0, min_replicas=2, max_step_retries=1)
    assert (o.store, o.replica, o.replica_dim) == ("redis://127.0.0.1:6379", 2,
                                                   "DP_REPLICATE")
    assert (o.heartbeat_ttl, o.op_timeout, o.min_replicas, o.max_step_retries) == \
        (0.5, 2.0, 2, 1)
    with pytest.raises(ValueError, match="op_timeout: -1"):
        vemesh.ElasticOptions(store="x", replica=0, op_timeout=-1)
    with pytest.raises(ValueError, match="max_step_retries"):
        vemesh.ElasticOptions(store="x", replica=0, max_step_retries=-1)


def test_bad_elastic_argument_and_unreachable_store():
    assert VESCALE_DEVICE_MESH.elastic() is None
    with pytest.raises(TypeError, match="elastic: expected a vemesh.ElasticOptions"):
        vemesh.init_device_mesh("cpu", (1, 1), mesh_dim_names=("DP", "TP"), elastic=5)
    with pytest.raises(ValueError, match="replica_dim 'XX' is not a dimension"):
        VESCALE_DEVICE_MESH.init_device_mesh(
            "cpu", (1, 1), mesh_dim_names=("DP", "TP"),
            elastic={"store": "redis://127.0.0.1:1", "replica": 0, "replica_dim": "XX"})
    with pytest.raises(vemesh.Error, match="cannot reach Redis") as e:
        vemesh.init_device_mesh(
            "cpu", (1, 1), mesh_dim_names=("DP", "TP"),
            elastic=vemesh.ElasticOptions(store="redis://127.0.0.1:1", replica=0))
    assert e.value.code == "UNAVAILABLE"
    assert VESCALE_DEVICE_MESH.elastic() is None


def test_async_saver_copies_at_start_and_commits_at_wait(tmp_path):
    """vemesh.checkpoint.AsyncSaver (what ElasticCheckpointer saves with):
    start() copies the state (changing it afterwards changes nothing saved),
    nothing is a checkpoint until wait() or the next start() commits it."""
    import vemesh.checkpoint as vc
    mesh = vemesh.init_device_mesh("cpu", (1,), mesh_dim_names=("DP",))
    try:
        d = str(tmp_path / "ckpt")
        w = torch.arange(6, dtype=torch.float64)
        saver = vc.AsyncSaver(mesh)
        assert not saver.in_flight
        saver.start({"w": w}, checkpoint_id=d, step=1)
        assert saver.in_flight
        w.add_(100)  # after start: not in step 1
        assert vc.latest_step(d) is None  # not committed yet
        saver.start({"w": w}, checkpoint_id=d, step=2)  # commits step 1
        assert vc.latest_step(d) == 1
        saver.wait()
        assert not saver.in_flight and vc.latest_step(d) == 2
        got = {"w": torch.zeros(6, dtype=torch.float64)}
        vc.load(got, checkpoint_id=d, process_group=mesh, step=1)
        assert torch.equal(got["w"], torch.arange(6, dtype=torch.float64))
        vc.load(got, checkpoint_id=d, process_group=mesh)
        assert torch.equal(got["w"], torch.arange(6, dtype=torch.float64) + 100)
        saver.wait()  # nothing in flight: nothing to do
        with pytest.raises(ValueError, match="keep_last"):
            saver.start({"w": w}, checkpoint_id=d, step=3, keep_last=0)
    finally:
        VESCALE_DEVICE_MESH.reset()
