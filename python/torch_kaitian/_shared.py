"""_shared.py - DDP's gradient buckets in shared memory, registered with the
core, so that their all_reduce among the ranks of one host runs single-copy
(the core reads and writes the peers' buckets in place; include/kaitian.h,
kt_mem_register).

Which tensors: those an all_reduce from C++ (DDP's reducer, a comm hook's
default) is asked to reduce in place, on the CPU, contiguous, covering their
whole storage, of at least KAITIAN_SHM_DIRECT_BYTES, seen a second time at the
same address. A bucket lives as long as its DDP model, so it is moved once:
its storage goes into shared memory in place (torch's own
UntypedStorage._share_fd_cpu_, what Tensor.share_memory_ does), which keeps
every view of it (DDP's gradients with gradient_as_bucket_view) valid. Never
while an op of this group may still use the storage, and never when /dev/shm
lacks room for it (torch's shared storages live there). KAITIAN_SHARE_BUCKETS=0
turns this off.
"""
import ctypes
import os
import threading

from . import _lib

_MARGIN = 64 << 20  # room left in /dev/shm after a bucket moves there
_SEEN_MAX = 64      # addresses remembered between sightings
_CHURN_MAX = 8      # registered storages found freed before auto-sharing stops


def _env_int(name, default):
    try:
        return int(os.environ.get(name, default))
    except ValueError:
        return default


def _untyped(t):
    f = getattr(t, "untyped_storage", None)  # torch 2.x
    return f() if f is not None else t.storage().untyped()


class Sharer:
    """Per process group: what it moved into shared memory and what is in flight."""

    enabled = os.environ.get("KAITIAN_SHARE_BUCKETS", "1") not in ("0", "")
    min_bytes = _env_int("KAITIAN_SHM_DIRECT_BYTES", 32768)

    def __init__(self):
        self.lock = threading.Lock()
        self.busy = {}        # storage address -> ops in flight on it
        self.seen = {}        # (address, bytes) -> sightings
        self.registered = {}  # address -> bytes
        self.churn = 0

    def candidate(self, t):
        """t's untyped storage when t is a bucket-like tensor, else None."""
        if not (self.enabled and self.min_bytes > 0 and t.is_cpu and t.is_contiguous()
                and t.storage_offset() == 0):
            return None
        nbytes = t.numel() * t.element_size()
        if nbytes < self.min_bytes:
            return None
        u = _untyped(t)
        if u.nbytes() != nbytes:
            return None
        return u

    def prepare(self, t):
        """Before an in-place all_reduce of t from C++: move t's storage into
        shared memory and register it when the rules above say so. Returns
        the storage address to pass to done() once the op is over (None: not
        tracked)."""
        u = self.candidate(t)
        if u is None:
            return None
        ptr, nbytes = u.data_ptr(), u.nbytes()
        with self.lock:
            if ptr in self.registered:
                if u.is_shared():
                    return self._track(ptr)
                # Freed since, and the address reused by ordinary memory.
                del self.registered[ptr]
                _lib.lib.kt_mem_deregister(ctypes.c_void_p(ptr))
                self.churn += 1
            if self.churn >= _CHURN_MAX or self.busy.get(ptr):
                return self._track(ptr)
            key = (ptr, nbytes)
            n = self.seen.get(key, 0) + 1
            if n < 2:
                if len(self.seen) >= _SEEN_MAX:
                    self.seen.clear()
                self.seen[key] = n
                return self._track(ptr)
            self.seen.pop(key, None)
            if not u.is_shared() and not _room_for(nbytes):
                return self._track(ptr)
            try:
                fd, size = u._share_fd_cpu_()[:2]
            except (RuntimeError, AttributeError):
                self.enabled = False  # no room after all, or a torch without it
                return self._track(ptr)
            ptr = u.data_ptr()
            if size >= nbytes and _lib.lib.kt_mem_register(ctypes.c_void_p(ptr), nbytes, fd, 0) == _lib.SUCCESS:
                self.registered[ptr] = nbytes
            return self._track(ptr)

    def _track(self, ptr):
        self.busy[ptr] = self.busy.get(ptr, 0) + 1
        return ptr

    def after(self, ptr, finish):
        """The op's finish callback: finish (None: nothing), then done(ptr)."""
        def run():
            try:
                if finish is not None:
                    finish()
            finally:
                self.done(ptr)
        return run

    def done(self, ptr):
        with self.lock:
            n = self.busy.get(ptr, 0) - 1
            if n > 0:
                self.busy[ptr] = n
            else:
                self.busy.pop(ptr, None)


def _room_for(nbytes):
    try:
        st = os.statvfs("/dev/shm")
    except OSError:
        return False
    return st.f_bavail * st.f_frsize >= nbytes + _MARGIN
