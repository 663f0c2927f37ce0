"""One replica of the elastic torch job that tests/python/elastic_torch.sh runs.

A torch MLP (float64) with AdamW on a (DP_REPLICATE, DP_SHARD) mesh whose
DP_REPLICATE dimension is elastic (vemesh.elastic): each replica is one launch
of 2 ranks (mpirun or torchrun), the replicas meet through a Redis. Every rank
takes its rows of the step's global batch of 12 (12 / (2 * DP_REPLICATE)), the
gradients are summed over DP_SHARD and then over DP_REPLICATE (the replicate
group handed out once, before the loop: the same object in every epoch), and
AdamW steps once the step is committed. The loop is docs/TORCH.md's.

    elastic_torch.py --store redis://127.0.0.1:P --replica K --out DIR [...]
    elastic_torch.py --check DIR --steps N      # the driver's assertions

What it prints, for the driver: "state: epoch E DP=D step S hash H" after
joining and after each recovery (H covers the model, AdamW's state and the
progress), each recovery's record, "step S committed DP=D", and at the end
"PASS: replica K shard R step S DP=D hash H" (its final state in DIR). --check
asserts that every final state is bit-identical and equal to one process
training the same model on the whole batch for the committed steps.
"""

import argparse
import glob
import hashlib
import os
import sys
import time

import numpy as np
import torch

import vemesh
from vemesh import VESCALE_DEVICE_MESH
from vemesh.elastic import decode, encode

FULL = 3          # replicas that start the job
BATCH = 12        # the global batch of every step (any DP_REPLICATE in 1..3)
DIMS = (8, 16, 16, 4)


def build():
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(DIMS[0], DIMS[1]), torch.nn.Tanh(),
        torch.nn.Linear(DIMS[1], DIMS[2]), torch.nn.Tanh(),
        torch.nn.Linear(DIMS[2], DIMS[3])).double()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)
    return model, opt


def batch(step: int):
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(BATCH, DIMS[0], generator=g, dtype=torch.float64)
    y = torch.randn(BATCH, DIMS[-1], generator=g, dtype=torch.float64)
    return x, y


def wrap(mode, el, model, opt):
    """The model the loop trains and its optimizer, by --mode: manual (the
    MLP itself, gradients through all_reduce_gradients), ddp (torch's own
    DistributedDataParallel: vemesh.torch.elastic.ElasticDDP), hsdp (vemesh
    FSDP HYBRID_SHARD over (DP_REPLICATE, DP_SHARD), AdamW on its shards).
    Built once, before sync_state, on founders and joiners alike."""
    if mode == "ddp":
        # A buffer: each forward broadcasts it over the elastic replicate
        # group (ElasticDDP) and the replica's group (torch's DDP), across
        # the shrink and the grow; it is part of the compared state.
        model.register_buffer("scale", torch.ones(1, dtype=torch.float64))
        return vemesh.torch.elastic.ElasticDDP(model, el), opt
    if mode == "hsdp":
        from vemesh.torch.fsdp import FullyShardedDataParallel, ShardingStrategy
        fsdp = FullyShardedDataParallel(
            model, device_mesh=el.mesh,
            sharding_strategy=ShardingStrategy.HYBRID_SHARD)
        return fsdp, torch.optim.AdamW(fsdp.parameters(), lr=1e-2,
                                       weight_decay=0.01)
    return model, opt


def local_state(model, opt):
    """This rank's model and optimizer state, without a collective (an
    FSDP's shards)."""
    if isinstance(model, vemesh.torch.FullyShardedDataParallel):
        return vemesh.torch.elastic.local_state_fns(model)[0](), opt.state_dict()
    return model.state_dict(), opt.state_dict()


def state_hash(model, opt, progress, samples) -> str:
    h = hashlib.sha256()
    for part in (*local_state(model, opt), progress, samples):
        h.update(encode(part))
    return h.hexdigest()[:16]


def final_state(args, model, opt):
    """The whole model and AdamW state (an FSDP's gathered inside the
    replica, the optimizer's keyed as one process's)."""
    if args.mode == "ddp":
        return model.module.state_dict(), opt.state_dict()
    if args.mode != "hsdp":
        return model.state_dict(), opt.state_dict()
    FSDP = vemesh.torch.FullyShardedDataParallel
    full = {k: v.clone() for k, v in model.state_dict().items()}
    osd = FSDP.optim_state_dict(model, opt)
    names = [n for n, _ in build()[0].named_parameters()]
    state = {names.index(n): st for n, st in osd["state"].items()}
    return full, {"state": state}


