"""Python between two C++ runs (ckpt_train_nd.py runs it under mpirun):
loads the checkpoint examples/train_nd wrote into torch parameters and AdamW
state held as row and column blocks over the ranks, saves them again as a
checkpoint of its own (same step and metadata), and checks that both hold
the same bytes.

  mpirun -n 2 python3 torch_ckpt_reshard.py SRC DST
"""
import os
import sys

import torch
from torch import nn

import vemesh
import vemesh.checkpoint as vc
from vemesh.torch import checkpoint as tc

torch.set_num_threads(1)


def main(src, dst):
    meta = vc.read_metadata(src)
    mesh = vemesh.init_device_mesh("cpu", (_world(),), timeout=60.0)
    g = mesh.get_group()
    n, r = g.size(), g.rank()
    # train_nd's names: layer<l>.weight [in, out] and layer<l>.bias [1, out]
    # (float64), with AdamW state; here weights in row blocks and biases in
    # column blocks, one nn.Parameter each.
    shards, params = [], []
    for name, t in sorted(meta.tensors.items()):
        if not (name.endswith(".weight") or name.endswith(".bias")):
            continue
        assert t.dtype == "F64", (name, t.dtype)
        dim = 0 if name.endswith(".weight") else 1
        size = t.shape[dim]
        lo, hi = size * r // n, size * (r + 1) // n
        local = list(t.shape)
        local[dim] = hi - lo
        offsets = [0] * len(t.shape)
        offsets[dim] = lo
        p = nn.Parameter(torch.full(local, float("nan"), dtype=torch.float64))
        params.append(p)
        shards.append(tc.ParamShard(p, [tc.Piece(name, tuple(t.shape),
                                                 tuple(offsets))]))
    opt = torch.optim.AdamW(params, lr=1.0)
    info = tc.load(None, opt, checkpoint_id=src, process_group=mesh,
                   shards=shards)
    assert info.step == meta.step
    assert all(not torch.isnan(p).any() for p in params)
    assert all(float(opt.state[p]["step"]) == meta.step for p in params)
    keep = {k: v for k, v in info.metadata.items()
            if not k.startswith("torch.optim.")}
    tc.save(None, opt, checkpoint_id=dst, process_group=mesh,
            shards=shards, step=info.step, metadata=keep)
    # The same tensors, bit for bit, in both checkpoints.
    a, _ = vc.load_full(src, process_group=mesh)
    b, _ = vc.load_full(dst, process_group=mesh)
    assert sorted(a) == sorted(b), (sorted(a), sorted(b))
    for k in a:
        assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape, k
        assert a[k].tobytes() == b[k].tobytes(), k
    saved = vc.read_metadata(dst).metadata
    assert {k: v for k, v in saved.items()
            if not k.startswith("torch.optim.")} == meta.metadata
    print(f"rank {r}: resharded {len(a)} tensors of step {info.step}: "
          "bit-identical", flush=True)


def _world():
    return int(os.environ.get("OMPI_COMM_WORLD_SIZE",
                              os.environ.get("WORLD_SIZE", "1")))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
