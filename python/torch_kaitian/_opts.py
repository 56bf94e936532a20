"""_opts.py - what torch passes the backend, read: the one tensor of a list,
an options object's fields, its reduction op (cached), the group's timeout.
Used by the group (process_group.py) and the group of one rank (_solo.py)."""
import os
import warnings
from datetime import timedelta

import torch

from . import _lib
from . import _tensors as T


def _ms(timeout):
    """The group's deadline in ms: the shorter of torch's group timeout and
    KAITIAN_TIMEOUT (when set), so that either can shorten it; a malformed
    KAITIAN_TIMEOUT is reported once and ignored."""
    if timeout is None:
        ms = 0
    elif isinstance(timeout, timedelta):
        ms = max(1, int(timeout.total_seconds() * 1000))
    else:
        ms = max(1, int(timeout))
    env = os.environ.get("KAITIAN_TIMEOUT", "").strip()
    if env:
        try:
            value = int(env)
            if value <= 0:
                raise ValueError
        except ValueError:
            global _warned_timeout
            if not _warned_timeout:
                _warned_timeout = True
                warnings.warn(f"KAITIAN_TIMEOUT={env!r} is not a positive number of milliseconds; ignored "
                              f"(the group's timeout applies: {ms or 1800000} ms)", stacklevel=3)
        else:
            ms = value if ms == 0 else min(ms, value)
    return ms


_warned_timeout = False


def _one(tensors, what):
    if isinstance(tensors, torch.Tensor):
        return tensors, [tensors]
    if len(tensors) != 1:
        raise ValueError(f"kaitian backend: {what} takes exactly one tensor per process, "
                         f"got {len(tensors)}")
    return tensors[0], tensors


def _opt(opts, name, default):
    return getattr(opts, name, default) if opts is not None else default


_OP_CACHE = {}


def _reduce_op(opts):
    """(kt op, name) of an options object's reduceOp (or of a ReduceOp itself)."""
    if opts is None:
        return _lib.SUM, "SUM"
    rop = getattr(opts, "reduceOp", opts)  # one property read: each builds a new object
    key = getattr(rop, "op", rop)
    hit = _OP_CACHE.get(key)
    if hit is None:
        hit = (T.kt_op(rop), T.op_name(rop))
        if T.op_name(rop) != "PREMUL_SUM":  # never cache an op that carries a factor
            _OP_CACHE[key] = hit
    return hit
