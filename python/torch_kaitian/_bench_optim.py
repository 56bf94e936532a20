"""python -m torch_kaitian.bench --optim - one Adam step over float32
parameters: torch_kaitian.optim.CPUAdam (the C kernels of src/optim) against
torch's AdamW (foreach=False, foreach=True, and fused=True where this torch
has it on the CPU), and against the memory-bandwidth bound, in one run.

An Adam step streams 28 bytes per float32 parameter (reads param, grad,
exp_avg, exp_avg_sq: 16; writes param, exp_avg, exp_avg_sq: 12), so its
bound is 28 x params / bandwidth, with the bandwidth of a copy larger than
the caches measured in the same run on as many threads: (bytes read + bytes
written) / time, the better of torch's copy_ and a split memmove. torch runs
on the same number of threads as CPUAdam. Small sizes can beat the bound
(their 28 x params bytes partly stay in the caches between steps), and so
can large ones where the copy's stores read each destination line first
(write-allocate: 1.5x the bytes counted) while Adam's stores go to lines it
has just read. Each
figure is the median of --reps steps after one untimed step (the first
allocates the state). Sizes: K, M, G are 2^10, 2^20, 2^30.
"""
import argparse
import concurrent.futures
import ctypes
import gc
import os
import statistics
import time

import torch

from .optim import CPUAdam

BYTES_PER_PARAM = 28


def _parse_size(s):
    s = s.strip().upper()
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(s[-1:], 1)
    return int(float(s[:-1] if s[-1:] in "KMG" else s) * mult)


def _fmt_params(n):
    for unit, s in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= s and n % s == 0:
            return f"{n // s} {unit}"
    return str(n)


def _median_step(opt, reps):
    opt.step()  # allocates the state: not timed
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        opt.step()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _time_optimizer(n, reps, make):
    """Median seconds per step of make([param]) on n parameters (the
    parameter, its gradient and the state freed afterwards)."""
    gen = torch.Generator().manual_seed(0)
    p = torch.nn.Parameter(torch.randn(n, generator=gen))
    p.grad = torch.randn(n, generator=gen)
    try:
        return _median_step(make([p]), reps)
    finally:
        del p
        gc.collect()


def _best_time(fn, reps):
    fn()
    times = []
    for _ in range(max(reps, 3)):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def _copy_bandwidth(nbytes, reps, threads):
    """Bytes moved per second (read + write) copying nbytes: the better of
    torch's copy_ (on torch's threads) and memmove split across `threads`
    Python threads (ctypes releases the GIL), each the best of max(reps, 3)."""
    n = nbytes // 4
    src, dst = torch.ones(n), torch.empty(n)
    t_torch = _best_time(lambda: dst.copy_(src), reps)
    step = -(-n // threads)
    chunks = [(dst.data_ptr() + 4 * i, src.data_ptr() + 4 * i, 4 * min(step, n - i))
              for i in range(0, n, step)]
    with concurrent.futures.ThreadPoolExecutor(len(chunks)) as pool:
        def copy_all():
            list(pool.map(lambda c: ctypes.memmove(*c), chunks))
        t_memmove = _best_time(copy_all, reps)
    return 2 * 4 * n / min(t_torch, t_memmove), 2 * 4 * n / t_torch, 2 * 4 * n / t_memmove


def _torch_impls():
    impls = [("foreach=False", lambda ps: torch.optim.AdamW(ps, lr=1e-3, foreach=False)),
             ("foreach=True", lambda ps: torch.optim.AdamW(ps, lr=1e-3, foreach=True))]
    try:
        p = torch.nn.Parameter(torch.zeros(4))
        p.grad = torch.zeros(4)
        torch.optim.AdamW([p], lr=1e-3, fused=True).step()
        impls.append(("fused=True", lambda ps: torch.optim.AdamW(ps, lr=1e-3, fused=True)))
    except (RuntimeError, TypeError, ValueError):
        pass  # fused AdamW is CUDA-only before torch 2.4
    return impls


def _ms(t):
    return f"{t * 1e3:.2f}"


def _threads(threads):
    """What CPUAdam uses: --threads, else KAITIAN_OPTIM_THREADS, else the CPUs
    of this process's affinity mask."""
    if threads > 0:
        return threads
    env = os.environ.get("KAITIAN_OPTIM_THREADS", "")
    if env.strip().isdigit() and int(env) > 0:
        return int(env)
    return len(os.sched_getaffinity(0))


def run(sizes, reps, threads, copy_mib):
    nthreads = _threads(threads)
    torch.set_num_threads(nthreads)  # the same CPUs for torch as for CPUAdam
    impls = _torch_impls()
    names = [name for name, _ in impls]
    bw, bw_torch, bw_memmove = _copy_bandwidth(copy_mib << 20, reps, nthreads)
    print(f"{nthreads} threads for CPUAdam and torch {torch.__version__}; AdamW lr 1e-3, "
          f"weight_decay 0.01; median of {reps} steps")
    print(f"copy of {copy_mib} MiB, read + write: torch copy_ {bw_torch / 1e9:.1f} GB/s, memmove "
          f"on {nthreads} threads {bw_memmove / 1e9:.1f} GB/s; bound: {BYTES_PER_PARAM} bytes per "
          f"parameter at {bw / 1e9:.1f} GB/s")
    if "fused=True" not in names:
        print("(this torch has no fused AdamW on the CPU)")
    head = (f"{'params':>8} {'ours ms':>9} " + " ".join(f"{n + ' ms':>17}" for n in names)
            + f" {'bound ms':>9} {'ours/bound':>10} {'speedup':>8}")
    print(head)
    for n in sizes:
        ours = _time_optimizer(n, reps, lambda ps: CPUAdam(ps, lr=1e-3, weight_decay=0.01,
                                                           threads=nthreads))
        theirs = [_time_optimizer(n, reps, make) for _, make in impls]
        bound = BYTES_PER_PARAM * n / bw
        best = min(theirs)
        frac = f"{100 * bound / ours:.0f}%"
        speedup = f"{best / ours:.2f}x"
        print(f"{_fmt_params(n):>8} {_ms(ours):>9} " + " ".join(f"{_ms(t):>17}" for t in theirs)
              + f" {bound * 1e3:9.2f} {frac:>10} {speedup:>8}", flush=True)
    print("ours/bound: the bandwidth bound's time over ours (100% = at the bound); speedup: "
          "torch's fastest over ours")


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m torch_kaitian.bench --optim", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1M,4M,16M,64M,256M",
                    help="parameter counts, comma-separated (default 1M,4M,16M,64M,256M)")
    ap.add_argument("--reps", type=int, default=5, help="timed steps per measurement (default 5)")
    ap.add_argument("--copy-mib", type=int, default=256,
                    help="MiB copied to measure the bandwidth (default 256; beyond the caches)")
    ap.add_argument("--threads", type=int, default=0,
                    help="CPUAdam threads (default 0: KAITIAN_OPTIM_THREADS, else every CPU "
                         "this process may use)")
    args = ap.parse_args(argv)
    if args.reps < 1 or args.threads < 0 or args.copy_mib < 1:
        ap.error("--reps and --copy-mib must be >= 1, --threads >= 0")
    run([_parse_size(s) for s in args.sizes.split(",") if s.strip()], args.reps, args.threads,
        args.copy_mib)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
