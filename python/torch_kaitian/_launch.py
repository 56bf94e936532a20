"""The job's shape from the environment, for torch: `srun` and `mpirun` with
no launcher of ours.

The C library decides (kt_job_from_env: KaiTian's own variables, torchrun's,
Slurm's, Open MPI's, PMI's, first complete source first), so the launcher,
the C API and torch agree. Where the shape comes from a cluster manager,
torch's env:// contract (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
MASTER_ADDR, MASTER_PORT) is filled from it: rank 0's torch store goes on
the first host of the job at a port derived from the job's id (MASTER_PORT
and MASTER_ADDR, when set, win). `import torch_kaitian` does this for
variables that are not set yet, so a plain `dist.init_process_group("kaitian")`
works under srun and mpirun too.
"""
import ctypes
import os

import torch.distributed as dist

from . import _lib

_SCHEDULERS = ("slurm", "openmpi", "pmi")
_filled = None  # the job fill_env() filled torch's variables from


class _Job(ctypes.Structure):
    """kt_job (include/kaitian.h)."""
    _fields_ = [("rank", ctypes.c_int), ("size", ctypes.c_int), ("local_rank", ctypes.c_int),
                ("local_size", ctypes.c_int), ("node_rank", ctypes.c_int), ("nnodes", ctypes.c_int),
                ("store_host", ctypes.c_char * 256), ("store_port", ctypes.c_int),
                ("serve_store", ctypes.c_int), ("source", ctypes.c_char * 16),
                ("job_id", ctypes.c_char * 96)]


# Declared once, as _lib declares the rest of the C API.
_job_from_env = (_lib._decl("kt_job_from_env", ctypes.c_int, ctypes.POINTER(_Job))
                 if hasattr(_lib.lib, "kt_job_from_env") else None)


def job_from_env():
    """The job's shape as the environment describes it: a dict with rank,
    size, local_rank, local_size, node_rank, nnodes (-1 where the source does
    not say), store_host, store_port, source ("kaitian", "torchrun", "slurm",
    "openmpi", "pmi" or "none") and job_id. Raises ValueError naming the
    variables when the environment is half set or inconsistent."""
    if _filled is not None and os.environ.get("RANK") == str(_filled["rank"]):
        return dict(_filled)  # what the variables we filled came from
    if _job_from_env is None:
        raise RuntimeError(f"{_lib.path} predates kt_job_from_env; rebuild libkaitian")
    job = _Job()
    if _job_from_env(ctypes.byref(job)) != 0:
        raise ValueError(_lib.last_error())
    out = {name: getattr(job, name) for name, _ in _Job._fields_}
    for key in ("store_host", "source", "job_id"):
        out[key] = out[key].decode(errors="replace")
    return out


def _torch_env(job):
    """torch's env:// variables for a job shaped by a cluster manager."""
    env = {"RANK": job["rank"], "WORLD_SIZE": job["size"]}
    if job["local_rank"] >= 0:
        env["LOCAL_RANK"] = job["local_rank"]
    if job["local_size"] > 0:
        env["LOCAL_WORLD_SIZE"] = job["local_size"]
    if job["node_rank"] >= 0:
        env["GROUP_RANK"] = job["node_rank"]
    if job["size"] > 1:
        env["MASTER_ADDR"] = job["store_host"]
        env["MASTER_PORT"] = job["store_port"]
    else:  # nobody to meet: any free port on loopback
        env["MASTER_ADDR"] = "127.0.0.1"
        env["MASTER_PORT"] = _free_port()
    return {k: str(v) for k, v in env.items()}


def _port_bindable(port):
    """Whether PORT binds as torch's store binds it: every address, with
    SO_REUSEADDR (a port held on any one address fails here too)."""
    import socket
    for fam, addr in ((socket.AF_INET6, "::"), (socket.AF_INET, "0.0.0.0")):
        try:
            s = socket.socket(fam, socket.SOCK_STREAM)
        except OSError:
            continue
        with s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if fam == socket.AF_INET6:
                s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            try:
                s.bind((addr, port))
                return True
            except OSError:
                return False
    return False


def _free_port():
    """A port for torch's store, which rank 0 binds later: free now and outside
    the kernel's ephemeral range, so that no outgoing connection is handed it
    in between (as `kaitian run` picks it). Any port the kernel hands out
    where 200 random tries find none."""
    import random
    import socket
    lo, hi = 32768, 60999
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            lo, hi = (int(v) for v in f.read().split()[:2])
    except (OSError, ValueError):
        pass
    rng = random.SystemRandom()
    first, end = (10000, lo) if lo > 10100 else (hi + 1, 65536)  # below the range, else above
    if end - first >= 100:
        for _ in range(200):
            p = rng.randrange(first, end)
            if _port_bindable(p):
                return p
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("0.0.0.0", 0))
        return s.getsockname()[1]


def fill_env():
    """Fill torch's env:// variables from the cluster manager's, where
    RANK is not set yet. Returns the job (dict), or None when there was
    nothing to fill. Raises ValueError on an inconsistent environment."""
    if "RANK" in os.environ or "WORLD_SIZE" in os.environ:
        return None
    global _filled
    job = job_from_env()
    if job["source"] not in _SCHEDULERS + ("kaitian",):
        return None
    for key, value in _torch_env(job).items():
        os.environ.setdefault(key, value)
    _filled = job
    return job


_import_error = None


def fill_env_on_import():
    """`import torch_kaitian`: fill what can be filled; an inconsistent
    environment is kept for init_process_group() to raise (importing must
    not fail)."""
    global _import_error
    try:
        fill_env()
    except (ValueError, RuntimeError) as e:
        _import_error = e


def init_process_group(backend="kaitian", **kwargs):
    """torch.distributed.init_process_group for a job started by
    `kaitian run`, torchrun, `srun` or `mpirun`: the environment is read in C
    (kt_job_from_env), torch's env:// contract filled from it where a
    cluster manager set it, then torch's init_process_group(backend, ...)
    is called with the rest of the arguments. Raises ValueError naming the
    variables when the environment is half set or inconsistent."""
    if _import_error is not None and "RANK" not in os.environ:
        raise ValueError(str(_import_error))
    job = fill_env() or job_from_env()  # the latter checks torchrun's variables too
    if "init_method" not in kwargs and "store" not in kwargs:
        kwargs.setdefault("rank", int(os.environ.get("RANK", job["rank"])))
        kwargs.setdefault("world_size", int(os.environ.get("WORLD_SIZE", job["size"])))
        if job["size"] == 1 and "MASTER_PORT" not in os.environ:
            os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
            os.environ["MASTER_PORT"] = str(_free_port())
    try:
        dist.init_process_group(backend, **kwargs)
    except RuntimeError as e:
        if "in use" in str(e).lower() and job["source"] in _SCHEDULERS:
            raise RuntimeError(
                f"rank {job['rank']}: cannot start torch's store at MASTER_PORT="
                f"{os.environ.get('MASTER_PORT')} (derived from {job['source']} job "
                f"{job['job_id']}): {e}; set MASTER_PORT to a free port") from e
        raise
    return job
