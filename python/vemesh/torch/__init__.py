"""vemesh.torch: train ``torch.nn.Module``s on vemesh groups.

PyTorch's and veScale's names over vemesh communicators: mesh groups as torch
ProcessGroups (so ``torch.distributed`` calls and torch's DDP run on them),
FullyShardedDataParallel with PyTorch's sharding strategies, veScale's DDP and
DistributedOptimizer, Megatron-style tensor-parallel layers and checkpoints of
torch state dicts. Importing it imports torch; ``import vemesh`` alone does not.
See docs/TORCH.md.
"""

from .work import Work  # noqa: E402,F401
from .process_group import (  # noqa: E402,F401
    BACKEND, ProcessGroupVemesh, as_process_group)
from . import backend  # noqa: E402,F401  (registers "vemesh" with torch)
