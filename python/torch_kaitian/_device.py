"""_device.py - the seed API: the few device-neutral calls a DDP script needs,
so that one script runs on CUDA, on CPU, or on a mix of both in one job.

Under `kaitian run` each rank finds its device in KAITIAN_DEVICE (`cuda:1`,
`xpu:0`, `cpu`: the launcher's device plan) and these calls follow it, for any
device type that torch has a `torch.<type>` module for. Without it, a rank
uses CUDA when torch sees a CUDA device, else the CPU."""
import os
import random
import re

import torch
import torch.distributed as dist

_ENV = "KAITIAN_DEVICE"
_current = None  # index chosen by set_device, or applied from the plan (CPU: always 0)
_PLAN = re.compile(r"([a-z][a-z0-9_]*)(?::(\d+))?")


def _cuda():
    return torch.cuda.is_available()


def _where():
    """'KAITIAN_DEVICE=cuda:1 (rank 3)', for messages."""
    rank = os.environ.get("RANK", "?")
    return f"{_ENV}={os.environ.get(_ENV, '')} (rank {rank})"


class _NoDeviceType(ValueError, RuntimeError):
    """KAITIAN_DEVICE names a type this torch lacks: a bad value of the
    variable (ValueError, as every other bad value) and, as before, a
    RuntimeError."""


def _plan():
    """The launcher's device for this rank: None when KAITIAN_DEVICE is unset,
    ("cpu", None, None), or (type, index, torch.<type> module)."""
    value = os.environ.get(_ENV, "")
    if not value:
        return None
    m = _PLAN.fullmatch(value)
    if not m:
        raise ValueError(f"{_where()}: not a device; expected cpu or TYPE:INDEX, e.g. cuda:1")
    kind, index = m.group(1), m.group(2)
    if kind == "cpu":
        if index not in (None, "0"):
            raise ValueError(f"{_where()}: the CPU is one device, cpu (or cpu:0)")
        return ("cpu", None, None)
    module = getattr(torch, kind, None)
    if module is None or not callable(getattr(module, "device_count", None)):
        raise _NoDeviceType(f"{_where()}: this torch ({torch.__version__}) has no device type "
                           f"'{kind}' (no torch.{kind}.device_count)")
    return (kind, int(index or 0), module)


def _select(kind, module, index):
    """Make device `index` of `kind` current (torch.<kind>.set_device where the
    module has one), after checking that this host has it."""
    global _current
    count = module.device_count()
    if not 0 <= index < count:
        raise RuntimeError(f"{_where()}: device {kind}:{index} does not exist: this host has "
                           f"{count} {kind} device{'' if count == 1 else 's'}")
    if callable(getattr(module, "set_device", None)):
        module.set_device(index)
    _current = index


def local_device_count():
    """Devices of this rank's type: with KAITIAN_DEVICE, torch.<type>.device_count()
    (1 for cpu); otherwise CUDA devices, 1 on a CPU-only host (the CPU counts as
    one device). So `rank % local_device_count()` always works."""
    plan = _plan()
    if plan is not None:
        return 1 if plan[0] == "cpu" else plan[2].device_count()
    return torch.cuda.device_count() if _cuda() else 1


def set_device(index):
    """Make device `index` of this rank's type its device (torch.<type>.set_device;
    on the CPU only index 0 exists and nothing changes). An explicit choice wins
    over KAITIAN_DEVICE's index."""
    global _current
    index = int(index)
    plan = _plan()
    if plan is not None and plan[0] != "cpu":
        kind, _, module = plan
        count = module.device_count()
        if not 0 <= index < count:
            raise ValueError(f"torch_kaitian.set_device({index}): this host has {count} {kind} "
                             f"device{'' if count == 1 else 's'} ({_where()})")
        _select(kind, module, index)
        return
    n = local_device_count()
    if not 0 <= index < n:
        what = f"device (the CPU; {_where()})" if plan else (
            "CUDA devices" if _cuda() else "device (the CPU)")
        raise ValueError(f"torch_kaitian.set_device({index}): this host has {n} {what}")
    if plan is None and _cuda():
        torch.cuda.set_device(index)
    _current = index


def device():
    """The torch.device this process computes on. With KAITIAN_DEVICE: that
    device (made current on the first call unless set_device chose another);
    otherwise cuda:<current> or cpu."""
    plan = _plan()
    if plan is not None:
        kind, index, module = plan
        if kind == "cpu":
            return torch.device("cpu")
        if _current is None:
            _select(kind, module, index)
        return torch.device(kind, _current)
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
    """Seed Python, NumPy (when present), torch, every CUDA device and the devices
    of KAITIAN_DEVICE's type. With deterministic=True, also select deterministic
    algorithms where the device has them (cuDNN, cuBLAS workspace; torch warns
    instead of failing for ops that have none)."""
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
    plan = _plan()
    if plan is not None and plan[0] not in ("cpu", "cuda"):
        seed_all = getattr(plan[2], "manual_seed_all", None)
        if callable(seed_all):
            seed_all(seed)
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
        try:
            torch.use_deterministic_algorithms(True, warn_only=True)
        except TypeError:  # torch without warn_only
            pass


def _collective_device(group=None):
    """Where a small tensor must live for a collective of `group`: NCCL takes
    the current CUDA device's tensors only; every other backend (kaitian, gloo)
    takes CPU tensors."""
    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _group_ranks(group=None):
    """The global ranks of `group` (None: the default group), in group-rank order."""
    if group is None or group is dist.group.WORLD:
        return list(range(dist.get_world_size()))
    return list(dist.get_process_group_ranks(group))
