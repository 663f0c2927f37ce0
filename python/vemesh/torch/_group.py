"""What vemesh.torch accepts where veScale and Megatron take a process group.

A ``vemesh.Communicator`` is used as it is. A ``vemesh.DeviceMesh`` gives the
group of one dimension: its only one when 1-D (``VESCALE_DEVICE_MESH["DP"]``),
else the named ``role`` when the mesh has a dimension of that name, else its
first (veScale's DDP: "by default we treat the first dim of devicemesh as
data-parallel"). ``VESCALE_DEVICE_MESH`` itself gives its group of ``role``.
``None`` means the registry's group of ``role``, so it must be initialised.
"""

import vemesh


def resolve_group(group, role, who):
    """The vemesh.Communicator that ``group`` stands for (see the module)."""
    if isinstance(group, vemesh.Communicator):
        return group
    if isinstance(group, vemesh.DeviceMesh):
        if group.ndim == 1:
            return group.get_group()
        if role in group.mesh_dim_names:
            return group.get_group(role)
        return group.get_group(0)
    if group is None or isinstance(group, vemesh.VeDeviceMesh):
        registry = vemesh.VESCALE_DEVICE_MESH if group is None else group
        if not registry.is_initialized():
            raise ValueError(
                f"{who}: no group given and VESCALE_DEVICE_MESH is not "
                f"initialised; call VESCALE_DEVICE_MESH.init_device_mesh(...) "
                f"(with a {role!r} dimension) first, or pass a "
                f"vemesh.DeviceMesh or vemesh.Communicator")
        try:
            return registry.get_role_dim_groups(role)
        except KeyError as e:
            raise KeyError(f"{who}: no group given, and VESCALE_DEVICE_MESH "
                           f"has no {role} group: {e.args[0]}") from e
    raise TypeError(
        f"{who}: expected a vemesh.DeviceMesh (such as "
        f"VESCALE_DEVICE_MESH[{role!r}]), a vemesh.Communicator or None "
        f"(VESCALE_DEVICE_MESH's {role} group); got {type(group).__name__}")


def comm_device(comm):
    """Where ``comm``'s buffers must live: this process's CUDA device for
    NCCL, host memory for MPI and Gloo."""
    import torch
    if comm.backend == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


class SharedGroup:
    """A communicator held by a module: a copy of the module (copy.deepcopy,
    an EMA model) is in the same group, so copying gives the same one."""

    __slots__ = ("comm",)

    def __init__(self, comm):
        self.comm = comm

    def __deepcopy__(self, memo):
        return self

    def __copy__(self):
        return self
