"""Load the (2, 4) HSDP checkpoint torch_ckpt_save.py wrote onto another
mesh and strategy, bit-identical to what the serial run held at the save,
and train on from it exactly as the serial run does; bad checkpoints and bad
input are an exception on every rank.

  4 ranks: FULL_SHARD over one unit of all parameters (other boundaries and
           padding than the saved units), then a DDP-style (replicated) save
           of the same state loaded as FULL_SHARD;
  1 rank:  a plain model and AdamW (and a model wrapped in torch's DDP).

  VEMESH_CKPT_DIR=/tmp/ck torchrun --standalone --nproc_per_node=4 \
      --redirects 1 --tee 1 torch_ckpt_load.py
  VEMESH_CKPT_DIR=/tmp/ck python3 torch_ckpt_load.py
"""
import os
import shutil
import sys

import numpy as np
import pytest

try:
    import torch
except ImportError:  # pragma: no cover
    print("SKIPPED: torch is not installed (Debian: python3-torch)")
    sys.exit(77)

import vemesh
import vemesh.checkpoint as vc
from torch_ckpt_common import (FULL_UNITS, LR, SAVED_STEPS, TIMEOUT,
                               FlatShards, Net, assert_chunks_equal,
                               assert_models_equal, assert_same_bits,
                               ckpt_base, loss_of, serial, shared_dir)
from vemesh.torch import checkpoint as tc

HSDP = os.path.join(ckpt_base(), "hsdp")


@pytest.fixture(scope="module")
def mesh():
    n = int(os.environ.get("WORLD_SIZE", os.environ.get("OMPI_COMM_WORLD_SIZE", "1")))
    return vemesh.init_device_mesh("cpu", (n,), mesh_dim_names=("fsdp",),
                                   timeout=TIMEOUT)


@pytest.fixture(scope="module")
def group(mesh):
    return mesh.get_group()


@pytest.fixture(scope="module")
def scratch(group):
    path = shared_dir(group, os.path.join(ckpt_base(), "scratch"))
    yield path
    group.barrier()
    if group.rank() == 0:
        shutil.rmtree(path, ignore_errors=True)


def fresh_full_shard(group, lr=0.5):
    """A FULL_SHARD rank of a model initialised otherwise (seed 7), whose
    AdamW has not stepped (no state yet) and another learning rate."""
    torch.manual_seed(7)
    return FlatShards(Net(), FULL_UNITS, group.size(), group.rank(), lr=lr)


def test_hsdp_checkpoint_loads_as_full_shard(mesh, group):
    state = fresh_full_shard(group)
    info = tc.load(None, state.opt, checkpoint_id=HSDP, process_group=mesh,
                   shards=state.description)
    assert info.step == SAVED_STEPS and info.metadata["job"] == "hsdp 2x4"
    want_model, want_opt = serial(SAVED_STEPS)
    want = FlatShards(want_model, FULL_UNITS, group.size(), group.rank(),
                      want_opt)
    assert_chunks_equal(state, want)
    assert state.opt.param_groups[0]["lr"] == LR  # restored from the manifest
    # Two more FSDP steps from the loaded state == the serial run's.
    for step in range(SAVED_STEPS, SAVED_STEPS + 2):
        state.step(state.full_model(group), step)
    m5, o5 = serial(SAVED_STEPS + 2)
    assert_chunks_equal(state, FlatShards(m5, FULL_UNITS, group.size(),
                                          group.rank(), o5))


def test_hsdp_checkpoint_loads_on_a_plain_model(mesh, group):
    # Every rank the whole model (one process, or DDP's replicas).
    torch.manual_seed(7)
    model = Net()
    opt = torch.optim.AdamW(model.parameters(), lr=0.5, weight_decay=0.1)
    tc.load(model, opt, checkpoint_id=HSDP, process_group=mesh)
    want_model, want_opt = serial(SAVED_STEPS)
    assert_models_equal(model, opt, want_model, want_opt)
    for step in range(SAVED_STEPS, SAVED_STEPS + 2):
        opt.zero_grad()
        loss_of(model, step).backward()
        opt.step()
    m5, o5 = serial(SAVED_STEPS + 2)
    assert_models_equal(model, opt, m5, o5)


