"""python -m torch_kaitian.bench --pipeline - the GPT example
(examples/train_gpt.py) as a pipeline, in one run:

  1. the bubble: step time at pipe P (tensor 1, data 1) with M microbatches,
     against the ideal (M + P - 1) / M times the step of the whole model on one
     rank divided by P (stages perfectly balanced, communication free), over
     kaitian and gloo;
  2. tensor 2: pipe 2 x tensor 2, kaitian against gloo;
  3. activation memory: the first stage's count of microbatches held at once
     with 1F1B and with GPipe (times the bytes of one microbatch's activations).

With --balance instead: stages sized by speed (parallel.balance) against the
equal cut, on forked ranks each bound to its own CPUs, rank r slowed by
--slow[r] (a factor k: k - 1 busy processes share the rank's CPUs): the step
time of a pipeline of --balance-layers equal layers with each cut, their
ratio (goal >= 1.3x where the slowest stage decides the step) and what
balance() predicted.

Each configuration is a `kaitian run` of the example (CLI: --cli, default the
build tree's kaitian or the one on PATH); the step time is the median over
--steps steps after the first 2. Ranks beyond the host's CPUs share them, so
the bubble is only meaningful where P x tensor <= CPUs (marked otherwise).
"""
import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))


def _cli(given):
    if given:
        return given
    for cand in (os.path.join(ROOT, "build", "kaitian"), shutil.which("kaitian")):
        if cand and os.access(cand, os.X_OK):
            return cand
    sys.exit("bench --pipeline: no kaitian command (give --cli)")


def _run(args, n, extra):
    cmd = [args.cli, "run", "-n", str(n), args.example, "--steps", str(args.steps + 2),
           "--global-batch", str(args.global_batch), "--layers", str(args.layers),
           "--d-model", str(args.d_model), "--context", str(args.context)] + extra
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=1800)
    if p.returncode != 0:
        print(p.stdout[-2000:], file=sys.stderr)
        return None, None
    rates = [float(x) for x in re.findall(r"loss [0-9.]+ +([0-9.]+) tokens/s", p.stdout)][2:]
    held = re.findall(r"at most (\d+) microbatches", p.stdout)
    tokens = args.global_batch * args.context
    step = statistics.median(tokens / r for r in rates) if rates else None
    return step, int(held[0]) if held else None


