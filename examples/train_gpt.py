#!/usr/bin/python3
"""train_gpt.py - a small GPT-style decoder trained with pipeline x tensor x data
parallelism (3-D), on text that ships with every Debian system: the license
texts of /usr/share/common-licenses (package base-files, ~260 KB of English),
read as characters.

    kaitian run -n 8 examples/train_gpt.py --pipe 2 --tensor 2 --data 2
    kaitian run -n 1 examples/train_gpt.py --pipe 1 --tensor 1 --data 1   # the same losses

The pieces, all from torch_kaitian.parallel:
  Topology([("pipe", P), ("data", D), ("tensor", T)])  tensor innermost: its groups
      are consecutive ranks (one host), where the most traffic is;
  ColumnParallelLinear / RowParallelLinear: Megatron's split of attention (heads
      divided among the tensor ranks) and of the MLP; VocabParallelEmbedding and
      vocab_parallel_cross_entropy: the vocabulary divided too;
  Pipeline: the layers divided among the pipe stages, 1F1B over microbatches;
  ZeroOptimizer(stage=1, group=data): AdamW state sharded over the data ranks,
      gradients averaged over them.
With --mixed (ranks of different speeds and memories, e.g. under
`kaitian run --devices cuda:1,cpu:3`; tensor 1), the plan for mixed devices:
  balance(): the layers cut into stages by each pipe rank's measured speed
      (the first data replica's cut, used by every replica);
  ZeroOptimizer(shard_weights="memory"): each data rank holds optimizer state in
      proportion to its free memory;
  shares of every global batch among the data replicas by speed (each
      replica's slowest stage under the cut; torch_kaitian.shares, the rule of
      HeteroSampler), each replica's loss weighted by its share so that the
      gradient stays the exact mean over the global batch.
  The plan is printed at the start (and at KAITIAN_DEBUG=INFO by the pieces).
Every rank builds the whole model from the same seed and keeps its stage and
its shards, so a 3-D run starts from the same weights as a 1-D run, and with
the same global batch it follows the same loss curve (float rounding aside).
The last stage prints loss and tokens/s per step.
"""
import argparse
import glob
import json
import math
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

try:
    import torch_kaitian
except ImportError:  # run from a source checkout: use the package next to this example
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
    import torch_kaitian
from torch_kaitian.parallel import (ColumnParallelLinear, Pipeline, PipelineError,
                                    RowParallelLinear, StagePlan, Topology,
                                    VocabParallelEmbedding, ZeroOptimizer, balance,
                                    vocab_parallel_cross_entropy)

CORPUS = "/usr/share/common-licenses"


def load_corpus():
    """Every regular file of /usr/share/common-licenses, in name order, as one
    string; the vocabulary is its characters."""
    text = ""
    for path in sorted(glob.glob(os.path.join(CORPUS, "*"))):
        if os.path.isfile(path) and not os.path.islink(path):
            with open(path, encoding="utf-8", errors="replace") as f:
                text += f.read() + "\n"
    if len(text) < 10000:
        sys.exit(f"train_gpt: {CORPUS} holds {len(text)} characters; is base-files installed?")
    chars = sorted(set(text))
    return torch.tensor([chars.index(c) for c in text], dtype=torch.int64), chars


class Attention(nn.Module):
    """Causal self-attention; the heads are divided among the tensor ranks: the
    fused q/k/v projection is column-parallel (each rank computes its heads'
    q, k and v; the output is laid out head by head), the output projection
    row-parallel (one all-reduce)."""

    def __init__(self, d, heads, tp):
        super().__init__()
        if heads % dist.get_world_size(tp):
            raise ValueError(f"{heads} heads cannot be divided among {dist.get_world_size(tp)} "
                             f"tensor ranks")
        self.hd = d // heads
        self.local = heads // dist.get_world_size(tp)
        self.qkv = ColumnParallelLinear(d, 3 * d, gather_output=False, group=tp)
        self.out = RowParallelLinear(d, d, input_is_parallel=True, group=tp)

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = self.qkv(x).view(b, t, self.local, 3, self.hd).permute(3, 0, 2, 1, 4)
        att = (q @ k.transpose(-1, -2)) / math.sqrt(self.hd)
        mask = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
        att = att.masked_fill(mask, float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, self.local * self.hd)
        return self.out(y)


class Block(nn.Module):
    def __init__(self, d, heads, tp):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = Attention(d, heads, tp)
        self.fc = ColumnParallelLinear(d, 4 * d, gather_output=False, group=tp)
        self.proj = RowParallelLinear(4 * d, d, input_is_parallel=True, group=tp)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.proj(F.gelu(self.fc(self.ln2(x))))


class Stage(nn.Module):
    """The layers of one pipe stage: the embeddings on the first, the final norm
    and the (vocabulary-parallel) head on the last."""

    def __init__(self, parts):
        super().__init__()
        self.parts = nn.ModuleList(parts)

    def forward(self, x):
        for p in self.parts:
            x = p(x)
        return x


