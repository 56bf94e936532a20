"""test_zero.py - torch_kaitian.parallel.ZeroOptimizer under `kaitian run -n W`.

The global batch of every step is fixed and split evenly over the ranks, so
the reference is one process training on the whole batch with the same torch
optimizer (the mean over ranks of per-rank means is the global mean). Checked,
for stage 1 (alone, and under DDP with reduce_gradients=False) and stage 2
(overlap on and off): parameters after 20 steps in float64 (<= 1e-10
relative) and float32 (<= 1e-5), with two parameter groups of their own lr and
weight decay, odd parameter counts, a frozen parameter, gradient clipping by
global norm, SGD with momentum and AdamW, a shard group of 2 inside 4 ranks
(the node-local layout), offload; bf16 parameters with fp32 master state (against one process computing each
rank's bf16 gradient and averaging them in fp32: equal up to bf16 rounding of
the parameters, 1e-2); the
optimizer state and the gradients held measure ~1/p of the plain optimizer's. Shares by weight (shard_weights): 1:1:2, 1:3, a rank of
weight 0, "memory", with offload and clipping, stages 1 and 2, over kaitian
and gloo (its fallback), each equal to one process (float64, 1e-10), and the
optimizer state each rank holds counted to the element against its weight.

  check [--backend gloo]       every case above at this world size
  save PATH / load PATH        10 steps then state_dict() to PATH (rank 0
                               writes); a job of another size and stage loads
                               it and runs the other 10: equal to 20 steps of
                               one process (--weights 1,3: shard weights)
  resume KAITIAN_CLI           runs `save` on 4 ranks (stage 2), `load` on 2
                               (stage 1) and on 3 (stage 2); `save` on 2 ranks
                               with weights 1:3, `load` on 2 with equal weights
                               and on 3 with weights 2:0:1, in a temporary dir
"""
import argparse
import os
import subprocess
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.nn as nn

import torch_kaitian  # noqa: F401
from torch_kaitian.parallel import ZeroOptimizer

GLOBAL_BATCH, STEPS = 12, 20  # 12: split evenly over 1, 2, 3, 4 ranks


def fail(msg):
    print(f"FAIL rank {dist.get_rank()}: {msg}", file=sys.stderr, flush=True)
    sys.exit(1)


