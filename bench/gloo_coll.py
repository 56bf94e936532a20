#!/usr/bin/python3
"""gloo_coll.py - time torch.distributed collectives over gloo the way
`kaitian bench` times KaiTian's, and print the same CSV lines (rank 0):

    collective,size,count,float32,sum,root,time_us,algbw_GBps,busbw_GBps,N/A

Run under a launcher that sets the env:// variables, e.g.

    kaitian run -n 2 bench/gloo_coll.py -C allreduce,allgather -b 64K -e 64M

Sizes as `kaitian bench` counts them: allreduce and broadcast move `size`
bytes per rank; for allgather and reduce_scatter `size` is the whole n x count
buffer (allgather's output, reduce_scatter's input). Time = the slowest
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

COLLS = ("allreduce", "allgather", "reduce_scatter", "broadcast")


def parse_size(text):
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    s = text.strip()
    mult = units.get(s[-1:].lower(), 1)
    if mult > 1:
        s = s[:-1]
    if not s.isdigit():
        raise argparse.ArgumentTypeError(f"expected a size with an optional K, M or G suffix, got {text!r}")
    return int(s) * mult


def op_for(coll, n, count):
    """The call to time and a checker of its result, for `count` elements per rank."""
    rank = dist.get_rank()
    if coll == "allreduce":
        t = torch.zeros(count)

        def run():
            dist.all_reduce(t)

        def check():
            t.fill_(rank + 1)
            dist.all_reduce(t)
            return int((t != n * (n + 1) / 2).sum())
        return run, check, 2.0 * (n - 1) / n, count * 4
    if coll == "broadcast":
        t = torch.zeros(count)

        def run():
            dist.broadcast(t, 0)

        def check():
            t.fill_(7 if rank == 0 else 0)
            dist.broadcast(t, 0)
            return int((t != 7).sum())
        return run, check, 1.0, count * 4
    if coll == "allgather":
        mine = torch.zeros(count)
        out = [torch.zeros(count) for _ in range(n)]

        def run():
            dist.all_gather(out, mine)

        def check():
            mine.fill_(rank + 1)
            dist.all_gather(out, mine)
            return sum(int((o != k + 1).sum()) for k, o in enumerate(out))
        return run, check, (n - 1) / n, count * 4 * n
    if coll == "reduce_scatter":
        out = torch.zeros(count)
        ins = [torch.zeros(count) for _ in range(n)]

        def run():
            dist.reduce_scatter(out, ins)

        def check():
            for k, t in enumerate(ins):
                t.fill_(rank + k)
            dist.reduce_scatter(out, ins)
            return int((out != sum(r + rank for r in range(n))).sum())
        return run, check, (n - 1) / n, count * 4 * n
    raise ValueError(coll)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-C", "--coll", default="allreduce")
    ap.add_argument("-b", "--minbytes", type=parse_size, default=64 << 10)
    ap.add_argument("-e", "--maxbytes", type=parse_size, default=64 << 20)
    ap.add_argument("-f", "--stepfactor", type=int, default=4)
    ap.add_argument("-n", "--iters", type=int, default=10)
    ap.add_argument("-w", "--warmup_iters", type=int, default=3)
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
    for coll in colls:
        size = args.minbytes
        while size <= args.maxbytes:
            per_rank = size // 4 // (n if coll in ("allgather", "reduce_scatter") else 1)
            if per_rank:
                try:
                    run, check, factor, nbytes = op_for(coll, n, per_rank)
                    for _ in range(args.warmup_iters):
                        run()
                    dist.barrier()
                    t0 = time.monotonic_ns()
                    for _ in range(args.iters):
                        run()
                    local = torch.tensor([(time.monotonic_ns() - t0) / 1e3 / args.iters], dtype=torch.float64)
                    dist.all_reduce(local, op=dist.ReduceOp.MAX)
                    us = local.item()
                    wrong += check()
                except RuntimeError as e:
                    if rank == 0:
                        print(f"# {coll}: unsupported by gloo here: {str(e).splitlines()[0]}", flush=True)
                    break
                if rank == 0:
                    algbw = nbytes / us / 1e3
                    print(f"{coll},{nbytes},{per_rank},float32,sum,{0 if coll == 'broadcast' else -1},"
                          f"{us:.3f},{algbw:.4f},{algbw * factor:.4f},N/A", flush=True)
            size *= args.stepfactor
    dist.destroy_process_group()
    if wrong:
        print(f"gloo_coll.py: rank {rank}: {wrong} wrong elements", file=sys.stderr)
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
