"""vemesh.torch.fsdp: FullyShardedDataParallel (FSDP and HSDP) for torch modules.

PyTorch's ``torch.distributed.fsdp`` names over vemesh communicators on CPU
tensors, so a PyTorch script changes only its imports::

    from vemesh import init_device_mesh
    from vemesh.torch.fsdp import FullyShardedDataParallel as FSDP, ShardingStrategy

    mesh_2d = init_device_mesh("cpu", (2, 4), mesh_dim_names=("replicate", "shard"))
    model = FSDP(ToyModel(), device_mesh=mesh_2d,
                 sharding_strategy=ShardingStrategy.HYBRID_SHARD)
    optim = torch.optim.AdamW(model.parameters(), lr=0.01)
    loss_fn(model(x), y).backward(); optim.step(); optim.zero_grad()

Each unit's parameters (``auto_wrap_policy`` picks the units, the wrapped
module is the last) are flattened, padded to a multiple of the shard group
size and sharded; all-gathered before the unit's forward (forward pre-hooks)
and, under FULL_SHARD / HYBRID_SHARD, freed after it and gathered again
before its backward; the unit's gradient is reduce-scattered when its
backward is done, all-reduced over the replicate group under HYBRID_SHARD
and averaged over the data-parallel ranks. ``parameters()`` yields the local
shards: any ``torch.optim`` optimizer trains them. See docs/TORCH.md.

Files: ``_api`` (the module, the enums, state dict types), ``_param_group``
(one unit: flatten, shard, gather, reduce), ``_collectives`` (groups from
the mesh, agreement on every rank), ``_state_dict`` (full and sharded state
dicts), ``wrap`` (auto-wrap policies).
"""

from ._api import (BackwardPrefetch, CPUOffload, FlatParamShard,
                   FullStateDictConfig,
                   FullyShardedDataParallel, ShardedStateDictConfig,
                   ShardingStrategy, StateDictConfig, StateDictType)
from ._collectives import FsdpError
from ._state_dict import FlatShard
from .wrap import (ModuleWrapPolicy, always_wrap_policy,
                   lambda_auto_wrap_policy, size_based_auto_wrap_policy,
                   transformer_auto_wrap_policy)

__all__ = [
    "BackwardPrefetch", "CPUOffload", "FlatParamShard", "FlatShard", "FsdpError",
    "FullStateDictConfig", "FullyShardedDataParallel", "ModuleWrapPolicy",
    "ShardedStateDictConfig", "ShardingStrategy", "StateDictConfig",
    "StateDictType", "always_wrap_policy", "lambda_auto_wrap_policy",
    "size_based_auto_wrap_policy", "transformer_auto_wrap_policy",
]
