"""The groups one FullyShardedDataParallel instance talks over, and agreement.

``FsdpGroups.from_args`` turns PyTorch's ``device_mesh=`` / ``process_group=``
into a shard group and a replicate group (vemesh communicators, either may be
None for a group of one rank):

=================  ==========================  ================================
strategy           1-D mesh (n,)               2-D mesh (replicate, shard)
=================  ==========================  ================================
FULL_SHARD         shard over n                shard over the flattened mesh
SHARD_GRAD_OP      shard over n                shard over the flattened mesh
HYBRID_SHARD       refused (needs 2-D)         shard over dim 1, replicate
                                               over dim 0
NO_SHARD           replicate over n            replicate over the flattened mesh
=================  ==========================  ================================

``process_group=`` is one communicator (the group of FULL_SHARD /
SHARD_GRAD_OP / NO_SHARD) or, for HYBRID_SHARD, the pair ``(shard_group,
replicate_group)`` in PyTorch's order (intra-node, inter-node). A group of
every rank (the 1-D mesh's, the flattened 2-D mesh's) carries the
per-forward input check (``DigestCheck``).

``exchange`` is how every check that could fail on one rank only fails on
every rank: each rank puts a small JSON record (its error, if any, and a
signature of what it is about to do) in a fixed-size byte slot, and one
all_gather per agreement group gives every rank every record. The agreement
groups are the mesh's dimensions (or the process groups given), the same on
every rank whatever the other arguments say, so the exchange itself cannot
mismatch.
"""

import hashlib
import json

import torch

# One rank's record in an exchange; longer strings are cut (see _encode).
_SLOT_BYTES = 2048
_FIELD_CHARS = 600


def _is_communicator(obj):
    return all(hasattr(obj, m) for m in ("all_gather", "reduce_scatter",
                                         "all_reduce", "size", "rank"))


def _describe(obj):
    return f"{type(obj).__module__}.{type(obj).__qualname__}"


class FsdpError(ValueError):
    """Bad input to FullyShardedDataParallel, raised on every rank alike."""


def agreement_groups(device_mesh, process_group):
    """The communicators every check is agreed over, in mesh order.

    Raises (locally) only for arguments no group can be found in; those are
    the same on every rank of a job that got as far as building a mesh.
    """
    if device_mesh is not None and process_group is not None:
        raise FsdpError(
            "FullyShardedDataParallel: pass device_mesh= or process_group=, "
            "not both")
    if device_mesh is not None:
        if not (hasattr(device_mesh, "get_group") and
                hasattr(device_mesh, "ndim")):
            raise FsdpError(
                f"FullyShardedDataParallel: device_mesh is a "
                f"{_describe(device_mesh)}; expected a vemesh.DeviceMesh "
                f"(vemesh.init_device_mesh)")
        return [device_mesh.get_group(d) for d in range(device_mesh.ndim)]
    if process_group is None:
        raise FsdpError(
            "FullyShardedDataParallel: no group: pass device_mesh= (a "
            "vemesh.DeviceMesh from vemesh.init_device_mesh) or "
            "process_group= (a vemesh Communicator, or for HYBRID_SHARD the "
            "pair (shard_group, replicate_group))")
    groups = (list(process_group) if isinstance(process_group, (tuple, list))
              else [process_group])
    for g in groups:
        if not _is_communicator(g):
            raise FsdpError(
                f"FullyShardedDataParallel: process_group holds a "
                f"{_describe(g)}; expected a vemesh Communicator "
                f"(mesh.get_group(dim))")
    return groups[::-1]  # (shard, replicate) -> mesh order (replicate, shard)


