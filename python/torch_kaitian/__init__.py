"""torch_kaitian - the KaiTian collective library as a torch.distributed backend.

    import torch_kaitian                       # registers backend "kaitian"
    torch.distributed.init_process_group("kaitian")

Pure Python over libkaitian.so (ctypes): no compile against torch. Also the
device-neutral helpers a training script needs (the "seed API"):
local_device_count(), set_device(i), device(), global_world_size(),
global_rank(), manual_seed(seed); init_process_group() and job_from_env() for
jobs started by kaitian run, torchrun, srun or mpirun. And heterogeneous data parallelism
(hetero.py, planner.py): plan(), measure_capability(), capabilities(),
HeteroSampler, HeteroDDP, weighted_mean().
"""
import torch.distributed as _dist

from . import _launch, _lib
from ._completion import KaitianError
from ._device import (device, global_rank, global_world_size, local_device_count, manual_seed,
                      set_device)
from ._tensors import KaitianUnsupported
from .hetero import (HeteroDDP, HeteroPlan, HeteroSampler, capabilities, max_local_batch,
                     measure_capability, memory_per_sample, plan, shares, weighted_mean)
from ._launch import init_process_group, job_from_env
from .process_group import ProcessGroupKaitian

__all__ = ["ProcessGroupKaitian", "KaitianError", "KaitianUnsupported", "BACKEND", "device",
           "global_rank", "global_world_size", "local_device_count", "manual_seed", "set_device",
           "library_path", "core_version", "measure_capability", "capabilities", "HeteroSampler",
           "HeteroDDP", "HeteroPlan", "plan", "weighted_mean", "shares", "memory_per_sample",
           "max_local_batch", "init_process_group", "job_from_env"]

BACKEND = "kaitian"
library_path = _lib.path
core_version = _lib.version()
__version__ = core_version


def _register():
    """Register "kaitian" with torch once per interpreter (re-import safe)."""
    plugins = getattr(_dist.Backend, "_plugins", {})
    if BACKEND.upper() in plugins or getattr(_dist.Backend, BACKEND.upper(), None) is not None:
        return
    from . import _backend as _pg
    reg = _dist.Backend.register_backend
    try:
        reg(BACKEND, _pg.create, devices=["cpu", "cuda"])  # torch >= 2.1
    except TypeError:
        reg(BACKEND, _pg.create)


_register()
# Under srun / mpirun with no launcher of ours: torch's env:// variables from
# the cluster manager's (only those not set), so that a plain
# dist.init_process_group("kaitian") works as well as init_process_group().
_launch.fill_env_on_import()
