"""python -m torch_kaitian.bench --hetero - one training job on ranks of unequal
speed, on any device plan: each rank alone, the even split (plain DDP) and the
planned job (torch_kaitian.plan + HeteroSampler + HeteroDDP), in one run.

    kaitian run --devices cuda:1,cpu:2 python -m torch_kaitian.bench --hetero --width 1024 \
        --batch 512
    python -m torch_kaitian.bench --hetero --slow 7    # 2 CPU ranks, rank 1 about 8x slower

The job: a 4-layer MLP 256 -> W -> W -> W -> 10 (--width W, default 512),
float32, cross entropy, SGD, global batch --batch (default 128), every rank on
torch_kaitian.device() (under `kaitian run`, its device of the launcher's
plan). The data is a TensorDataset on the CPU of 4 global batches; every
configuration takes its batches from a DataLoader over it and moves each to
its device. The DataLoaders fetch sample by sample and collate (--fetch
sample, the default, as HeteroSampler.loader() does), or each batch in one
indexing of the dataset's tensors (--fetch batch: the batch sampler given as
the sampler, batch_size=None; for a GPU rank at large batches, where
collating on the CPU can take longer than the step).
  rank r alone   the whole global batch on rank r, no communication; the ranks
                 run alone all at once (on a shared CPU host they compete for
                 memory bandwidth and caches, so each figure may be below
                 what the rank reaches with the host to itself);
  even split     plain DistributedDataParallel over --backend, every rank an
                 equal share (HeteroSampler with equal capabilities);
  planned job    tk.plan(model, sample, B, rebalance=True, window=--window),
                 HeteroSampler(plan=).loader(), HeteroDDP(plan=);
  predicted      what the plan's model says of each row (the planned row:
                 plan.predicted_rate), from the step-time curves and the
                 gradient exchange it measured.
Each configuration runs --warmup steps, then --steps timed ones; its samples/s
is the global batch over the slowest rank's mean step time. The plan's
verdict, its curves and exchanges, and any rebalancing follow the table. The
last line is `hetero/best_solo=X hetero/sum=Y predicted/measured=Z`: the
planned job over the best rank alone, over the sum of the ranks alone, and the
plan's predicted samples/s over the measured.

Started plainly (no RANK in the environment) it forks -n CPU ranks (default
2), each bound to its own block of CPUs. --slow K (default 1) starts K
CPU-bound processes on each CPU of rank --slow-rank (default 1): K=1 about
half speed, K=7 about 8x slower; --slow 0 (or --no-slow) slows nothing. Under
`kaitian run` it uses the ranks it was started as, and --slow K slows rank
--slow-rank the same way on the CPUs it is bound to; with K > 0 the ranks must
be bound to CPUs apart (else the busy processes would slow the others too).
"""
import argparse
import ctypes
import os
import signal
import socket
import subprocess
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import BatchSampler, DataLoader, RandomSampler, TensorDataset


def _model(width, dev):
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(256, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(),
                         nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 10)).to(dev)


def _dataset(n):
    g = torch.Generator().manual_seed(1)
    return TensorDataset(torch.randn(n, 256, generator=g), torch.randint(0, 10, (n,), generator=g))


def _sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def _batches(loader, dev, sampler):
    """The loader's batches on `dev`, epoch after epoch (sampler.set_epoch
    before each, where there is a sampler to reshuffle)."""
    epoch = 0
    while True:
        if sampler is not None:
            sampler.set_epoch(epoch)
        for x, y in loader:
            yield x.to(dev), y.to(dev)
        epoch += 1


def _timed(model, loader, dev, args, sampler=None):
    """This rank's mean seconds per training step over the loader's batches:
    --warmup steps, then --steps timed, every rank starting together."""
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = _batches(loader, dev, sampler)

    def step():
        x, y = next(data)
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        opt.step()
    for _ in range(args.warmup):
        step()
    _sync(dev)
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(args.steps):
        step()
    _sync(dev)
    return (time.perf_counter() - t0) / args.steps


def _gather(value):
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, value)
    return out


