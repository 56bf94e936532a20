"""_store.py - torch's c10d store bridged to the C store interface (kt_store_ops).

The core calls these callbacks only on the thread that called kt_comm_init, so
they run with the GIL released by that very ctypes call and re-acquired by
ctypes for the callback. A failure in torch's store is kept (the core cannot
receive Python's message) and joined to the core's own error by the caller.
"""
import ctypes
from datetime import timedelta

from . import _lib

def _keys(arr, n):
    return [arr[i].decode() for i in range(n)]


class StoreBridge:
    """A kt_store whose operations call a torch.distributed.Store.

    Keep the object alive while the C store is in use (the callbacks belong to
    it); free() releases the C handle."""

    def __init__(self, store):
        self.store = store
        self.error = None  # the last exception a callback caught (str)
        self._last_get = (None, None)  # (key, value): a TRUNCATED get is retried at once
        ops = _lib.StoreOps()
        # Every callback object is an attribute, so none is collected while C holds it.
        self._cbs = [
            _lib.SET_FN(self._set), _lib.GET_FN(self._get), _lib.ADD_FN(self._add),
            _lib.WAIT_FN(self._wait), _lib.CHECK_FN(self._check), _lib.DEL_FN(self._del),
            _lib.DESTROY_FN(0)]
        ops.set, ops.get, ops.add, ops.wait, ops.check, ops.del_, ops.destroy = self._cbs
        self._ops = ops
        self.handle = ctypes.c_void_p()
        rc = _lib.lib.kt_store_create(ctypes.byref(ops), None, ctypes.byref(self.handle))
        if rc != _lib.SUCCESS:
            raise RuntimeError(f"kaitian backend: kt_store_create failed: {_lib.strerror(rc)}: "
                               f"{_lib.last_error()}")

    def free(self):
        if self.handle:
            _lib.lib.kt_store_free(self.handle)
            self.handle = ctypes.c_void_p()

    # Each callback returns a kt_result; exceptions never cross into C.
    def _fail(self, what, key, exc):
        self.error = f"torch store {what} of key '{key}' failed: {type(exc).__name__}: {exc}"
        text = str(exc).lower()
        if "timeout" in text or "timed out" in text:
            return _lib.ERR_TIMEOUT
        return _lib.ERR_STORE

    @staticmethod
    def _timeout(ms):
        # torch reads a zero timeout as "none": the shortest real deadline is 1 ms.
        return timedelta(milliseconds=max(ms, 1)) if ms >= 0 else None

    def _set(self, _ctx, key, value, length):
        try:
            self.store.set(key.decode(), ctypes.string_at(value, length) if length else b"")
            return _lib.SUCCESS
        except Exception as e:  # noqa: BLE001 - reported through the result code
            return self._fail("set", key.decode(errors="replace"), e)

    def _get(self, _ctx, key, buf, cap, length, timeout_ms):
        k = key.decode()
        try:
            if self._last_get[0] == k:
                value = self._last_get[1]
            else:
                t = self._timeout(timeout_ms)
                if t is not None:
                    self.store.wait([k], t)
                value = self.store.get(k)
            length[0] = len(value)
            if len(value) > cap:
                self._last_get = (k, value)
                return _lib.ERR_TRUNCATED
            self._last_get = (None, None)
            ctypes.memmove(buf, value, len(value))
            return _lib.SUCCESS
        except Exception as e:  # noqa: BLE001
            self._last_get = (None, None)
            return self._fail("get", k, e)

    def _add(self, _ctx, key, delta, result):
        try:
            result[0] = int(self.store.add(key.decode(), int(delta)))
            return _lib.SUCCESS
        except Exception as e:  # noqa: BLE001
            return self._fail("add", key.decode(errors="replace"), e)

    def _wait(self, _ctx, keys, n, timeout_ms):
        ks = _keys(keys, n)
        try:
            t = self._timeout(timeout_ms)
            if t is None:
                self.store.wait(ks)
            else:
                self.store.wait(ks, t)
            return _lib.SUCCESS
        except Exception as e:  # noqa: BLE001
            return self._fail("wait", ",".join(ks), e)

    def _check(self, _ctx, keys, n, ready):
        ks = _keys(keys, n)
        try:
            ready[0] = 1 if self.store.check(ks) else 0
            return _lib.SUCCESS
        except Exception as e:  # noqa: BLE001
            return self._fail("check", ",".join(ks), e)

    def _del(self, _ctx, key):
        k = key.decode()
        try:
            self.store.delete_key(k)
        except Exception:  # noqa: BLE001 - some stores (FileStore) cannot delete; harmless
            pass
        return _lib.SUCCESS
