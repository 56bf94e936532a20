"""python -m torch_kaitian.bench - kaitian against gloo through torch.distributed.

In one run, on the same ranks:
  1. dist.all_reduce of float32 from 8 B to 64 MiB, kaitian and gloo (time per
     call and the ratio), plus kt_allreduce called directly on the same
     communicator (the C API's own time), so the binding's overhead shows;
  2. the DDP training step of a fixed model (median of the slowest rank's step),
     split into compute (the same step without gradient synchronisation, DDP's
     no_sync) and communication (the rest), for both backends, with DDP's
     default gradient buckets and with gradient_as_bucket_view=True.

The other benchmarks, each with its own --help:
  --hetero    heterogeneous data parallelism: each rank alone, the even split and the
              planned job (torch_kaitian.plan), --slow K to slow a rank (_bench_hetero.py)
  --optim     the CPU Adam kernels against torch's AdamW (_bench_optim.py)
  --zero      ZeroOptimizer against ZeroRedundancyOptimizer and DDP (_bench_zero.py)
  --pipeline  the GPT example's pipeline bubble, kaitian against gloo (_bench_pipeline.py)
  --device    a device rank (CUDA) alone and with CPU ranks: all_reduce and DDP's
              communication, kaitian against gloo and nccl (_bench_device.py)

Started plainly it forks its own ranks (-n, default 2), each bound to its own
block of CPUs as `kaitian run` binds them (docs/launcher.md); under `kaitian
run` or torchrun (RANK set) it uses the ranks it was started as.
"""
import argparse
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

SIZES = [8 << (3 * i) for i in range(8)] + [64 << 20]  # 8 B, 64 B, ..., 16 MiB, 64 MiB


def _fmt_size(n):
    for unit, s in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= s:
            return f"{n // s} {unit}"
    return f"{n} B"


