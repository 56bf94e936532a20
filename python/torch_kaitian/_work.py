"""_work.py - what an op of the kaitian backend hands back: how it was called
(torch's Python wrapper waiting at once, handing the work to the user, or
another caller such as DDP's reducer in C++), the work of an op that is over,
and the work of an op in flight (a torch Future completed elsewhere).

Used by process_group.py (the group), _devpath.py (the device path) and
_hier.py (within device types); it imports none of them.
"""
import sys

import torch
import torch.distributed.distributed_c10d as c10d_py

from . import _completion as C

_c10d = torch._C._distributed_c10d
_work_from_future = _c10d._create_work_from_future

_C10D_FILE = c10d_py.__file__
if _C10D_FILE.endswith(".pyc"):
    _C10D_FILE = _C10D_FILE[:-1]

# torch.distributed functions that call a ProcessGroup method and then either
# wait at once (async_op=False; send/recv always) or hand the work to the user.
_WRAPPERS = frozenset((
    "all_reduce", "all_reduce_coalesced", "broadcast", "reduce", "all_gather",
    "all_gather_into_tensor", "_all_gather_base", "all_gather_coalesced", "gather", "scatter",
    "reduce_scatter", "reduce_scatter_tensor", "_reduce_scatter_base", "all_to_all",
    "all_to_all_single", "barrier", "isend", "irecv", "send", "recv", "all_reduce_multigpu",
    "all_gather_single", "reduce_scatter_single", "gather_single",
    "broadcast_multigpu", "reduce_multigpu", "all_gather_multigpu", "reduce_scatter_multigpu"))
_ALWAYS_SYNC = frozenset(("send", "recv"))
_NEVER_SYNC = frozenset(("isend", "irecv"))

OTHER, PYTHON, SYNC = 0, 1, 2


def _caller_mode(depth=2):
    """How the method `depth` frames up was called: SYNC when torch's Python
    wrapper waits right away, PYTHON when it returns the work to the user,
    OTHER for any other caller (C++ through the trampoline, user code)."""
    try:
        f = sys._getframe(depth)
    except ValueError:  # called from C++ with fewer Python frames (DDP's reducer on torch 2.x)
        return OTHER
    code = f.f_code
    if code.co_filename != _C10D_FILE or code.co_name not in _WRAPPERS:
        return OTHER
    name = code.co_name
    if name in _ALWAYS_SYNC:
        return SYNC
    if name in _NEVER_SYNC:
        return PYTHON
    return SYNC if f.f_locals.get("async_op", True) is False else PYTHON


class _DoneWork:
    """What a SYNC call returns: the op is over; torch's wrapper calls wait()."""

    __slots__ = ("_result", "_source")

    def __init__(self, result, source=-1):
        self._result, self._source = result, source

    def wait(self, timeout=None):
        return True

    def is_completed(self):
        return True

    def is_success(self):
        return True

    def exception(self):
        return None

    def result(self):
        return self._result

    def source_rank(self):
        return self._source

    _source_rank = source_rank

    def synchronize(self):
        pass

    def get_future(self):
        fut = C.new_future(self._result if isinstance(self._result, list) else [])
        fut.set_result(self._result)
        return fut


class Work(_c10d.Work):
    """The work torch's Python API returns to the user for an async op.

    wait() blocks until the core is done and raises the op's error
    (torch_kaitian.KaitianError, with the core's message) if it failed."""

    def __init__(self, fut, pending):
        super().__init__()
        self._fut = fut
        self._pending = pending

    def _error(self):
        return self._pending.exc if self._pending is not None else None

    def wait(self, timeout=None):
        if not self._fut.done():
            comp = C.completer()
            if comp.on_completion_thread() and self._pending is not None:
                comp.drive(self._pending)  # a future callback waits: complete ops here
        try:
            self._fut.wait()
        except Exception:
            exc = self._error()
            if exc is not None:
                raise exc from None  # the core's error itself, not torch's wrapping of it
            raise
        return True

    def is_completed(self):
        return self._fut.done()

    def is_success(self):
        return self._fut.done() and self._error() is None

    def exception(self):
        return self._error() if self._fut.done() else None

    def result(self):
        self.wait()
        return self._fut.value()

    def source_rank(self):
        self.wait()
        return self._pending.source

    _source_rank = source_rank

    def synchronize(self):
        pass

    def get_future(self):
        return self._fut

    def __repr__(self):
        what = self._pending.what() if self._pending is not None else "op"
        return f"<torch_kaitian.Work {what} {'done' if self._fut.done() else 'running'}>"



def completed(mode, result):
    """The work of an op that is over, for a caller of `mode`."""
    if mode == SYNC:
        return _DoneWork(result)
    fut = C.new_future(result)
    fut.set_result(result)
    return Work(fut, None) if mode == PYTHON else _work_from_future(fut)
