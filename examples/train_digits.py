#!/usr/bin/python3
"""train_digits.py - DistributedDataParallel training of a small CNN on the
8x8 handwritten digits that ship with scikit-learn (python3-sklearn), over the
"kaitian" backend (or any other: --backend gloo / nccl).

    kaitian run -n 2 examples/train_digits.py            # what `make demo` runs
    kaitian run -n 2 examples/train_digits.py --backend gloo

The usual tutorial pattern: a DistributedSampler (set_epoch each epoch), the
training loss and held-out accuracy all-reduced across ranks, rank 0 prints one
line per epoch, saves a checkpoint, every rank waits at a barrier and loads it
with map_location. Same --seed, same loss curve on every backend.
"""
import argparse
import json
import os
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

try:
    import torch_kaitian
except ImportError:  # run from a source checkout: use the package next to this example
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
    import torch_kaitian


class Net(nn.Module):
    """Two 3x3 convolutions, a pooling, two linear layers: 8x8 digits -> 10 classes."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.fc1 = nn.Linear(32 * 4 * 4, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


def load_data(seed):
    """Digits as (N, 1, 8, 8) float tensors in [0, 1]: 75% training, 25% held out
    (stratified, the same split on every rank)."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split
    digits = load_digits()
    x = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
    y = torch.tensor(digits.target, dtype=torch.int64)
    tr, te = train_test_split(range(len(y)), test_size=0.25, random_state=seed, stratify=digits.target)
    return TensorDataset(x[tr], y[tr]), TensorDataset(x[te], y[te])


def evaluate(model, data, device, rank, world):
    """Held-out accuracy over every rank's share (rank r takes samples r, r+world, ...)."""
    model.eval()
    x, y = data.tensors
    x, y = x[rank::world].to(device), y[rank::world].to(device)
    with torch.no_grad():
        correct = (model(x).argmax(1) == y).sum()
    counts = torch.stack([correct.to(torch.float64).cpu(), torch.tensor(float(len(y)), dtype=torch.float64)])
    dist.all_reduce(counts)  # correct and total, summed over ranks
    model.train()
    return (counts[0] / counts[1]).item()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", default="kaitian", help="kaitian (default), gloo, nccl, ...")
    ap.add_argument("--epochs", type=int, default=15)
    ap.add_argument("--batch-size", type=int, default=32, help="per rank")
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--checkpoint", help="checkpoint file (default: a temporary file)")
    ap.add_argument("--loss-log", help="rank 0 writes the per-epoch metrics here (JSON)")
    args = ap.parse_args()

    # The seed API: the same lines run on CPU, CUDA, or a mix of both.
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    torch_kaitian.set_device(local_rank % torch_kaitian.local_device_count())
    device = torch_kaitian.device()
    torch_kaitian.manual_seed(args.seed)

    dist.init_process_group(args.backend)
    rank, world = torch_kaitian.global_rank(), torch_kaitian.global_world_size()

    train, held_out = load_data(args.seed)
    sampler = DistributedSampler(train, num_replicas=world, rank=rank, shuffle=True, seed=args.seed)
    loader = DataLoader(train, batch_size=args.batch_size, sampler=sampler)

    model = nn.parallel.DistributedDataParallel(
        Net().to(device), device_ids=[device.index] if device.type == "cuda" else None)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)

    if rank == 0:
        print(f"training on {len(train)} digits, {len(held_out)} held out; {world} ranks, "
              f"backend {dist.get_backend()}, device {device}", flush=True)
    history = []
    for epoch in range(1, args.epochs + 1):
        sampler.set_epoch(epoch)  # a different shuffle each epoch, the same on every rank
        t0 = time.time()
        stats = torch.zeros(2, dtype=torch.float64)  # loss sum, samples
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()  # DDP averages the gradients across ranks here
            opt.step()
            stats += torch.tensor([loss.item() * len(y), len(y)], dtype=torch.float64)
        dist.all_reduce(stats)  # the epoch's loss over every rank's samples
        train_loss = (stats[0] / stats[1]).item()
        acc = evaluate(model, held_out, device, rank, world)
        history.append({"epoch": epoch, "loss": train_loss, "accuracy": acc})
        if rank == 0:
            print(f"epoch {epoch:2d}  train loss {train_loss:.4f}  held-out accuracy {acc:6.2%}  "
                  f"({time.time() - t0:.2f} s)", flush=True)

    # Checkpoint: rank 0 saves, everyone waits, everyone loads (onto its own device).
    tmpdir = None
    path = args.checkpoint
    if path is None:
        tmpdir = tempfile.mkdtemp(prefix="kt-digits-") if rank == 0 else None
        holder = [os.path.join(tmpdir, "checkpoint.pt") if tmpdir else None]
        dist.broadcast_object_list(holder, src=0)
        path = holder[0]
    if rank == 0:
        torch.save({"model": model.module.state_dict(), "optimizer": opt.state_dict(),
                    "epoch": args.epochs}, path)
    dist.barrier()
    state = torch.load(path, map_location=device)
    restored = Net().to(device)
    restored.load_state_dict(state["model"])
    acc = evaluate(restored, held_out, device, rank, world)
    dist.barrier()  # nobody still reads the file when rank 0 removes it
    if rank == 0:
        print(f"checkpoint {path} (epoch {state['epoch']}) reloaded on every rank: held-out "
              f"accuracy {acc:.2%}", flush=True)
        if tmpdir:
            os.unlink(path)
            os.rmdir(tmpdir)
        if args.loss_log:
            with open(args.loss_log, "w") as f:
                json.dump({"backend": dist.get_backend(), "world_size": world, "epochs": history,
                           "reloaded_accuracy": acc}, f, indent=1)
    # DDP holds the group: drop it first (torch 1.13's gloo group can hang
    # when its last reference goes with the model after the group's end).
    del model, opt
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