def _iters(nbytes, scale):
    return max(3, int(min(2000, (32 << 20) // max(nbytes, 16 << 10)) * scale))


def _time_loop(fn, iters):
    """Mean time per call of iters back-to-back calls (seconds), started together."""
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - t0) / iters


def _agree(value, group=None):
    """The slowest rank's value (what a user waits for)."""
    t = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return t.item()


def bench_allreduce(gloo, scale, reps, max_bytes):
    """Per size: `reps` rounds, each timing the C API, kaitian and gloo in turn, so
    that load changes on a shared machine hit all three alike. Reported: the
    best round of each, and the median of the per-round kaitian - C API
    differences (the binding's overhead)."""
    from . import _lib
    pg = dist.distributed_c10d._get_default_group()
    rows = []
    for nbytes in [s for s in SIZES if s <= max_bytes]:
        x = torch.ones(nbytes // 4, dtype=torch.float32)
        iters = _iters(nbytes, scale)
        g_iters = max(3, iters // 4)
        for _ in range(3):  # warm up both paths (connections, page faults)
            dist.all_reduce(x)
            dist.all_reduce(x, group=gloo)
        ptr, n, comm = x.data_ptr(), x.numel(), pg._comm
        f = _lib.lib.kt_allreduce
        c_api = lambda: f(ptr, ptr, n, _lib.FLOAT32, _lib.SUM, comm)  # noqa: E731
        kt = lambda: dist.all_reduce(x)  # noqa: E731
        gl = lambda: dist.all_reduce(x, group=gloo)  # noqa: E731
        ts_c, ts_kt, ts_gl = [], [], []
        for _ in range(reps):
            ts_c.append(_agree(_time_loop(c_api, iters)))
            ts_kt.append(_agree(_time_loop(kt, iters)))
            ts_gl.append(_agree(_time_loop(gl, g_iters)))
        t_c, t_kt, t_gl = min(ts_c), min(ts_kt), min(ts_gl)
        over = statistics.median(k - c for k, c in zip(ts_kt, ts_c))
        rows.append((nbytes, t_c, t_kt, t_gl, over))
        if dist.get_rank() == 0:
            print(f"  {_fmt_size(nbytes):>8s} {t_c * 1e6:11.1f} {t_kt * 1e6:11.1f} "
                  f"{over * 1e6:9.1f} {t_gl * 1e6:11.1f} {t_gl / t_kt:8.1f}x", flush=True)
    return rows


def bench_overhead(own, scale):
    """What a call costs where there is nothing to communicate: dist.all_reduce
    of 2 floats on a 1-rank group, which moves nothing (_solo.py: torch's
    wrapper and the binding's dispatch), next to kt_allreduce on a 1-rank
    communicator. The binding's cost on the path of larger groups is the
    table's overhead column (kaitian - C API on the same communicator). Rank 0
    measures while the others wait."""
    from . import _lib
    if dist.get_rank() == 0:
        x = torch.ones(2)
        ptr, comm = x.data_ptr(), own._comm
        f = _lib.lib.kt_allreduce
        n = max(1000, int(20000 * scale))
        t_c = min(_time_loop_local(lambda: f(ptr, ptr, 2, _lib.FLOAT32, _lib.SUM, comm), n) for _ in range(5))
        t_kt = min(_time_loop_local(lambda: dist.all_reduce(x, group=own), n) for _ in range(5))
        print(f"\na 1-rank group: dist.all_reduce {t_kt * 1e6:.1f} us per call (it moves nothing: "
              f"torch's wrapper and the binding's dispatch), kt_allreduce {t_c * 1e6:.1f} us")
    dist.barrier()


def _time_loop_local(fn, iters):
    for _ in range(100):
        fn()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - t0) / iters


class _Model(torch.nn.Module):
    """A fixed MLP: 4 hidden layers of 1024 (3.42 M parameters, 13.1 MiB of float32 gradients)."""

    def __init__(self):
        super().__init__()
        layers, width = [], 1024
        layers += [torch.nn.Linear(256, width), torch.nn.ReLU()]
        for _ in range(3):
            layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
        layers += [torch.nn.Linear(width, 10)]
        self.net = torch.nn.Sequential(*layers)

    def forward(self, x):
        return self.net(x)


def _no_communication(state, bucket):
    """A DDP comm hook that leaves the bucket as it is: DDP's own cost per step."""
    fut = torch.futures.Future()
    fut.set_result(bucket.buffer())
    return fut


def bench_ddp(groups, steps, views, batch):
    """DDP steps of the fixed model, one DDP instance per (backend, bucket view)
    config; backend "none" is DDP with a comm hook that does not communicate
    (DDP's own work per step: the floor of any backend's "communication").
    The configs take turns, a few steps each (after an untimed step, so that
    each finds its buffers in cache again), so that other load on a shared
    machine falls on all of them alike. Returns {config: (step, compute, comm)}
    in seconds."""
    x = torch.randn(batch, 256)
    y = torch.randint(0, 10, (batch,))
    loss_fn = torch.nn.CrossEntropyLoss()
    runs = {}
    for view in views:
        for name, group in groups:
            torch.manual_seed(0)
            model = torch.nn.parallel.DistributedDataParallel(_Model(), process_group=group,
                                                              gradient_as_bucket_view=view)
            if name == "none":
                model.register_comm_hook(None, _no_communication)
            runs[name, view] = (model, torch.optim.SGD(model.parameters(), lr=0.01), group)

    def step(cfg, sync):
        model, opt, _ = runs[cfg]
        opt.zero_grad(set_to_none=True)
        if sync:
            loss_fn(model(x), y).backward()
        else:
            with model.no_sync():
                loss_fn(model(x), y).backward()
        opt.step()

    for cfg in runs:
        for _ in range(3):
            step(cfg, True)
            step(cfg, False)
    times = {(cfg, sync): [] for cfg in runs for sync in (False, True)}
    block = 5  # timed step pairs per turn, after one untimed pair (caches warm again)
    for first in range(0, steps, block):
        for cfg in runs:
            step(cfg, False)
            step(cfg, True)
            for _ in range(min(block, steps - first)):
                for sync in (False, True):
                    dist.barrier(group=runs[cfg][2])
                    t0 = time.perf_counter()
                    step(cfg, sync)
                    times[cfg, sync].append(time.perf_counter() - t0)
    # The job's step is its slowest rank's: per step, the slowest rank's time.
    # Paired: each synchronised step next to an unsynchronised one, medians (a
    # shared machine's hiccups hit single steps, not the median). Taking the
    # slowest rank per step, not each rank's own difference, keeps the ranks'
    # compute skew (present without any communication) out of "communication".
    job = {key: _slowest(ts) for key, ts in times.items()}
    out = {}
    for cfg in runs:
        synced, alone = job[cfg, True], job[cfg, False]
        comm = statistics.median(s - c for s, c in zip(synced, alone))
        out[cfg] = (statistics.median(synced), statistics.median(alone), max(0.0, comm))
    return out


def _memcpy_time(numel, reps=30):
    """One copy of numel float32 between two buffers of this rank on one
    thread, every rank at once: the slowest rank's median, seconds."""
    src, dst = torch.ones(numel), torch.empty(numel)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one thread, as the core's reduction runs on one
    try:
        dst.copy_(src)
        ts = []
        for _ in range(reps):
            dist.barrier()
            t0 = time.perf_counter()
            dst.copy_(src)
            ts.append(time.perf_counter() - t0)
    finally:
        torch.set_num_threads(threads)
    return statistics.median(_slowest(ts))


def _slowest(values, group=None):
    """Per index, the largest of the ranks' values."""
    t = torch.tensor(values, dtype=torch.float64)
    parts = [torch.empty_like(t) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, t, group=group)
    return torch.stack(parts).max(dim=0).values.tolist()


def _cpu_blocks(n):
    """This process's CPUs split into n contiguous blocks, as `kaitian run --bind
    auto` splits them (None when there are fewer CPUs than ranks)."""
    cpus = sorted(os.sched_getaffinity(0))
    if n > len(cpus):
        return None
    return [cpus[i * len(cpus) // n:(i + 1) * len(cpus) // n] for i in range(n)]


def fork_ranks(n, target, *extra):
    """Fork n ranks of a job on this host, rank r bound to block r of this
    process's CPUs as `kaitian run` binds them (unbound with fewer CPUs than
    ranks), each calling target(rank, n, port, cpus, *extra) with MASTER_PORT
    free; returns their exit codes."""
    import torch.multiprocessing as mp
    ctx = mp.get_context("fork")
    from ._launch import _free_port
    port = _free_port()
    blocks = _cpu_blocks(n) or [None] * n
    procs = [ctx.Process(target=target, args=(r, n, port, blocks[r]) + extra) for r in range(n)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    return [p.exitcode for p in procs]


def _worker(rank, size, port, cpus, args):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(size))
    if cpus:
        os.sched_setaffinity(0, cpus)
        args.threads = args.threads or len(cpus)
    _run(args)


def _run(args):
    import torch_kaitian  # noqa: F401 - registers "kaitian"
    # Threads: --threads; in fork mode the rank's block of CPUs; under a
    # launcher its OMP_NUM_THREADS (kaitian run: the rank's share of the CPUs);
    # else an equal share of the CPUs this rank may use.
    local = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ["WORLD_SIZE"]))
    mine = len(os.sched_getaffinity(0))
    omp = os.environ.get("OMP_NUM_THREADS", "")
    torch.set_num_threads(args.threads or (int(omp) if omp.isdigit() and int(omp) > 0 else 0)
                          or max(1, mine // local))
    dist.init_process_group("kaitian")
    gloo = dist.new_group(backend="gloo")
    rank, size = dist.get_rank(), dist.get_world_size()
    singles = [dist.new_group([r]) for r in range(size)]  # every rank creates every group
    if rank == 0:
        placement = f"rank 0 may run on {mine} of {os.cpu_count()} CPUs"
        print(f"torch_kaitian bench: {size} ranks, torch {torch.__version__}, KaiTian "
              f"{torch_kaitian.core_version} ({torch_kaitian.library_path}), "
              f"{torch.get_num_threads()} torch thread(s) per rank, {placement}")
    if not args.skip_allreduce:
        if rank == 0:
            print("\ndist.all_reduce(float32), time per call in microseconds (slowest rank, best of "
                  f"{args.reps} rounds; overhead: median over rounds of kaitian - C API)")
            print(f"  {'size':>8s} {'C API':>11s} {'kaitian':>11s} {'overhead':>9s} {'gloo':>11s} "
                  f"{'gloo/kt':>9s}")
        bench_allreduce(gloo, args.scale, args.reps, args.max_bytes)
        bench_overhead(singles[rank], args.scale)
    if not args.skip_ddp:
        views = {"off": [False], "on": [True], "both": [False, True]}[args.bucket_view]
        results = bench_ddp((("kaitian", None), ("gloo", gloo), ("none", None)), args.steps, views,
                            args.batch)
        if rank == 0:
            n = sum(p.numel() for p in _Model().parameters())
            print(f"\nDDP step of a fixed MLP ({n / 1e6:.2f} M parameters, {n * 4 / 2**20:.1f} MiB of "
                  f"gradients, batch {args.batch}), milliseconds, the slowest rank per step, median of "
                  f"{args.steps} steps, configurations taking turns every 5; comm: median of (step - the "
                  f"same step under no_sync)")
            print(f"  {'backend':>8s} {'bucket view':>12s} {'step':>8s} {'compute':>8s} {'comm':>8s}")
            for (name, view), (total, compute, comm) in results.items():
                print(f"  {name:>8s} {'yes' if view else 'no':>12s} {total * 1e3:8.2f} {compute * 1e3:8.2f} "
                      f"{comm * 1e3:8.2f}")
            print("  (none: DDP with a comm hook that does not communicate; its comm is DDP's own work "
                  "per step, part of every backend's)")
            moved = len(dist.distributed_c10d._get_default_group()._sharer.registered)
            print(f"  (kaitian: {moved} gradient bucket(s) moved into shared memory and registered, so their "
                  f"all_reduce runs single-copy; KAITIAN_SHARE_BUCKETS=0 turns that off)")
        mc = _memcpy_time(sum(p.numel() for p in _Model().parameters()))
        if rank == 0:
            print(f"  one memcpy of the gradients, every rank at once: {mc * 1e3:.2f} ms (slowest rank, "
                  "median of 30)")
            for view in views:
                kc, gc, nc = (results[be, view][2] for be in ("kaitian", "gloo", "none"))
                ratio = f"{gc / kc:.1f}x" if kc > 0 else "n/a (kaitian's exposed communication rounds to 0)"
                bound = f"{gc / nc:.1f}x" if nc > 0 else "unbounded"
                print(f"  communication per step, gradient_as_bucket_view={view}: gloo / kaitian = {ratio} "
                      f"(gloo / none = {bound}: the most any backend can reach); kaitian - none = "
                      f"{(kc - nc) * 1e3:.2f} ms = {(kc - nc) / mc:.2f} memcpy of the gradients")
    dist.barrier()
    dist.destroy_process_group()


_OTHER = {"--hetero": "_bench_hetero", "--optim": "_bench_optim", "--zero": "_bench_zero",
          "--pipeline": "_bench_pipeline", "--device": "_bench_device"}


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    for flag, module in _OTHER.items():  # the other benchmarks, with their own options
        if flag in argv:
            import importlib
            argv.remove(flag)
            return importlib.import_module(f"{__package__}.{module}").main(argv)
    ap = argparse.ArgumentParser(prog="python -m torch_kaitian.bench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", "--nproc", type=int, default=2, help="ranks to fork (default 2)")
    ap.add_argument("--steps", type=int, default=40, help="DDP steps measured (default 40)")
    ap.add_argument("--batch", type=int, default=8, help="DDP step: samples per rank (default 8)")
    ap.add_argument("--reps", type=int, default=5, help="timing rounds per size")
    ap.add_argument("--scale", type=float, default=1.0, help="multiply iteration counts")
    ap.add_argument("--threads", type=int, default=0, help="torch threads per rank")
    ap.add_argument("--max-bytes", type=int, default=64 << 20, help="largest all_reduce size")
    ap.add_argument("--skip-allreduce", action="store_true")
    ap.add_argument("--skip-ddp", action="store_true")
    ap.add_argument("--bucket-view", choices=("off", "on", "both"), default="both",
                    help="DDP's gradient_as_bucket_view (on: no copy of the reduced buckets back to "
                         "the gradients); both (default) measures the two")
    args = ap.parse_args(argv)
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        _run(args)
        return 0
    codes = fork_ranks(args.nproc, _worker, args)  # bound as `kaitian run` binds them
    return 1 if any(codes) else 0


if __name__ == "__main__":
    sys.exit(main())
