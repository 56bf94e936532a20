#!/usr/bin/python3
"""gloo_allreduce.py - time torch.distributed all_reduce over gloo, the way
`kaitian bench -C allreduce` times KaiTian, and print the same CSV lines.

Run under the launcher, which sets MASTER_ADDR/MASTER_PORT/RANK/WORLD_SIZE:

    kaitian run -n 2 /usr/bin/python3 bench/gloo_allreduce.py -b 8 -e 64M

Time per size = the average over -n iterations (after -w warm-up iterations
and a barrier) of one all_reduce, on the slowest rank (max over ranks of each
rank's CLOCK_MONOTONIC average). Data lines, printed by rank 0 only:

    allreduce,size,count,float32,sum,-1,time_us,algbw_GBps,busbw_GBps,N/A

busbw = algbw * 2(n-1)/n as in kaitian bench. gloo's all_reduce is in place,
so compare with `kaitian bench -I`. After timing, each size is checked once
(every rank contributes rank+1, the sum must be n(n+1)/2 everywhere) so that
a misconfigured run cannot report a fast no-op.
"""
import argparse
import os
import sys
import time

import torch
import torch.distributed as dist


def parse_size(text):
    """Bytes with an optional K/M/G suffix (powers of 1024), as kaitian bench."""
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    s = text.strip()
    mult = 1
    if s and s[-1].lower() in units:
        mult = units[s[-1].lower()]
        s = s[:-1]
    if not s.isdigit():
        raise argparse.ArgumentTypeError("expected a size in bytes with an optional K, M or G "
                                         "suffix, got %r" % text)
    return int(s) * mult


def positive(text):
    v = int(text)
    if v < 1:
        raise argparse.ArgumentTypeError("must be at least 1, got %r" % text)
    return v


def non_negative(text):
    v = int(text)
    if v < 0:
        raise argparse.ArgumentTypeError("must be at least 0, got %r" % text)
    return v


def now_us():
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC) / 1e3


def time_size(tensor, iters, warmup):
    for _ in range(warmup):
        dist.all_reduce(tensor)
    dist.barrier()
    t0 = now_us()
    for _ in range(iters):
        dist.all_reduce(tensor)
    local = torch.tensor([(now_us() - t0) / iters], dtype=torch.float64)
    dist.all_reduce(local, op=dist.ReduceOp.MAX)
    return local.item()


def check_size(tensor, rank, nranks):
    tensor.fill_(rank + 1)
    dist.all_reduce(tensor)
    want = nranks * (nranks + 1) / 2
    bad = int((tensor != want).sum().item())
    if bad:
        sys.stderr.write("gloo_allreduce.py: rank %d: %d of %d elements wrong after all_reduce "
                         "(expected %g, first got %g)\n"
                         % (rank, bad, tensor.numel(), want, tensor[tensor != want][0].item()))
    return bad


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-b", "--minbytes", type=parse_size, default=8)
    ap.add_argument("-e", "--maxbytes", type=parse_size, default=32 << 20)
    ap.add_argument("-f", "--stepfactor", type=int, default=2)
    ap.add_argument("-n", "--iters", type=positive, default=20)
    ap.add_argument("-w", "--warmup_iters", type=non_negative, default=5)
    args = ap.parse_args()
    if args.stepfactor < 2:
        ap.error("-f must be at least 2")

    dist.init_process_group("gloo", init_method="env://")
    rank, nranks = dist.get_rank(), dist.get_world_size()
    if rank == 0:
        print("# gloo all_reduce, torch %s, ranks %d, GLOO_SOCKET_IFNAME=%s, warm-up %d, iters %d"
              % (torch.__version__, nranks, os.environ.get("GLOO_SOCKET_IFNAME", ""),
                 args.warmup_iters, args.iters))
        print("# collective,size,count,type,redop,root,time,algbw,busbw,#wrong")
        sys.stdout.flush()
    factor = 2.0 * (nranks - 1) / nranks
    wrong = 0
    size = args.minbytes
    while size <= args.maxbytes:
        count = size // 4
        if count:
            tensor = torch.zeros(count, dtype=torch.float32)
            us = time_size(tensor, args.iters, args.warmup_iters)
            wrong += check_size(tensor, rank, nranks)
            algbw = count * 4 / us / 1e3
            if rank == 0:
                print("allreduce,%d,%d,float32,sum,-1,%.3f,%.4f,%.4f,N/A"
                      % (count * 4, count, us, algbw, algbw * factor))
                sys.stdout.flush()
        size = size * args.stepfactor if size else 1
    dist.destroy_process_group()
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
