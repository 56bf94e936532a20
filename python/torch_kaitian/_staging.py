"""_staging.py - device tensors through host memory the core works in, in
pieces, with the copies overlapping the host's work.

A rank whose tensors live on a device (CUDA, or any torch device type with
streams and events) reaches the other ranks through host memory. This module
is how that memory is had and filled:

- HostPool: blocks of memory from kt_mem_alloc (a memfd the core has
  registered: among the ranks of one host a collective on it runs
  single-copy, reading and writing the peers' blocks in place), page-locked for
  the device (cudaHostRegister through torch.cuda.cudart()), so the
  device-to-host copy lands where the peers read. Blocks are reused once the
  device is done with them (an event); where kt_mem_alloc or page-locking is
  refused, torch's pinned allocator stands in (the core then copies through its
  segment).
- pieces(): the cut of a message into pieces, a function of the element count,
  the element size and KAITIAN_DEVICE_PIECE_BYTES only, so that every rank of
  a group cuts an op alike (each piece is one op of the core, matched across
  ranks).
- Streams (a device) and Host (CPU tensors sent through the same engine:
  tests, with KAITIAN_TEST_DEVICE_TYPE): the copies and the events. On a
  device the copies down run on a side stream ordered after the caller's
  current stream by an event, the copies up on a second stream, and the
  caller's stream is ordered after the last copy up by an event: never a
  device-wide synchronisation.
- run(): the pipeline. Every piece's copy down is queued at once; then for
  each piece in turn the host waits for its copy (an event), runs the piece's
  op in the core and queues its copy up, so the copy down of piece k+1, the
  host's work on piece k and the copy up of piece k-1 proceed together.
"""
import ctypes
import os
import threading

import torch

from . import _lib

_MIN_AUTO, _MAX_AUTO = 256 << 10, 4 << 20
_BLOCK_MIN = 64 << 10
_POOL_KEEP = 1 << 30  # bytes of free blocks kept for reuse


def piece_bytes_env():
    """KAITIAN_DEVICE_PIECE_BYTES as an int (0: choose by size). A value that is
    not a positive integer is an error naming the variable."""
    raw = os.environ.get("KAITIAN_DEVICE_PIECE_BYTES", "").strip()
    if not raw:
        return 0
    try:
        v = int(raw)
    except ValueError:
        v = 0
    if v <= 0:
        raise ValueError(f"KAITIAN_DEVICE_PIECE_BYTES={raw!r}: expected a positive number of bytes")
    return v


