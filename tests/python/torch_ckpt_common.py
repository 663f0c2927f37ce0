"""What the torch checkpoint tests share: the serial model and its training
(the reference every rank recomputes: one thread, so bit-identical in every
process), and an FSDP/HSDP rank's state as the flat-shard contract of
vemesh.torch.checkpoint describes it (units flattened, padded to the shard
count, rank s holding chunk s, AdamW stepping the chunks).
"""
import math
import os

import numpy as np
import torch
from torch import nn

import vemesh
from vemesh.torch import checkpoint as tc

torch.set_num_threads(1)

TIMEOUT = 60.0
SAVED_STEPS = 3
LR, WD = 1e-2, 0.1
# The HSDP checkpoint: two units (layer by layer) sharded 4 ways.
HSDP_UNITS = (("fc1.weight", "fc1.bias"), ("fc2.weight", "fc2.bias"))
# FULL_SHARD on load: one unit of everything (other boundaries, other padding).
FULL_UNITS = (("fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"),)


class Net(nn.Module):
    def __init__(self, hidden=24, dtype=torch.float32):
        super().__init__()
        self.fc1 = nn.Linear(12, hidden, dtype=dtype)
        self.fc2 = nn.Linear(hidden, 10, dtype=dtype)
        self.register_buffer("scale", torch.linspace(0.5, 1.5, 10, dtype=dtype))
        self.register_buffer("scratch", torch.zeros(3), persistent=False)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x))) * self.scale


def batch(step):
    g = torch.Generator().manual_seed(1000 + step)
    return torch.randn(32, 12, generator=g), torch.randn(32, 10, generator=g)


def loss_of(model, step):
    x, y = batch(step)
    return ((model(x) - y) ** 2).mean()


def serial(steps, seed=0):
    """The one-process run: Net and AdamW after `steps` steps."""
    torch.manual_seed(seed)
    model = Net()
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WD)
    for step in range(steps):
        opt.zero_grad()
        loss_of(model, step).backward()
        opt.step()
    return model, opt


def shapes(model):
    return {n: tuple(p.shape) for n, p in model.named_parameters()}


def unit_range(numel, shards, s):
    """[begin, end) of chunk s of a unit of `numel` elements padded to a
    multiple of `shards`."""
    chunk = math.ceil(numel / shards)
    return s * chunk, (s + 1) * chunk


def flat_of(tensors):
    return torch.cat([t.detach().reshape(-1) for t in tensors])


class FlatShards:
    """One rank of FSDP over `units`, `shards` ways, shard index `s`: a flat
    chunk per unit (an nn.Parameter, padded with zeros), an AdamW over the
    chunks, and the vemesh.torch.checkpoint description of them. Built from
    a model's values (and, given `opt`, its AdamW state: what the sharded
    job would hold after the same steps)."""

    def __init__(self, model, units, shards, s, opt=None, lr=LR):
        params = dict(model.named_parameters())
        shp = shapes(model)
        self.units, self.shards, self.s = units, shards, s
        self.chunks, self.description, self.ranges = [], [], []
        for unit in units:
            numel = sum(math.prod(shp[n]) for n in unit)
            begin, end = unit_range(numel, shards, s)
            self.ranges.append((begin, end))
            flat = self._pad(flat_of([params[n] for n in unit]), end)
            chunk = nn.Parameter(flat[begin:end].clone())
            self.chunks.append(chunk)
            self.description.append(tc.ParamShard(
                chunk, tc.flat_pieces([(n, shp[n]) for n in unit], begin, end)))
        self.opt = torch.optim.AdamW(self.chunks, lr=lr, weight_decay=WD)
        if opt is not None:
            for unit, chunk, (begin, end) in zip(units, self.chunks,
                                                 self.ranges):
                ps = [params[n] for n in unit]
                st = {"step": torch.tensor(float(opt.state[ps[0]]["step"]))}
                for key in ("exp_avg", "exp_avg_sq"):
                    full = self._pad(flat_of([opt.state[p][key] for p in ps]),
                                     end)
                    st[key] = full[begin:end].clone()
                self.opt.state[chunk] = st

    @staticmethod
    def _pad(flat, end):
        if flat.numel() >= end:
            return flat
        return torch.cat([flat, flat.new_zeros(end - flat.numel())])

    def step(self, model_for_grads, step):
        """One FSDP step with the gradients of the full model (every rank
        computes the full batch: the average over ranks is that)."""
        model_for_grads.zero_grad()
        loss_of(model_for_grads, step).backward()
        params = dict(model_for_grads.named_parameters())
        for unit, chunk, (begin, end) in zip(self.units, self.chunks,
                                             self.ranges):
            g = self._pad(flat_of([params[n].grad for n in unit]), end)
            chunk.grad = g[begin:end].clone()
        self.opt.step()

    def full_model(self, group):
        """A Net whose parameters are the all-gathered chunks (over `group`,
        whose rank order is the shard order)."""
        model = Net()
        params = dict(model.named_parameters())
        shp = shapes(model)
        for unit, chunk in zip(self.units, self.chunks):
            out = torch.empty(chunk.numel() * group.size())
            group.all_gather(out, chunk.detach())
            at = 0
            with torch.no_grad():
                for n in unit:
                    k = math.prod(shp[n])
                    params[n].copy_(out[at:at + k].view(shp[n]))
                    at += k
        return model


def bits(t):
    """A tensor's bytes, for bit-identical comparisons."""
    return t.detach().contiguous().numpy().tobytes()


def assert_same_bits(got, want, what):
    assert bits(got) == bits(want), f"{what}: {got} != {want}"


def assert_chunks_equal(a: FlatShards, b: FlatShards):
    for i, (x, y) in enumerate(zip(a.chunks, b.chunks)):
        assert_same_bits(x, y, f"unit {i} values")
        sx, sy = a.opt.state[x], b.opt.state[y]
        assert float(sx["step"]) == float(sy["step"]), f"unit {i} step"
        for key in ("exp_avg", "exp_avg_sq"):
            assert_same_bits(sx[key], sy[key], f"unit {i} {key}")


def assert_models_equal(m, o, want_m, want_o):
    for (n, p), (_, q) in zip(m.named_parameters(), want_m.named_parameters()):
        assert_same_bits(p, q, n)
        sp, sq = o.state[p], want_o.state[q]
        assert float(sp["step"]) == float(sq["step"]), f"{n} step"
        for key in ("exp_avg", "exp_avg_sq"):
            assert_same_bits(sp[key], sq[key], f"{n} {key}")
    for (n, b), (_, c) in zip(m.named_buffers(), want_m.named_buffers()):
        assert_same_bits(b, c, n)


def shared_dir(group, base):
    """A fresh directory under `base` that every rank of `group` names the
    same (rank 0 makes it)."""
    import tempfile
    buf = np.zeros(512, np.uint8)
    if group.rank() == 0:
        os.makedirs(base, exist_ok=True)
        path = tempfile.mkdtemp(prefix="work-", dir=base).encode()
        buf[:len(path)] = np.frombuffer(path, np.uint8)
    group.broadcast(buf, src=0)
    return bytes(buf[buf != 0]).decode()


def ckpt_base():
    base = os.environ.get("VEMESH_CKPT_DIR")
    if not base:
        raise RuntimeError("VEMESH_CKPT_DIR is not set (tests/python/CMakeLists.txt sets it)")
    return base
