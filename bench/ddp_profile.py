"""ddp_profile.py - where a DDP step of torch_kaitian.bench's MLP spends its time.

Run under the launcher, one backend per run:
    kaitian run -n 2 /usr/bin/python3 bench/ddp_profile.py kaitian
    kaitian run -n 2 /usr/bin/python3 bench/ddp_profile.py gloo
Rank 0 prints the time of one all_reduce of all the gradients as one tensor
(what DDP's buckets add up to) and torch.profiler's table of 10 synchronised
DDP steps, sorted by self CPU time. Needs torch_kaitian importable
(PYTHONPATH=python, KAITIAN_LIBRARY=build/libkaitian.so in a build tree).
"""
import sys
import time

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile

import torch_kaitian  # noqa: F401 - registers "kaitian"
from torch_kaitian.bench import _Model


def main():
    backend = sys.argv[1] if len(sys.argv) > 1 else "kaitian"
    torch.set_num_threads(1)
    dist.init_process_group(backend)
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(_Model())
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(32, 256), torch.randint(0, 10, (32,))
    loss_fn = torch.nn.CrossEntropyLoss()

    def step():
        opt.zero_grad(set_to_none=True)
        loss_fn(model(x), y).backward()
        opt.step()

    for _ in range(5):
        step()
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(10):
        dist.all_reduce(flat)
    one = (time.perf_counter() - t0) / 10
    dist.barrier()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(10):
            step()
    if dist.get_rank() == 0:
        print(f"{backend}: one all_reduce of all {flat.numel() * 4 / 2**20:.1f} MiB of gradients: "
              f"{one * 1e3:.2f} ms")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=14))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