class Net(nn.Module):
    """Odd parameter counts (7*5+5, 5*3+3, 3*2, a scalar) and a frozen layer."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(7, 5)
        self.b = nn.Linear(5, 3)
        self.frozen = nn.Linear(3, 3)
        self.c = nn.Linear(3, 2, bias=False)
        self.scale = nn.Parameter(torch.tensor(0.9))  # a 0-dimensional parameter
        self.frozen.requires_grad_(False)

    def forward(self, x):
        return self.c(self.frozen(torch.tanh(self.b(torch.tanh(self.a(x)))))) * self.scale


def make(dtype):
    torch.manual_seed(5)
    return Net().to(dtype)


def groups(model, opt_name):
    extra = {"weight_decay": 0.01} if opt_name == "adamw" else {"momentum": 0.9}
    return [{"params": list(model.a.parameters()) + list(model.frozen.parameters()),
             "lr": 0.05, **extra},
            {"params": list(model.b.parameters()) + list(model.c.parameters()) + [model.scale],
             "lr": 0.02}]


OPTS = {"adamw": torch.optim.AdamW, "sgd": torch.optim.SGD}


def batch(step, dtype):
    g = torch.Generator().manual_seed(100 + step)
    x = torch.randn(GLOBAL_BATCH, 7, generator=g).to(dtype)
    y = torch.randn(GLOBAL_BATCH, 2, generator=g).to(dtype)
    return x, y


def mse(out, y):
    if out.dtype in (torch.bfloat16, torch.float16):  # no bf16 mse_loss on the CPU
        out, y = out.float(), y.float()
    return (out - y).square().mean()


def my_part(x, rank, world):
    n = GLOBAL_BATCH // world
    return x[rank * n:(rank + 1) * n]


def reference(dtype, opt_name, clip, steps=STEPS, master=False):
    """One process, the whole batch. master: bf16 parameters with an fp32 master
    copy that the optimizer steps (what ZeroOptimizer does for bf16)."""
    model = make(dtype)
    params = [p for p in model.parameters()]
    if master:
        masters = [p.detach().float().clone().requires_grad_(p.requires_grad) for p in params]
        gm = groups(model, opt_name)
        pos = {id(p): i for i, p in enumerate(params)}
        mgroups = [{**g, "params": [masters[pos[id(p)]] for p in g["params"]]} for g in gm]
        opt = OPTS[opt_name](mgroups)
    else:
        opt = OPTS[opt_name](groups(model, opt_name))
    for s in range(steps):
        x, y = batch(s, dtype)
        model.zero_grad()
        if master:  # each rank's bf16 gradient, averaged in fp32 (what the ranks compute)
            world = dist.get_world_size()
            for m in masters:
                m.grad = None
            for r in range(world):
                model.zero_grad()
                mse(model(my_part(x, r, world)), my_part(y, r, world)).backward()
                for p, m in zip(params, masters):
                    if p.grad is not None:
                        g = p.grad.float() / world
                        m.grad = g if m.grad is None else m.grad + g
        else:
            mse(model(x), y).backward()
        if master:
            if clip:
                torch.nn.utils.clip_grad_norm_([m for m in masters if m.grad is not None], clip)
            opt.step()
            with torch.no_grad():
                for p, m in zip(params, masters):
                    p.copy_(m)
        else:
            if clip:
                torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            opt.step()
    return model, opt


def train_zero(dtype, opt_name, clip, steps=STEPS, start=0, model=None, opt_state=None,
               ddp=False, perturb=False, **zkw):
    rank, world = dist.get_rank(), dist.get_world_size()
    model = model or make(dtype)
    if perturb:  # ranks start from different parameters: ZeroOptimizer takes the first rank's
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.1 * rank)
    net = nn.parallel.DistributedDataParallel(model) if ddp else model
    opt = ZeroOptimizer(groups(model, opt_name), OPTS[opt_name], **zkw)
    if opt_state is not None:
        opt.load_state_dict(opt_state)
    for s in range(start, start + steps):
        x, y = batch(s, dtype)
        opt.zero_grad()
        mse(net(my_part(x, rank, world)), my_part(y, rank, world)).backward()
        if clip:
            opt.clip_grad_norm(clip)
        opt.step()
    return model, opt


def rel(a, b):
    return max(((p.detach().double() - q.detach().double()).abs().max() /
                q.detach().double().abs().max()).item()
               for p, q in zip(a.parameters(), b.parameters()))


def case(name, tol, dtype, opt_name, clip=None, master=False, **zkw):
    ref, _ = reference(dtype, opt_name, clip, master=master)
    got, opt = train_zero(dtype, opt_name, clip, **zkw)
    d = rel(got, ref)
    if not d <= tol:
        fail(f"{name} ({opt!r}): relative difference {d:.3e} > {tol}")
    if not torch.equal(got.frozen.weight, make(dtype).frozen.weight.to(got.frozen.weight.device)):
        fail(f"{name}: the frozen layer changed")
    if dist.get_rank() == 0:
        print(f"  ok {name:<46s} {d:.2e}  {opt!r}", flush=True)


def check_memory():
    """State and gradient bytes of stage 1/2 against the plain optimizer's."""
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    big = nn.Sequential(nn.Linear(256, 512), nn.Linear(512, 256))  # 262 k parameters
    nparam = sum(p.numel() for p in big.parameters())
    plain = torch.optim.AdamW(big.parameters())
    x = torch.randn(4 * world, 256)
    big(x).square().mean().backward()
    plain.step()
    plain_state = sum(t.numel() * t.element_size() for st in plain.state.values()
                      for t in st.values() if torch.is_tensor(t) and t.dim() > 0)
    full_grad = nparam * 4
    out = {}
    for stage in (1, 2):
        m = nn.Sequential(nn.Linear(256, 512), nn.Linear(512, 256))
        opt = ZeroOptimizer(m.parameters(), torch.optim.AdamW, stage=stage, bucket_mb=0.25)
        opt.zero_grad()
        m(my_part(x, rank, world) if False else x[rank * 4:(rank + 1) * 4]).square().mean().backward()
        held = opt.memory_bytes()["grad"] if stage == 2 else None
        opt.step()
        state = opt.memory_bytes()["state"]
        slack = 1 + 0.01 + 64 * world / nparam
        if not state <= plain_state / world * slack:
            fail(f"memory: stage {stage} state {state} B, plain {plain_state} B / {world}")
        if stage == 2:
            # after backward, before step: only this rank's chunks (+ the last bucket
            # in flight at most, already reduced by now)
            if not held <= full_grad / world * slack:
                fail(f"memory: stage 2 holds {held} B of gradients, full {full_grad} B / {world}")
        out[stage] = (state, held)
    if rank == 0:
        print(f"  ok memory: AdamW state {out[1][0]} B (stage 1), {out[2][0]} B (stage 2) against "
              f"{plain_state} B unsharded (1/{world} = {plain_state // world} B); stage 2 holds "
              f"{out[2][1]} B of gradients after backward against {full_grad} B", flush=True)


