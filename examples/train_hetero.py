#!/usr/bin/python3
"""train_hetero.py - one model trained on ranks of different speeds: every device
type in one job (CUDA, CPU, any torch device), each rank given a share of every
global batch planned from its measured step times, ranks that cannot pay for
the gradient exchange they cause left out, gradients the exact mean over the
global batch. The task is the digits of train_digits.py (python3-sklearn).

    kaitian run --devices cpu:2 examples/train_hetero.py              # this machine
    kaitian run --devices cuda:1,cpu:2 examples/train_hetero.py       # a GPU host
    KAITIAN_CAPABILITIES=1,3 kaitian run -n 2 examples/train_hetero.py  # fixed weights

What changes against a plain DDP script (train_digits.py):
  1. plan = torch_kaitian.plan(model, sample, global_batch) once, before training
     (it prints what it decided on rank 0);
  2. HeteroSampler(dataset, global_batch, plan=plan) instead of DistributedSampler
     (its loader() yields one batch per step, possibly empty on a slow rank);
  3. HeteroDDP(model, plan=plan) instead of DistributedDataParallel (it also
     rebalances the shares while training when the ranks' step times drift);
  4. metrics reduced with torch_kaitian.weighted_mean (each rank's batch differs),
     and model.sync_parameters() before every rank evaluates, where the plan
     left a rank out (its parameters are not the job's).
"""
import argparse
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import TensorDataset

try:
    import torch_kaitian
except ImportError:  # run from a source checkout: use the package next to this example
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
    import torch_kaitian


class Net(nn.Module):
    """The digits CNN of train_digits.py: 8x8 digits -> 10 classes."""

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
    ap.add_argument("--epochs", type=int, default=15)
    ap.add_argument("--global-batch", type=int, default=64, help="samples per step, all ranks")
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    device = torch_kaitian.device()  # the launcher's plan: KAITIAN_DEVICE=cuda:0, cpu, ...
    torch_kaitian.manual_seed(args.seed)
    dist.init_process_group(args.backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    train, held_out = load_data(args.seed)

    net = Net().to(device)
    # 1. How fast is each rank on this model, against its batch, and what does
    #    the gradient exchange cost? The plan: who computes, with which share
    #    of each global batch (a second or two; every rank calls it).
    sample = train.tensors[0][:32].to(device), train.tensors[1][:32].to(device)
    plan = torch_kaitian.plan(net, sample, args.global_batch, loss_fn=F.cross_entropy)
    # 2. Each rank's share of every global batch (no communication per step).
    sampler = torch_kaitian.HeteroSampler(train, args.global_batch, seed=args.seed, plan=plan)
    loader = sampler.loader()
    # 3. The exact mean of the gradients over the global batch, among the ranks
    #    the plan chose.
    model = torch_kaitian.HeteroDDP(net, plan=plan,
                                    device_ids=[device.index] if device.type == "cuda" else None)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    devices = [None] * world
    dist.all_gather_object(devices, str(device))
    if rank == 0:
        print(f"{world} ranks on {', '.join(devices)}; shares of each batch of "
              f"{args.global_batch}: {plan.shares}; predicted {plan.predicted_rate:.0f} samples/s; "
              f"{sampler.num_steps} steps per epoch", flush=True)

    for epoch in range(1, args.epochs + 1):
        sampler.set_epoch(epoch)
        t0, busy, loss_sum, seen = time.time(), 0.0, 0.0, 0
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            t = time.time()
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)  # the mean over this rank's batch (NaN if empty)
            loss.backward()                      # gradients: the mean over the global batch
            opt.step()
            busy += time.time() - t
            if len(y):
                loss_sum, seen = loss_sum + loss.item() * len(y), seen + len(y)
        # 4. The epoch's loss over every rank's samples, weighted by how many each had.
        train_loss = torch_kaitian.weighted_mean(loss_sum / max(seen, 1), seen)
        if plan.left_out:
            model.sync_parameters()  # the ranks left out evaluate with the job's parameters
        model.eval()
        with torch.no_grad():
            xs, ys = held_out.tensors
            xs, ys = xs[rank::world].to(device), ys[rank::world].to(device)
            acc = (model(xs).argmax(1) == ys).double().mean().item() if len(ys) else 0.0
        model.train()
        acc = torch_kaitian.weighted_mean(acc, len(ys))
        per_rank = [None] * world
        dist.all_gather_object(per_rank, round(seen / busy if busy else 0.0))
        if rank == 0:
            print(f"epoch {epoch:2d}  train loss {train_loss:.4f}  held-out accuracy {acc:6.2%}  "
                  f"({time.time() - t0:.2f} s; samples/s while stepping per rank: {per_rank})",
                  flush=True)
    del model, opt
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
