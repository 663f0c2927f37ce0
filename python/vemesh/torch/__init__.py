"""vemesh.torch: train ``torch.nn.Module``s on vemesh groups.

PyTorch's and veScale's names over vemesh communicators: mesh groups as torch
ProcessGroups (so ``torch.distributed`` calls and torch's DDP run on them),
FullyShardedDataParallel with PyTorch's sharding strategies, veScale's DDP and
DistributedOptimizer, Megatron-style tensor-parallel layers and checkpoints of
torch state dicts. Importing it imports torch; ``import vemesh`` alone does not.
See docs/TORCH.md.
"""

from . import checkpoint  # noqa: F401,E402  (torch state dicts in vemesh checkpoints)
# veScale's DDP, DistributedOptimizer and Megatron-style tensor parallelism.
from .ddp import DDP, DistributedDataParallel, GradBuffer  # noqa: E402,F401
from .optimizer import DistributedOptimizer, ShardedState  # noqa: E402,F401
from .parallelize import Partial, Replicate, Shard, parallelize_module  # noqa: E402,F401
from .tensor_parallel import (  # noqa: E402,F401
    ColumnParallelLinear, RowParallelLinear, copy_to_tensor_parallel_region,
    gather_from_tensor_parallel_region, reduce_from_tensor_parallel_region,
    scatter_to_tensor_parallel_region)
from .fsdp import (FullyShardedDataParallel, ShardingStrategy,  # noqa: F401
                   StateDictType)
from . import elastic  # noqa: F401,E402  (torch state and gradients on the elastic mesh)
from .work import Work  # noqa: E402,F401
from .process_group import (  # noqa: E402,F401
    BACKEND, ProcessGroupVemesh, as_process_group)
from . import backend  # noqa: E402,F401  (registers "vemesh" with torch)