def _encode(record):
    """A record as exactly _SLOT_BYTES bytes (uint8 tensor)."""
    record = {k: (v[:_FIELD_CHARS] if isinstance(v, str) else v)
              for k, v in record.items()}
    data = json.dumps(record, ensure_ascii=True,
                      separators=(",", ":")).encode()
    if len(data) > _SLOT_BYTES:  # many escapes: keep the keys, hash the rest
        record = {k: (digest(v) if isinstance(v, str) else v)
                  for k, v in record.items()}
        data = json.dumps(record).encode()
    buf = torch.zeros(_SLOT_BYTES, dtype=torch.uint8)
    buf[:len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    return buf


def _decode(slot):
    raw = bytes(slot.numpy().tobytes()).rstrip(b"\0")
    return json.loads(raw.decode())


def exchange(groups, record):
    """Every rank's record, in mesh (row-major) order: one all_gather of
    a fixed-size slot per group, innermost dimension first."""
    buf = _encode(record)
    for g in reversed(groups):
        out = torch.empty(g.size() * buf.numel(), dtype=torch.uint8)
        g.all_gather(out, buf)
        buf = out
    return [_decode(s) for s in buf.split(_SLOT_BYTES)]


def digest(text):
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


def raise_if_any_failed(records, me, what):
    """Raises FsdpError on every rank if any record carries an error: the
    first failing rank's message, naming that rank (the same text on every
    rank)."""
    for r in records:
        if r.get("err"):
            raise FsdpError(f"{what}: rank {r['rank']}: {r['err']}")


def first_difference(a, b, sep=";"):
    """The first item of two `sep`-joined summaries that differs."""
    xs, ys = a.split(sep), b.split(sep)
    for x, y in zip(xs, ys):
        if x != y:
            return x, y
    if len(xs) != len(ys):
        return (f"{len(xs)} items", f"{len(ys)} items")
    return a, b


class FsdpGroups:
    """The shard and replicate communicators of one FSDP instance.

    ``shard`` is None for a shard group of one rank (NO_SHARD) and
    ``replicate`` None for a replicate group of one; ``world_size`` is the
    number of data-parallel ranks gradients are averaged over.

    ``elastic``: the replicate group is vemesh.elastic's long-lived group,
    whose size follows membership: it is kept even at one member, and
    ``replicate_size`` / ``world_size`` are read from it at every use (the
    average after a shrink or a grow is over the replicas of that step).
    """

    def __init__(self, shard, replicate, agree, world=None, elastic=False):
        self.shard = shard if shard is not None and shard.size() > 1 else None
        self.elastic = bool(elastic)
        self.replicate = (replicate if replicate is not None and
                          (self.elastic or replicate.size() > 1) else None)
        self.agree = agree
        # One group of every rank, when there is one: the per-forward input
        # check gathers its digests there in a single collective.
        self.world = world
        self.shard_size = shard.size() if shard is not None else 1
        self.shard_rank = shard.rank() if shard is not None else 0

    @property
    def replicate_size(self):
        return self.replicate.size() if self.replicate is not None else 1

    @property
    def replicate_rank(self):
        return self.replicate.rank() if self.replicate is not None else 0

    @property
    def world_size(self):
        return self.shard_size * self.replicate_size

    @staticmethod
    def from_args(device_mesh, process_group, strategy, agree, elastic=None):
        """Called after the arguments were agreed: builds the groups
        (flattening the mesh is a collective, the same on every rank).
        ``elastic``: the elastic replicate group (HYBRID_SHARD only): the
        shard group is then the only group of every rank the checks use."""
        from ._api import ShardingStrategy as S
        hybrid = strategy in (S.HYBRID_SHARD, S._HYBRID_SHARD_ZERO2)
        if elastic is not None:
            shard = (device_mesh.get_group(1) if device_mesh is not None
                     else process_group[0])
            return FsdpGroups(shard, elastic, agree, shard, elastic=True)
        if device_mesh is not None:
            whole = (device_mesh.get_group(0) if device_mesh.ndim == 1 else
                     device_mesh.flatten().get_group())
            if hybrid:
                return FsdpGroups(device_mesh.get_group(1),
                                  device_mesh.get_group(0), agree, whole)
        elif hybrid:
            shard, replicate = process_group
            return FsdpGroups(shard, replicate, agree)
        else:
            whole = process_group
        if strategy == S.NO_SHARD:
            return FsdpGroups(None, whole, agree, whole)
        return FsdpGroups(whole, None, agree, whole)


def elastic_replicate(groups):
    """The elastic mesh's long-lived replicate group if it is one of
    ``groups`` (vemesh.elastic), else None."""
    from vemesh import elastic as _elastic
    el = _elastic.get()
    if el is None:
        return None
    replicate = el.get_group(el.replicate_dim)
    return next((g for g in groups if g is replicate), None)


_DIGEST_BYTES = 16


class DigestCheck:
    """Started: every rank's 16-byte digest of `text` being all_gathered
    over `world` (asynchronously); ``same()`` waits and says whether all
    ranks had this rank's."""

    def __init__(self, world, text):
        raw = hashlib.blake2b(text.encode(), digest_size=_DIGEST_BYTES)
        self.mine = torch.frombuffer(bytearray(raw.digest()), dtype=torch.uint8)
        self.out = torch.empty(world.size() * _DIGEST_BYTES, dtype=torch.uint8)
        self.work = world.all_gather(self.out, self.mine, async_op=True)

    def same(self):
        self.work.wait()
        return bool((self.out.view(-1, _DIGEST_BYTES) == self.mine).all())
