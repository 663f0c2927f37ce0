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
        return registry.get_role_dim_groups(role)
    raise TypeError(
        f"{who}: expected a vemesh.DeviceMesh (such as "
        f"VESCALE_DEVICE_MESH[{role!r}]), a vemesh.Communicator or None "
        f"(VESCALE_DEVICE_MESH's {role} group); got {type(group).__name__}")


def describe_member(comm, group_rank, role):
    """'DP rank 1 (global rank 2)': a member of ``comm`` in messages."""
    return f"{role} rank {group_rank} (global rank {comm.ranks()[group_rank]})"
