"""torch.distributed's "vemesh" backend: ``init_process_group("vemesh")``.

Importing ``vemesh.torch`` registers it (``Backend.register_backend``), so
that under torchrun::

    import torch.distributed as dist
    import vemesh.torch                       # registers "vemesh"

    dist.init_process_group("vemesh")         # env://, as for "gloo"
    dist.all_reduce(t)                        # the default group: vemesh's
    model = DistributedDataParallel(model)    # its world, on vemesh

The default group is a ``ProcessGroupVemesh`` over a 1-D vemesh mesh of the
whole job (``init_device_mesh("cpu", (world_size,))``: Gloo under torchrun),
made through the store torch's rendezvous just made - vemesh's ranks meet
there, so MASTER_PORT stays torch's. torch's rank and world size must be the
launcher's (they are under torchrun). Later meshes (``vemesh.init_device_mesh``,
the registry) share the same launch.

``dist.new_group(ranks)`` on this backend makes a vemesh group of those
ranks from the default group (a Gloo subgroup, connected among the members
only: torch 1.13 calls a backend on the members of a new group alone).
Groups of a mesh's dimensions are ``as_process_group(mesh, "dp")``.
"""

import torch.distributed as dist

import vemesh
from vemesh import _meeting

from .process_group import BACKEND, ProcessGroupVemesh


def _create(options, pg_options=None):
    """torch's creator (extended API): the default group (a vemesh world), or
    a dist.new_group of some of its ranks (called on those ranks only)."""
    rank, size = options.group_rank, options.group_size
    members = list(options.global_ranks_in_group)
    name = options.group_id or "vemesh:world"
    if members:
        world = dist.group.WORLD
        if not isinstance(world, ProcessGroupVemesh):
            raise ValueError(
                f"dist.new_group(ranks={members}, backend='vemesh'): the "
                f"members make their group from a vemesh default group; "
                f"call dist.init_process_group('vemesh') first, or take a "
                f"mesh dimension: vemesh.torch.as_process_group(mesh, 'dp')")
        comm = world.communicator.subgroup(f"torch/new_group/{name}", members)
        return ProcessGroupVemesh(comm, name=name)
    seconds = options.timeout.total_seconds()
    with _meeting.meet_through(options.store, rank, size,
                               "torch.distributed.init_process_group's store"):
        mesh = vemesh.init_device_mesh("cpu", (size,),
                                       timeout=min(seconds, 86400.0))
    comm = mesh.get_group()
    if (comm.rank(), comm.size()) != (rank, size):
        raise RuntimeError(
            f"init_process_group('vemesh'): torch gives rank {rank} of "
            f"{size}, vemesh's launch rank {comm.rank()} of {comm.size()}; "
            f"they must be the launcher's (RANK, WORLD_SIZE)")
    return ProcessGroupVemesh(comm, name=name)


def register():
    """Registers the "vemesh" backend with torch.distributed (once; importing
    vemesh.torch does)."""
    if BACKEND.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(BACKEND, _create, extended_api=True)


register()
