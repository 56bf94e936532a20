"""python -m torch_kaitian.bench --pipeline - the GPT example
(examples/train_gpt.py) as a pipeline, in one run:

  1. the bubble: step time at pipe P (tensor 1, data 1) with M microbatches,
     against the ideal (M + P - 1) / M times the step of the whole model on one
     rank divided by P (stages perfectly balanced, communication free), over
     kaitian and gloo;
  2. tensor 2: pipe 2 x tensor 2, kaitian against gloo;
  3. activation memory: the first stage's count of microbatches held at once
     with 1F1B and with GPipe (times the bytes of one microbatch's activations).

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
    args = ap.parse_args(argv)
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
