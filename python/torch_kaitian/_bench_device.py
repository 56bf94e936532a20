"""python -m torch_kaitian.bench --device [cuda] - a device rank's collectives,
alone and with CPU ranks, kaitian against gloo (and nccl where it exists).

In one run, rank 0 computing on the device and the other ranks on the CPU
(`kaitian run --devices cuda:1,cpu:1 python -m torch_kaitian.bench --device`,
or started plainly: it forks -n ranks, rank 0 on --device):
  1. rank 0 alone (a group of one rank): dist.all_reduce of a device tensor of
     4 KiB, 256 KiB, 4 MiB and 64 MiB, over nccl (CUDA only), gloo and kaitian;
  2. every rank: the same all_reduce, rank 0's tensor on the device and the
     others' on the CPU, over gloo and kaitian, next to kaitian's all_reduce of
     CPU tensors on the same ranks (what the device's copies add);
  3. DDP's communication per step (the step minus the same step under no_sync)
     of a 4-layer MLP of 2.6 M parameters, batch --batch per rank, on rank 0
     alone (nccl, gloo, kaitian) and with the CPU ranks (gloo, kaitian), for
     rank 0 and for the slowest CPU rank.
Time per call: the mean of back-to-back calls, the device synchronised at the
end of each loop (not within it), the slowest rank's, best of --reps rounds.
"""
import argparse
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

SIZES = (4 << 10, 256 << 10, 4 << 20, 64 << 20)


def _fmt(n):
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB"


def _sync(dev):
    if dev.type != "cpu":
        getattr(torch, dev.type).synchronize(dev)


def _loop(fn, iters, dev, group=None):
    """Seconds per call of iters back-to-back calls, the ranks of group started together."""
    for _ in range(2):
        fn()
    _sync(dev)
    if group is not False:
        dist.barrier(group=group)
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    _sync(dev)
    return (time.perf_counter() - t0) / iters