def _balance_job(rank, world, port, cpus, args, out):
    import subprocess as sp
    import time

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world))
    if cpus:
        os.sched_setaffinity(0, cpus)
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    import torch_kaitian  # noqa: F401
    from torch_kaitian.parallel import Pipeline, StagePlan, balance
    torch.set_num_threads(len(cpus) if cpus else 1)
    dist.init_process_group(args.backend)
    slow = [float(x) for x in args.slow.split(",")] + [1.0] * world
    busy = []
    mine = cpus or sorted(os.sched_getaffinity(0))
    for i in range(int(round(slow[rank])) - 1):
        c = mine[i % len(mine)]
        busy.append(sp.Popen([sys.executable, "-c", "while True: pass"],
                             preexec_fn=lambda c=c: os.sched_setaffinity(0, {c})))
    try:
        torch.manual_seed(0)
        w = args.balance_width
        layers = [nn.Sequential(nn.Linear(w, w), nn.Tanh()) for _ in range(args.balance_layers)]
        mb = args.balance_batch // args.balance_microbatches
        plan = balance(layers, torch.randn(mb, w), device="cpu", seconds=0.2)
        n, p = len(layers), world
        eq = [(round(i * n / p), round((i + 1) * n / p)) for i in range(p)]
        equal = StagePlan(layers, eq, plan.equal_times, plan.layer_times, plan.equal_times, None)
        x, y = torch.randn(args.balance_batch, w), torch.randn(args.balance_batch, w)
        res = {}
        for name, sp_ in (("equal", equal), ("balanced", plan)):
            pipe = Pipeline(sp_, None, args.balance_microbatches,
                            loss_fn=lambda o, t: (o - t).square().mean())
            times = []
            for step in range(args.steps + 2):
                dist.barrier()
                t0 = time.perf_counter()
                pipe.step(x if rank == 0 else None, y if rank == p - 1 else None)
                times.append(time.perf_counter() - t0)
            res[name] = statistics.median(times[2:])
        t = torch.tensor([res["equal"], res["balanced"]], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        per = [sum(lt) / len(lt) for lt in plan.layer_times]
        if rank == 0:
            out.put((t.tolist(), plan.sizes, max(plan.equal_times) / max(plan.stage_times),
                     [v / min(per) for v in per]))
    finally:
        for b in busy:
            b.kill()
            b.wait()
    dist.destroy_process_group()


def _balance(args):
    import torch.multiprocessing as mp
    from .bench import fork_ranks
    p = args.balance_pipe
    print(f"torch_kaitian bench --pipeline --balance: {p} stages over {args.backend}, "
          f"{args.balance_layers} x (Linear({args.balance_width}) + tanh), batch "
          f"{args.balance_batch} in {args.balance_microbatches} microbatches (1F1B), median of "
          f"{args.steps} steps; ranks slowed {args.slow}; {len(os.sched_getaffinity(0))} CPUs")
    q = mp.get_context("fork").Queue()
    if any(fork_ranks(p, _balance_job, args, q)):
        print("  failed", file=sys.stderr)
        return 1
    (eq, bal), sizes, predicted, speeds = q.get()
    print(f"  layer time per rank, relative to the fastest: "
          f"{', '.join(f'{v:.2f}' for v in speeds)}")
    print(f"  equal cut     {'/'.join([str(args.balance_layers // p)] * p):>12s}   "
          f"step {eq * 1e3:8.1f} ms")
    print(f"  balanced cut  {'/'.join(map(str, sizes)):>12s}   step {bal * 1e3:8.1f} ms   "
          f"{eq / bal:.2f}x faster (predicted {predicted:.2f}x; goal >= 1.3x)", flush=True)
    return 0


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m torch_kaitian.bench --pipeline",
                                 description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cli")
    ap.add_argument("--example", default=os.path.join(ROOT, "examples", "train_gpt.py"))
    ap.add_argument("--pipes", default="2,4")
    ap.add_argument("--microbatches", default="4,8,16")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--global-batch", type=int, default=32)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--d-model", type=int, default=128)
    ap.add_argument("--context", type=int, default=64)
    ap.add_argument("--backends", default="kaitian,gloo")
    ap.add_argument("--balance", action="store_true",
                    help="stages by speed against the equal cut (see above)")
    ap.add_argument("--backend", default="kaitian", help="--balance: the backend")
    ap.add_argument("--slow", default="1,2", help="--balance: slowdown factor per rank")
    ap.add_argument("--balance-pipe", type=int, default=2)
    ap.add_argument("--balance-layers", type=int, default=12)
    ap.add_argument("--balance-width", type=int, default=512)
    ap.add_argument("--balance-batch", type=int, default=256)
    ap.add_argument("--balance-microbatches", type=int, default=8)
    args = ap.parse_args(argv)
    if args.balance:
        return _balance(args)
    args.cli = _cli(args.cli)
    if not os.path.exists(args.example):
        sys.exit(f"bench --pipeline: no example at {args.example} (give --example)")
    cpus = len(os.sched_getaffinity(0))
    backends = args.backends.split(",")
    pipes = [int(x) for x in args.pipes.split(",")]
    ms = [int(x) for x in args.microbatches.split(",")]
    print(f"torch_kaitian bench --pipeline: {args.example}, {args.layers} layers, d_model "
          f"{args.d_model}, global batch {args.global_batch} x {args.context} tokens; median step "
          f"of {args.steps}; {cpus} CPUs")
    print("\n1. bubble: step ms at pipe P (tensor 1), against the ideal (M+P-1)/M x (1-rank step / P)")
    print(f"  {'P':>2s} {'M':>3s} {'1 rank':>8s} {'ideal':>8s} " +
          " ".join(f"{b:>8s} {b + '/ideal':>12s}" for b in backends))
    for m in ms:
        one, _ = _run(args, 1, ["--microbatches", str(m), "--backend", backends[0]])
        for p in pipes:
            if one is None:
                continue
            ideal = one / p * (m + p - 1) / m
            row = f"  {p:2d} {m:3d} {one * 1e3:8.1f} {ideal * 1e3:8.1f} "
            for b in backends:
                st, _ = _run(args, p, ["--pipe", str(p), "--microbatches", str(m), "--backend", b])
                row += (f"{st * 1e3:8.1f} {st / ideal:11.2f}x " if st else f"{'failed':>8s} {'':>12s} ")
            print(row + ("" if p <= cpus else f"  ({p} ranks on {cpus} CPUs: shared)"), flush=True)
    print("\n2. pipe 2 x tensor 2, step ms")
    for m in ms[:2]:
        res = {b: _run(args, 4, ["--pipe", "2", "--tensor", "2", "--microbatches", str(m),
                                 "--backend", b])[0] for b in backends}
        line = "  " + f"M={m:<3d}" + " ".join(f"{b} {res[b] * 1e3:8.1f}" if res[b] else f"{b} failed"
                                             for b in backends)
        if len(backends) > 1 and all(res.values()):
            line += f"   {backends[1]}/{backends[0]} = {res[backends[1]] / res[backends[0]]:.2f}x"
        print(line + ("" if 4 <= cpus else f"  (4 ranks on {cpus} CPUs: shared)"), flush=True)
    print("\n3. activation memory: microbatches held at once by the first stage")
    for p in pipes:
        for m in ms:
            held = {s: _run(args, p, ["--pipe", str(p), "--microbatches", str(m), "--schedule", s,
                                      "--steps", "1", "--backend", backends[0]])[1]
                    for s in ("1f1b", "gpipe")}
            print(f"  P={p} M={m:<3d} 1f1b {held['1f1b']}  gpipe {held['gpipe']}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
