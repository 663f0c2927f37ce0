"""vemesh.torch.fsdp on 8 ranks, launched by torchrun or mpirun: every result
equals one process training the same model on the whole batch.

  torchrun --standalone --nproc_per_node=8 --redirects 1 --tee 1 fsdp_mp.py
  mpirun -n 8 python3 fsdp_mp.py

Every rank runs the same pytest session, so the collectives line up test by
test. The one-process reference runs on every rank (the models are small).
"""
import functools
import os
import sys

import pytest
import torch
import torch.nn as nn

import vemesh
from vemesh.torch.fsdp import (BackwardPrefetch, FlatShard, FsdpError,
                               FullStateDictConfig,
                               FullyShardedDataParallel as FSDP,
                               ModuleWrapPolicy, ShardingStrategy,
                               StateDictType, size_based_auto_wrap_policy)

WORLD = 8
TIMEOUT = 60.0  # seconds: a lost rank fails the test instead of hanging it
STEPS = 3
BATCH = 16  # global batch: 2 samples per rank

_MESHES = {}


def mesh(shape):
    """One mesh per shape for the session (meshes are collective to make)."""
    if shape not in _MESHES:
        names = ("replicate", "shard") if len(shape) == 2 else ("dp",)
        _MESHES[shape] = vemesh.init_device_mesh(
            "cpu", shape, mesh_dim_names=names, timeout=TIMEOUT)
    return _MESHES[shape]


def rank():
    return mesh((WORLD,)).get_rank()


class Block(nn.Module):

    def __init__(self, n):
        super().__init__()
        self.fc = nn.Linear(n, n)
        self.act = nn.Tanh()

    def forward(self, x):
        return x + self.act(self.fc(x))


class Net(nn.Module):
    """Units of 11*13+13, 13*13+13 (x2) and 13*13+13+13*3+3 elements: none a
    multiple of 8 (padding), a LayerNorm buffer-free and a tied-free root."""

    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(11, 13)
        self.blocks = nn.Sequential(Block(13), Block(13))
        self.norm = nn.LayerNorm(13)
        self.out = nn.Linear(13, 3)

    def forward(self, x):
        return self.out(self.norm(self.blocks(torch.relu(self.inp(x)))))


def make_model(dtype=torch.float64, seed=0):
    torch.manual_seed(seed)
    return Net().to(dtype)


def batches(dtype=torch.float64, steps=STEPS):
    g = torch.Generator().manual_seed(1234)
    return [(torch.randn(BATCH, 11, generator=g, dtype=dtype),
             torch.randn(BATCH, 3, generator=g, dtype=dtype))
            for _ in range(steps)]


def local(t):
    n = BATCH // WORLD
    return t[rank() * n:(rank() + 1) * n]


def loss_fn(out, y):
    return ((out - y)**2).mean()


def make_optimizer(params):
    return torch.optim.AdamW(params, lr=0.01, weight_decay=0.01)


@functools.lru_cache(maxsize=None)
def serial(dtype=torch.float64, steps=STEPS):
    """One process, whole batch: the parameters after each step."""
    model = make_model(dtype)
    opt = make_optimizer(model.parameters())
    states = []
    for x, y in batches(dtype, steps):
        loss_fn(model(x), y).backward()
        opt.step()
        opt.zero_grad()
        states.append({k: v.clone() for k, v in model.state_dict().items()})
    return states


def train(model, dtype=torch.float64, steps=STEPS):
    opt = make_optimizer(model.parameters())
    for x, y in batches(dtype, steps):
        loss_fn(model(local(x)), local(y)).backward()
        opt.step()
        opt.zero_grad()
    return opt


def full_state(model):
    with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT):
        return model.state_dict()


def assert_close(got, want, rtol=1e-10, atol=1e-12):
    assert list(got) == list(want)
    for k in want:
        torch.testing.assert_close(got[k], want[k], rtol=rtol, atol=atol,
                                   msg=lambda m, k=k: f"{k}: {m}")


def wrap(shape, strategy, **kw):
    kw.setdefault("auto_wrap_policy", ModuleWrapPolicy({Block}))
    return FSDP(make_model(kw.pop("dtype", torch.float64)),
                device_mesh=mesh(shape), sharding_strategy=strategy, **kw)


# -- each strategy on (1, 8), (2, 4), (4, 2) with AdamW == one process -------

