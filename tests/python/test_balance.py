"""test_balance.py - torch_kaitian.parallel.balance / cut: pipeline stages sized
by speed.

  cut       one process: cut() against brute force on 400 random instances
            (1-4 stages, up to 9 layers, stages of different speeds, memory
            budgets some of which bind): the slowest stage equals the best any
            cut gives, the budgets hold, and among the optimal cuts the most
            even is taken; equal layers on equal stages give the equal cut;
            budgets no cut fits and bad figures raise ValueError.
  slow      3 ranks: 12 equal layers timed by balance() on each rank in turn;
            first unslowed (the equal cut 4:4:4), then rank 2 sharing its CPU
            with a busy process this test starts (pinned to the same CPU): rank
            2 gets the smallest stage.
  exact     4 ranks (data 2 x pipe 2) and 3 ranks (pipe 3): stages of unequal
            layer counts from cut() through Pipeline(StagePlan), 1F1B and GPipe,
            10 SGD steps (gradients averaged over the data group): the
            parameters equal one process training the whole model on the whole
            batch (float64, <= 1e-10 relative).
"""
import argparse
import itertools
import os
import random
import subprocess
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn

import torch_kaitian  # noqa: F401
from torch_kaitian.parallel import (Pipeline, StagePlan, Topology, average_gradients, balance,
                                    cut)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_pipeline import BLOCKS, Block, Chain, data, loss_fn  # noqa: E402


def fail(msg):
    rank = dist.get_rank() if dist.is_initialized() else 0
    print(f"FAIL rank {rank}: {msg}", file=sys.stderr, flush=True)
    sys.exit(1)


# ---- cut against brute force ------------------------------------------------------------------

def brute(times, memory, budgets):
    """Every cut: (best slowest-stage time, least deviation among the optimal)."""
    p, n = len(times), len(times[0])
    best = None
    cuts = []
    for points in itertools.combinations(range(1, n), p - 1):
        b = [0, *points, n]
        bounds = list(zip(b[:-1], b[1:]))
        if memory is not None and any(budgets[s] is not None and
                                      sum(memory[s][x] for x in range(lo, hi)) > budgets[s]
                                      for s, (lo, hi) in enumerate(bounds)):
            continue
        worst = max(sum(times[s][lo:hi]) for s, (lo, hi) in enumerate(bounds))
        dev = sum((hi - lo - n / p) ** 2 for lo, hi in bounds)
        cuts.append((worst, dev, bounds))
        best = worst if best is None else min(best, worst)
    if best is None:
        return None, None
    return best, min(d for w, d, _ in cuts if w <= best * (1 + 1e-12))


