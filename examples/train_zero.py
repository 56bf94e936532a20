#!/usr/bin/python3
"""train_zero.py - ZeRO stage 2 with the optimizer on the CPU (ZeRO-Offload):
each rank keeps 1/p of the AdamW state, steps it with KaiTian's SIMD CPUAdam,
and the gradients are reduce-scattered while backward runs. The task is the
digits of train_digits.py (python3-sklearn) with a wider CNN (0.75 M parameters,
20x those of train_digits.py's).

    kaitian run -n 4 examples/train_zero.py            # ZeRO-2 + offloaded CPUAdam
    kaitian run -n 4 examples/train_zero.py --plain    # the same with DDP + torch AdamW

Both print the same loss curve (up to float rounding): ZeRO changes where the
optimizer state lives, not what is computed.
"""
import argparse
import os
import sys
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
from torch_kaitian.parallel import ZeroOptimizer


class WideNet(nn.Module):
    """8x8 digits -> 10 classes: three 3x3 convolutions and two wide linear layers
    (0.75 M parameters)."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 64, 3, padding=1)
        self.conv2 = nn.Conv2d(64, 128, 3, padding=1)
        self.conv3 = nn.Conv2d(128, 128, 3, padding=1)
        self.fc1 = nn.Linear(128 * 4 * 4, 256)
        self.fc2 = nn.Linear(256, 10)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = F.relu(self.conv3(x))
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


def load_data(seed):
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split
    digits = load_digits()
    x = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
    y = torch.tensor(digits.target, dtype=torch.int64)
    tr, te = train_test_split(range(len(y)), test_size=0.25, random_state=seed,
                              stratify=digits.target)
    return TensorDataset(x[tr], y[tr]), TensorDataset(x[te], y[te])


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", default="kaitian")
    ap.add_argument("--epochs", type=int, default=6)
    ap.add_argument("--batch-size", type=int, default=16, help="per rank")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--plain", action="store_true", help="DDP + torch.optim.AdamW instead")
    args = ap.parse_args()

    device = torch_kaitian.device()
    torch_kaitian.manual_seed(args.seed)
    dist.init_process_group(args.backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    train, held_out = load_data(args.seed)
    sampler = DistributedSampler(train, shuffle=True, seed=args.seed)
    loader = DataLoader(train, batch_size=args.batch_size, sampler=sampler)

    model = WideNet().to(device)
    nparam = sum(p.numel() for p in model.parameters())
    if args.plain:
        net = nn.parallel.DistributedDataParallel(model)
        opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
        what = "DDP + torch.optim.AdamW"
    else:
        from torch_kaitian.optim import CPUAdam
        net = model  # ZeRO-2 reduces the gradients itself: no DDP wrapper
        opt = ZeroOptimizer(model.parameters(), CPUAdam, stage=2, offload=True, lr=args.lr,
                            weight_decay=0.01)
        what = f"{opt!r}"
    if rank == 0:
        print(f"{world} ranks, {nparam / 1e6:.2f} M parameters, {what}", flush=True)

    for epoch in range(1, args.epochs + 1):
        sampler.set_epoch(epoch)
        t0 = time.time()
        stats = torch.zeros(2, dtype=torch.float64)
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            opt.zero_grad()
            loss = F.cross_entropy(net(x), y)
            loss.backward()
            opt.step()
            stats += torch.tensor([loss.item() * len(y), len(y)], dtype=torch.float64)
        dist.all_reduce(stats)
        model.eval()
        with torch.no_grad():
            xs, ys = held_out.tensors
            xs, ys = xs[rank::world].to(device), ys[rank::world].to(device)
            right = torch.tensor([float((model(xs).argmax(1) == ys).sum()), float(len(ys))],
                                 dtype=torch.float64)
        model.train()
        dist.all_reduce(right)
        if rank == 0:
            mem = opt.memory_bytes() if isinstance(opt, ZeroOptimizer) else None
            extra = (f"; optimizer state on this rank {mem['state'] / 2**20:.1f} MiB"
                     if mem else "")
            print(f"epoch {epoch:2d}  train loss {(stats[0] / stats[1]).item():.4f}  held-out "
                  f"accuracy {(right[0] / right[1]).item():6.2%}  ({time.time() - t0:.2f} s{extra})",
                  flush=True)
    del net, opt
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