def run(args) -> int:
    torch.set_num_threads(1)
    opts = vemesh.ElasticOptions(
        store=args.store, replica=args.replica, replica_dim="DP_REPLICATE",
        job=args.job, heartbeat_ttl=1.0, op_timeout=2.0, max_step_retries=2,
        fingerprint_every=args.fingerprint_every)
    vemesh.init_device_mesh("cpu", (FULL, 2),
                            mesh_dim_names=("DP_REPLICATE", "DP_SHARD"),
                            elastic=opts)
    el = VESCALE_DEVICE_MESH.elastic()
    model, opt = wrap(args.mode, el, *build())
    progress = {"step": el.last_recovery.resume_step, "target": args.steps}
    vemesh.torch.elastic.register_state(el, model, opt, progress=progress)
    # The data position as a live buffer: sent from and received into in
    # place (register_state_bytes), not serialised.
    samples = np.zeros(1, dtype=np.int64)
    el.register_state_bytes("samples", lambda: samples)
    shard = el.get_group("DP_SHARD")
    ck = None
    if args.ckpt_dir:
        ck = vemesh.torch.elastic.ElasticCheckpointer(
            el, model, opt, checkpoint_id=args.ckpt_dir, every=args.ckpt_every,
            progress=progress)
        resumed = ck.restore()  # a founder of a relaunched job; None on a joiner
        if resumed is not None:
            samples[0] = BATCH * progress["step"]
            print(f"resumed at step {resumed} from {args.ckpt_dir}", flush=True)
    el.sync_state()  # a joiner receives the model, AdamW and progress here
    replicate = el.get_group("DP_REPLICATE")  # built once: kept across epochs
    me = shard.rank()

    def on_epoch(r):
        # After a (re)grow to the full size, train `extra` more steps (so that
        # a relaunched replica takes part in some); all members see the same
        # record, so all set the same target.
        if r.dp_size == FULL:
            progress["target"] = max(progress["target"], r.resume_step + args.extra)
        assert el.get_group("DP_REPLICATE") is replicate
        assert replicate.size() == r.dp_size, (replicate.size(), r.dp_size)
        assert VESCALE_DEVICE_MESH.get_strategy_size("DP_REPLICATE") == r.dp_size
        print(f"state: epoch {r.epoch} DP={r.dp_size} step {progress['step']} "
              f"shard {me} hash {state_hash(model, opt, progress, samples)}",
              flush=True)

    on_epoch(el.last_recovery)
    while progress["step"] < progress["target"]:
        step = progress["step"]
        error = None
        try:
            x, y = batch(step)
            per = BATCH // (replicate.size() * shard.size())
            lo = (replicate.rank() * shard.size() + shard.rank()) * per
            opt.zero_grad()
            if args.mode == "manual":
                loss = ((model(x[lo:lo + per]) - y[lo:lo + per]) ** 2).sum() / BATCH
                loss.backward()
            else:  # DDP and FSDP average: this rank's mean
                loss = ((model(x[lo:lo + per]) - y[lo:lo + per]) ** 2).sum() / per
                loss.backward()  # raises the step's lost-member error, if any
            if args.bug_at == step and el.replica == args.bug_replica:
                raise RuntimeError(f"injected bug at step {step}")
            if args.mode == "manual":
                # The replica's own group first, the replicate group last.
                vemesh.torch.elastic.all_reduce_gradients(model, [shard, replicate])
        except Exception as e:  # a lost replica, or a bug (retried, then raised)
            error = e
        v = el.end_step(error)
        if v.committed:
            opt.step()
            progress["step"] += 1
            samples += BATCH
            if (progress["step"] == args.corrupt_at and me == 0
                    and el.replica == args.corrupt_replica):
                with torch.no_grad():  # a bit flip's worth of divergence
                    next(model.parameters()).view(-1)[0] += 1e-3
            if replicate.size() < FULL:
                # Shrunk: keep training until the replica is back.
                progress["target"] = max(progress["target"], progress["step"] + 2)
            print(f"step {progress['step']} committed DP={replicate.size()} "
                  f"at={time.time() * 1000:.2f}", flush=True)
        if ck is not None:  # commits the background save in flight
            before = ck.committed_step
            if ck.maybe_save(v):
                print(f"checkpoint: step {progress['step']} started", flush=True)
            if ck.committed_step != before:
                print(f"checkpoint: step {ck.committed_step} committed", flush=True)
        if v.recover:
            r = el.recover(progress["step"])
            print(r, flush=True)
            if r.evicted:
                return 3
            on_epoch(r)
        if args.pace_ms:
            time.sleep(args.pace_ms / 1000.0)
    if ck is not None:
        ck.finish()
    assert samples[0] == BATCH * progress["step"], (samples, progress)
    model_sd, opt_sd = final_state(args, model, opt)
    final = {"model": model_sd, "optimizer": opt_sd,
             "step": progress["step"], "samples": samples}
    path = os.path.join(args.out, f"final_r{args.replica}_s{me}.bin")
    with open(path + ".tmp", "wb") as f:
        f.write(encode(final))
    os.replace(path + ".tmp", path)
    print(f"PASS: replica {args.replica} shard {me} step {progress['step']} "
          f"DP={replicate.size()} hash {state_hash(model, opt, progress, samples)}",
          flush=True)
    return 0