def _iters(nbytes, scale):
    return max(3, int(min(500, (64 << 20) // max(nbytes, 64 << 10)) * scale))


def _slowest(value, group):
    t = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return t.item()


class _MLP(torch.nn.Module):
    """4 layers, 2.63 M parameters."""

    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(1024, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024), torch.nn.ReLU(),
            torch.nn.Linear(1024, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10))

    def forward(self, x):
        return self.net(x)


def _ddp_comm(group, dev, batch, steps, members):
    """(this rank's median step, its comm: median of step - no_sync step), ms."""
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(
        _MLP().to(dev), process_group=group, device_ids=[dev.index] if dev.type == "cuda" else None)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(batch, 1024, device=dev)
    y = torch.randint(0, 10, (batch,), device=dev)
    loss_fn = torch.nn.CrossEntropyLoss()

    def step(sync):
        opt.zero_grad(set_to_none=True)
        if sync:
            loss_fn(model(x), y).backward()
        else:
            with model.no_sync():
                loss_fn(model(x), y).backward()
        opt.step()
        _sync(dev)

    for _ in range(3):
        step(True)
        step(False)
    synced, alone = [], []
    for _ in range(steps):
        for sync, out in ((False, alone), (True, synced)):
            if members > 1:
                dist.barrier(group=group)
            t0 = time.perf_counter()
            step(sync)
            out.append(time.perf_counter() - t0)
    comm = statistics.median(s - a for s, a in zip(synced, alone))
    return statistics.median(synced) * 1e3, max(0.0, comm) * 1e3


def run(args):
    import torch_kaitian
    dist.init_process_group("kaitian")
    rank, size = dist.get_rank(), dist.get_world_size()
    dev = torch_kaitian.device() if rank == 0 else torch.device("cpu")
    if rank == 0 and dev.type == "cpu" and args.device not in ("cpu", None):
        raise SystemExit(f"rank 0 computes on the CPU (KAITIAN_DEVICE={os.environ.get('KAITIAN_DEVICE')}); "
                         f"start it with kaitian run --devices {args.device}:1,cpu:{max(1, size - 1)}")
    gloo = dist.new_group(backend="gloo")
    solo_kt = dist.new_group([0])
    solo_gloo = dist.new_group([0], backend="gloo")
    flag = torch.tensor([1 if dev.type == "cuda" and dist.is_nccl_available() else 0])
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)  # every rank makes the same groups
    has_nccl = bool(flag.item())
    solo_nccl = dist.new_group([0], backend="nccl") if has_nccl else None
    types = dist.distributed_c10d._get_default_group()._types
    if rank == 0:
        print(f"torch_kaitian bench --device: {size} ranks {types}, rank 0 on {dev}"
              f"{' (' + torch.cuda.get_device_name(dev) + ')' if dev.type == 'cuda' else ''}, torch "
              f"{torch.__version__}, KaiTian {torch_kaitian.core_version}; best of {args.reps} rounds")
    sizes = [s for s in SIZES if s <= args.max_bytes]
    # 1. rank 0 alone.
    solo = {}
    if rank == 0:
        for nbytes in sizes:
            x = torch.ones(nbytes // 4, device=dev)
            it = _iters(nbytes, args.scale)
            for name, g in (("nccl", solo_nccl), ("gloo", solo_gloo), ("kaitian", solo_kt)):
                if g is None:
                    continue
                solo[name, nbytes] = min(_loop(lambda: dist.all_reduce(x, group=g), it, dev, False)
                                         for _ in range(args.reps))
        print(f"\n1. rank 0 alone: dist.all_reduce of a {dev.type} tensor, us per call")
        print(f"  {'size':>8s} {'nccl':>9s} {'gloo':>9s} {'kaitian':>9s} {'kt/nccl':>8s}")
        for nbytes in sizes:
            n = solo.get(("nccl", nbytes))
            g, k = solo["gloo", nbytes], solo["kaitian", nbytes]
            print(f"  {_fmt(nbytes):>8s} {n * 1e6 if n else float('nan'):9.1f} {g * 1e6:9.1f} {k * 1e6:9.1f} "
                  f"{k / n if n else float('nan'):8.2f}")
    dist.barrier()
    # 2. every rank.
    if rank == 0:
        print(f"\n2. {size} ranks, rank 0's tensor on {dev}, the others' on the CPU: us per call "
              "(slowest rank)")
        print(f"  {'size':>8s} {'gloo':>10s} {'kaitian':>10s} {'kt cpu':>10s} {'kt/kt cpu':>10s} "
              f"{'gloo/kt':>8s}")
    for nbytes in sizes:
        it = max(3, _iters(nbytes, args.scale) // 2)
        x = torch.ones(nbytes // 4, device=dev)
        xc = torch.ones(nbytes // 4)
        res = {}
        for name, fn, d in (("gloo", lambda: dist.all_reduce(x, group=gloo), dev),
                            ("kaitian", lambda: dist.all_reduce(x), dev),
                            ("cpu", lambda: dist.all_reduce(xc), torch.device("cpu"))):
            its = max(3, it // 4) if name == "gloo" else it
            res[name] = min(_slowest(_loop(fn, its, d), gloo) for _ in range(args.reps))
        if rank == 0:
            g, k, c = res["gloo"], res["kaitian"], res["cpu"]
            print(f"  {_fmt(nbytes):>8s} {g * 1e6:10.1f} {k * 1e6:10.1f} {c * 1e6:10.1f} {k / c:10.2f} "
                  f"{g / k:8.1f}")
    # 3. DDP.
    if not args.skip_ddp:
        rows = []
        if rank == 0:
            for name, g in (("nccl", solo_nccl), ("gloo", solo_gloo), ("kaitian", solo_kt)):
                if g is not None:
                    rows.append((f"rank 0 alone, {name}",) + _ddp_comm(g, dev, args.batch, args.steps, 1))
        dist.barrier()
        for name, g in (("gloo", gloo), ("kaitian", None)):
            step, comm = _ddp_comm(g, dev, args.batch, args.steps, size)
            others = _slowest(comm if rank else 0.0, gloo)
            if rank == 0:
                rows.append((f"{size} ranks, {name}: rank 0", step, comm))
                rows.append((f"{size} ranks, {name}: slowest CPU rank's comm", float("nan"), others))
        if rank == 0:
            n = sum(p.numel() for p in _MLP().parameters())
            print(f"\n3. DDP of an MLP of {n / 1e6:.2f} M parameters, batch {args.batch} per rank: "
                  f"ms per step, median of {args.steps}; comm = step - the same step under no_sync")
            print(f"  {'job':<44s} {'step':>8s} {'comm':>8s}")
            for what, step, comm in rows:
                print(f"  {what:<44s} {step:8.2f} {comm:8.2f}")
    dist.barrier()
    dist.destroy_process_group()


def _worker(rank, size, port, cpus, args):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(size), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(size))
    if rank == 0 and args.device != "cpu":
        os.environ["KAITIAN_DEVICE"] = f"{args.device}:0"
    else:
        os.environ["KAITIAN_DEVICE"] = "cpu"
    if cpus:
        os.sched_setaffinity(0, cpus)
    torch.set_num_threads(max(1, len(cpus) if cpus else 1))
    run(args)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m torch_kaitian.bench --device", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("device", nargs="?", default="cuda",
                    help="rank 0's device type when forking ranks (default cuda)")
    ap.add_argument("-n", "--nproc", type=int, default=2, help="ranks to fork (default 2)")
    ap.add_argument("--reps", type=int, default=3, help="timing rounds (default 3)")
    ap.add_argument("--scale", type=float, default=1.0, help="multiply iteration counts")
    ap.add_argument("--steps", type=int, default=20, help="DDP steps measured (default 20)")
    ap.add_argument("--batch", type=int, default=512, help="DDP: samples per rank (default 512)")
    ap.add_argument("--max-bytes", type=int, default=64 << 20, help="largest all_reduce size")
    ap.add_argument("--skip-ddp", action="store_true")
    args = ap.parse_args(argv)
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        run(args)
        return 0
    from .bench import fork_ranks
    codes = fork_ranks(args.nproc, _worker, args)
    return 1 if any(codes) else 0


if __name__ == "__main__":
    sys.exit(main())
