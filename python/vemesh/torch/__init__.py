"""vemesh.torch: train ``torch.nn.Module``s on vemesh groups.

PyTorch's and veScale's names over vemesh communicators: mesh groups as torch
ProcessGroups (so ``torch.distributed`` calls and torch's DDP run on them),
FullyShardedDataParallel with PyTorch's sharding strategies, veScale's DDP and
DistributedOptimizer, Megatron-style tensor-parallel layers and checkpoints of
torch state dicts. Importing it imports torch; ``import vemesh`` alone does not.
See docs/TORCH.md.
"""

from . import checkpoint  # noqa: F401,E402  (torch state dicts in vemesh checkpoints)
from . import elastic  # noqa: F401,E402  (torch state and gradients on the elastic mesh)
