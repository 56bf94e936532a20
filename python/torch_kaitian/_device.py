"""_device.py - the seed API: the few device-neutral calls a DDP script needs,
so that one script runs on CUDA, on CPU, or on a mix of both in one job.

A rank uses CUDA when torch sees a CUDA device, else the CPU."""
import os
import random

import torch
import torch.distributed as dist

_current = None  # index chosen by set_device (CPU: always 0)


def _cuda():
    return torch.cuda.is_available()


def local_device_count():
    """Accelerators this process can use (CUDA devices), 1 on a CPU-only host
    (the CPU counts as one device), so `rank % local_device_count()` always works."""
    return torch.cuda.device_count() if _cuda() else 1


def set_device(index):
    """Make device `index` this process's device (torch.cuda.set_device on CUDA;
    on CPU only index 0 exists and nothing changes)."""
    global _current
    n = local_device_count()
    if not 0 <= int(index) < n:
        raise ValueError(f"torch_kaitian.set_device({index}): this host has {n} "
                         f"{'CUDA devices' if _cuda() else 'device (the CPU)'}")
    if _cuda():
        torch.cuda.set_device(int(index))
    _current = int(index)


def device():
    """The torch.device this process computes on: cuda:<current> or cpu."""
    if _cuda():
        return torch.device("cuda", torch.cuda.current_device() if _current is None else _current)
    return torch.device("cpu")


def global_world_size():
    """Ranks in the job: the default group's size once initialized, else $WORLD_SIZE (1)."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size()
    return int(os.environ.get("WORLD_SIZE", "1"))


def global_rank():
    """This process's rank in the job: the default group's rank, else $RANK (0)."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return int(os.environ.get("RANK", "0"))


def manual_seed(seed, deterministic=True):
    """Seed Python, NumPy (when present), torch and every CUDA device. With
    deterministic=True, also select deterministic algorithms where the device has
    them (cuDNN, cuBLAS workspace; torch warns instead of failing for ops that
    have none)."""
    seed = int(seed)
    random.seed(seed)
    try:
        import numpy as np
        np.random.seed(seed % (2 ** 32))
    except ImportError:
        pass
    torch.manual_seed(seed)  # CPU and, in current torch, every CUDA device
    if _cuda():
        torch.cuda.manual_seed_all(seed)
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
        try:
            torch.use_deterministic_algorithms(True, warn_only=True)
        except TypeError:  # torch without warn_only
            pass