class Embed(nn.Module):
    def __init__(self, vocab, d, ctx, tp):
        super().__init__()
        self.tok = VocabParallelEmbedding(vocab, d, group=tp)
        self.pos = nn.Embedding(ctx, d)

    def forward(self, ids):
        return self.tok(ids) + self.pos(torch.arange(ids.shape[1], device=ids.device))


class Head(nn.Module):
    def __init__(self, d, vocab, tp):
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.lm = ColumnParallelLinear(d, vocab, bias=False, gather_output=False, group=tp)

    def forward(self, x):
        return self.lm(self.ln(x))


class FailingForward(nn.Module):
    """--fail-stage: the stage raises in its forward of the second step."""

    def __init__(self, inner):
        super().__init__()
        self.inner, self.calls, self.armed = inner, 0, False

    def forward(self, x):
        if self.armed:
            raise RuntimeError("injected failure in this stage's forward (--fail-stage)")
        return self.inner(x)


def build_layers(args, vocab, topo):
    """Every rank builds every layer in the same order from the same seed (so
    the weights equal a 1-D run's)."""
    tp = topo.group("tensor")
    torch.manual_seed(args.seed)
    layers = [Embed(vocab, args.d_model, args.context, tp)]
    layers += [Block(args.d_model, args.heads, tp) for _ in range(args.layers)]
    layers.append(Head(args.d_model, vocab, tp))
    if len(layers) < topo.size("pipe"):
        raise ValueError(f"{len(layers)} layers cannot fill {topo.size('pipe')} pipe stages")
    return layers


def build_stage(args, vocab, topo):
    """This rank's stage: the layers cut into equal counts."""
    layers = build_layers(args, vocab, topo)
    p, s = topo.size("pipe"), topo.rank("pipe")
    bounds = [round(i * len(layers) / p) for i in range(p + 1)]
    return Stage(layers[bounds[s]:bounds[s + 1]])


