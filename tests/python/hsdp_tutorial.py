"""The seeds' HSDP tutorial (PyTorch's DeviceMesh recipe, hsdp.py) on vemesh,
trained a few steps with AdamW and checked against one process.

Only the imports differ from PyTorch's script (and "cuda" is "cpu"):

    -from torch.distributed.device_mesh import init_device_mesh
    -from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, ShardingStrategy
    +from vemesh import init_device_mesh
    +from vemesh.torch.fsdp import FullyShardedDataParallel as FSDP, ShardingStrategy

    torchrun --standalone --nproc_per_node=8 --redirects 1 --tee 1 hsdp_tutorial.py
    mpirun -n 8 python3 hsdp_tutorial.py

Each rank trains on its eighth of a global batch; every rank also trains the
same ToyModel alone on the whole batch and compares the gathered parameters.
The last line is PASS or FAIL (exit code 1).
"""
import sys

import torch
import torch.nn as nn

from vemesh import init_device_mesh
from vemesh.torch.fsdp import FullyShardedDataParallel as FSDP, ShardingStrategy


class ToyModel(nn.Module):
    def __init__(self):
        super(ToyModel, self).__init__()
        self.net1 = nn.Linear(10, 10)
        self.relu = nn.ReLU()
        self.net2 = nn.Linear(10, 5)

    def forward(self, x):
        return self.net2(self.relu(self.net1(x)))


# HSDP: MeshShape(2, 4)
torch.manual_seed(0)
mesh_2d = init_device_mesh("cpu", (2, 4), mesh_dim_names=("replicate", "shard"))
model = FSDP(
    ToyModel(), device_mesh=mesh_2d, sharding_strategy=ShardingStrategy.HYBRID_SHARD
)
optim = torch.optim.AdamW(model.parameters(), lr=0.01)

# -- a few steps, as a PyTorch user trains it ---------------------------------
STEPS, BATCH = 5, 64
rank, world = mesh_2d.get_rank(), mesh_2d.size()
data = torch.Generator().manual_seed(1)
batches = [(torch.randn(BATCH, 10, generator=data),
            torch.randn(BATCH, 5, generator=data)) for _ in range(STEPS)]
mine = slice(rank * BATCH // world, (rank + 1) * BATCH // world)
loss_fn = nn.MSELoss()
for x, y in batches:
    loss = loss_fn(model(x[mine]), y[mine])
    loss.backward()
    optim.step()
    optim.zero_grad()
trained = model.state_dict()  # FULL_STATE_DICT: gathered, original names

# -- the same ToyModel in one process, whole batch ----------------------------
torch.manual_seed(0)
serial = ToyModel()
serial_optim = torch.optim.AdamW(serial.parameters(), lr=0.01)
for x, y in batches:
    loss_fn(serial(x), y).backward()
    serial_optim.step()
    serial_optim.zero_grad()

want = serial.state_dict()
worst = max(((trained[k] - want[k]).abs().max() /
             want[k].abs().max()).item() for k in want)
ok = list(trained) == list(want) and worst <= 1e-5
print(f"rank {rank}: {list(trained)} after {STEPS} AdamW steps on "
      f"{tuple(mesh_2d.shape)}: largest relative difference from one process "
      f"{worst:.2e}", flush=True)
print("PASS" if ok else "FAIL", flush=True)
sys.exit(0 if ok else 1)
