"""_tensors.py - torch tensors as the C core sees them: contiguous host memory
of one of its dtypes.

A tensor the core can use as it is (CPU, contiguous, native dtype) is passed by
pointer. Anything else goes through a host "stage": a contiguous copy (pinned
when the tensor is on CUDA), in the type the reduction needs (int16 -> int32,
complex -> float pairs), copied back into the caller's tensor when the op is
over. Data-movement ops (broadcast, gather, alltoall, send/recv, ...) move any
dtype as bytes.
"""
import ctypes

import torch

from . import _lib

NATIVE = {
    torch.int8: _lib.INT8, torch.uint8: _lib.UINT8, torch.int32: _lib.INT32,
    torch.int64: _lib.INT64, torch.float16: _lib.FLOAT16, torch.bfloat16: _lib.BFLOAT16,
    torch.float32: _lib.FLOAT32, torch.float64: _lib.FLOAT64, torch.bool: _lib.BOOL,
}
_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)

_OPS = {"SUM": _lib.SUM, "PRODUCT": _lib.PROD, "MIN": _lib.MIN, "MAX": _lib.MAX,
        "AVG": _lib.AVG, "BAND": _lib.BAND, "BOR": _lib.BOR, "BXOR": _lib.BXOR}
_OP_NAMES = {v: k for k, v in _OPS.items()}

# The core rejects a NULL buffer even for zero elements: empty tensors point here.
_EMPTY = ctypes.create_string_buffer(16)
EMPTY_PTR = ctypes.addressof(_EMPTY)


class KaitianUnsupported(RuntimeError):
    """A dtype, op or argument the kaitian backend cannot handle."""


def op_name(reduce_op):
    rt = getattr(reduce_op, "op", reduce_op)  # ReduceOp object or RedOpType
    name = getattr(rt, "name", None) or str(rt).rsplit(".", 1)[-1]
    return name.upper()


def kt_op(reduce_op):
    name = op_name(reduce_op)
    if name not in _OPS:
        if name == "PREMUL_SUM":
            raise KaitianUnsupported(
                "kaitian backend: ReduceOp PREMUL_SUM is not supported (its factor cannot be read "
                "from Python); multiply the tensor by the factor, then use ReduceOp.SUM")
        raise KaitianUnsupported(f"kaitian backend: unsupported ReduceOp {name}")
    return _OPS[name]


def _int_work_dtype(dtype):
    """An integer type the core has whose wrap-around arithmetic is exact for dtype."""
    if dtype == torch.int16:
        return torch.int32
    for name, work in (("uint16", torch.int32), ("uint32", torch.int64)):
        if getattr(torch, name, None) is not None and dtype == getattr(torch, name):
            return work
    return None


def reduce_plan(dtype, op):
    """(work dtype, kt dtype, reinterpret) for reducing `dtype` with kt op `op`.

    reinterpret: "complex" when the tensor is viewed as float pairs, "uint64" when
    viewed as int64 (same bits), None otherwise. Raises KaitianUnsupported with the
    dtype and op when no exact way exists."""
    name = _OP_NAMES[op]
    if dtype in NATIVE:
        if op in (_lib.BAND, _lib.BOR, _lib.BXOR) and dtype in _FLOATS:
            raise KaitianUnsupported(f"kaitian backend: ReduceOp {name} is not defined for {dtype}")
        return dtype, NATIVE[dtype], None
    if dtype.is_complex:
        if op not in (_lib.SUM, _lib.AVG):
            raise KaitianUnsupported(
                f"kaitian backend: ReduceOp {name} is not defined for complex dtype {dtype} "
                "(only SUM and AVG are)")
        real = {torch.complex64: torch.float32, torch.complex128: torch.float64}.get(dtype)
        if real is None:
            chalf = getattr(torch, "complex32", None)
            if dtype == chalf:
                real = torch.float16
            else:
                raise KaitianUnsupported(f"kaitian backend: unsupported dtype {dtype}")
        return dtype, NATIVE[real], "complex"
    work = _int_work_dtype(dtype)
    if work is not None:
        if op == _lib.AVG and dtype != torch.int16:
            raise KaitianUnsupported(f"kaitian backend: ReduceOp AVG is not supported for {dtype}")
        return work, NATIVE[work], None
    if getattr(torch, "uint64", None) is not None and dtype == torch.uint64:
        if op in (_lib.SUM, _lib.PROD, _lib.BAND, _lib.BOR, _lib.BXOR):
            return dtype, _lib.INT64, "uint64"
        raise KaitianUnsupported(f"kaitian backend: ReduceOp {name} is not supported for {dtype}")
    raise KaitianUnsupported(f"kaitian backend: dtype {dtype} is not supported for reductions "
                             f"(ReduceOp {name})")


