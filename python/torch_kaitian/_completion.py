"""_completion.py - completing torch futures from the core's completion queue.

One daemon thread per process blocks in kt_cq_wait (a ctypes call: the GIL is
released while it waits). For each tag it frees the request with kt_wait (which
returns at once with the op's result), reads the error text on this same thread,
copies staged results back into the caller's tensors and completes the torch
Future. The C progress thread never calls into Python.

Errors: torch's Python Future.set_exception stores the exception as the
future's *value* (C++ consumers such as DDP's reducer would take it for a
result). So every op has two futures: the one this thread completes (`fut`,
with the value or a _Failure) and the one users and C++ get (`user`, made by
fut.then(_unwrap)), in which a failure is a real error that wait() and value()
raise, in Python and in C++.
"""
import atexit
import ctypes
import os
import sys
import threading
import traceback

import torch

from . import _lib

_WAKE = 0  # tag posted to wake the thread (shutdown, fork)


class KaitianError(RuntimeError):
    """An operation failed in the KaiTian core (timeout, dead peer, mismatch, ...).

    .code is the kt_result value, .code_name its name (e.g. "KT_ERR_TIMEOUT")."""

    def __init__(self, code, message):
        super().__init__(message)
        self.code = code
        self.code_name = _lib.strerror(code).split(":", 1)[0]


def make_error(code, detail, what):
    """KaitianError for a failed op; what: its description (or a callable giving it)."""
    if callable(what):
        what = what()
    text = _lib.strerror(code)
    if code == _lib.ERR_TIMEOUT:  # torch's tests and users grep for "Timed out"
        text = "Timed out (KT_ERR_TIMEOUT)"
    msg = f"kaitian backend: {what} failed: {text}"
    if detail:
        msg += f": {detail}"
    return KaitianError(code, msg)


class _Failure:
    __slots__ = ("exc",)

    def __init__(self, exc):
        self.exc = exc


def _unwrap(fut):
    value = fut.value()
    if isinstance(value, _Failure):
        raise value.exc
    return value


class InFlight:
    """A group's count of ops in flight (issued from any thread, completed here)."""

    __slots__ = ("n", "lock")

    def __init__(self):
        self.n = 0
        self.lock = threading.Lock()

    def add(self, k):
        with self.lock:
            self.n += k


class Pending:
    """An op in flight: its request, the future to complete, what to keep alive."""

    __slots__ = ("req", "more", "fut", "finish", "result", "keep", "what", "source", "counter", "exc")

    def __init__(self, req, fut, finish, result, keep, what):
        self.req, self.fut, self.finish, self.result = req, fut, finish, result
        self.keep, self.what = keep, what
        self.source = -1
        self.more = None  # requests issued before req on its communicator (one op in pieces)
        self.counter = None  # the group's InFlight
        self.exc = None  # the op's error, once it failed