def mixed_plan(args, vocab, topo, ids, device):
    """--mixed: the cut by speed (the first replica's), and each data
    replica's capability (1 / its slowest stage under that cut)."""
    layers = build_layers(args, vocab, topo)
    per = max(1, args.global_batch // args.data // args.microbatches)
    g = torch.Generator().manual_seed(args.seed)
    start = torch.randint(0, len(ids) - args.context - 1, (per,), generator=g)
    sample = torch.stack([ids[i:i + args.context] for i in start.tolist()])
    plan = balance(layers, sample.to(device), topo.group("pipe"), device=device)
    # Every replica uses the first replica's cut (its stages hold the same layers).
    bounds = torch.tensor([b for ab in plan.bounds for b in ab], dtype=torch.int64)
    dist.broadcast(bounds, src=0)
    cut = [(int(bounds[2 * i]), int(bounds[2 * i + 1])) for i in range(topo.size("pipe"))]
    times = [sum(t[a:b]) for t, (a, b) in zip(plan.layer_times, cut)]
    plan = StagePlan(layers, cut, times, plan.layer_times, plan.equal_times, topo.group("pipe"))
    cap = torch.tensor([1.0 / max(max(times), 1e-12)], dtype=torch.float64)
    every = [torch.zeros_like(cap) for _ in range(topo.size("data"))]
    dist.all_gather(every, cap, group=topo.group("data"))
    return plan, [float(c) for c in every]


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pipe", type=int, default=1)
    ap.add_argument("--tensor", type=int, default=1)
    ap.add_argument("--data", type=int, default=1)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--global-batch", type=int, default=16, help="sequences per step")
    ap.add_argument("--microbatches", type=int, default=4)
    ap.add_argument("--context", type=int, default=64)
    ap.add_argument("--d-model", type=int, default=64)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--schedule", default="1f1b", choices=["1f1b", "gpipe"])
    ap.add_argument("--backend", default="kaitian")
    ap.add_argument("--loss-log", help="the last stage's rank 0 writes the losses here (JSON)")
    ap.add_argument("--fail-stage", type=int, default=-1, help="(test) this stage raises")
    ap.add_argument("--mixed", action="store_true",
                    help="the plan for mixed devices: stages by speed, ZeRO state by memory, "
                         "batch shares by speed (see above); each rank on torch_kaitian.device()")
    args = ap.parse_args()

    dist.init_process_group(args.backend)
    world = dist.get_world_size()
    if args.pipe * args.tensor * args.data != world:
        sys.exit(f"train_gpt: --pipe {args.pipe} x --tensor {args.tensor} x --data {args.data} "
                 f"= {args.pipe * args.tensor * args.data}, but the job has {world} ranks")
    topo = Topology([("pipe", args.pipe), ("data", args.data), ("tensor", args.tensor)])
    if dist.get_rank() == 0:
        print(topo.describe(), flush=True)
    ids, chars = load_corpus()
    vocab = len(chars) + (-len(chars)) % args.tensor  # divisible among the tensor ranks
    device = torch.device("cpu")
    caps = [1.0] * args.data
    if args.mixed:
        if args.tensor != 1:
            sys.exit("train_gpt: --mixed runs with --tensor 1 (balance times whole layers)")
        device = torch_kaitian.device()
        plan, caps = mixed_plan(args, vocab, topo, ids, device)
        stage = plan.stage(topo.rank("pipe")).to(device)
        if dist.get_rank() == 0:
            print(plan.describe(), flush=True)
    else:
        stage = build_stage(args, vocab, topo)
    s, p = topo.rank("pipe"), topo.size("pipe")
    first, last = s == 0, s == p - 1
    if s == args.fail_stage:
        stage = FailingForward(stage)
    tp = topo.group("tensor")
    # Each replica's share of every global batch (equal without --mixed) and
    # the weight of each microbatch's loss: the pipeline averages its M
    # microbatches' losses and ZeroOptimizer averages over the D replicas, so
    # a microbatch of n sequences weighted n x M x D / global batch makes the
    # result the mean over the global batch however uneven the pieces.
    shares = torch_kaitian.shares(args.global_batch, caps)
    me_d = topo.rank("data")
    scale = args.microbatches * args.data / args.global_batch
    if min(shares) < args.microbatches:
        sys.exit(f"train_gpt: a data replica's share of the global batch ({shares}) is smaller "
                 f"than --microbatches {args.microbatches}")
    pipe = Pipeline(stage, topo.group("pipe"), args.microbatches, schedule=args.schedule,
                    loss_fn=lambda logits, y: y.shape[0] * scale * vocab_parallel_cross_entropy(
                        logits.reshape(-1, logits.shape[-1]), y.reshape(-1), group=tp),
                    device=device)
    opt = ZeroOptimizer(stage.parameters(), torch.optim.AdamW, stage=1, group=topo.group("data"),
                        lr=args.lr, weight_decay=0.0,
                        shard_weights="memory" if args.mixed else None)
    if args.mixed and dist.get_rank() == 0:
        print(f"data replicas: capabilities {', '.join(f'{c:.1f}' for c in caps)} "
              f"microbatch/s, shares {shares} of {args.global_batch} sequences; {opt!r}",
              flush=True)
    nparam = torch.tensor([float(sum(q.numel() for q in stage.parameters()))])
    dist.all_reduce(nparam, group=topo.group("pipe"))
    dist.all_reduce(nparam, group=tp)
    reporter = last and topo.rank("data") == 0 and topo.rank("tensor") == 0
    if reporter:
        print(f"corpus {CORPUS}: {len(ids)} characters, vocabulary {len(chars)}; "
              f"{nparam.item() / 1e6:.2f} M parameters; pipe {p} x tensor {args.tensor} x data "
              f"{args.data}, {args.microbatches} microbatches ({args.schedule}), global batch "
              f"{args.global_batch} x {args.context} tokens", flush=True)
    if not args.mixed and args.global_batch % args.data:
        sys.exit(f"train_gpt: --global-batch {args.global_batch} is not divisible by --data "
                 f"{args.data}")
    lo = sum(shares[:me_d])
    losses = []
    for step in range(args.steps):
        g = torch.Generator().manual_seed(args.seed * 1000003 + step)  # the same batch everywhere
        start = torch.randint(0, len(ids) - args.context - 1, (args.global_batch,), generator=g)
        rows = torch.stack([ids[i:i + args.context + 1] for i in start.tolist()])
        mine = rows[lo:lo + shares[me_d]]
        x, y = mine[:, :-1].to(device), mine[:, 1:].to(device)
        if isinstance(stage, FailingForward):
            stage.armed = step == 1
        t0 = time.perf_counter()
        opt.zero_grad()
        try:
            loss = pipe.step(x if first else None, y if last else None, broadcast_loss=True)
        except PipelineError as e:
            print(f"rank {dist.get_rank()} (stage {s}): {e}", file=sys.stderr, flush=True)
            sys.exit(1)
        opt.step()
        lt = torch.tensor([float(loss)], dtype=torch.float64)  # each replica's weighted part:
        dist.all_reduce(lt, group=topo.group("data"))           # their mean is the global mean
        lt /= args.data
        dt = time.perf_counter() - t0
        losses.append(lt.item())
        if reporter:
            print(f"step {step:3d}  loss {lt.item():.4f}  {args.global_batch * args.context / dt:8.0f} "
                  f"tokens/s", flush=True)
    if first and topo.rank("data") == 0 and topo.rank("tensor") == 0:
        print(f"first stage: at most {pipe.max_live} microbatches' activations held at once "
              f"({args.schedule}, {args.microbatches} microbatches, {p} stages)", flush=True)
    if reporter and args.loss_log:
        with open(args.loss_log, "w") as f:
            json.dump({"losses": losses, "pipe": p, "tensor": args.tensor, "data": args.data}, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
