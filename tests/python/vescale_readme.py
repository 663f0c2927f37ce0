"""veScale's README flow on vemesh: its snippet with only the imports changed.

The snippet is veScale's "How to use VeDeviceMesh?" (vescale/devicemesh_api/
README.md): a model, VESCALE_DEVICE_MESH on (DP=2, TP=2), parallelize_module
over "TP", DDP over "DP", DistributedOptimizer(torch.optim.Adam), the
training loop. Changed: the imports; "cuda" is "cpu" (this runs on host
memory); the snippet's `...` are filled with the values of veScale's own
optimizer README (use_distributed_optimizer=True, optimizer_kwargs={"lr":
0.01}). What the snippet takes as given is defined above it: the model is
veScale's DModule README MLP (fc1 4->8, ReLU, fc2 8->4) returning its loss,
with that README's sharding plan (fc1 column-, fc2 row-parallel), and
data_set yields this DP rank's half of each global batch.

After the snippet every rank checks its shards against one process
training the same MLP on the whole batches with torch.optim.Adam.

  torchrun --standalone --nproc_per_node=4 --redirects 1 --tee 1 vescale_readme.py
  mpirun -n 4 python3 vescale_readme.py
(tests/python/mp_vescale.py runs main() in its pytest session too.)
"""
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

# veScale's imports:
#   from vescale.devicemesh_api import VESCALE_DEVICE_MESH
#   from vescale.dmodule.api import parallelize_module
#   from vescale.ddp.distributed_data_parallel import DistributedDataParallel as DDP
#   from vescale.optim.distributed_optimizer import DistributedOptimizer
#   from vescale.dtensor.placement_types import Replicate, Shard
from vemesh import VESCALE_DEVICE_MESH
from vemesh.torch import parallelize_module
from vemesh.torch import DDP
from vemesh.torch import DistributedOptimizer
from vemesh.torch import Replicate, Shard

STEPS, GLOBAL_BATCH = 4, 8


class MLP(nn.Module):
    """veScale's DModule README MLP; forward(X, Y) gives the loss."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(4, 8)
        self.relu = nn.ReLU()
        self.fc2 = nn.Linear(8, 4)

    def forward(self, x, y):
        return F.mse_loss(self.fc2(self.relu(self.fc1(x))), y)


GPT = MLP
sharding_plan = {  # veScale's DModule README plan for this MLP
    "parameter": {
        "fc1.weight": [Shard(0)],
        "fc1.bias": [Shard(0)],
        "fc2.weight": [Shard(1)],
        "fc2.bias": [Replicate()],
    },
    "forward": {
        "fc1.input": [[Replicate()]],
        "fc2.output": [[Replicate()]],
    },
}


def global_batches():
    g = torch.Generator().manual_seed(1234)
    return [(torch.randn(GLOBAL_BATCH, 4, generator=g),
             torch.randn(GLOBAL_BATCH, 4, generator=g)) for _ in range(STEPS)]


class DataSet:
    """This DP rank's half of each global batch (read when iterated: the
    mesh exists by then)."""

    def __iter__(self):
        dp = VESCALE_DEVICE_MESH.get_data_parallel_rank()
        n = GLOBAL_BATCH // VESCALE_DEVICE_MESH.get_strategy_size("DP")
        for x, y in global_batches():
            yield x[dp * n:(dp + 1) * n], y[dp * n:(dp + 1) * n]


data_set = DataSet()


def main():
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)  # a tight comparison below
    try:
        torch.manual_seed(0)
        model = run_snippet()
        check_against_one_process(model)
    finally:
        torch.set_default_dtype(previous)


def run_snippet():
    # ---- veScale's snippet (vescale/devicemesh_api/README.md) ----
    # create torch-native model as usual
    model = GPT()

    # initialize a VeDeviceMesh containing a global DeviceMesh with size of (2, 2)
    VESCALE_DEVICE_MESH.init_device_mesh("cpu", mesh_shape=(2, 2), mesh_dim_names=("DP", "TP"))

    # use VeDeviceMesh to obtain global DeviceMesh's tensor parallelism view
    if VESCALE_DEVICE_MESH.get_strategy_size("TP") > 1:
        # wrap DModule (TP/SP)
        model = parallelize_module(model, VESCALE_DEVICE_MESH["TP"], sharding_plan)

    # use VeDeviceMesh to obtain global DeviceMesh's data parallelism view
    if VESCALE_DEVICE_MESH.get_strategy_size("DP") > 1:
        # wrap DDP module
        model = DDP(model, VESCALE_DEVICE_MESH["DP"], use_distributed_optimizer=True)

    # use VeDeviceMesh to build distributed optimizer
    if VESCALE_DEVICE_MESH.get_strategy_size("DP") > 1:
        optimizer = DistributedOptimizer(torch.optim.Adam, models=[model], optimizer_kwargs={"lr": 0.01})

    # Train model
    for X, Y in data_set:
        optimizer.zero_grad()
        loss = model(X, Y)
        loss.backward()
        optimizer.step()
    # ---- end of the snippet ----
    return model


def check_against_one_process(model):
    torch.manual_seed(0)
    ref = GPT()
    adam = torch.optim.Adam(ref.parameters(), lr=0.01)
    for x, y in global_batches():
        adam.zero_grad()
        ref(x, y).backward()
        adam.step()
    tp = VESCALE_DEVICE_MESH.get_tensor_parallel_rank()
    mlp = model.module
    expected = {
        "fc1.weight": ref.fc1.weight[tp * 4:(tp + 1) * 4],
        "fc1.bias": ref.fc1.bias[tp * 4:(tp + 1) * 4],
        "fc2.weight": ref.fc2.weight[:, tp * 4:(tp + 1) * 4],
        "fc2.bias": ref.fc2.bias,
    }
    for name, want in expected.items():
        got = mlp.get_parameter(name)
        if not torch.allclose(got, want, rtol=1e-10, atol=1e-12):
            raise AssertionError(f"{name} after {STEPS} steps differs from one "
                                 f"process: {got} vs {want}")
    print(f"vescale_readme: global rank {VESCALE_DEVICE_MESH.get_rank()}: "
          f"{STEPS} Adam steps on DP=2 x TP=2 equal one process", flush=True)


if __name__ == "__main__":
    main()
    sys.exit(0)
