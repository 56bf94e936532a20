"""python -m torch_kaitian.bench --hetero - one training job on ranks of unequal
speed: each rank alone, the even split (plain DDP, every rank the same batch),
and HeteroSampler + HeteroDDP (shares from measure_capability), in one run.

Started plainly it forks 2 ranks, each bound to its own block of CPUs, and
slows rank 1 by running a CPU-bound process on each of its CPUs (so it runs at
about half speed); --no-slow leaves it alone. Under `kaitian run` it uses the
ranks it was started as (rank --slow-rank is slowed the same way).

Reported: samples/s of each configuration (the solo figures: each rank
training the whole global batch by itself, both at once), the heterogeneous
job against the sum of the solo figures and against the even split, and each
configuration's compute time per step (forward + backward under no_sync at
its own batch) of the slowest rank against the fastest.
"""
import argparse
import os
import subprocess
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


def _model(width):
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(256, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(),
                         nn.Linear(width, 10))


def _data(n):
    g = torch.Generator().manual_seed(1)
    return torch.randn(n, 256, generator=g), torch.randint(0, 10, (n,), generator=g)


def _step(model, opt, x, y, sync=True):
    opt.zero_grad(set_to_none=True)
    if sync:
        F.cross_entropy(model(x), y).backward()
    else:
        with model.no_sync():
            F.cross_entropy(model(x), y).backward()
    opt.step()


def _timed(fn, steps, warmup=3):
    for _ in range(warmup):
        fn()
    t0 = time.perf_counter()
    for _ in range(steps):
        fn()
    return (time.perf_counter() - t0) / steps


def _gather(value):
    t = torch.tensor([float(value)], dtype=torch.float64)
    out = [torch.zeros_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(out, t)
    return [float(v.item()) for v in out]


def _job(model_cls, batch, args, x, y):
    """Samples/s of the whole job with this rank's batch size `batch` (slowest
    rank's time), and this rank's compute time per step at that batch."""
    import torch_kaitian as tk  # noqa: F401
    model = model_cls(_model(args.width))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    xb, yb = x[:batch], y[:batch]
    compute = _timed(lambda: _step(model, opt, xb, yb, sync=False), max(5, args.steps // 3))
    dist.barrier()
    step = max(_gather(_timed(lambda: _step(model, opt, xb, yb), args.steps)))
    return args.batch / step, _gather(compute)


def _run(args):
    import torch_kaitian as tk
    dist.init_process_group(args.backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    busy = []
    if args.slow and rank == args.slow_rank:
        busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"],
                                 preexec_fn=(lambda c=c: os.sched_setaffinity(0, {c})))
                for c in sorted(os.sched_getaffinity(0))]
    try:
        x, y = _data(args.batch)
        # Each rank alone: the whole global batch, no communication (all at once).
        solo_model = _model(args.width)
        solo_opt = torch.optim.SGD(solo_model.parameters(), lr=0.01)

        def solo_step():
            solo_opt.zero_grad(set_to_none=True)
            F.cross_entropy(solo_model(x), y).backward()
            solo_opt.step()
        dist.barrier()
        solo = _gather(args.batch / _timed(solo_step, max(5, args.steps // 2)))
        # Even split: plain DDP.
        even_share = tk.shares(args.batch, [1.0] * world)
        even_rate, even_compute = _job(nn.parallel.DistributedDataParallel, even_share[rank],
                                       args, x, y)
        # Heterogeneous: measured capabilities, HeteroSampler's shares, HeteroDDP.
        probe = _model(args.width)
        per = max(1, args.batch // world)
        caps = tk.measure_capability(probe, (x[:per], y[:per]), loss_fn=F.cross_entropy)
        sampler = tk.HeteroSampler(list(range(args.batch * 4)), args.batch, capabilities=caps)
        het_share = sampler.full_shares
        het_rate, het_compute = _job(tk.HeteroDDP, het_share[rank], args, x, y)
    finally:
        for b in busy:
            b.kill()
            b.wait()
    if rank == 0:
        _report(args, world, solo, even_share, even_rate, even_compute, caps, het_share, het_rate,
                het_compute)
    dist.barrier()
    dist.destroy_process_group()


def _report(args, world, solo, even_share, even_rate, even_compute, caps, het_share, het_rate,
            het_compute):
    slow = f"rank {args.slow_rank} slowed by a CPU-bound process on its CPUs" if args.slow else \
        "no rank slowed"
    print(f"torch_kaitian bench --hetero: {world} ranks over {args.backend}, {slow}; MLP "
          f"256-{args.width}-{args.width}-10, global batch {args.batch}, {args.steps} steps")
    print(f"  capabilities measured (samples/s): {', '.join(f'{c:.0f}' for c in caps)}")
    print(f"  {'configuration':<28s} {'shares':>14s} {'samples/s':>10s} {'compute ms/step per rank':>26s}"
          f" {'slowest/fastest':>16s}")
    for r, s in enumerate(solo):
        print(f"  {'rank %d alone' % r:<28s} {args.batch:>14d} {s:10.0f}")
    print(f"  {'sum of the solo figures':<28s} {'':>14s} {sum(solo):10.0f}")
    for name, sh, rate, comp in (("even split (DDP)", even_share, even_rate, even_compute),
                                 ("HeteroSampler + HeteroDDP", het_share, het_rate, het_compute)):
        spread = max(comp) / min(comp) if min(comp) > 0 else float("inf")
        print(f"  {name:<28s} {':'.join(map(str, sh)):>14s} {rate:10.0f} "
              f"{' '.join(f'{c * 1e3:.1f}' for c in comp):>26s} {spread:15.2f}x")
    print(f"  heterogeneous job / sum of solo = {het_rate / sum(solo):.1%} (goal >= 90%); "
          f"/ even split = {het_rate / even_rate:.2f}x (goal >= 1.3x); compute spread "
          f"{max(het_compute) / min(het_compute) - 1:+.0%} (goal within 15%; even split "
          f"{max(even_compute) / min(even_compute) - 1:+.0%})")


def _worker(rank, size, port, cpus, args):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(size))
    if cpus:
        os.sched_setaffinity(0, cpus)
    torch.set_num_threads(len(cpus) if cpus else 1)
    _run(args)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m torch_kaitian.bench --hetero", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", "--nproc", type=int, default=2, help="ranks to fork (default 2)")
    ap.add_argument("--steps", type=int, default=40, help="steps timed per configuration")
    ap.add_argument("--batch", type=int, default=128, help="global batch size (default 128)")
    ap.add_argument("--width", type=int, default=512, help="MLP width (default 512)")
    ap.add_argument("--backend", default="kaitian")
    ap.add_argument("--slow-rank", type=int, default=1, help="the rank to slow (default 1)")
    ap.add_argument("--no-slow", dest="slow", action="store_false",
                    help="slow no rank")
    args = ap.parse_args(argv)
    import torch_kaitian  # noqa: F401 - registers "kaitian"
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        omp = os.environ.get("OMP_NUM_THREADS", "")
        if omp.isdigit() and int(omp) > 0:
            torch.set_num_threads(int(omp))
        _run(args)
        return 0
    from .bench import fork_ranks
    n = args.nproc
    if args.slow and n > len(os.sched_getaffinity(0)):
        print(f"bench --hetero: {n} ranks on {len(os.sched_getaffinity(0))} CPUs cannot be bound "
              f"apart; a slowed rank would slow the others too (use --no-slow or fewer ranks)",
              file=sys.stderr)
        return 2
    return 1 if any(fork_ranks(n, _worker, args)) else 0

if __name__ == "__main__":
    sys.exit(main())