def check(backend):
    rank, world = dist.get_rank(), dist.get_world_size()
    f64 = torch.float64
    for opt_name in ("adamw", "sgd"):
        for stage in (1, 2):
            case(f"{opt_name} stage {stage} float64", 1e-10, f64, opt_name, stage=stage)
        case(f"{opt_name} stage 2 float32", 1e-5, torch.float32, opt_name, stage=2)
    case("adamw stage 1 under DDP (reduce_gradients=False)", 1e-10, f64, "adamw", stage=1,
         ddp=True, reduce_gradients=False)
    case("adamw stage 2 overlap off", 1e-10, f64, "adamw", stage=2, overlap=False)
    case("adamw stage 2 clip 0.05", 1e-10, f64, "adamw", clip=0.05, stage=2)
    case("sgd stage 1 clip 0.05", 1e-10, f64, "sgd", clip=0.05, stage=1)
    case("adamw stage 2 tiny buckets", 1e-10, f64, "adamw", stage=2, bucket_mb=1e-4)
    case("adamw stage 2 offload", 1e-10, f64, "adamw", stage=2, offload=True)
    case("adamw stage 2 offload, ranks built unequal", 1e-10, f64, "adamw", stage=2, offload=True,
         perturb=True)
    case("sgd stage 1, ranks built unequal", 1e-10, f64, "sgd", stage=1, perturb=True)
    case("adamw stage 2 bf16 params, fp32 master", 1e-2,
         torch.bfloat16, "adamw", master=True, stage=2)
    if world == 4:
        pairs = [dist.new_group([0, 1]), dist.new_group([2, 3])]
        mine = pairs[rank // 2]
        case("adamw stage 2 shard group of 2 in 4", 1e-10, f64, "adamw", stage=2, shard_group=mine)
        case("sgd stage 1 shard group of 2 in 4, clip", 1e-10, f64, "sgd", clip=0.05, stage=1,
             shard_group=mine)
    case("adamw stage 2 shard_group='node'", 1e-10, f64, "adamw", stage=2, shard_group="node")
    check_memory()
    check_weights()
    check_uneven_use()
    check_errors()
    if rank == 0:
        print(f"PASS zero check, {world} ranks over {backend}")


def _weight_cases(world):
    """(name, weights) for this world size."""
    out = []
    if world == 2:
        out.append(("1:3", [1, 3]))
    if world == 3:
        out.append(("1:1:2", [1, 1, 2]))
    if world >= 2:
        out.append(("rank 0 weight 0", [0] + [1] * (world - 1)))
        out.append(("last rank weight 0, others 1:2:...", list(range(1, world)) + [0]))
    return out


def check_weights():
    """Shares by weight: exact against one process; the state held per rank
    is its part, counted to the element."""
    rank, world = dist.get_rank(), dist.get_world_size()
    f64 = torch.float64
    for name, w in _weight_cases(world):
        case(f"adamw stage 2 weights {name}", 1e-10, f64, "adamw", stage=2, shard_weights=w)
        case(f"sgd stage 1 weights {name}, clip", 1e-10, f64, "sgd", clip=0.05, stage=1,
             shard_weights=w)
        case(f"adamw stage 2 weights {name}, offload, clip", 1e-10, f64, "adamw", clip=0.05,
             stage=2, offload=True, shard_weights=w)
        case(f"adamw stage 1 weights {name}, tiny buckets", 1e-10, f64, "adamw", stage=1,
             bucket_mb=1e-4, shard_weights=w)
    case("adamw stage 2 weights 'memory'", 1e-10, f64, "adamw", stage=2, shard_weights="memory")
    # The state held: AdamW keeps two tensors of each master's size.
    for name, w in _weight_cases(world) + [("equal", None)]:
        torch.manual_seed(0)
        m = nn.Sequential(nn.Linear(64, 96), nn.Linear(96, 33)).double()
        n = sum(p.numel() for p in m.parameters())
        opt = ZeroOptimizer(m.parameters(), torch.optim.AdamW, stage=2, shard_weights=w,
                            bucket_mb=0.02)
        opt.zero_grad()
        m(torch.randn(4, 64, dtype=f64)).square().mean().backward()
        opt.step()
        held = sum(t.numel() * t.element_size() for st in opt.inner.state.values()
                   for k, t in st.items() if torch.is_tensor(t) and k != "step")
        mine = sum(b.cnt[rank] for b in opt.buckets)
        want = 2 * 8 * mine
        if held != want:
            fail(f"memory, weights {name}: AdamW state {held} B, expected 2 x 8 x {mine} elements")
        if w is not None:
            for b in opt.buckets:
                exact = b.numel * w[rank] / sum(w)
                if abs(b.cnt[rank] - exact) >= 1 or sum(b.cnt) != b.numel:
                    fail(f"memory, weights {name}: part {b.cnt} of a bucket of {b.numel} "
                         f"elements is not by weight")
            if w[rank] == 0 and held != 0:
                fail(f"memory, weights {name}: a rank of weight 0 holds {held} B of state")
        elif not mine <= -(-n // world) * len(opt.buckets):
            fail(f"memory, equal weights: {mine} elements of {n} on one of {world} ranks")
        parts = [None] * world
        dist.all_gather_object(parts, held)
        if rank == 0:
            print(f"  ok memory, weights {name}: AdamW state per rank {parts} B of {2 * 8 * n}",
                  flush=True)
    # Bad weights: one line naming the rank and what was wrong.
    m = make(f64)
    for w, text in ((["a"] * world, "list of"), ([1] * (world + 1), "weights for a shard group"),
                    ([-1] + [1] * (world - 1), "finite number >= 0"),
                    ([0] * world, "finite number >= 0"), ("disk", "must be None, 'memory'")):
        try:
            ZeroOptimizer(m.parameters(), torch.optim.SGD, lr=0.1, shard_weights=w)
        except ValueError as e:
            if text not in str(e) or f"rank {rank}" not in str(e):
                fail(f"shard_weights={w}: message {e}")
        else:
            fail(f"shard_weights={w} was accepted")
    if world > 1:
        try:
            ZeroOptimizer(m.parameters(), torch.optim.SGD, lr=0.1,
                          shard_weights=[1 + (rank == 0)] + [1] * (world - 1))
        except ValueError as e:
            if "different shard_weights" not in str(e):
                fail(f"ranks giving different weights: message {e}")
        else:
            fail("ranks giving different shard_weights were accepted")


def _uneven_layers():
    torch.manual_seed(1)
    return nn.Linear(4, 4).double(), nn.Linear(4, 4).double(), nn.Linear(4, 1).double()


def _uneven_loss(layers, r, step):
    """Rank r's loss at `step`: every rank the same input (seeded by rank and
    step), rank 0 through layer b too, the others past it."""
    a, b, c = layers
    x = torch.randn(5, 4, dtype=torch.float64,
                    generator=torch.Generator().manual_seed(100 * step + r))
    h = torch.tanh(a(x))
    if r == 0:
        h = torch.tanh(b(h))
    return c(h).square().mean()


def check_uneven_use():
    """Stage 2 with tiny buckets where rank 0 uses a layer the others skip (the
    drain path: buckets of parameters that got no gradient on some rank): the
    ranks end with the parameters of one process that averages every rank's
    gradient, a layer's zero where a rank did not use it (float64, 1e-10)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    layers = _uneven_layers()
    params = [q for m in layers for q in m.parameters()]
    opt = ZeroOptimizer(params, torch.optim.SGD, stage=2, bucket_mb=1e-5, lr=0.1)
    ref_layers = _uneven_layers()
    ref_params = [q for m in ref_layers for q in m.parameters()]
    ref_opt = torch.optim.SGD(ref_params, lr=0.1)
    for step in range(3):
        opt.zero_grad()
        _uneven_loss(layers, rank, step).backward()
        opt.step()
        ref_opt.zero_grad()
        total = [torch.zeros_like(q) for q in ref_params]
        for r in range(world):
            for q in ref_params:
                q.grad = None
            _uneven_loss(ref_layers, r, step).backward()
            for t, q in zip(total, ref_params):
                if q.grad is not None:
                    t += q.grad / world
        for t, q in zip(total, ref_params):
            q.grad = t
        ref_opt.step()
    d = max(((q - p).abs().max() / p.abs().max()).item() for q, p in zip(params, ref_params))
    if not d <= 1e-10:
        fail(f"uneven use: the parameters differ from one process by {d:.3e} after 3 steps")
    if rank == 0:
        print(f"  ok stage 2, a layer used by rank 0 only, {len(opt.buckets)} buckets: {d:.1e} "
              f"from one process", flush=True)


def check_errors():
    m = make(torch.float64)
    for kw, text in (({"stage": 3}, "stage must be 1 or 2"),
                     ({"stage": 2, "reduce_gradients": False}, "stage 2 is the gradient reduction"),
                     ({"shard_group": "host"}, "shard_group must be None, 'node'")):
        try:
            ZeroOptimizer(m.parameters(), torch.optim.SGD, lr=0.1, **kw)
        except ValueError as e:
            if text not in str(e) or f"rank {dist.get_rank()}" not in str(e):
                fail(f"{kw}: message {e}")
        else:
            fail(f"ZeroOptimizer({kw}) was accepted")


def save(path, weights=None):
    model, opt = train_zero(torch.float64, "adamw", 0.05, steps=STEPS // 2, stage=2,
                            shard_weights=weights)
    sd = opt.state_dict()
    if dist.get_rank() == 0:
        torch.save({"model": model.state_dict(), "opt": sd}, path)
    dist.barrier()


def load(path, stage, weights=None):
    ck = torch.load(path)
    model = make(torch.float64)
    model.load_state_dict(ck["model"])
    got, _ = train_zero(torch.float64, "adamw", 0.05, steps=STEPS // 2, start=STEPS // 2,
                        model=model, opt_state=ck["opt"], stage=stage, shard_weights=weights)
    ref, ref_opt = reference(torch.float64, "adamw", 0.05)
    d = rel(got, ref)
    if not d <= 1e-12:
        fail(f"resumed at {dist.get_world_size()} ranks, stage {stage}: difference {d:.3e}")
    # The consolidated state is the plain optimizer's too: it loads and steps it.
    m2 = make(torch.float64)
    m2.load_state_dict(ck["model"])
    plain = torch.optim.AdamW(groups(m2, "adamw"))
    plain.load_state_dict(ck["opt"])
    x, y = batch(STEPS // 2, torch.float64)
    mse(m2(x), y).backward()
    torch.nn.utils.clip_grad_norm_(m2.parameters(), 0.05)
    plain.step()
    # ... to where one process is after the same steps.
    one, _ = reference(torch.float64, "adamw", 0.05, steps=STEPS // 2 + 1)
    dp = rel(m2, one)
    if not dp <= 1e-10:
        fail(f"the consolidated state loaded into torch's AdamW: one step later the parameters "
             f"differ from one process by {dp:.3e}")
    if dist.get_rank() == 0:
        print(f"PASS zero resume from {path}: {dist.get_world_size()} ranks, stage {stage}, "
              f"weights {weights or 'equal'}, "
              f"difference {d:.2e} after {STEPS} steps; torch's AdamW from the consolidated "
              f"state {dp:.2e}", flush=True)


def resume(cli):
    here = os.path.abspath(__file__)
    with tempfile.TemporaryDirectory(prefix="kt-zero-") as tmp:
        path = os.path.join(tmp, "state.pt")
        wpath = os.path.join(tmp, "state13.pt")
        for cmd in ([cli, "run", "-n", "4", here, "save", path],
                    [cli, "run", "-n", "2", here, "load", path, "--stage", "1"],
                    [cli, "run", "-n", "3", here, "load", path, "--stage", "2"],
                    [cli, "run", "-n", "2", here, "save", wpath, "--weights", "1,3"],
                    [cli, "run", "-n", "2", here, "load", wpath, "--stage", "2"],
                    [cli, "run", "-n", "3", here, "load", wpath, "--stage", "1",
                     "--weights", "2,0,1"]):
            r = subprocess.run(cmd, timeout=300)
            if r.returncode != 0:
                sys.exit(f"FAIL: {' '.join(cmd)} exited {r.returncode}")
    print("PASS zero resume: saved at 4 ranks (stage 2), resumed at 2 (stage 1) and 3 (stage 2); "
          "saved at 2 ranks with weights 1:3, resumed at 2 with equal weights and at 3 with 2:0:1")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=["check", "save", "load", "resume"])
    ap.add_argument("arg", nargs="?")
    ap.add_argument("--backend", default="kaitian")
    ap.add_argument("--stage", type=int, default=1)
    ap.add_argument("--weights", type=lambda t: [float(x) for x in t.split(",")], default=None)
    a = ap.parse_args()
    if a.what == "resume":
        return resume(a.arg)
    dist.init_process_group(a.backend)
    if a.what == "check":
        check(a.backend)
    elif a.what == "save":
        save(a.arg, a.weights)
    else:
        load(a.arg, a.stage, a.weights)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    if "gloo" in sys.argv:
        # torch 2.15's gloo aborts a rank now and then at interpreter exit, after
        # the group is destroyed ("terminate called without an active exception"):
        # the test is over, leave without the teardown.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