def test_cut():
    rng = random.Random(7)
    bound_binds = 0
    for trial in range(400):
        p = rng.randint(1, 4)
        n = rng.randint(p, 9)
        speed = [rng.choice([1.0, 1.0, 2.0, 0.5, 3.0]) for _ in range(p)]
        base = [rng.uniform(0.1, 2.0) for _ in range(n)]
        times = [[b * sp for b in base] for sp in speed]
        memory = budgets = None
        if trial % 2:
            memory = [[rng.uniform(1, 5) for _ in range(n)] for _ in range(p)]
            budgets = [rng.choice([None, rng.uniform(3, 15)]) for _ in range(p)]
        want, want_dev = brute(times, memory, budgets)
        if want is None:
            try:
                cut(times, memory, budgets)
            except ValueError as e:
                if "fits the memory budgets" not in str(e):
                    fail(f"cut trial {trial}: message {e}")
                continue
            fail(f"cut trial {trial}: no cut fits, but cut() returned one")
        bounds, st = cut(times, memory, budgets, tolerance=0.0)
        flat = [x for ab in bounds for x in ab]
        if bounds[0][0] != 0 or bounds[-1][1] != n or any(b <= a for a, b in bounds) or \
                any(bounds[i][1] != bounds[i + 1][0] for i in range(p - 1)):
            fail(f"cut trial {trial}: bounds {bounds} do not cover {n} layers in {p} stages")
        got = max(st)
        if abs(got - want) > 1e-12 * want:
            fail(f"cut trial {trial}: slowest stage {got} against the best {want} ({flat})")
        dev = sum((b - a - n / p) ** 2 for a, b in bounds)
        if abs(dev - want_dev) > 1e-9:
            fail(f"cut trial {trial}: layer counts {[b - a for a, b in bounds]} deviate {dev}, "
                 f"the most even optimal cut {want_dev}")
        if memory is not None:
            for s, (a, b) in enumerate(bounds):
                if budgets[s] is not None and sum(memory[s][a:b]) > budgets[s]:
                    fail(f"cut trial {trial}: stage {s} over its budget")
            unconstrained, _ = brute(times, None, None)
            bound_binds += want > unconstrained * (1 + 1e-9)
    # Equal layers, equal stages: the equal cut, also with noise within the tolerance.
    for p, n in ((2, 8), (3, 12), (4, 8), (3, 9)):
        noisy = [[1.0 + 0.03 * random.Random(s * 100 + i).uniform(-1, 1) for i in range(n)]
                 for s in range(p)]
        bounds, _ = cut(noisy, tolerance=0.10)
        if [b - a for a, b in bounds] != [n // p] * p:
            fail(f"equal layers on {p} equal stages: {bounds}")
    for bad, text in (([[1.0]] * 2, "cannot make"), ([[1.0, -1.0]], "finite"),
                      ([[1.0, 2.0], [1.0]], "a time per layer")):
        try:
            cut(bad)
        except ValueError as e:
            if text not in str(e):
                fail(f"cut({bad}): message {e}")
        else:
            fail(f"cut({bad}) was accepted")
    if bound_binds < 20:
        fail(f"only {bound_binds} instances where a budget changed the answer: the test is weak")
    print(f"PASS cut: 400 random instances against brute force ({bound_binds} where a memory "
          f"budget changed the best cut); equal layers cut equally")


# ---- balance on ranks this test slows -----------------------------------------------------

class Layer(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.lin = nn.Linear(width, width)

    def forward(self, x):
        return torch.tanh(self.lin(x))


def test_slow():
    rank, p = dist.get_rank(), dist.get_world_size()
    if p != 3:
        fail("slow runs on 3 ranks")
    every = [None] * p
    dist.all_gather_object(every, sorted(os.sched_getaffinity(0)))
    allcpus = sorted(set().union(*map(set, every)))
    if len(allcpus) < 2:
        print("SKIP: fewer than 2 CPUs")
        sys.exit(77)
    # Ranks 0 and 1 on the first CPU, rank 2 on the second (they time in turn).
    mine = {allcpus[0]} if rank < 2 else {allcpus[1]}
    os.sched_setaffinity(0, mine)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    layers = [Layer(192) for _ in range(12)]
    sample = torch.randn(64, 192)
    plan = balance(layers, sample, seconds=0.1, device="cpu")
    if plan.sizes != [4, 4, 4]:
        fail(f"unslowed: sizes {plan.sizes} (stage times {plan.stage_times}), expected 4:4:4")
    busy = None
    if rank == 2:
        busy = subprocess.Popen([sys.executable, "-c", "while True: pass"],
                                preexec_fn=lambda: os.sched_setaffinity(0, mine))
        time.sleep(0.3)
    try:
        slowed = balance(layers, sample, seconds=0.1, device="cpu")
    finally:
        if busy is not None:
            busy.kill()
            busy.wait()
    per = [sum(t) / len(t) for t in slowed.layer_times]
    ratio = per[2] / min(per[0], per[1])
    if slowed.sizes[2] >= min(slowed.sizes[:2]):
        fail(f"rank 2 slowed {ratio:.2f}x got {slowed.sizes[2]} layers, the others "
             f"{slowed.sizes[:2]}")
    if not isinstance(slowed, StagePlan) or len(slowed.stage(rank).layers) != slowed.sizes[rank]:
        fail("StagePlan.stage() does not hold this rank's layers")
    if rank == 0:
        print(f"PASS balance slow: unslowed 4:4:4; rank 2 slowed {ratio:.2f}x -> "
              f"{':'.join(map(str, slowed.sizes))} ({slowed.describe()})", flush=True)


# ---- unequal stages train exactly ---------------------------------------------------------

STEPS, LR = 10, 0.05


def whole():
    torch.manual_seed(3)
    return Chain([Block() for _ in range(BLOCKS)]).double()


def forced_plan(blocks, group, sizes):
    """A StagePlan with these stage sizes, from cut() on made-up times."""
    p = len(sizes)
    times = []
    for s in range(p):  # stage s: its own layers cheap, every other layer dear
        lo = sum(sizes[:s])
        times.append([1.0 if lo <= i < lo + sizes[s] else 100.0 for i in range(BLOCKS)])
    bounds, st = cut(times)
    got = [b - a for a, b in bounds]
    if got != sizes:
        fail(f"cut() of made-up times gave {got}, wanted {sizes}")
    return StagePlan(blocks, bounds, st, times, st, group)


def test_exact(backend):
    rank, world = dist.get_rank(), dist.get_world_size()
    if world == 4:
        topo = Topology([("data", 2), ("pipe", 2)])
        pipe, datag, d, nd = topo.group("pipe"), topo.group("data"), topo.rank("data"), 2
        sizes = [6, 2]
    else:
        pipe, datag, d, nd = dist.group.WORLD, None, 0, 1
        sizes = [2, 5, 1] if world == 3 else [BLOCKS]
    s = dist.get_rank(pipe)
    for schedule in ("1f1b", "gpipe"):
        model = whole()
        plan = forced_plan(list(model.blocks), pipe, sizes)
        pl = Pipeline(plan, pipe, 4, schedule=schedule, loss_fn=loss_fn)
        opt = torch.optim.SGD(pl.stage.parameters(), lr=LR, momentum=0.9)
        ref = whole()
        ref_opt = torch.optim.SGD(ref.parameters(), lr=LR, momentum=0.9)
        for step in range(STEPS):
            x, y = data(step, 96)
            ref_opt.zero_grad()
            loss_fn(ref(*x), y).backward()
            ref_opt.step()
            half = 96 // nd
            xs = tuple(t[d * half:(d + 1) * half] for t in x)
            ys = y[d * half:(d + 1) * half]
            opt.zero_grad()
            pl.step(xs if s == 0 else None, ys if s == len(sizes) - 1 else None)
            if datag is not None:
                average_gradients(pl.stage, datag)
            opt.step()
        lo, hi = plan.bounds[s]
        mine = [q for b in model.blocks[lo:hi] for q in b.parameters()]
        theirs = [q for b in ref.blocks[lo:hi] for q in b.parameters()]
        dmax = max(((a - b).abs().max() / b.abs().max()).item() for a, b in zip(mine, theirs))
        if not dmax <= 1e-10:
            fail(f"{schedule}, stages {sizes}: stage {s} differs from one process by {dmax:.3e} "
                 f"after {STEPS} steps")
        every = [None] * world
        dist.all_gather_object(every, dmax)
        if rank == 0:
            print(f"  ok {schedule} stages {sizes} x data {nd} over {backend}: {STEPS} steps, "
                  f"largest difference {max(every):.2e}", flush=True)
    if rank == 0:
        print(f"PASS balance exact: {world} ranks", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=["cut", "slow", "exact"])
    ap.add_argument("--backend", default="kaitian")
    a = ap.parse_args()
    if a.what == "cut":
        return test_cut()
    dist.init_process_group(a.backend)
    if a.what == "slow":
        test_slow()
    else:
        test_exact(a.backend)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    if "gloo" in sys.argv:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
