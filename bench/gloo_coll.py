#!/usr/bin/python3
"""gloo_coll.py - time torch.distributed collectives over gloo the way
`kaitian bench` times KaiTian's, and print the same CSV lines (rank 0):

    collective,size,count,float32,sum,root,time_us,algbw_GBps,busbw_GBps,N/A

Run under a launcher that sets the env:// variables, e.g.

    kaitian run -n 2 bench/gloo_coll.py -C allreduce,allgather -b 64K -e 64M

Sizes as `kaitian bench` counts them: allreduce, broadcast and reduce move
`size` bytes per rank; for allgather, reduce_scatter, alltoall, gather and
scatter `size` is the whole n x count buffer; barrier is one row of size 0.
-d bfloat16 times torch.bfloat16 tensors. Time = the slowest
rank's average over -n iterations after -w warm-up ones and a barrier; busbw
= algbw x 2(n-1)/n (allreduce), (n-1)/n (allgather, reduce_scatter), 1
(broadcast). Each size is checked once after timing, so that a misconfigured
run cannot report a fast no-op. (gloo has no reduce_scatter on torch 1.13:
that collective is reported as unsupported there.)
"""
import argparse
import os
import sys
import time

import torch
import torch.distributed as dist

COLLS = ("allreduce", "broadcast", "reduce", "allgather", "reduce_scatter", "alltoall", "gather", "scatter",
         "barrier")
TOTAL = ("allgather", "reduce_scatter", "alltoall", "gather", "scatter")  # size = the n blocks
DTYPES = {"float": torch.float32, "float32": torch.float32, "bfloat16": torch.bfloat16}


def parse_size(text):
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    s = text.strip()
    mult = units.get(s[-1:].lower(), 1)
    if mult > 1:
        s = s[:-1]
    if not s.isdigit():
        raise argparse.ArgumentTypeError(f"expected a size with an optional K, M or G suffix, got {text!r}")
    return int(s) * mult


def op_for(coll, n, count, dtype=torch.float32):
    """The call to time and a checker of its result, for `count` elements per rank."""
    rank = dist.get_rank()
    es = torch.tensor([], dtype=dtype).element_size()

    def zeros(k):
        return torch.zeros(k, dtype=dtype)
    if coll == "barrier":
        def run():
            dist.barrier()
        return run, lambda: 0, 0.0, 0
    if coll == "reduce":
        t = zeros(count)

        def run():
            dist.reduce(t, 0)

        def check():
            t.fill_(rank + 1)
            dist.reduce(t, 0)
            return int((t != n * (n + 1) / 2).sum()) if rank == 0 else 0
        return run, check, 1.0, count * es
    if coll == "alltoall":
        src, dst = zeros(count * n), zeros(count * n)

        def run():
            dist.all_to_all_single(dst, src)

        def check():
            for k in range(n):
                src[k * count:(k + 1) * count] = rank * n + k
            dist.all_to_all_single(dst, src)
            return sum(int((dst[k * count:(k + 1) * count] != k * n + rank).sum()) for k in range(n))
        return run, check, (n - 1) / n, count * es * n
    if coll == "gather":
        mine = zeros(count)
        out = [zeros(count) for _ in range(n)] if rank == 0 else None

        def run():
            dist.gather(mine, out, 0)

        def check():
            mine.fill_(rank + 1)
            dist.gather(mine, out, 0)
            return sum(int((o != k + 1).sum()) for k, o in enumerate(out)) if rank == 0 else 0
        return run, check, (n - 1) / n, count * es * n
    if coll == "scatter":
        mine = zeros(count)
        ins = [zeros(count) for _ in range(n)] if rank == 0 else None

        def run():
            dist.scatter(mine, ins, 0)

        def check():
            if rank == 0:
                for k, t in enumerate(ins):
                    t.fill_(k + 1)
            dist.scatter(mine, ins, 0)
            return int((mine != rank + 1).sum())
        return run, check, (n - 1) / n, count * es * n
    if coll == "allreduce":
        t = zeros(count)

        def run():
            dist.all_reduce(t)

        def check():
            t.fill_(rank + 1)
            dist.all_reduce(t)
            return int((t != n * (n + 1) / 2).sum())
        return run, check, 2.0 * (n - 1) / n, count * es
    if coll == "broadcast":
        t = zeros(count)

        def run():
            dist.broadcast(t, 0)

        def check():
            t.fill_(7 if rank == 0 else 0)
            dist.broadcast(t, 0)
            return int((t != 7).sum())
        return run, check, 1.0, count * es
    if coll == "allgather":
        mine = zeros(count)
        out = [zeros(count) for _ in range(n)]

        def run():
            dist.all_gather(out, mine)

        def check():
            mine.fill_(rank + 1)
            dist.all_gather(out, mine)
            return sum(int((o != k + 1).sum()) for k, o in enumerate(out))
        return run, check, (n - 1) / n, count * es * n
    if coll == "reduce_scatter":
        out = zeros(count)
        ins = [zeros(count) for _ in range(n)]

        def run():
            dist.reduce_scatter(out, ins)

        def check():
            for k, t in enumerate(ins):
                t.fill_(rank + k)
            dist.reduce_scatter(out, ins)
            return int((out != sum(r + rank for r in range(n))).sum())
        return run, check, (n - 1) / n, count * es * n
    raise ValueError(coll)


