"""_devpath.py - a group's large collectives when some rank computes on a
device: cut into pieces every rank cuts alike, device tensors staged through
the host pool in a pipeline (_staging.py), asynchronous to the caller.

Which ops: allreduce, broadcast, reduce, all_gather_into_tensor and
reduce_scatter_tensor (what DDP, ZeRO and tensor parallelism issue). They run
on a communicator of their own, created only in groups where some rank said
at creation that it computes on a device, so a group of CPU ranks is as it was.
In such a group every rank cuts these ops into the same pieces (one op of the
core each): a CPU rank's pieces are views of its tensor (no copy), a device
rank's are staged.

Order: ops on this communicator must reach the core in the order they were
issued. A device op's pieces run on the group's staging thread, one job after
another; a blocking op runs on the caller's thread when that thread is idle
(no thread hop for small messages), else it waits for its turn; a CPU tensor's
pieces are issued non-blocking at once when the thread is idle, else queued
behind it.

Completion: a device op's work completes when its last copy up is queued; its
torch Future records an event on the copy-up stream, so wait() orders the
caller's current stream after it (as NCCL's work does) and the host waits for
nothing.
"""
import collections
import ctypes
import os
import sys
import threading
import traceback

import torch

from . import _completion as C
from . import _lib
from . import _staging as S
from . import _tensors as T
from ._work import PYTHON, SYNC, Work, _DoneWork, _work_from_future

_lib_ = _lib.lib
_BLOCKING = {n: getattr(_lib_, "kt_" + n) for n in ("allreduce", "broadcast", "reduce", "allgather",
                                                    "reduce_scatter")}
_NONBLOCKING = {n: getattr(_lib_, "kt_i" + n) for n in _BLOCKING}
_HOST = S.Host()
TEST_TYPE_ENV = "KAITIAN_TEST_DEVICE_TYPE"


class Stager:
    """The group's staging thread: jobs one at a time, in issue order."""

    def __init__(self):
        self.cv = threading.Condition()
        self.jobs = collections.deque()
        self.inflight = 0  # queued or running, inline runs included
        self.run_lock = threading.Lock()
        self.thread = None
        self.stopping = False
        self.pid = os.getpid()

    def try_inline(self):
        """Reserve the right to run one job on the calling thread now (True), or
        False when jobs are queued or running."""
        with self.cv:
            if self.inflight == 0 and self.run_lock.acquire(blocking=False):
                self.inflight += 1
                return True
        return False

    def end_inline(self):
        self.run_lock.release()
        with self.cv:
            self.inflight -= 1
            self.cv.notify_all()

    def if_idle(self, issue):
        """Call issue() under the lock when nothing is queued or running."""
        with self.cv:
            if self.inflight == 0 and not self.run_lock.locked():
                issue()
                return True
        return False

    def submit(self, job):
        with self.cv:
            self.inflight += 1
            self.jobs.append(job)
            if self.thread is None:
                self.thread = threading.Thread(target=self._run, name="kaitian-staging", daemon=True)
                self.thread.start()
            self.cv.notify_all()

    def run_and_wait(self, fn):
        """Queue fn behind the jobs before it, wait for it on this thread;
        its result, or its exception raised here."""
        box = {}
        done = threading.Event()

        def job():
            try:
                box["value"] = fn()
            except BaseException as e:  # noqa: BLE001 - raised on the caller's thread
                box["exc"] = e
            finally:
                done.set()
        self.submit(job)
        done.wait()
        if "exc" in box:
            raise box["exc"]
        return box.get("value")

    def _run(self):
        while True:
            with self.cv:
                while not self.jobs and not self.stopping:
                    self.cv.wait()
                if not self.jobs:
                    return
                job = self.jobs.popleft()
            try:
                with self.run_lock:
                    job()
            finally:
                with self.cv:
                    self.inflight -= 1
                    self.cv.notify_all()

    def stop(self):
        with self.cv:
            self.stopping = True
            self.cv.notify_all()
        t = self.thread
        if t is not None and t is not threading.current_thread():
            t.join(timeout=5)


def test_type():
    """KAITIAN_TEST_DEVICE_TYPE for this process: a device type name its CPU
    tensors pretend to be on (the staging runs as for a device, with copies
    on the CPU), or None. A comma-separated list gives one entry per rank
    ($RANK), where cpu means none."""
    raw = os.environ.get(TEST_TYPE_ENV, "").strip()
    if not raw:
        return None
    if "," in raw:
        items = [x.strip() for x in raw.split(",")]
        rank = int(os.environ.get("RANK", "0"))
        if not 0 <= rank < len(items):
            raise ValueError(f"{TEST_TYPE_ENV}={raw!r}: no entry for rank {rank}")
        raw = items[rank]
    return None if raw in ("", "cpu") else raw