def _no_orphan():
    """In a busy child: die with the rank that started it (PR_SET_PDEATHSIG),
    even if the rank is killed before its finally runs."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)
    except (OSError, AttributeError):
        pass


def _start_busy(k, cpus):
    """k CPU-bound processes on each of `cpus` (killed by _stop_busy)."""
    busy = []
    try:
        for c in cpus:
            for _ in range(k):
                busy.append(subprocess.Popen(
                    [sys.executable, "-c", "while True: pass"],
                    preexec_fn=lambda c=c: (_no_orphan(), os.sched_setaffinity(0, {c}))))
    except BaseException:
        _stop_busy(busy)
        raise
    time.sleep(0.3)  # past their interpreters' start-up
    return busy


def _stop_busy(busy):
    for b in busy:
        b.kill()
    for b in busy:
        b.wait()


def _check_job(args, where):
    """Every rank has a sample of the global batch, and with --slow K > 0 the
    slowed rank exists and shares no CPU with another rank of its host (the
    same verdict on every rank). Returns an error text or None."""
    world = len(where)
    if args.batch < world:
        return f"--batch {args.batch}: fewer samples than the job's {world} ranks"
    if not args.slow:
        return None
    if not 0 <= args.slow_rank < world:
        return f"--slow-rank {args.slow_rank}: the job has ranks 0..{world - 1}"
    _, host, cpus = where[args.slow_rank]
    shared = sorted({c for r, (_, h, other) in enumerate(where) if r != args.slow_rank
                     and h == host for c in other} & set(cpus))
    if shared:
        return (f"--slow {args.slow}: rank {args.slow_rank} may run on CPUs {cpus}, which other "
                f"ranks of {host} may run on too ({shared}): its busy processes would slow them "
                f"as well. Bind the ranks apart (kaitian run binds them when there are enough "
                f"CPUs) or use --slow 0")
    return None


def _run(args):
    import torch_kaitian as tk
    dist.init_process_group(args.backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    dev = tk.device()
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    where = _gather((str(dev), socket.gethostname(), sorted(os.sched_getaffinity(0))))
    bad = _check_job(args, where)
    if bad:
        if rank == 0:
            print(f"bench --hetero: {bad}", file=sys.stderr, flush=True)
        dist.destroy_process_group()
        return 2
    busy = []
    try:
        if args.slow and rank == args.slow_rank:
            busy = _start_busy(args.slow, where[rank][2])
        res = _measure(tk, args, rank, world, dev)
    finally:
        _stop_busy(busy)
    if rank == 0:
        _report(args, [d for d, _, _ in where], *res)
    dist.barrier()
    dist.destroy_process_group()
    return 0


def _loader(ds, batches, fetch):
    """A DataLoader giving the index lists of `batches` (a batch sampler) as
    batches: sample by sample and collated (fetch "sample"), or each in one
    indexing of the tensors (fetch "batch": the batch sampler as the sampler,
    batch_size=None)."""
    if fetch == "batch":
        return DataLoader(ds, sampler=batches, batch_size=None)
    return DataLoader(ds, batch_sampler=batches)


def _measure(tk, args, rank, world, dev):
    """Every configuration's per-rank mean step times, and the plan."""
    B = args.batch
    ds = _dataset(4 * B)
    ddp_kw = {"device_ids": [dev.index]} if dev.type == "cuda" else {}
    # Each rank alone on the whole global batch (all ranks at once).
    whole = BatchSampler(RandomSampler(ds), B, drop_last=False)
    solo = _gather(_timed(_model(args.width, dev), _loader(ds, whole, args.fetch), dev, args))
    # The even split: plain DDP, equal shares.
    even_sampler = tk.HeteroSampler(ds, B, capabilities=[1.0] * world)
    even = _gather(_timed(nn.parallel.DistributedDataParallel(_model(args.width, dev), **ddp_kw),
                          _loader(ds, even_sampler.batches(), args.fetch), dev, args, even_sampler))
    # The planned job: as a user runs it.
    model = _model(args.width, dev)
    per = max(1, B // world)
    sample = (ds.tensors[0][:per].to(dev), ds.tensors[1][:per].to(dev))
    plan = tk.plan(model, sample, B, loss_fn=F.cross_entropy, rebalance=True,
                   window=args.window, verbose=False)
    sampler = tk.HeteroSampler(ds, B, plan=plan)
    loader = sampler.loader() if args.fetch == "sample" else _loader(ds, sampler.batches(), "batch")
    planned = _gather(_timed(tk.HeteroDDP(model, plan=plan, **ddp_kw), loader, dev, args, sampler))
    return solo, even_sampler.full_shares, even, plan, planned


def _predicted_even(plan, shares):
    """The plan's model of the even split: B / (max t_r(b_r) + the exchange of
    every rank), or None where the exchange of every rank was not measured."""
    curves, world = plan.decision.curves, len(shares)
    x = 0.0 if world == 1 else plan.exchange.get(tuple(range(world)))
    if x is None:
        return None
    return sum(shares) / (max(c.time(b) for c, b in zip(curves, shares)) + x)


def _report(args, devices, solo, even_shares, even, plan, planned):
    B, world = args.batch, len(devices)
    rate = lambda times: B / max(times)  # noqa: E731 - the slowest rank's mean step
    curves = plan.decision.curves
    slow = (f"rank {args.slow_rank} slowed by {args.slow} busy process{'es' * (args.slow != 1)} "
            f"on each of its CPUs" if args.slow else "no rank slowed")
    kinds = ", ".join(f"{r}: {d}" for r, d in enumerate(devices))
    print(f"torch_kaitian bench --hetero: {world} ranks over {args.backend} ({kinds}), {slow}; "
          f"MLP 256-{args.width}-{args.width}-{args.width}-10 float32, cross entropy, SGD; global "
          f"batch {B}; {args.warmup} warm-up + {args.steps} timed steps per configuration; "
          f"{torch.get_num_threads()} torch thread(s) on rank 0")
    print(f"  (batches from DataLoaders over a CPU TensorDataset, fetched {args.fetch} by "
          f"{args.fetch}; the ranks alone run all at once, so on a shared CPU host they compete "
          f"with each other)")
    print(f"  {'configuration':<24s} {'shares':>16s} {'samples/s':>10s} {'predicted':>10s}  "
          f"step ms per rank")
    ms = lambda times: " ".join(f"{t * 1e3:.1f}" for t in times)  # noqa: E731

    def row(name, shares, times, pred):
        p = f"{pred:10.0f}" if pred is not None else f"{'-':>10s}"
        print(f"  {name:<24s} {shares:>16s} {rate(times):10.0f} {p}  {ms(times)}")
    for r, t in enumerate(solo):
        print(f"  {'rank %d alone (%s)' % (r, devices[r]):<24s} {B:>16d} {B / t:10.0f} "
              f"{curves[r].rate(B):10.0f}  {t * 1e3:.1f}")
    solo_rates = [B / t for t in solo]
    print(f"  {'sum of the ranks alone':<24s} {'':>16s} {sum(solo_rates):10.0f}")
    row("even split (DDP)", ":".join(map(str, even_shares)), even,
        _predicted_even(plan, even_shares))
    first = plan.decision.shares
    sh = ":".join(map(str, first)) + ("" if plan.shares == first else
                                      " -> " + ":".join(map(str, plan.shares)))
    row("planned (HeteroDDP)", sh, planned, plan.predicted_rate)
    print(f"  plan: {plan.describe()}")
    print("  step-time curves t(b) = a + b*c: " + "; ".join(
        f"rank {r} a={c.a * 1e3:.2f} ms c={c.c * 1e6:.1f} us/sample" for r, c in enumerate(curves)))
    if plan.exchange:
        print("  gradient exchange measured: " + "; ".join(
            f"ranks {','.join(map(str, k))} {v * 1e3:.2f} ms" for k, v in plan.exchange.items()))
    print("  rebalanced: " + ("; ".join(f"from step {s}: {':'.join(map(str, x))}"
                                        for s, x in plan.history) or "no"))
    measured = rate(planned)
    print(f"hetero/best_solo={measured / max(solo_rates):.2f} "
          f"hetero/sum={measured / sum(solo_rates):.2f} "
          f"predicted/measured={plan.predicted_rate / measured:.2f}", flush=True)


def _worker(rank, size, port, cpus, args):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(size), KAITIAN_DEVICE="cpu")  # forked ranks are CPU ranks
    if cpus:
        os.sched_setaffinity(0, cpus)
    torch.set_num_threads(len(cpus) if cpus else 1)
    sys.exit(_run(args))


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m torch_kaitian.bench --hetero", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", "--nproc", type=int, default=2, help="ranks to fork (default 2)")
    ap.add_argument("--steps", type=int, default=40,
                    help="steps timed per configuration (default 40)")
    ap.add_argument("--warmup", type=int, default=5, help="untimed steps before them (default 5)")
    ap.add_argument("--batch", type=int, default=128, help="global batch size (default 128)")
    ap.add_argument("--width", type=int, default=512, help="MLP width (default 512)")
    ap.add_argument("--window", type=int, default=20,
                    help="the plan's rebalancing window, steps (default 20)")
    ap.add_argument("--backend", default="kaitian")
    ap.add_argument("--fetch", choices=("sample", "batch"), default="sample",
                    help="how the DataLoaders fetch a batch: sample by sample, collated (default; "
                         "the planned job through sampler.loader()), or in one indexing of the "
                         "dataset's tensors (sampler.batches() as the sampler, batch_size=None)")
    ap.add_argument("--slow", type=int, default=1, metavar="K",
                    help="K busy processes on each CPU of the slowed rank (default 1: about half "
                         "speed; 7: about 8x slower; 0: none)")
    ap.add_argument("--no-slow", dest="slow", action="store_const", const=0,
                    help="the same as --slow 0")
    ap.add_argument("--slow-rank", type=int, default=1, help="the rank to slow (default 1)")
    args = ap.parse_args(argv)
    if args.steps < 1 or args.warmup < 0 or args.batch < 1 or args.width < 1 or args.slow < 0:
        ap.error("--steps, --batch and --width must be >= 1, --warmup and --slow >= 0")
    import torch_kaitian  # noqa: F401 - registers "kaitian"
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        omp = os.environ.get("OMP_NUM_THREADS", "")
        if omp.isdigit() and int(omp) > 0:
            torch.set_num_threads(int(omp))
        return _run(args)
    from .bench import fork_ranks
    n = args.nproc
    if args.slow and n > len(os.sched_getaffinity(0)):
        print(f"bench --hetero: {n} ranks on {len(os.sched_getaffinity(0))} CPUs cannot be bound "
              f"apart; a slowed rank would slow the others too (use --slow 0 or fewer ranks)",
              file=sys.stderr)
        return 2
    codes = fork_ranks(n, _worker, args)
    return 2 if all(c == 2 for c in codes) else 1 if any(codes) else 0


if __name__ == "__main__":
    sys.exit(main())
