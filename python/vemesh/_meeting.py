"""Where an env:// launch meets when torch.distributed shares the process.

torch.distributed's env:// rendezvous has rank 0 host its TCPStore at
MASTER_ADDR:MASTER_PORT for the life of the job, and so did vemesh's: the two
could not both start in one torchrun job. vemesh now meets through torch's
store when torch is there first, and gives MASTER_PORT back once its ranks
met when it is first (vemesh/bootstrap/launch.h, EnvLaunchPolicy). The
compiled module asks ``meeting_store`` which store, once, when the first
mesh is made; nothing here imports torch.
"""

import contextlib
import sys

# (store, description, rank, world_size) given by ``meet_through`` (the
# "vemesh" torch backend passes the store torch.distributed is initialising).
_explicit = None


@contextlib.contextmanager
def meet_through(store, rank, world_size, description):
    """Within the block, an env:// launch meets through ``store``."""
    global _explicit
    previous, _explicit = _explicit, (store, description, rank, world_size)
    try:
        yield
    finally:
        _explicit = previous


def meeting_store(rank, world_size):
    """None, or ``(store, description)``: a torch store every rank of this
    job reaches, as rank ``rank`` of ``world_size`` (torch's ranks must be
    the launcher's)."""
    if _explicit is not None:
        store, description, r, n = _explicit
        if (r, n) == (rank, world_size):
            return store, description
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return None
    try:
        store = dist.distributed_c10d._get_default_store()
        same = (dist.get_rank(), dist.get_world_size()) == (rank, world_size)
    except (RuntimeError, AttributeError, KeyError):
        return None
    if store is None or not same:  # torch's MPI backend has no store
        return None
    return store, "torch.distributed's default store"
