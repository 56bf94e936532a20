"""_memory.py - how much memory a rank's device has free, the same question on
every device type torch knows, for splits of training state by memory
(ZeroOptimizer(shard_weights="memory"), HeteroSampler(max_local_batch="memory")).

A device with a memory of its own (cuda, xpu, mps, ...) answers with what torch
reports free on it. The CPU is shared by the ranks of a host: its available
memory (MemAvailable of /proc/meminfo, else the physical pages free) divided
by the number of ranks of `group` on the host that hold their state on the
CPU."""
import os
import socket
from contextlib import contextmanager

import torch
import torch.distributed as dist


def _host_available():
    """Bytes of memory the host can give without swapping."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return 0


def device_free_bytes(device):
    """Free bytes on `device` as torch reports them (None for the CPU: see
    free_memory)."""
    device = torch.device(device)
    if device.type == "cpu":
        return None
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    module = getattr(torch, device.type, None)
    info = getattr(module, "mem_get_info", None)
    if callable(info):  # xpu and the other torch.<type> modules that follow cuda's API
        return int(info(device)[0])
    if device.type == "mps":
        total = getattr(torch.mps, "recommended_max_memory", None)
        used = getattr(torch.mps, "current_allocated_memory", None)
        if callable(total) and callable(used):
            return max(0, int(total()) - int(used()))
    raise RuntimeError(f"rank {dist.get_rank()}: this torch ({torch.__version__}) cannot tell the "
                       f"free memory of a {device.type} device (no torch.{device.type}.mem_get_info)")


def free_memory(device, group=None):
    """Every rank of `group`'s free memory for training state, in group rank
    order (a collective: every rank of the group calls it). `device`: where
    this rank keeps its state."""
    device = torch.device(device)
    mine = device_free_bytes(device)
    views = [None] * dist.get_world_size(group)
    dist.all_gather_object(views, (socket.gethostname(), device.type == "cpu",
                                   mine if mine is not None else _host_available()), group=group)
    cpu_ranks = {}
    for host, on_cpu, _ in views:
        if on_cpu:
            cpu_ranks[host] = cpu_ranks.get(host, 0) + 1
    return [free // cpu_ranks[host] if on_cpu else free for host, on_cpu, free in views]


@contextmanager
def saved_bytes(module):
    """Counts the bytes autograd saves for backward while the block runs
    (each tensor once; `module`'s parameters, which every batch shares, not
    counted): `with saved_bytes(m) as count: out = m(x)`, then count[0]."""
    params = {q.data_ptr() for q in module.parameters()}
    seen, count = set(), [0]

    def pack(t):
        key = (t.data_ptr(), t.numel(), t.dtype)
        if t.data_ptr() not in params and key not in seen:
            seen.add(key)
            count[0] += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        yield count