def test_replicated_save_loads_as_full_shard(mesh, group, scratch):
    # DDP's state: the whole model and optimizer on every rank; written once.
    path = os.path.join(scratch, "ddp")
    model, opt = serial(SAVED_STEPS)
    tc.save(model, opt, checkpoint_id=path, process_group=mesh, step=11)
    meta = vc.read_metadata(path)
    assert all(len(t.pieces) == 1 for t in meta.tensors.values())
    assert len({t.pieces[0]["file"] for t in meta.tensors.values()}) == group.size()
    state = fresh_full_shard(group)
    assert tc.load(None, state.opt, checkpoint_id=path, process_group=mesh,
                   shards=state.description).step == 11
    assert_chunks_equal(state, FlatShards(model, FULL_UNITS, group.size(),
                                          group.rank(), opt))


def test_state_dict_api_and_numpy(mesh, group, scratch):
    # get_state_dict / vemesh.checkpoint / set_state_dict, as DCP spells it
    # (nested dicts: the loaded numbers land in the caller's dicts), and
    # numpy arrays in the same checkpoint.
    path = os.path.join(scratch, "dcp")
    model, opt = serial(2)
    model_sd, optim_sd = tc.get_state_dict(model, opt)
    extra = {"position": 1234, "rng": np.arange(5, dtype=np.int64)}
    vc.save({"model": model_sd, "optim": optim_sd, "data": extra},
            checkpoint_id=path, process_group=mesh, step=2)
    assert "optim.fc1.weight.exp_avg" in vc.read_metadata(path).tensors
    torch.manual_seed(3)
    m2 = Net()
    o2 = torch.optim.AdamW(m2.parameters(), lr=LR, weight_decay=0.1)
    tc._init_optimizer_state(o2)
    msd, osd = tc.get_state_dict(m2, o2)
    got = {"position": 0, "rng": np.zeros(5, np.int64)}
    vc.load({"model": msd, "optim": osd, "data": got}, checkpoint_id=path,
            process_group=mesh)
    tc.set_state_dict(m2, o2, model_state_dict=msd, optim_state_dict=osd)
    assert got["position"] == 1234
    assert got["rng"].tolist() == list(range(5))
    assert_models_equal(m2, o2, model, opt)


def test_one_directory_one_job(mesh, group, scratch):
    # A named job's save claims the directory; another job's save and an
    # unnamed save there are refused naming the owner, on every rank; a
    # load can require the job, and LoadInfo names it and the mesh.
    path = os.path.join(scratch, "owned")
    model, opt = serial(1)
    tc.save(model, opt, checkpoint_id=path, process_group=mesh, step=1,
            job="pretrain-a", mesh=f"fsdp={group.size()}")
    with pytest.raises(Exception, match="pretrain-a") as other:
        tc.save(model, opt, checkpoint_id=path, process_group=mesh, step=2,
                job="pretrain-b")
    assert "pretrain-b" in str(other.value)
    with pytest.raises(Exception, match="pretrain-a"):
        vc.save({"x": np.zeros(3)}, checkpoint_id=path, process_group=mesh,
                step=3)
    m2, o2 = serial(0)
    info = tc.load(m2, o2, checkpoint_id=path, process_group=mesh,
                   job="pretrain-a")
    assert (info.step, info.job, info.mesh) == (1, "pretrain-a",
                                                f"fsdp={group.size()}")
    assert_models_equal(m2, o2, model, opt)
    with pytest.raises(Exception, match="pretrain-c") as wrong:
        tc.load(m2, o2, checkpoint_id=path, process_group=mesh,
                job="pretrain-c")
    assert "pretrain-a" in str(wrong.value)
    with pytest.raises(TypeError, match="job: expected a str"):
        vc.load({"x": np.zeros(3)}, checkpoint_id=path, process_group=mesh,
                job=7)


def test_a_chunk_of_padding_only_adds_nothing(mesh, scratch):
    # FSDP's last ranks may hold padding only: no pieces, no state saved.
    path = os.path.join(scratch, "padding")
    model, opt = serial(1)
    pad = torch.nn.Parameter(torch.zeros(3))
    pad_opt = torch.optim.AdamW([pad])
    pad.grad = torch.ones(3)
    pad_opt.step()
    pieces = tc.flat_pieces([("fc2.bias", (10,))], 10, 13)
    assert pieces == []
    tc.save(model, [opt, pad_opt], checkpoint_id=path, process_group=mesh,
            shards=[tc.ParamShard(pad, pieces)])
    names = set(vc.read_metadata(path).tensors)
    assert names == set(tc.get_state_dict(model, opt)[0]) | set(
        tc.get_state_dict(model, opt)[1])


# -- errors, on every rank ---------------------------------------------------


def test_model_of_another_shape_is_an_error_on_every_rank(mesh, group):
    model = Net(hidden=20)
    with pytest.raises(vemesh.Error, match="fc1.weight' is F32 \\[24, 12\\] "
                       "in checkpoint .* but F32 \\[20, 12\\] here") as e:
        tc.load(model, None, checkpoint_id=HSDP, process_group=mesh)
    assert e.value.code == "FAILED_PRECONDITION"


