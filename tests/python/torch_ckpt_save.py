"""Save a torch model and its AdamW state as a (2, 4) HSDP job holds them:
replicated over the first mesh dimension, each unit's flat parameter
row-sharded over the second (vemesh.torch.checkpoint's flat-shard contract).
8 ranks; the checkpoint goes to $VEMESH_CKPT_DIR/hsdp, where
torch_ckpt_load.py (4 ranks FULL_SHARD, 1 process) loads it:

  VEMESH_CKPT_DIR=/tmp/ck torchrun --standalone --nproc_per_node=8 \
      --redirects 1 --tee 1 torch_ckpt_save.py
"""
import os
import shutil
import sys

import pytest

try:
    import torch  # noqa: F401
except ImportError:  # pragma: no cover
    print("SKIPPED: torch is not installed (Debian: python3-torch)")
    sys.exit(77)

import vemesh
import vemesh.checkpoint as vc
from torch_ckpt_common import (HSDP_UNITS, LR, SAVED_STEPS, TIMEOUT,
                               FlatShards, ckpt_base, serial)
from vemesh.torch import checkpoint as tc


@pytest.fixture(scope="module")
def mesh():
    return vemesh.init_device_mesh("cpu", (2, 4), mesh_dim_names=("replicate", "shard"),
                                   timeout=TIMEOUT)


def test_save_hsdp_2x4(mesh):
    assert mesh.size() == 8, "run on 8 ranks"
    path = os.path.join(ckpt_base(), "hsdp")
    world = mesh.flatten().get_group()
    if world.rank() == 0:
        shutil.rmtree(path, ignore_errors=True)
    world.barrier()
    model, opt = serial(SAVED_STEPS)
    s = mesh.get_local_rank("shard")
    state = FlatShards(model, HSDP_UNITS, 4, s, opt, lr=LR)
    # The buffer (not sharded by FSDP) and the chunks; no model parameters
    # but those the chunks hold.
    tc.save(model, state.opt, checkpoint_id=path, process_group=mesh,
            shards=state.description, step=SAVED_STEPS,
            metadata={"job": "hsdp 2x4"})
    meta = vc.read_metadata(path)
    assert meta.step == SAVED_STEPS and meta.world_size == 8
    assert meta.metadata["job"] == "hsdp 2x4"
    assert sorted(meta.tensors) == sorted(
        ["scale"] + [f"{n}{k}" for n in ("fc1.weight", "fc1.bias", "fc2.weight",
                                         "fc2.bias")
                     for k in ("", ".exp_avg", ".exp_avg_sq", ".step")])
    w = meta.tensors["fc1.weight"]
    assert (w.dtype, w.shape) == ("F32", (24, 12))
    assert meta.tensors["fc1.weight.step"].dtype == "I64"
    # Replicas are written once: the pieces of a tensor cover it exactly.
    for name, t in meta.tensors.items():
        assert t.bytes == max(1, _numel(t.shape)) * {"F32": 4, "I64": 8}[t.dtype], name
    # ... and spread over both replicas' ranks.
    writers = {p["file"] for t in meta.tensors.values() for p in t.pieces}
    assert len(writers) == 8, writers


def test_save_is_bad_input_on_every_rank(mesh):
    # One rank describes a piece outside its tensor: every rank raises, and
    # nothing is committed.
    path = os.path.join(ckpt_base(), "hsdp")
    model, opt = serial(1)
    s = mesh.get_local_rank("shard")
    state = FlatShards(model, HSDP_UNITS, 4, s, opt)
    if mesh.get_rank() == 5:
        shard = state.description[0]
        bad = shard.pieces[0]._replace(start=10**6)
        state.description[0] = tc.ParamShard(shard.tensor, [bad])
    with pytest.raises(ValueError, match="rank 5: .*outside the local tensor"):
        tc.save(model, state.opt, checkpoint_id=path, process_group=mesh,
                shards=state.description, step=99)
    assert vc.latest_step(path) == SAVED_STEPS


def _numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


if __name__ == "__main__":
    code = pytest.main(["-q", "-p", "no:cacheprovider", "-x", __file__]
                       + sys.argv[1:])
    who = os.environ.get("RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "?"))
    print(f"rank {who}: pytest exit {int(code)}", flush=True)
    sys.exit(int(code))