def check(args) -> int:
    """Every final state bit-identical, and equal to one process training on
    the whole batch for the committed steps."""
    files = sorted(glob.glob(os.path.join(args.check, "final_r*_s*.bin")))
    assert len(files) == 2 * FULL, f"expected {2 * FULL} final states, got {files}"
    blobs = {f: open(f, "rb").read() for f in files}
    first = files[0]
    for f in files[1:]:
        assert blobs[f] == blobs[first], \
            f"{os.path.basename(f)} differs from {os.path.basename(first)}"
    got = decode(blobs[first])
    steps = got["step"]
    assert got["samples"][0] == BATCH * steps, (got["samples"], steps)
    assert steps >= args.steps, (steps, args.steps)
    model, opt = build()
    for step in range(steps):
        x, y = batch(step)
        opt.zero_grad()
        (((model(x) - y) ** 2).sum() / BATCH).backward()
        opt.step()
    worst = 0.0
    for name, ref in model.state_dict().items():
        d = (got["model"][name] - ref).abs().max().item()
        worst = max(worst, d)
    ref_state = opt.state_dict()["state"]
    for pid, st in got["optimizer"]["state"].items():
        for key in ("exp_avg", "exp_avg_sq"):
            d = (st[key] - ref_state[pid][key]).abs().max().item()
            worst = max(worst, d)
        assert float(st["step"]) == float(ref_state[pid]["step"]) == steps
    assert worst < 1e-9, f"final state differs from the one-process run by {worst}"
    print(f"PASS: {len(files)} final states bit-identical; equal to one process "
          f"over {steps} committed steps (max |diff| {worst:.2e})")
    return 0


def run_plain(args) -> int:
    """The same job on an ordinary (3, 2) mesh in one launch of 6 ranks, its
    DP_REPLICATE group Gloo as the elastic one is: the baseline of
    bench/RESULTS.md's steady-state step time (no end_step)."""
    torch.set_num_threads(1)
    mesh = vemesh.init_device_mesh("cpu", (FULL, 2),
                                   mesh_dim_names=("DP_REPLICATE", "DP_SHARD"),
                                   backend_override={"DP_REPLICATE": "gloo"})
    model, opt = build()
    if args.mode == "hsdp":  # the same FSDP on the ordinary mesh
        from vemesh.torch.fsdp import FullyShardedDataParallel, ShardingStrategy
        model = FullyShardedDataParallel(
            model, device_mesh=mesh,
            sharding_strategy=ShardingStrategy.HYBRID_SHARD)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)
    elif args.mode != "manual":
        raise SystemExit(f"--plain: --mode {args.mode} has no baseline here")
    shard, replicate = mesh.get_group("DP_SHARD"), mesh.get_group("DP_REPLICATE")
    for step in range(args.steps):
        x, y = batch(step)
        per = BATCH // (replicate.size() * shard.size())
        lo = (replicate.rank() * shard.size() + shard.rank()) * per
        opt.zero_grad()
        if args.mode == "manual":
            (((model(x[lo:lo + per]) - y[lo:lo + per]) ** 2).sum() / BATCH).backward()
            vemesh.torch.elastic.all_reduce_gradients(model, [shard, replicate])
        else:
            (((model(x[lo:lo + per]) - y[lo:lo + per]) ** 2).sum() / per).backward()
        opt.step()
        print(f"step {step + 1} committed DP={replicate.size()} "
              f"at={time.time() * 1000:.2f}", flush=True)
    return 0


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--store")
    p.add_argument("--replica", type=int, default=0)
    p.add_argument("--job", default="elastic_torch")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--extra", type=int, default=10)
    p.add_argument("--pace_ms", type=int, default=0)
    p.add_argument("--out", default=".")
    p.add_argument("--bug_at", type=int, default=-1)
    p.add_argument("--bug_replica", type=int, default=-1)
    p.add_argument("--corrupt_at", type=int, default=-1)
    p.add_argument("--corrupt_replica", type=int, default=-1)
    p.add_argument("--fingerprint_every", type=int, default=0)
    p.add_argument("--ckpt_dir")
    p.add_argument("--ckpt_every", type=int, default=5)
    p.add_argument("--plain", action="store_true")
    p.add_argument("--mode", choices=("manual", "ddp", "hsdp"), default="manual")
    p.add_argument("--check")
    args = p.parse_args()
    if args.check:
        return check(args)
    import vemesh.torch  # noqa: F401  (vemesh.torch.elastic)
    return run_plain(args) if args.plain else run(args)


if __name__ == "__main__":
    sys.exit(main())