def test_another_dtype_on_one_rank_is_an_error_on_every_rank(mesh, group):
    bad = group.size() - 1
    model = Net(dtype=torch.float64 if group.rank() == bad else torch.float32)
    with pytest.raises(vemesh.Error, match=f"rank {bad}: tensor '.*' is F32 .* "
                       "but F64 .* here"):
        tc.load(model, None, checkpoint_id=HSDP, process_group=mesh)


def test_missing_checkpoint_is_an_error_on_every_rank(mesh, scratch):
    with pytest.raises(KeyError, match="no committed checkpoint in"):
        tc.load(Net(), None, checkpoint_id=os.path.join(scratch, "absent"),
                process_group=mesh)


def test_bad_value_on_one_rank_is_an_error_on_every_rank(mesh, group):
    want = {"scale": torch.zeros(10)}
    if group.rank() == 0:
        want["scale"] = "not a tensor"
    with pytest.raises(ValueError, match="rank 0: tensor 'scale': str is not"):
        vc.load(want, checkpoint_id=HSDP, process_group=mesh)


def copy_of_hsdp(group, scratch, name):
    path = os.path.join(scratch, name)
    if group.rank() == 0:
        shutil.copytree(HSDP, path, symlinks=True)
    group.barrier()
    return path


def test_corrupt_shard_is_an_error_on_every_rank(mesh, group, scratch):
    path = copy_of_hsdp(group, scratch, "corrupt")
    meta = vc.read_metadata(path)
    piece = meta.tensors["fc2.weight.exp_avg"].pieces[0]
    if group.rank() == 0:
        with open(os.path.join(meta.path, piece["file"]), "r+b") as f:
            f.seek(piece["offset"] + piece["length"] // 2)
            byte = f.read(1)
            f.seek(-1, os.SEEK_CUR)
            f.write(bytes([byte[0] ^ 0x40]))
    group.barrier()
    state = fresh_full_shard(group)
    with pytest.raises(vemesh.Error, match="checksum mismatch .*fc2.weight.exp_avg") as e:
        tc.load(None, state.opt, checkpoint_id=path, process_group=mesh,
                shards=state.description)
    assert e.value.code == "DATA_LOSS"


def test_truncated_shard_is_an_error_on_every_rank(mesh, group, scratch):
    path = copy_of_hsdp(group, scratch, "truncated")
    meta = vc.read_metadata(path)
    name = sorted(meta.files)[0]
    if group.rank() == 0:
        f = os.path.join(meta.path, name)
        os.truncate(f, os.path.getsize(f) - 10)
    group.barrier()
    with pytest.raises(vemesh.Error, match="truncated"):
        vc.load_full(path, process_group=mesh)


def test_damaged_manifest_is_an_error_on_every_rank(mesh, group, scratch):
    path = copy_of_hsdp(group, scratch, "manifest")
    meta = vc.read_metadata(path)
    group.barrier()  # everyone has read it before it is damaged
    if group.rank() == 0:
        with open(os.path.join(meta.path, "manifest.json"), "r+b") as f:
            f.seek(40)
            f.write(b"}}}}")
    group.barrier()
    with pytest.raises(ValueError, match="manifest.json"):
        tc.load(Net(), None, checkpoint_id=path, process_group=mesh)


def test_torch_ddp_names_are_the_serial_model_s(mesh, group, scratch):
    # torch's DDP (its own one-process gloo group: the names are the point).
    if group.size() != 1:
        pytest.skip("one process: torch.distributed's own group of 1")
    import socket
    import torch.distributed as dist
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}",
                            rank=0, world_size=1)
    try:
        model, opt = serial(SAVED_STEPS)
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        path = os.path.join(scratch, "torch_ddp")
        tc.save(ddp, opt, checkpoint_id=path, process_group=mesh, step=1)
        names = set(vc.read_metadata(path).tensors)
        assert "fc1.weight" in names and "fc1.weight.exp_avg" in names
        assert not any(n.startswith("module.") for n in names)
        full, _ = vc.load_full(path, names=["fc2.bias"], process_group=mesh)
        assert_same_bits(torch.from_numpy(full["fc2.bias"]), model.fc2.bias,
                         "fc2.bias")
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    code = pytest.main(["-q", "-p", "no:cacheprovider", "-x", __file__]
                       + sys.argv[1:])
    who = os.environ.get("RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "?"))
    print(f"rank {who}: pytest exit {int(code)}", flush=True)
    sys.exit(int(code))
