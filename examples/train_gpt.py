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
                                    RowParallelLinear, Topology, VocabParallelEmbedding,
                                    ZeroOptimizer, vocab_parallel_cross_entropy)

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


def build_stage(args, vocab, topo):
    """Every rank builds every layer in the same order from the same seed (so
    the weights equal a 1-D run's) and keeps those of its stage."""
    tp = topo.group("tensor")
    torch.manual_seed(args.seed)
    layers = [Embed(vocab, args.d_model, args.context, tp)]
    layers += [Block(args.d_model, args.heads, tp) for _ in range(args.layers)]
    layers.append(Head(args.d_model, vocab, tp))
    p, s = topo.size("pipe"), topo.rank("pipe")
    if len(layers) < p:
        raise ValueError(f"{len(layers)} layers cannot fill {p} pipe stages")
    bounds = [round(i * len(layers) / p) for i in range(p + 1)]
    return Stage(layers[bounds[s]:bounds[s + 1]])


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
    stage = build_stage(args, vocab, topo)
    s, p = topo.rank("pipe"), topo.size("pipe")
    first, last = s == 0, s == p - 1
    if s == args.fail_stage:
        stage = FailingForward(stage)
    tp = topo.group("tensor")
    pipe = Pipeline(stage, topo.group("pipe"), args.microbatches, schedule=args.schedule,
                    loss_fn=lambda logits, y: vocab_parallel_cross_entropy(
                        logits.reshape(-1, logits.shape[-1]), y.reshape(-1), group=tp))
    opt = ZeroOptimizer(stage.parameters(), torch.optim.AdamW, stage=1, group=topo.group("data"),
                        lr=args.lr, weight_decay=0.0)
    nparam = torch.tensor([float(sum(q.numel() for q in stage.parameters()))])
    dist.all_reduce(nparam, group=topo.group("pipe"))
    dist.all_reduce(nparam, group=tp)
    reporter = last and topo.rank("data") == 0 and topo.rank("tensor") == 0
    if reporter:
        print(f"corpus {CORPUS}: {len(ids)} characters, vocabulary {len(chars)}; "
              f"{nparam.item() / 1e6:.2f} M parameters; pipe {p} x tensor {args.tensor} x data "
              f"{args.data}, {args.microbatches} microbatches ({args.schedule}), global batch "
              f"{args.global_batch} x {args.context} tokens", flush=True)
    per = args.global_batch // args.data
    if per * args.data != args.global_batch:
        sys.exit(f"train_gpt: --global-batch {args.global_batch} is not divisible by --data "
                 f"{args.data}")
    losses = []
    for step in range(args.steps):
        g = torch.Generator().manual_seed(args.seed * 1000003 + step)  # the same batch everywhere
        start = torch.randint(0, len(ids) - args.context - 1, (args.global_batch,), generator=g)
        rows = torch.stack([ids[i:i + args.context + 1] for i in start.tolist()])
        mine = rows[topo.rank("data") * per:(topo.rank("data") + 1) * per]
        x, y = mine[:, :-1], mine[:, 1:]
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
        lt = torch.tensor([float(loss)], dtype=torch.float64)
        dist.all_reduce(lt, group=topo.group("data"))
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