def local_type():
    """This rank's device type as it declares it to the group: the test type,
    else KAITIAN_DEVICE's type, else cuda when torch sees a CUDA device, else cpu."""
    t = test_type()
    if t is not None:
        return t
    from . import _device
    try:
        plan = _device._plan()
    except (ValueError, RuntimeError):
        plan = None
    if plan is not None:
        return plan[0]
    return "cuda" if torch.cuda.is_available() else "cpu"


class DevicePath:
    """The split ops of one ProcessGroupKaitian (see the module's text)."""

    def __init__(self, pg, comm):
        self.pg = pg
        self.comm = comm
        self.piece_bytes = S.piece_bytes_env()
        self.test_host = test_type() is not None
        self.copiers = {}
        self.stager = Stager()

    def close(self):
        self.stager.stop()

    # ---- how a tensor takes part ------------------------------------------------------
    def _copies(self, t, work):
        """None when t's own memory serves the core (CPU, contiguous, of the
        work dtype), else the copier for its device."""
        dev = t.device
        if dev.type == "cpu":
            if self.test_host or not t.is_contiguous() or t.dtype != work:
                return _HOST
            return None
        c = self.copiers.get(dev)
        if c is None:
            c = S.Streams(dev) if S.Streams.supports(dev) else _HOST
            self.copiers[dev] = c
        return c

    def _fail(self, what):
        return lambda rc: C.make_error(rc, _lib.last_error(), what())

    # ---- issuing ------------------------------------------------------------------
    def _issue(self, mode, result, what, copies, build, keep, after=None):
        """Run one op: build() -> (plan, tail, blocks), called with the copies
        ordered after the caller (for conversions on the copy stream). copies
        None: the plan's ops work in the caller's own memory."""
        if copies is not None:
            copies.begin(keep)
            with copies.on_down():
                plan, tail, blocks = build()
            events = S.queue_down(copies, plan)
        else:
            plan, tail, blocks = build()
            events = [None] * len(plan)
        fail = self._fail(what)
        pool = S.pool()

        def execute():
            fence = None
            try:
                if copies is None:
                    for p in plan:
                        rc = p.op()
                        if rc != _lib.SUCCESS:
                            raise fail(rc)
                    if tail is not None:
                        tail()
                    return None
                fence = S.finish(copies, plan, events, fail, tail)
                return fence
            finally:
                if blocks:
                    if fence is None and copies is not None:
                        fence = copies.fence()
                    for b in blocks:
                        pool.put(b, fence)

        if mode == SYNC:
            if self.stager.try_inline():
                try:
                    fence = execute()
                finally:
                    self.stager.end_inline()
            else:
                fence = self.stager.run_and_wait(execute)
            if copies is not None and fence is not None:
                copies.order_caller(fence)
            if after is not None:
                after()
            return _DoneWork(result)

        fut, user = C.new_op_futures(result)
        pending = C.Pending(None, fut, None, result, keep, what)
        work = Work(user, pending) if mode == PYTHON else _work_from_future(user)
        counter = self.pg._outstanding
        counter.add(1)

        if copies is None and self._issue_direct(plan, pending, after, counter):
            return work

        def job():
            exc = None
            try:
                execute()
            except Exception as e:  # noqa: BLE001 - handed to the waiter
                exc = e
            if after is not None:
                try:
                    after()
                except Exception as e:  # noqa: BLE001
                    exc = exc or e
            ctx = copies.on_up() if copies is not None else S._Nothing()
            with ctx:  # a device future records its event on the copy-up stream
                complete(pending, fut, result, exc, counter)
        self.stager.submit(job)
        return work

    def _issue_direct(self, plan, pending, after, counter):
        """CPU memory, staging thread idle: every piece non-blocking now, the
        completion thread completes the op when the last one is done (the
        core runs a communicator's ops in order)."""
        issued = []

        def issue():
            reqs = []
            for p in plan:
                req = ctypes.c_void_p()
                rc = p.op(req)
                if rc != _lib.SUCCESS:
                    for r in reqs:  # already running: let them finish, then fail
                        _lib_.kt_wait(r)
                    raise C.make_error(rc, _lib.last_error(), pending.what)
                reqs.append(req)
            issued.append(reqs)
        try:
            if not self.stager.if_idle(issue):
                return False
        except BaseException:
            counter.add(-1)
            raise
        reqs = issued[0]
        pending.req = reqs[-1]
        pending.more = reqs[:-1]
        pending.finish = after
        pending.counter = counter
        C.completer().add(pending)
        return True

    # ---- the ops ------------------------------------------------------------------
    def _host(self, copies, nbytes):
        return S.pool().get(nbytes, copies.pin)

    def _pieces(self, n, es):
        return S.pieces(n, es, self.piece_bytes)

    def _work(self, t, work, copies, write):
        """(flat contiguous tensor of dtype work on t's device, writeback or None)."""
        if copies is None:
            return t.reshape(-1), None
        if t.is_contiguous() and t.dtype == work:
            return t.reshape(-1), None
        w = t.reshape(-1).to(work) if t.dtype != work else t.contiguous().reshape(-1)
        if not w.is_contiguous():
            w = w.contiguous()
        copies.adopt(w)  # made on the copy-down stream, written on the copy-up one
        back = (lambda: t.copy_(w.view(t.shape) if t.dim() else w.view(()))) if write else None
        return w, back

    @staticmethod
    def _reduce_kinds(dtype, op):
        work, dt, how = T.reduce_plan(dtype, op)
        return work, dt, (2 if how == "complex" else 1)

    @staticmethod
    def _move_kinds(dtype):
        dt = T.NATIVE.get(dtype)
        if dt is not None:
            return dtype, dt, 1
        return dtype, _lib.UINT8, torch.empty((), dtype=dtype).element_size()

    def allreduce(self, t, result, op, what, mode, after=None):
        work, dt, k = self._reduce_kinds(t.dtype, op)
        return self._inplace("allreduce", t, result, work, dt, k, what, mode, after,
                             lambda p, n, cnt: (p, p, cnt, dt, op), True, True)

    def broadcast(self, t, result, root, what, mode):
        work, dt, k = self._move_kinds(t.dtype)
        is_root = root == self.pg._rank
        return self._inplace("broadcast", t, result, work, dt, k, what, mode, None,
                             lambda p, n, cnt: (p, p, cnt, dt, root), is_root, not is_root)

    def reduce(self, t, result, op, root, what, mode):
        work, dt, k = self._reduce_kinds(t.dtype, op)
        is_root = root == self.pg._rank
        return self._inplace("reduce", t, result, work, dt, k, what, mode, None,
                             lambda p, n, cnt: (p, p if is_root else None, cnt, dt, op, root),
                             True, is_root)

    def _inplace(self, name, t, result, work, dt, k, what, mode, after, args, read, write):
        copies = self._copies(t, work)
        nb, ni = _BLOCKING[name], _NONBLOCKING[name]
        comm = self.comm
        if copies is None and mode == SYNC:
            n = t.numel()
            es = t.element_size()
            if n * es <= (self.piece_bytes or S._MIN_AUTO) and n:
                # One piece of the caller's own memory, blocking: the core's
                # call itself, on this thread, when nothing is queued before it.
                st = self.stager
                if st.run_lock.acquire(False):
                    try:
                        if st.inflight == 0:
                            rc = nb(*args(t.data_ptr(), n, n * k), comm)
                            if rc != _lib.SUCCESS:
                                raise C.make_error(rc, _lib.last_error(), what())
                            if after is not None:
                                after()
                            return _DoneWork(result)
                    finally:
                        st.run_lock.release()

        def build():
            w, back = self._work(t, work, copies, write)
            es = w.element_size()
            cuts = self._pieces(w.numel(), es)
            blocks = []
            if copies is None:
                base = w.data_ptr() if w.numel() else T.EMPTY_PTR
                hv = None
            else:
                blk = self._host(copies, w.numel() * es)
                blocks.append(blk)
                base = blk.ptr
                hv = blk.tensor[:w.numel() * es].view(work)
            plan = []
            for a, b in cuts:
                ptr = base + a * es if b > a else T.EMPTY_PTR
                cnt = (b - a) * k
                fn = _op(nb, ni, args(ptr, b - a, cnt), comm)
                down = [(hv[a:b], w[a:b])] if hv is not None and read and b > a else None
                up = [(w[a:b], hv[a:b])] if hv is not None and write and b > a else None
                plan.append(S.Piece(down, fn, up))
            return plan, back, blocks
        return self._issue(mode, result, what, copies, build, [t], after)

    def _buffers(self, copies, wi, wo, n_in, n_out, work):
        """(input address, output address, host views of each or None, host
        blocks) for an op of n_in elements in and n_out out: the tensors'
        own memory (copies None), else host blocks."""
        if copies is None:
            empty = wi.numel() == 0
            return (T.EMPTY_PTR if empty else wi.data_ptr(), T.EMPTY_PTR if empty else wo.data_ptr(),
                    None, None, [])
        es = wi.element_size()
        bi, bo = self._host(copies, n_in * es), self._host(copies, n_out * es)
        return (bi.ptr, bo.ptr, bi.tensor[:n_in * es].view(work), bo.tensor[:n_out * es].view(work),
                [bi, bo])

    def allgather(self, out, inp, result, what, mode):
        """all_gather_into_tensor: out holds size x inp's elements."""
        work, dt, k = self._move_kinds(inp.dtype)
        copies = self._copies(out, work) or self._copies(inp, work)
        p = self.pg._size
        comm = self.comm
        if copies is None and len(self._pieces(inp.numel(), inp.element_size())) > 1:
            # The core gathers piece k of every rank contiguously, and those
            # are not contiguous in out: CPU memory goes through a host block.
            copies = _HOST

        def build():
            wi, _ = self._work(inp, work, copies, False)
            wo, back = self._work(out, work, copies, True)
            n, es = wi.numel(), wi.element_size()
            cuts = self._pieces(n, es)
            ib, ob, hi, ho, blocks = self._buffers(copies, wi, wo, n, p * n, work)
            plan = []
            for a, b in cuts:
                m = b - a
                src = ib + a * es if m else T.EMPTY_PTR
                dst = ob + p * a * es if m else T.EMPTY_PTR
                fn = _op(_BLOCKING["allgather"], _NONBLOCKING["allgather"],
                         (src, dst, m * k, dt), comm)
                down = [(hi[a:b], wi[a:b])] if hi is not None and m else None
                up = [(wo[r * n + a:r * n + b], ho[p * a + r * m:p * a + (r + 1) * m])
                      for r in range(p)] if ho is not None and m else None
                plan.append(S.Piece(down, fn, up))
            return plan, back, blocks
        return self._issue(mode, result, what, copies, build, [out, inp])

    def reduce_scatter(self, out, inp, result, op, what, mode):
        """reduce_scatter_tensor: inp holds size x out's elements."""
        work, dt, k = self._reduce_kinds(out.dtype, op)
        copies = self._copies(out, work) or self._copies(inp, work)
        p = self.pg._size
        comm = self.comm
        if copies is None and len(self._pieces(out.numel(), out.element_size())) > 1:
            copies = _HOST  # a piece's inputs are not contiguous in inp: through a host block

        def build():
            wi, _ = self._work(inp, work, copies, False)
            wo, back = self._work(out, work, copies, True)
            n, es = wo.numel(), wo.element_size()
            cuts = self._pieces(n, es)
            ib, ob, hi, ho, blocks = self._buffers(copies, wi, wo, p * n, n, work)
            plan = []
            for a, b in cuts:
                m = b - a
                src = ib + p * a * es if m else T.EMPTY_PTR
                dst = ob + a * es if m else T.EMPTY_PTR
                fn = _op(_BLOCKING["reduce_scatter"], _NONBLOCKING["reduce_scatter"],
                         (src, dst, m * k, dt, op), comm)
                down = [(hi[p * a + r * m:p * a + (r + 1) * m], wi[r * n + a:r * n + b])
                        for r in range(p)] if hi is not None and m else None
                up = [(wo[a:b], ho[a:b])] if ho is not None and m else None
                plan.append(S.Piece(down, fn, up))
            return plan, back, blocks
        return self._issue(mode, result, what, copies, build, [out, inp])


def complete(pending, fut, result, exc, counter):
    """An op run on a staging thread is over: record its error, release what
    it kept, complete its future (on the caller's current streams)."""
    pending.exc = exc
    pending.keep = None
    counter.add(-1)
    try:
        fut.set_result(result if exc is None else C._Failure(exc))
    except Exception:  # noqa: BLE001 - a user callback failed
        sys.stderr.write("kaitian backend: a future callback raised:\n" + traceback.format_exc())


def _op(blocking, nonblocking, args, comm):
    """A piece's op: called with no argument it runs blocking; with a request
    it is issued non-blocking."""
    def fn(req=None):
        if req is None:
            return blocking(*args, comm)
        return nonblocking(*args, comm, ctypes.byref(req))
    return fn