def pieces(n, elem_size, piece_bytes=0):
    """[(start, stop), ...] in elements, covering [0, n): pieces of
    piece_bytes (default: an eighth of the message, within 256 KiB-4 MiB),
    at least one element each; one empty piece when n is 0."""
    if n <= 0:
        return [(0, 0)]
    if piece_bytes <= 0:
        piece_bytes = min(_MAX_AUTO, max(_MIN_AUTO, n * elem_size // 8))
    per = max(1, piece_bytes // max(1, elem_size))
    return [(a, min(a + per, n)) for a in range(0, n, per)]


class _Block:
    __slots__ = ("ptr", "nbytes", "tensor", "owner", "pinned", "locked", "fence", "_keep")

    def free(self):
        if self.pinned:
            try:
                torch.cuda.cudart().cudaHostUnregister(self.ptr)
            except Exception:  # noqa: BLE001 - at exit the runtime may be gone
                pass
        if self.owner == "kaitian":
            _lib.lib.kt_mem_free(ctypes.c_void_p(self.ptr))
        self.tensor = self._keep = None


class HostPool:
    """Per process: host blocks the core has registered, reused across ops."""

    def __init__(self):
        self.lock = threading.Lock()
        self.free_blocks = []  # _Block, fence set by the last user
        self.free_bytes = 0
        self.pid = os.getpid()

    @staticmethod
    def _size_class(nbytes):
        size = _BLOCK_MIN
        while size < nbytes:
            size *= 2
        return size

    def get(self, nbytes, pin_for):
        """A block of at least nbytes; pin_for: the device type to page-lock it
        for ("cuda"), or None."""
        size = self._size_class(max(1, nbytes))
        with self.lock:
            for i, b in enumerate(self.free_blocks):
                if b.nbytes == size and (b.locked or pin_for is None) and _fence_done(b.fence):
                    del self.free_blocks[i]
                    self.free_bytes -= b.nbytes
                    b.fence = None
                    return b
        return self._alloc(size, pin_for)

    def _alloc(self, size, pin_for):
        b = _Block()
        b.nbytes, b.fence, b.pinned, b.locked = size, None, False, False
        ptr = ctypes.c_void_p()
        if _lib.lib.kt_mem_alloc(size, ctypes.byref(ptr)) == _lib.SUCCESS:
            b.ptr, b.owner = ptr.value, "kaitian"
            b._keep = (ctypes.c_char * size).from_address(b.ptr)
            b.tensor = torch.frombuffer(b._keep, dtype=torch.uint8)
            if pin_for == "cuda":
                b.pinned = b.locked = _cuda_register(b.ptr, size)
            if pin_for is None or b.pinned:
                return b
            b.free()  # cannot page-lock it: torch's pinned memory instead
        b.owner = "torch"
        b.tensor = torch.empty(size, dtype=torch.uint8, pin_memory=pin_for is not None)
        b.ptr, b._keep = b.tensor.data_ptr(), None
        b.pinned, b.locked = False, pin_for is not None
        return b

    def put(self, block, fence):
        """Give block back; it is reused once fence (an event, or None) is done."""
        block.fence = fence
        with self.lock:
            self.free_blocks.append(block)
            self.free_bytes += block.nbytes
            while self.free_bytes > _POOL_KEEP and len(self.free_blocks) > 1:
                old = self.free_blocks.pop(0)
                self.free_bytes -= old.nbytes
                if old.fence is not None:
                    old.fence.synchronize()
                old.free()


def _fence_done(fence):
    return fence is None or fence.query()


_registered_ok = None


def _cuda_register(ptr, size):
    """Page-lock [ptr, ptr + size) for CUDA; False where the runtime refuses."""
    global _registered_ok
    if _registered_ok is False:
        return False
    try:
        rt = torch.cuda.cudart()
        rc = rt.cudaHostRegister(ptr, size, 0)
        ok = int(getattr(rc, "value", rc)) == 0
    except Exception:  # noqa: BLE001 - a torch without cudart(): use its pinned memory
        ok = False
    if not ok and _registered_ok is None:
        _registered_ok = False
    return ok


_pool = None
_pool_lock = threading.Lock()


def pool():
    global _pool
    with _pool_lock:
        if _pool is None or _pool.pid != os.getpid():
            _pool = HostPool()
        return _pool


class Streams:
    """Copies between a device of a torch device type with streams and events
    (torch.cuda, torch.xpu, ...) and host memory."""

    host_side = False

    def __init__(self, device):
        self.device = device
        self.mod = getattr(torch, device.type)
        with self.mod.device(device):
            self.down_stream = self.mod.Stream()
            self.up_stream = self.mod.Stream()
        self.pin = device.type if device.type == "cuda" else None

    @staticmethod
    def supports(device):
        mod = getattr(torch, device.type, None)
        return all(callable(getattr(mod, n, None)) for n in ("Stream", "Event", "current_stream",
                                                             "stream", "device"))

    def _event(self, stream):
        ev = self.mod.Event()
        ev.record(stream)
        return ev

    def begin(self, tensors):
        """Order both copy streams after the caller's current stream, and keep
        the caching allocator from reusing tensors' memory before they are done."""
        ev = self._event(self.mod.current_stream(self.device))
        self.down_stream.wait_event(ev)
        self.up_stream.wait_event(ev)
        for t in tensors:
            self.adopt(t)

    def adopt(self, t):
        """t (on this device) is used on both copy streams: the caching
        allocator must not reuse its memory before they are done with it."""
        if t.device == self.device:
            t.record_stream(self.down_stream)
            t.record_stream(self.up_stream)

    def on_down(self):
        return self.mod.stream(self.down_stream)

    def on_up(self):
        return self.mod.stream(self.up_stream)

    def down(self, pairs):
        """Queue host <- device copies; the event the host waits for."""
        with self.mod.stream(self.down_stream):
            for host, dev in pairs:
                host.copy_(dev, non_blocking=True)
        return self._event(self.down_stream)

    def wait(self, event):
        if event is not None:
            event.synchronize()  # this thread only: the device keeps going

    def up(self, pairs):
        with self.mod.stream(self.up_stream):
            for dev, host in pairs:
                dev.copy_(host, non_blocking=True)

    def fence(self):
        """An event after everything queued on both copy streams."""
        self.up_stream.wait_stream(self.down_stream)
        return self._event(self.up_stream)

    def order_caller(self, fence):
        self.mod.current_stream(self.device).wait_event(fence)


class Host:
    """The same engine for CPU tensors (KAITIAN_TEST_DEVICE_TYPE): copies run at
    once, there is nothing to wait for."""

    host_side = True
    pin = None

    def begin(self, tensors):
        pass

    def adopt(self, t):
        pass

    def on_down(self):
        return _Nothing()

    on_up = on_down

    def down(self, pairs):
        for host, dev in pairs:
            host.copy_(dev)
        return None

    def wait(self, event):
        pass

    def up(self, pairs):
        for dev, host in pairs:
            dev.copy_(host)

    def fence(self):
        return None

    def order_caller(self, fence):
        pass


class _Nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class Piece:
    """One op of the core: copies down, the op (a callable returning a kt_result),
    copies up."""

    __slots__ = ("down", "op", "up")

    def __init__(self, down, op, up):
        self.down, self.op, self.up = down, op, up


def queue_down(copies, plan):
    """Queue every piece's copies down at once (on the caller's thread: cheap,
    and they start while earlier ops still run); the events to wait for."""
    return [copies.down(p.down) if p.down else None for p in plan]


def finish(copies, plan, events, fail, tail=None):
    """Run plan (a list of Piece) through copies (Streams or Host), pipelined:
    for each piece, wait for its copy down, run its op, queue its copy up;
    then tail() (on the copy-up stream) and return the fence (an event after
    the last copy up, or None). fail(rc) builds the exception for a failed op;
    the pieces after it are not run (the communicator is broken by then:
    every later op of it fails too) and the exception propagates."""
    for p, ev in zip(plan, events):
        copies.wait(ev)
        rc = p.op()
        if rc != _lib.SUCCESS:
            raise fail(rc)
        if p.up:
            copies.up(p.up)
    if tail is not None:
        with copies.on_up():
            tail()
    return copies.fence()