def _host_empty(t, dtype):
    pin = t.is_cuda and torch.cuda.is_available()
    return torch.empty(t.shape, dtype=dtype, device="cpu", pin_memory=pin)


class Buf:
    """Host memory standing in for tensor t during one op.

    ptr/count/dt: what to pass to the core. writeback(): copy the result into t
    (a no-op when the core wrote t's own memory). Keep the object alive until the
    op is over: it owns the stage."""

    __slots__ = ("t", "host", "view", "ptr", "count", "dt", "_back")

    def __init__(self, t, host, view, dt, back):
        self.t, self.host, self.view, self.dt, self._back = t, host, view, dt, back
        self.count = view.numel()
        self.ptr = view.data_ptr() if self.count else EMPTY_PTR

    def writeback(self):
        if self._back:
            self.t.copy_(self.host)


def _byte_view(h):
    return h.reshape(-1).view(torch.uint8)


_BITWISE = (_lib.BAND, _lib.BOR, _lib.BXOR)


def stage(t, read=True, write=True, op=None):
    """Buf for tensor t. read: the core reads t (copy it in); write: the core
    writes t (copy back afterwards). op: a kt op for reductions, None to move
    the elements as they are (any dtype)."""
    if t.is_cpu and t.is_contiguous():  # fast path: the core uses t's memory
        dt = NATIVE.get(t.dtype)
        if dt is not None and (op not in _BITWISE or t.dtype not in _FLOATS):
            return Buf(t, t, t, dt, False)
    if op is not None:
        work, dt, how = reduce_plan(t.dtype, op)
    elif t.dtype in NATIVE:
        work, dt, how = t.dtype, NATIVE[t.dtype], None
    else:
        work, dt, how = t.dtype, _lib.UINT8, "bytes"
    direct = t.device.type == "cpu" and work == t.dtype and t.is_contiguous()
    if direct:
        host = t
    else:
        host = _host_empty(t, work)
        if read:
            host.copy_(t)
    if how == "complex":
        view = torch.view_as_real(host) if host.dim() else torch.view_as_real(host.reshape(1))
    elif how == "uint64":
        view = host.reshape(-1).view(torch.int64)
    elif how == "bytes":
        view = _byte_view(host)
    else:
        view = host
    return Buf(t, host, view, dt, write and not direct)


def check_same(tensors, what):
    """Every tensor of a list on one device with one dtype (the first one's)."""
    t0 = tensors[0]
    for i, t in enumerate(tensors):
        if t.dtype != t0.dtype:
            raise ValueError(f"kaitian backend: {what}: tensor {i} has dtype {t.dtype}, "
                             f"expected {t0.dtype} (that of tensor 0)")
    return t0


def flat_stage(tensors, read=True, work=None, pin_like=None):
    """One contiguous host tensor holding the concatenation of tensors
    (flattened), in dtype `work` (default: theirs). Returns the host tensor."""
    dtype = work or tensors[0].dtype
    total = sum(t.numel() for t in tensors)
    pin = any(t.is_cuda for t in tensors) and torch.cuda.is_available()
    host = torch.empty(total, dtype=dtype, pin_memory=pin)
    if read:
        off = 0
        for t in tensors:
            n = t.numel()
            host[off:off + n].copy_(t.reshape(-1) if t.is_contiguous() else t.contiguous().view(-1))
            off += n
    return host


def unflatten_into(host, tensors):
    """Copy consecutive slices of host back into tensors (shapes kept)."""
    off = 0
    for t in tensors:
        n = t.numel()
        t.copy_(host[off:off + n].view(t.shape))
        off += n


def size_array(values):
    arr = (ctypes.c_size_t * max(1, len(values)))()
    for i, v in enumerate(values):
        arr[i] = v
    return arr


def flat_host(n, dtype, pin):
    """(host tensor of n elements, view for the core, kt dtype, elements per torch element)."""
    host = torch.empty(n, dtype=dtype, pin_memory=pin)
    if dtype in NATIVE:
        return host, host, NATIVE[dtype], 1
    view = host.view(torch.uint8)
    return host, view, _lib.UINT8, host.element_size()


def any_cuda(tensors):
    return any(t.is_cuda for t in tensors) and torch.cuda.is_available()


def consecutive(tensors):
    """Whether tensors are CPU, contiguous, of one native dtype and lie one
    right after another in memory (views of one buffer, in order: ZeRO's
    uneven parts): then the core reads or writes them in place."""
    t0 = tensors[0]
    if t0.dtype not in NATIVE:
        return False
    es, end = t0.element_size(), None
    for t in tensors:
        if not (t.is_cpu and t.is_contiguous() and t.dtype == t0.dtype):
            return False
        if end is not None and t.numel() and t.data_ptr() != end:
            return False
        if t.numel() or end is None:
            end = t.data_ptr() + t.numel() * es
    return True