class Completer:
    """The per-process completion thread and its queue."""

    def __init__(self):
        self.cq = ctypes.c_void_p()
        rc = _lib.lib.kt_cq_create(ctypes.byref(self.cq))
        if rc != _lib.SUCCESS:
            raise make_error(rc, _lib.last_error(), "kt_cq_create")
        self.pending = {}
        self.lock = threading.Lock()
        self.next_tag = 1
        self.stopping = False
        self.pid = os.getpid()
        self.thread = threading.Thread(target=self._run, name="kaitian-completion", daemon=True)
        self.thread.start()

    def add(self, op):
        """Register op; its future completes when the core finishes it."""
        with self.lock:
            tag = self.next_tag
            self.next_tag += 1
            self.pending[tag] = op
        rc = _lib.lib.kt_request_notify(op.req, self.cq, tag)
        if rc != _lib.SUCCESS:  # cannot happen for a fresh request; do not lose it
            with self.lock:
                self.pending.pop(tag, None)
            self._complete(op)

    def _run(self):
        tag = ctypes.c_uint64()
        wait = _lib.lib.kt_cq_wait
        while True:
            rc = wait(self.cq, ctypes.byref(tag), -1)
            if rc != _lib.SUCCESS:
                continue
            if tag.value == _WAKE:
                if self.stopping:
                    return
                continue
            with self.lock:
                op = self.pending.pop(tag.value, None)
            if op is not None:
                self._complete(op)

    def drive(self, op):
        """Complete ops on the calling thread until op is done: used when a future
        callback running on the completion thread waits for another op."""
        tag = ctypes.c_uint64()
        while not op.fut.done():  # op.fut completes before op.user (then-callback)
            rc = _lib.lib.kt_cq_wait(self.cq, ctypes.byref(tag), -1)
            if rc != _lib.SUCCESS or tag.value == _WAKE:
                if self.stopping:
                    return
                continue
            with self.lock:
                other = self.pending.pop(tag.value, None)
            if other is not None:
                self._complete(other)

    def on_completion_thread(self):
        return threading.current_thread() is self.thread

    @staticmethod
    def _complete(op):
        rc = _lib.SUCCESS
        if op.more:  # one op in pieces, done before req (a communicator runs its ops in order)
            for r in op.more:
                rc_more = _lib.lib.kt_wait(r)
                rc = rc_more if rc == _lib.SUCCESS else rc
            op.more = None
        rc_last = _lib.lib.kt_wait(op.req)
        rc = rc_last if rc == _lib.SUCCESS else rc
        op.req = None
        exc = None
        value = None
        if rc != _lib.SUCCESS:
            exc = make_error(rc, _lib.last_error(), op.what)
        else:
            try:
                if op.finish is not None:
                    op.finish()
                value = op.result() if callable(op.result) else op.result
            except Exception as e:  # noqa: BLE001 - handed to the waiter
                exc = e
        op.keep = None
        op.exc = exc
        if op.counter is not None:
            op.counter.add(-1)
        try:
            op.fut.set_result(value if exc is None else _Failure(exc))
        except Exception:  # noqa: BLE001 - a user callback failed; torch logs nothing
            sys.stderr.write("kaitian backend: a future callback raised:\n" + traceback.format_exc())

    def stop(self):
        self.stopping = True
        _lib.lib.kt_cq_post(self.cq, _WAKE)
        if threading.current_thread() is not self.thread:
            self.thread.join(timeout=5)


_completer = None
_completer_lock = threading.Lock()


def completer():
    """The process's completer (a new one in a forked child)."""
    global _completer
    c = _completer
    if c is not None and c.pid == os.getpid():
        return c
    with _completer_lock:
        if _completer is None or _completer.pid != os.getpid():
            _completer = Completer()
            atexit.register(_stop_at_exit, _completer)
        return _completer


def _stop_at_exit(c):
    """Stop the completion thread before the interpreter finalizes. A daemon
    thread that is inside torch (completing a future) when finalization begins
    is ended by the interpreter while C++ frames are on its stack, and the
    process aborts ("terminate called without an active exception")."""
    global _completer
    if c.pid == os.getpid():
        c.stop()
        with _completer_lock:
            if _completer is c:  # an op issued later (another atexit handler) gets a new one
                _completer = None


def _flatten(items):
    for x in items:
        if isinstance(x, (list, tuple)):
            yield from _flatten(x)
        elif isinstance(x, torch.Tensor):
            yield x


def new_future(tensors):
    """A torch Future able to carry `tensors` (CUDA-aware when some are on CUDA)."""
    devs = sorted({t.device.index or 0 for t in _flatten(tensors) if t.is_cuda})
    if devs:
        return torch.futures.Future(devices=[torch.device("cuda", i) for i in devs])
    return torch.futures.Future()


def new_op_futures(tensors):
    """(fut, user): the future the completion thread completes and the one to
    hand out, whose failures are real errors (see the module comment)."""
    fut = new_future(tensors)
    return fut, fut.then(_unwrap)
