"""A training script started by srun, mpirun, torchrun-style variables or
kaitian run, with no code of its own for the job's shape.

    test_launch_env.py [helper|plain] [--expect-size N] [--expect-source S]

helper: torch_kaitian.init_process_group(); plain: `import torch_kaitian`
then dist.init_process_group("kaitian"). Then checked all_reduce,
all_gather and a send/recv ring, and 5 DDP steps of a float64 model whose
parameters must agree on every rank and with one process trained on the
union of the ranks' batches (the reference, computed here by every rank).
Every rank prints "PASS launch-py rank R of N source S"; exit 1 on failure.
"""
import argparse
import os
import sys

import torch
import torch.distributed as dist

import torch_kaitian


def reference_step(model, batches, lr):
    """One SGD step of `model` on the union of every rank's batch."""
    x = torch.cat([b[0] for b in batches])
    y = torch.cat([b[1] for b in batches])
    model.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    with torch.no_grad():
        for p in model.parameters():
            p -= lr * p.grad


def batch(rank, step):
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(16, 7, generator=g, dtype=torch.float64)
    return x, x.sum(1, keepdim=True).sin()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["helper", "plain"], nargs="?", default="helper")
    ap.add_argument("--expect-size", type=int, default=0)
    ap.add_argument("--expect-source", default="")
    args = ap.parse_args()
    job = torch_kaitian.job_from_env()
    if args.mode == "helper":
        torch_kaitian.init_process_group()
    else:
        dist.init_process_group("kaitian")
    rank, size = dist.get_rank(), dist.get_world_size()
    fails = []
    if (rank, size) != (job["rank"], job["size"]):
        fails.append(f"rank {rank}/{size}, the job says {job['rank']}/{job['size']}")
    if args.expect_size and size != args.expect_size:
        fails.append(f"size {size}, expected {args.expect_size}")
    if args.expect_source and job["source"] != args.expect_source:
        fails.append(f"source {job['source']}, expected {args.expect_source}")
    if dist.get_backend() != "kaitian":
        fails.append(f"backend {dist.get_backend()}")

    t = torch.arange(1001, dtype=torch.float64) * (rank + 1)
    dist.all_reduce(t)
    want = torch.arange(1001, dtype=torch.float64) * (size * (size + 1) / 2)
    if not torch.equal(t, want):
        fails.append(f"all_reduce differs by {(t - want).abs().max().item()}")
    got = [torch.zeros(3, dtype=torch.int64) for _ in range(size)]
    dist.all_gather(got, torch.tensor([rank, size, int(os.environ.get("LOCAL_RANK", -1))]))
    if [int(g[0]) for g in got] != list(range(size)):
        fails.append(f"all_gather gave ranks {[int(g[0]) for g in got]}")
    if size > 1:
        out, inp = torch.tensor([float(rank)]), torch.zeros(1)
        reqs = [dist.isend(out, (rank + 1) % size), dist.irecv(inp, (rank - 1) % size)]
        for r in reqs:
            r.wait()
        if int(inp.item()) != (rank - 1) % size:
            fails.append(f"recv got {inp.item()}")

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(7, 5), torch.nn.Tanh(), torch.nn.Linear(5, 1)).double()
    ref = torch.nn.Sequential(torch.nn.Linear(7, 5), torch.nn.Tanh(), torch.nn.Linear(5, 1)).double()
    ref.load_state_dict(model.state_dict())
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    for step in range(5):
        x, y = batch(rank, step)
        opt.zero_grad()
        torch.nn.functional.mse_loss(ddp(x), y).backward()
        opt.step()
        reference_step(ref, [batch(r, step) for r in range(size)], 0.1)
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    every = [torch.zeros_like(flat) for _ in range(size)]
    dist.all_gather(every, flat)
    if any(not torch.equal(e, flat) for e in every):
        fails.append("DDP parameters differ between ranks")
    want = torch.cat([p.detach().reshape(-1) for p in ref.parameters()])
    err = (flat - want).abs().max().item()
    if err > 1e-10:
        fails.append(f"DDP parameters are {err:.3g} away from one process on the union of the batches")
    dist.barrier()
    dist.destroy_process_group()
    if fails:
        for f in fails:
            print(f"FAIL rank {rank}: {f}", file=sys.stderr, flush=True)
        sys.exit(1)
    print(f"PASS launch-py rank {rank} of {size} source {job['source']} mode {args.mode} "
          f"ddp-error {err:.1e}", flush=True)


if __name__ == "__main__":
    main()
