"""python -m torch_kaitian.bench --zero - ZeroOptimizer against torch's own
ZeroRedundancyOptimizer and plain DDP, same model and batch, over kaitian and
gloo, at 2 and 4 ranks, in one run.

Each configuration is a fresh job of forked ranks (each bound to its own block
of CPUs when there are enough), so peak memory is its own: reported are the
median step time of the slowest rank, the per-rank peak resident memory
(VmHWM, reset after the model is built, so it counts what training adds: the
gradients, the optimizer state, buffers in flight) and the optimizer state
bytes of rank 0. DDP and ZeroRedundancyOptimizer run under DDP; ZeroOptimizer
runs without it (stage 1 and 2 reduce the gradients themselves).

--shard-weights memory|w0,w1,...: instead, ZeroOptimizer stage 2 with equal
parts against parts by those weights ("memory": each rank's free memory), per
rank: the optimizer state held and the peak resident memory training added.
"""
import argparse
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn

CONFIGS = [  # (name, backend, kind)
    ("DDP + AdamW", "gloo", "ddp"),
    ("DDP + AdamW", "kaitian", "ddp"),
    ("DDP + ZeroRedundancyOptimizer", "gloo", "zro"),
    ("DDP + ZeroRedundancyOptimizer", "kaitian", "zro"),
    ("ZeroOptimizer stage 1", "kaitian", "zero1"),
    ("ZeroOptimizer stage 2", "kaitian", "zero2"),
    ("ZeroOptimizer stage 2", "gloo", "zero2"),
    ("ZeroOptimizer stage 2 + offload", "kaitian", "zero2off"),
]


def _model(width, depth):
    torch.manual_seed(0)
    layers = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*layers)


def _hwm_kib():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return 0


def _reset_hwm():
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def _state_bytes(opt):
    from torch_kaitian.parallel import ZeroOptimizer
    if isinstance(opt, ZeroOptimizer):
        return opt.memory_bytes()["state"]
    inner = getattr(opt, "optim", opt)  # ZeroRedundancyOptimizer keeps its local optimizer there
    return sum(t.numel() * t.element_size() for st in inner.state.values() for t in st.values()
               if torch.is_tensor(t))


def _job(rank, world, port, cpus, args, kind, backend, out, weights=None):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world))
    if cpus:
        os.sched_setaffinity(0, cpus)
    torch.set_num_threads(len(cpus) if cpus else 1)
    import torch_kaitian  # noqa: F401
    from torch_kaitian.parallel import ZeroOptimizer
    dist.init_process_group(backend)
    model = _model(args.width, args.depth)
    x = torch.randn(args.batch, args.width)
    _reset_hwm()
    base = _hwm_kib()
    adam = dict(lr=1e-4)
    if kind == "ddp":
        net = nn.parallel.DistributedDataParallel(model)
        opt = torch.optim.AdamW(model.parameters(), **adam)
    elif kind == "zro":
        from torch.distributed.optim import ZeroRedundancyOptimizer
        net = nn.parallel.DistributedDataParallel(model)
        opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW, **adam)
    else:
        net = model
        inner = torch.optim.AdamW
        if kind == "zero2off":
            try:
                from torch_kaitian.optim import CPUAdam
                inner = CPUAdam
            except ImportError:
                pass
        opt = ZeroOptimizer(model.parameters(), inner, stage=1 if kind == "zero1" else 2,
                            offload=kind == "zero2off", shard_weights=weights, **adam)
    times = []
    for s in range(args.warmup + args.steps):
        dist.barrier()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        net(x).square().mean().backward()
        opt.step()
        times.append(time.perf_counter() - t0)
    med = torch.tensor([statistics.median(times[args.warmup:])], dtype=torch.float64)
    dist.all_reduce(med, op=dist.ReduceOp.MAX)
    mine = (float(_hwm_kib() - base) * 1024, _state_bytes(opt))
    every = [None] * world
    dist.all_gather_object(every, mine)
    if rank == 0:
        out.put((med.item(), max(e[0] for e in every), every[0][1], every))
    del net, opt
    dist.destroy_process_group()


def _run_config(world, args, kind, backend, weights=None):
    import torch.multiprocessing as mp
    from .bench import fork_ranks
    q = mp.get_context("fork").Queue()
    if any(fork_ranks(world, _job, args, kind, backend, q, weights)):
        return None
    return q.get()


def _weights(args, world):
    if args.shard_weights == "memory":
        return "memory"
    w = [float(x) for x in args.shard_weights.split(",")]
    if len(w) != world:
        sys.exit(f"bench --zero: --shard-weights {args.shard_weights} has {len(w)} weights for "
                 f"{world} ranks")
    return w


def _by_weight(args, worlds):
    for world in worlds:
        w = _weights(args, world)
        print(f"\n{world} ranks, ZeroOptimizer stage 2 over kaitian: equal parts against weights "
              f"{args.shard_weights}")
        print(f"  {'split':<10s} {'step ms':>9s}   " + "  ".join(
            f"{'rank ' + str(r) + ' state/peak MiB':>24s}" for r in range(world)))
        for name, weights in (("equal", None), ("weighted", w)):
            r = _run_config(world, args, "zero2", "kaitian", weights)
            if r is None:
                print(f"  {name:<10s} {'failed':>9s}")
                continue
            cells = "  ".join(f"{st / 2**20:11.1f} / {pk / 2**20:10.1f}" for pk, st in r[3])
            print(f"  {name:<10s} {r[0] * 1e3:9.1f}   {cells}", flush=True)
    return 0


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m torch_kaitian.bench --zero", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--world", default="2,4", help="world sizes (default 2,4)")
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--depth", type=int, default=8, help="Linear layers (default 8: 8.4 M params)")
    ap.add_argument("--batch", type=int, default=16, help="samples per rank")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--shard-weights", help="memory or w0,w1,...: equal against weighted parts")
    args = ap.parse_args(argv)
    if args.shard_weights:
        return _by_weight(args, [int(w) for w in args.world.split(",")])
    n = sum(p.numel() for p in _model(args.width, args.depth).parameters())
    print(f"torch_kaitian bench --zero: MLP {args.depth} x Linear({args.width}, {args.width}) = "
          f"{n / 1e6:.1f} M parameters ({n * 4 / 2**20:.0f} MiB fp32), AdamW, batch {args.batch} "
          f"per rank; median of {args.steps} steps (slowest rank), peak RSS added by training "
          f"(largest rank), optimizer state of rank 0")
    for world in [int(w) for w in args.world.split(",")]:
        print(f"\n{world} ranks")
        print(f"  {'configuration':<34s} {'backend':>8s} {'step ms':>9s} {'peak MiB':>9s} "
              f"{'state MiB':>10s}")
        res = {}
        for name, backend, kind in CONFIGS:
            r = _run_config(world, args, kind, backend)
            res[kind, backend] = r
            if r is None:
                print(f"  {name:<34s} {backend:>8s} {'failed':>9s}")
                continue
            print(f"  {name:<34s} {backend:>8s} {r[0] * 1e3:9.1f} {r[1] / 2**20:9.1f} "
                  f"{r[2] / 2**20:10.1f}", flush=True)
        z, g = res.get(("zero2", "kaitian")), res.get(("zro", "gloo"))
        if z and g:
            print(f"  ZeroOptimizer stage 2 over kaitian against ZeroRedundancyOptimizer over gloo: "
                  f"{g[0] / z[0]:.2f}x faster per step (goal >= 2x), peak memory {z[1] / g[1]:.2f}x "
                  f"of its (goal <= 1)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