SHAPES = [(1, 8), (2, 4), (4, 2)]
STRATEGIES = [ShardingStrategy.FULL_SHARD, ShardingStrategy.SHARD_GRAD_OP,
              ShardingStrategy.HYBRID_SHARD, ShardingStrategy.NO_SHARD]
_RESULTS = {}


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("strategy", STRATEGIES, ids=lambda s: s.name)
def test_training_equals_one_process(shape, strategy):
    model = wrap(shape, strategy)
    opt = train(model)
    got = full_state(model)
    assert_close(got, serial()[-1])
    _RESULTS[(shape, strategy)] = got
    # The optimizer holds state for this rank's shards only.
    shards = {ShardingStrategy.NO_SHARD: 1,
              ShardingStrategy.HYBRID_SHARD: shape[1]}.get(strategy, WORLD)
    assert sorted(p.numel() for p in model.parameters()) == sorted(
        -(-u.numel // shards) for u in model._fsdp.units)
    for p in model.parameters():
        assert opt.state[p]["exp_avg"].shape == p.shape


def test_full_shard_and_shard_grad_op_are_bit_identical():
    # Same shards, same reductions: only when the gathers happen differs.
    for shape in SHAPES:
        a = _RESULTS[(shape, ShardingStrategy.FULL_SHARD)]
        b = _RESULTS[(shape, ShardingStrategy.SHARD_GRAD_OP)]
        for k in a:
            assert torch.equal(a[k], b[k]), (shape, k)


def test_one_dimensional_mesh_and_size_policy():
    policy = functools.partial(size_based_auto_wrap_policy, min_num_params=160)
    for strategy in (ShardingStrategy.FULL_SHARD, ShardingStrategy.NO_SHARD):
        model = wrap((WORLD,), strategy, auto_wrap_policy=policy)
        assert len(model._fsdp.units) == 3  # each Block.fc, then the rest
        train(model)
        assert_close(full_state(model), serial()[-1])


def test_float32_training_equals_one_process():
    model = wrap((2, 4), ShardingStrategy.HYBRID_SHARD, dtype=torch.float32)
    train(model, torch.float32)
    assert_close(full_state(model), serial(torch.float32)[-1], rtol=1e-5,
                 atol=1e-6)


def test_no_units_and_each_prefetch():
    for kw in ({"auto_wrap_policy": None},
               {"forward_prefetch": True, "backward_prefetch": None},
               {"backward_prefetch": BackwardPrefetch.BACKWARD_POST}):
        model = wrap((1, 8), ShardingStrategy.FULL_SHARD, **kw)
        train(model)
        assert_close(full_state(model), serial()[-1])


def test_gradient_accumulation_over_two_backwards():
    # Two half batches, losses halved, one step: the whole batch's step.
    model = wrap((2, 4), ShardingStrategy.FULL_SHARD)
    opt = make_optimizer(model.parameters())
    for x, y in batches():
        for half in (slice(0, 1), slice(1, 2)):
            (loss_fn(model(local(x)[half]), local(y)[half]) / 2).backward()
        opt.step()
        opt.zero_grad()
    assert_close(full_state(model), serial()[-1])


class Tied(nn.Module):
    """An embedding and an output layer sharing one weight."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(10, 6)
        self.hidden = Block(6)
        self.head = nn.Linear(6, 10, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, ids):
        return self.head(self.hidden(self.emb(ids)))


def test_tied_weights_and_a_torch_1_13_style_policy():
    def policy(module, recurse, unwrapped_params):  # torch 1.13's spelling
        return recurse or isinstance(module, Block)

    def run(model, ids, tgt):
        opt = make_optimizer(model.parameters())
        for _ in range(STEPS):
            nn.functional.cross_entropy(model(ids), tgt).backward()
            opt.step()
            opt.zero_grad()

    g = torch.Generator().manual_seed(5)
    ids = torch.randint(0, 10, (BATCH,), generator=g)
    tgt = torch.randint(0, 10, (BATCH,), generator=g)
    torch.manual_seed(0)
    ref = Tied().double()
    run(ref, ids, tgt)
    torch.manual_seed(0)
    model = FSDP(Tied().double(), device_mesh=mesh((4, 2)),
                 sharding_strategy=ShardingStrategy.HYBRID_SHARD,
                 auto_wrap_policy=policy)
    assert len(model._fsdp.units) == 2
    run(model, local(ids), local(tgt))
    got = full_state(model)
    assert torch.equal(got["emb.weight"], got["head.weight"])
    assert_close(got, ref.state_dict())


def test_process_group_communicators():
    m = mesh((2, 4))
    model = FSDP(make_model(), process_group=m.flatten().get_group(),
                 auto_wrap_policy=ModuleWrapPolicy({Block}))
    train(model)
    assert_close(full_state(model), serial()[-1])
    model = FSDP(make_model(), process_group=(m.get_group(1), m.get_group(0)),
                 sharding_strategy=ShardingStrategy.HYBRID_SHARD)
    train(model)
    assert_close(full_state(model), serial()[-1])


def test_full_shard_frees_parameters_between_units():
    model = wrap((1, 8), ShardingStrategy.FULL_SHARD)
    x, y = batches()[0]
    loss = loss_fn(model(local(x)), local(y))
    blocks = model.module.blocks
    # After forward: the Blocks' storage freed, attributes are placeholders.
    assert blocks[0].fc.weight.numel() == 0
    loss.backward()
    usage = model.memory_usage()
    assert usage["gathered"] == 0 and usage["peak_gathered"] > 0
    assert all(p.grad is not None for p in model.parameters())


def test_eval_forward_under_no_grad_equals_one_process():
    model = wrap((2, 4), ShardingStrategy.SHARD_GRAD_OP)
    ref = make_model()
    x, _ = batches()[0]
    with torch.no_grad():
        got = model(local(x))
    torch.testing.assert_close(got, local(ref(x)), rtol=1e-12, atol=1e-14)
    assert model.memory_usage()["gathered"] == 0


def test_clip_grad_norm_equals_one_process():
    model = wrap((2, 4), ShardingStrategy.HYBRID_SHARD)
    ref = make_model()
    x, y = batches()[0]
    loss_fn(model(local(x)), local(y)).backward()
    loss_fn(ref(x), y).backward()
    want = torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.05)
    got = model.clip_grad_norm_(0.05)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=0)
    torch.optim.SGD(model.parameters(), lr=0.1).step()
    torch.optim.SGD(ref.parameters(), lr=0.1).step()
    assert_close(full_state(model), ref.state_dict())


def test_summon_full_params():
    model = wrap((4, 2), ShardingStrategy.FULL_SHARD)
    with FSDP.summon_full_params(model):
        inside = model.state_dict()
        w = model.module.blocks[1].fc.weight
        assert torch.equal(w, make_model().blocks[1].fc.weight)
        with torch.no_grad():  # a Parameter, as in PyTorch
            w.mul_(2)  # written back on exit
        # PyTorch's names and whole parameters, as torch's FSDP yields them
        # inside the context (its _flat_param is unregistered meanwhile).
        names = [n for n, _ in model.named_parameters()]
        assert names == [n for n, _ in make_model().named_parameters()], names
        assert dict(model.named_parameters())["blocks.1.fc.weight"] is w
        with FSDP.summon_full_params(model):  # nested: nothing more to do
            assert dict(model.named_parameters())["blocks.1.fc.weight"] is w
    # Outside, parameters() is the shards again: what the optimizer steps.
    assert all(n.endswith("_flat_param") for n, _ in model.named_parameters())
    want = make_model().state_dict()
    want["blocks.1.fc.weight"] *= 2
    assert_close(full_state(model), want, rtol=0, atol=0)
    # A state dict taken inside is a copy that outlives the context.
    assert_close(inside, make_model().state_dict(), rtol=0, atol=0)


def test_summon_full_params_undone_when_the_body_raises():
    model = wrap((2, 4), ShardingStrategy.HYBRID_SHARD)
    try:
        with FSDP.summon_full_params(model):
            raise KeyError("the user's own error")
    except KeyError:
        pass
    assert all(n.endswith("_flat_param") for n, _ in model.named_parameters())
    with FSDP.summon_full_params(model):  # usable again
        names = [n for n, _ in model.named_parameters()]
    assert names == [n for n, _ in make_model().named_parameters()]
    train(model)
    assert_close(full_state(model), serial()[-1])


# -- state dicts --------------------------------------------------------------


def test_full_state_dict_round_trip_onto_another_mesh_and_strategy():
    model = wrap((2, 4), ShardingStrategy.HYBRID_SHARD)
    train(model)
    sd = full_state(model)
    assert list(sd) == list(make_model().state_dict())  # the original names
    other = FSDP(make_model(seed=7), device_mesh=mesh((1, 8)))  # FULL_SHARD
    other.load_state_dict(sd)
    assert_close(full_state(other), sd, rtol=0, atol=0)  # bit-identical
    with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT,
                              FullStateDictConfig(rank0_only=True)):
        only = model.state_dict()
    assert (len(only) > 0) == (rank() == 0)


def test_sharded_state_dict_round_trip():
    model = wrap((2, 4), ShardingStrategy.HYBRID_SHARD)
    train(model)
    with FSDP.state_dict_type(model, StateDictType.SHARDED_STATE_DICT):
        sd = model.state_dict()
    assert all(isinstance(v, FlatShard) for v in sd.values())
    # Every element of every parameter is on exactly one shard rank.
    counts = torch.tensor([v.tensor.numel() for v in sd.values()],
                          dtype=torch.int64)
    mesh((2, 4)).get_group(1).all_reduce(counts)
    assert counts.tolist() == [v.numel() for v in serial()[-1].values()]
    fresh = wrap((2, 4), ShardingStrategy.HYBRID_SHARD)
    with FSDP.state_dict_type(fresh, StateDictType.SHARDED_STATE_DICT):
        fresh.load_state_dict(sd)
    assert_close(full_state(fresh), full_state(model), rtol=0, atol=0)
    # A sharded dict is for the same layout: onto another it is refused.
    other = wrap((4, 2), ShardingStrategy.HYBRID_SHARD)
    with FSDP.state_dict_type(other, StateDictType.SHARDED_STATE_DICT):
        with pytest.raises(FsdpError, match="saved on another mesh"):
            other.load_state_dict(sd)


def optim_state(model, opt, kind):
    with FSDP.state_dict_type(model, kind):
        return FSDP.optim_state_dict(model, opt)


def assert_same_optim_state(a, b):
    assert a["param_groups"] == b["param_groups"]
    assert list(a["state"]) == list(b["state"])
    for name, entry in a["state"].items():
        for key, v in entry.items():
            w = b["state"][name][key]
            if isinstance(v, FlatShard):
                assert (v.offset, v.global_shape) == (w.offset, w.global_shape)
                v, w = v.tensor, w.tensor
            assert torch.equal(v, w), (name, key)


def test_optimizer_state_onto_another_mesh_and_strategy():
    # Two steps on (2, 4) HSDP, saved by name; loaded onto FULL_SHARD on
    # (1, 8), bit-identical; one more step each equals three in one process.
    model = wrap((2, 4), ShardingStrategy.HYBRID_SHARD)
    opt = train(model, steps=2)
    sd, osd = full_state(model), optim_state(
        model, opt, StateDictType.FULL_STATE_DICT)
    assert sorted(osd["state"]) == sorted(make_model().state_dict())
    assert osd["state"]["out.weight"]["exp_avg"].shape == (3, 13)
    other = FSDP(make_model(seed=9), device_mesh=mesh((1, 8)),
                 auto_wrap_policy=ModuleWrapPolicy({Block}))
    other.load_state_dict(sd)
    other_opt = make_optimizer(other.parameters())
    other_opt.load_state_dict(
        FSDP.optim_state_dict_to_load(other, other_opt, osd))
    assert_same_optim_state(
        optim_state(other, other_opt, StateDictType.FULL_STATE_DICT), osd)
    x, y = batches()[2]
    for m, o in ((model, opt), (other, other_opt)):
        loss_fn(m(local(x)), local(y)).backward()
        o.step()
        o.zero_grad()
        assert_close(full_state(m), serial()[-1])


def test_sharded_optimizer_state_round_trip():
    model = wrap((4, 2), ShardingStrategy.FULL_SHARD)
    opt = train(model, steps=2)
    osd = optim_state(model, opt, StateDictType.SHARDED_STATE_DICT)
    fresh = wrap((4, 2), ShardingStrategy.FULL_SHARD)
    fresh_opt = make_optimizer(fresh.parameters())
    with FSDP.state_dict_type(fresh, StateDictType.SHARDED_STATE_DICT):
        fresh_opt.load_state_dict(
            FSDP.optim_state_dict_to_load(fresh, fresh_opt, osd))
    assert_same_optim_state(
        optim_state(fresh, fresh_opt, StateDictType.SHARDED_STATE_DICT), osd)


def test_flat_shards_describe_the_sharded_state_dict():
    model = wrap((2, 4), ShardingStrategy.HYBRID_SHARD)
    with FSDP.state_dict_type(model, StateDictType.SHARDED_STATE_DICT):
        sd = model.state_dict()
    for s in model.flat_shards():
        assert s.tensor.numel() == s.end - s.begin
        assert s.replica == mesh((2, 4)).get_local_rank("replicate")
        at = 0
        for name, shape in s.params:  # each piece where the dict says
            n = torch.Size(shape).numel()
            lo, hi = max(s.begin, at), min(s.end, at + n)
            piece = sd[name]
            assert piece.global_shape == shape
            assert piece.tensor.numel() == max(hi - lo, 0)
            if hi > lo:
                assert piece.offset == lo - at
                assert torch.equal(piece.tensor,
                                   s.tensor.detach()[lo - s.begin:hi - s.begin])
            at += n


def test_vemesh_checkpoint_of_hsdp_loads_on_full_shard_and_one_process(
        tmp_path_factory):
    """Issue 41: a (2, 4) HSDP job's model and AdamW state saved with
    vemesh.torch.checkpoint (FSDP describes its own shards) load on
    FULL_SHARD over 8 ranks and into a plain model on every rank,
    bit-identical; one more step from the loaded state equals the HSDP
    job's next step."""
    import vemesh.torch.checkpoint as tc
    model = wrap((2, 4), ShardingStrategy.HYBRID_SHARD)
    opt = train(model)
    # One directory for every rank: rank 0's, broadcast as bytes.
    where = torch.zeros(256, dtype=torch.uint8)
    if rank() == 0:
        path = str(tmp_path_factory.mktemp("hsdp_ckpt")).encode()
        where[:len(path)] = torch.tensor(list(path), dtype=torch.uint8)
    mesh((WORLD,)).get_group("dp").broadcast(where, src=0)
    path = bytes(where[where != 0].tolist()).decode()
    tc.save(model, opt, checkpoint_id=path, process_group=mesh((WORLD,)),
            step=STEPS)
    want = full_state(model)
    other = wrap((WORLD,), ShardingStrategy.FULL_SHARD)
    other_opt = make_optimizer(other.parameters())
    info = tc.load(other, other_opt, checkpoint_id=path,
                   process_group=mesh((WORLD,)))
    assert info.step == STEPS
    got = full_state(other)
    assert list(got) == list(want)
    for k in want:
        assert torch.equal(got[k], want[k]), k
    plain = make_model()
    plain_opt = make_optimizer(plain.parameters())
    tc.load(plain, plain_opt, checkpoint_id=path, process_group=mesh((WORLD,)))
    for k, v in plain.state_dict().items():
        assert torch.equal(v, want[k]), k
    # The moments and step counts came too: the next steps agree.
    x, y = batches(steps=STEPS + 1)[STEPS]
    for m, o in ((model, opt), (other, other_opt)):
        loss_fn(m(local(x)), local(y)).backward()
        o.step()
        o.zero_grad()
    after, other_after = full_state(model), full_state(other)
    for k in after:
        torch.testing.assert_close(other_after[k], after[k], rtol=1e-12,
                                   atol=0)


# -- bad input: a clear exception on every rank, never a hang ------------------


class Wider(Net):

    def __init__(self):
        super().__init__()
        self.out = nn.Linear(13, 4)


def test_a_parameter_of_another_size_on_one_rank():
    model = Wider().double() if rank() == 3 else make_model()
    with pytest.raises(FsdpError, match=r"rank 3 wraps a different model.*"
                       r"out.weight: float\w*\[4, 13\]"):
        FSDP(model, device_mesh=mesh((2, 4)))


def test_a_parameter_of_another_dtype_on_one_rank():
    model = make_model(torch.float32 if rank() == 5 else torch.float64)
    with pytest.raises(FsdpError, match="rank 5 wraps a different model"):
        FSDP(model, device_mesh=mesh((1, 8)),
             sharding_strategy=ShardingStrategy.HYBRID_SHARD)


def test_parameters_of_other_values_on_one_rank():
    # PyTorch would shard a mix of both; the first rank's are broadcast.
    model = make_model(seed=1 if rank() == 2 else 0)
    with pytest.warns(UserWarning, match="parameters of rank 2 differ"):
        model = FSDP(model, device_mesh=mesh((2, 4)),
                     sharding_strategy=ShardingStrategy.HYBRID_SHARD)
    assert_close(full_state(model), make_model().state_dict(), rtol=0, atol=0)
    train(model)
    assert_close(full_state(model), serial()[-1])
    # sync_module_states=True broadcasts them without a word.
    model = FSDP(make_model(seed=rank()), device_mesh=mesh((WORLD,)),
                 sync_module_states=True)
    assert_close(full_state(model), make_model().state_dict(), rtol=0, atol=0)


def test_an_input_of_another_dtype_or_size_on_one_rank():
    model = wrap((2, 4), ShardingStrategy.FULL_SHARD)
    x, y = batches()[0]
    bad = local(x).float() if rank() == 6 else local(x)
    with pytest.raises(FsdpError, match=r"rank 6 passed input\[0\]: float32"):
        model(bad)
    bad = torch.randn(2, 12, dtype=torch.float64) if rank() == 1 else local(x)
    with pytest.raises(FsdpError, match=r"rank 1 passed input\[0\]: "
                       r"float64\[\*, 12\]"):
        model(bad)
    # The model is unharmed: it still trains to the one-process result.
    train(model)
    assert_close(full_state(model), serial()[-1])


def test_unknown_strategy_on_every_rank_and_on_one_rank():
    with pytest.raises(FsdpError, match="sharding_strategy is 'ZERO3'"):
        FSDP(make_model(), device_mesh=mesh((WORLD,)),
             sharding_strategy="ZERO3")
    strategy = "bogus" if rank() == 4 else ShardingStrategy.FULL_SHARD
    with pytest.raises(FsdpError, match="rank 4: sharding_strategy is 'bogus'"):
        FSDP(make_model(), device_mesh=mesh((WORLD,)),
             sharding_strategy=strategy)
    strategy = (ShardingStrategy.NO_SHARD if rank() == 7 else
                ShardingStrategy.FULL_SHARD)
    with pytest.raises(FsdpError, match="rank 7 wraps a different model or "
                       "passed other arguments.*strategy=NO_SHARD"):
        FSDP(make_model(), device_mesh=mesh((WORLD,)),
             sharding_strategy=strategy)


def test_a_policy_that_raises_on_one_rank():
    def policy(module, recurse, nonwrapped_numel):
        if rank() == 3 and isinstance(module, Block):
            raise RuntimeError("no blocks here")
        return recurse or isinstance(module, Block)

    with pytest.raises(FsdpError, match="rank 3: RuntimeError: no blocks"):
        FSDP(make_model(), device_mesh=mesh((2, 4)), auto_wrap_policy=policy)


def test_meshes_fsdp_does_not_take():
    m3 = vemesh.init_device_mesh("cpu", (2, 2, 2), mesh_dim_names=("a", "b",
                                                                   "c"),
                                 timeout=TIMEOUT)
    with pytest.raises(FsdpError, match=r"3 dimensions \(2, 2, 2\)"):
        FSDP(make_model(), device_mesh=m3)
    with pytest.raises(FsdpError, match="HYBRID_SHARD needs a 2-D"):
        FSDP(make_model(), device_mesh=mesh((WORLD,)),
             sharding_strategy=ShardingStrategy.HYBRID_SHARD)
    with pytest.raises(FsdpError, match="expected a vemesh.DeviceMesh"):
        FSDP(make_model(), device_mesh="cpu")


def test_load_state_dict_with_a_tensor_of_another_size_on_one_rank():
    model = wrap((2, 4), ShardingStrategy.HYBRID_SHARD)
    sd = make_model(seed=3).state_dict()
    if rank() == 2:
        sd["blocks.0.fc.bias"] = torch.zeros(14, dtype=torch.float64)
    with pytest.raises(FsdpError, match=r"rank 2: 'blocks.0.fc.bias' is a "
                       r"float64 tensor of shape \[14\]"):
        model.load_state_dict(sd)
    # Nothing was written on any rank.
    assert_close(full_state(model), make_model().state_dict(), rtol=0, atol=0)
    if rank() == 0:
        del sd["out.bias"]
    with pytest.raises(FsdpError, match=r"missing \['out.bias'\]"):
        model.load_state_dict(sd)


if __name__ == "__main__":
    code = pytest.main(["-q", "-p", "no:cacheprovider", "-x", __file__]
                       + sys.argv[1:])
    who = os.environ.get("RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "?"))
    print(f"rank {who}: pytest exit {int(code)}", flush=True)
    sys.exit(int(code))