def at_least(n, want, size):
    """n, or more iterations where n of size bytes fall short of want bytes
    (--iters-bytes, --warmup-bytes), as kaitian bench counts them."""
    if not want or not size:
        return n
    return max(n, -(-want // size))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-C", "--coll", default="allreduce")
    ap.add_argument("-b", "--minbytes", type=parse_size, default=64 << 10)
    ap.add_argument("-e", "--maxbytes", type=parse_size, default=64 << 20)
    ap.add_argument("-f", "--stepfactor", type=int, default=4)
    ap.add_argument("-n", "--iters", type=int, default=10)
    ap.add_argument("-w", "--warmup_iters", type=int, default=3)
    ap.add_argument("--iters-bytes", type=parse_size, default=0,
                    help="at least this many bytes' worth of timed iterations per size (as kaitian bench)")
    ap.add_argument("--warmup-bytes", type=parse_size, default=0,
                    help="the same for the warm-up")
    ap.add_argument("-d", "--datatype", default="float32", choices=sorted(DTYPES))
    ap.add_argument("-I", "--inplace", action="store_true",
                    help="accepted for kaitian bench's command line: allreduce, broadcast and reduce are in "
                         "place in torch, the others are not")
    ap.add_argument("--csv", action="store_true", help="accepted; the output is always CSV")
    args = ap.parse_args()
    colls = args.coll.split(",")
    for c in colls:
        if c not in COLLS:
            ap.error(f"unknown collective {c!r} (have {', '.join(COLLS)})")
    dist.init_process_group("gloo", init_method="env://")
    rank, n = dist.get_rank(), dist.get_world_size()
    if rank == 0:
        print(f"# gloo, torch {torch.__version__}, ranks {n}, GLOO_SOCKET_IFNAME="
              f"{os.environ.get('GLOO_SOCKET_IFNAME', '')}", flush=True)
    wrong = 0
    dtype = DTYPES[args.datatype]
    es = torch.tensor([], dtype=dtype).element_size()
    dname = "bfloat16" if dtype == torch.bfloat16 else "float32"
    for coll in colls:
        size = 0 if coll == "barrier" else args.minbytes
        while size <= args.maxbytes:
            per_rank = size // es // (n if coll in TOTAL else 1)
            if per_rank or coll == "barrier":
                try:
                    run, check, factor, nbytes = op_for(coll, n, per_rank, dtype)
                    warmup = at_least(args.warmup_iters, args.warmup_bytes, nbytes)
                    iters = at_least(args.iters, args.iters_bytes, nbytes)
                    for _ in range(warmup):
                        run()
                    dist.barrier()
                    t0 = time.monotonic_ns()
                    for _ in range(iters):
                        run()
                    local = torch.tensor([(time.monotonic_ns() - t0) / 1e3 / iters], dtype=torch.float64)
                    dist.all_reduce(local, op=dist.ReduceOp.MAX)
                    us = local.item()
                    wrong += check()
                except RuntimeError as e:
                    if rank == 0:
                        print(f"# {coll}: unsupported by gloo here: {str(e).splitlines()[0]}", flush=True)
                    break
                if rank == 0:
                    algbw = nbytes / us / 1e3
                    rooted = coll in ("broadcast", "reduce", "gather", "scatter")
                    print(f"{coll},{nbytes},{per_rank},{dname},sum,{0 if rooted else -1},"
                          f"{us:.3f},{algbw:.4f},{algbw * factor:.4f},N/A", flush=True)
            if coll == "barrier":
                break
            size *= args.stepfactor
    dist.destroy_process_group()
    if wrong:
        print(f"gloo_coll.py: rank {rank}: {wrong} wrong elements", file=sys.stderr)
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
