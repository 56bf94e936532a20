"""_hier.py - within one device type, the device's own library; across types,
the core through host memory.

In a group where a device type has several ranks and torch has a collective
library for it (NCCL for CUDA), those ranks reduce among themselves with that
library, one of them (the lowest rank: the type's leader) takes the type's
result across to the other types through the core, and hands the result back
within its type. Ranks of a type without a library (the CPU, whose library is
this one) take part in the crossing directly.

    allreduce:  library reduce to the leader -> the leaders and the other
                ranks allreduce through the core -> library broadcast
    broadcast:  within the root's type by its library, across by the core
                from its leader (or from the root itself), then within every
                other type from its leader

Other ops, dtypes and reduce ops the library lacks run over the whole group
as before. KAITIAN_DEVICE_LIBRARY: unset or 1 = on where a non-CPU type has
2+ ranks and torch has its library (cuda: nccl); 0 = off; nccl or gloo = that
library for every non-CPU type with 2+ ranks (gloo stands in on machines
without a device, for tests).

A failure within a type (a rank died: the library raises) or across (the
core's error) is raised by the op on that rank; a rank waiting on a leader
that failed sees its library fail when that rank's process ends, and the
group's timeout bounds the rest.
"""
import os
from datetime import timedelta

import torch

from . import _completion as C
from . import _devpath
from . import _lib
from . import _staging as S
from ._work import PYTHON, SYNC, Work, _DoneWork, _work_from_future

_c10d = torch._C._distributed_c10d
_ENV = "KAITIAN_DEVICE_LIBRARY"
_DEFAULT_LIBRARY = {"cuda": "nccl"}
_OPS = {_lib.SUM: "SUM", _lib.PROD: "PRODUCT", _lib.MIN: "MIN", _lib.MAX: "MAX"}
_DTYPES = {
    "gloo": (torch.float16, torch.float32, torch.float64, torch.int8, torch.uint8, torch.int32,
             torch.int64),
    "nccl": (torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int8, torch.uint8,
             torch.int32, torch.int64),
}


def setting():
    """KAITIAN_DEVICE_LIBRARY read: "auto", "off", "nccl" or "gloo"."""
    raw = os.environ.get(_ENV, "").strip().lower()
    if raw in ("", "1", "auto", "on"):
        return "auto"
    if raw in ("0", "off"):
        return "off"
    if raw in _DTYPES:
        return raw
    raise ValueError(f"{_ENV}={os.environ.get(_ENV)!r}: expected 1 (on where torch has a library), "
                     f"0 (off), nccl or gloo")


def _available(library):
    import torch.distributed as dist
    if library == "nccl":
        return dist.is_nccl_available() and torch.cuda.is_available()
    return dist.is_gloo_available()


def layout(types, how):
    """{type: library} for the types served by a library, given every rank's
    type and the setting; {} when none is."""
    if how == "off":
        return {}
    out = {}
    for t in sorted(set(types)):
        if t == "cpu" or types.count(t) < 2:
            continue
        lib = _DEFAULT_LIBRARY.get(t) if how == "auto" else how
        if lib is not None and _available(lib):
            out[t] = lib
    return out


class _Members:
    """What a DevicePath needs of its group: this rank's place and a counter."""

    def __init__(self, rank, size, outstanding):
        self._rank, self._size, self._outstanding = rank, size, outstanding


class Hierarchy:
    """The hierarchical path of one ProcessGroupKaitian."""

    def __init__(self, pg, store, bridge, libs):
        self.pg = pg
        types = pg._types
        me = pg._rank
        self.libs = libs
        self.members = {t: [r for r, x in enumerate(types) if x == t] for t in libs}
        self.leader = {t: rs[0] for t, rs in self.members.items()}
        self.cross = sorted(set(self.leader.values()) |
                            {r for r, x in enumerate(types) if x not in libs})
        self.type = types[me]
        self.library = libs.get(self.type)
        self.group = None
        self.sub_rank = None
        if self.library is not None:
            rs = self.members[self.type]
            self.sub_rank = rs.index(me)
            timeout = timedelta(milliseconds=pg._timeout_ms or 1800000)
            sub_store = _c10d.PrefixStore(f"{pg._prefix}/lib/{self.type}", store)
            self.group = self._make_library(self.library, sub_store, self.sub_rank, len(rs), timeout)
            if self.library == "gloo":
                self._forget_gloo_keys(sub_store, len(rs))
        self.cross_comm = None
        self.cross_path = None
        if me in self.cross and len(self.cross) > 1:
            crank = self.cross.index(me)
            self.cross_comm = pg._init_comm(bridge, f"{pg._prefix}/cross", crank, len(self.cross))
            self.cross_path = _devpath.DevicePath(_Members(crank, len(self.cross), pg._outstanding),
                                                  self.cross_comm)
        self.stager = _devpath.Stager()
        self.streams = {}

    @staticmethod
    def _make_library(library, store, rank, size, timeout):
        if library == "gloo":
            return _c10d.ProcessGroupGloo(store, rank, size, timeout)
        opts = _c10d.ProcessGroupNCCL.Options()
        opts._timeout = timeout
        return _c10d.ProcessGroupNCCL(store, rank, size, opts)

    def _forget_gloo_keys(self, store, size):
        """Past a barrier every member has connected: delete the addresses gloo
        left in the store (torch 1.13 and 2.x name them <device>/<rank> and
        <device>/rank_<rank>), or each group made and destroyed leaves them."""
        self.group.barrier().wait()
        if self.sub_rank == 0:
            for r in range(size):
                for key in (f"0/{r}", f"0/rank_{r}"):
                    try:
                        store.delete_key(key)
                    except Exception:  # noqa: BLE001 - a store that cannot delete: harmless
                        pass

    def describe(self):
        parts = [f"{t} ranks {self.members[t]} over {lib} (leader {self.leader[t]})"
                 for t, lib in sorted(self.libs.items())]
        return "; ".join(parts) + f"; across types through kaitian: ranks {self.cross}"

    def close(self):
        self.stager.stop()
        if self.cross_path is not None:
            self.cross_path.close()

    # ---- which ops ------------------------------------------------------------------
    def takes(self, dtype, op=None):
        """Whether an op on dtype (with reduce op `op`) goes the hierarchical
        way. It depends on nothing but the arguments every rank passes alike,
        so every rank decides alike: a tensor on another device than its
        type's library takes (a CUDA rank's CPU scalar, say) is moved there
        and back (_on_library_device)."""
        if not all(dtype in _DTYPES[lib] for lib in self.libs.values()):
            return False
        if op is None:
            return True
        if op == _lib.AVG:
            return dtype.is_floating_point
        return op in _OPS

    def _on_library_device(self, t):
        """(tensor for the chain, copy back or None): contiguous, and on the
        device the library takes (nccl: this rank's current CUDA device)."""
        w = t
        if self.library == "nccl" and not t.is_cuda:
            w = t.to(torch.device("cuda", torch.cuda.current_device()))
        elif not t.is_contiguous():
            w = t.contiguous()
        if w is t:
            return t, None
        return w, (lambda: t.copy_(w))

    # ---- the ops --------------------------------------------------------------------
    def _lib_fail(self, what, step, e):
        return C.KaitianError(_lib.ERR_PEER_FAILED,
                              f"kaitian backend: {what()} failed: within the {self.type} ranks "
                              f"{self.members[self.type]} over {self.library} ({step}): {e}")

    def _lib_op(self, what, step, call):
        try:
            call().wait()
        except C.KaitianError:
            raise
        except RuntimeError as e:
            raise self._lib_fail(what, step, e) from None

    def allreduce(self, t, result, op, what, mode):
        sum_op = _lib.SUM if op == _lib.AVG else op
        rop = getattr(_c10d.ReduceOp, _OPS[sum_op])
        world = self.pg._size

        def chain():
            w, back = self._on_library_device(t) if self.group is not None else (t, None)
            if self.group is not None:
                o = _c10d.ReduceOptions()
                o.reduceOp, o.rootRank, o.rootTensor = rop, 0, 0
                self._lib_op(what, "reduce to the leader", lambda: self.group.reduce([w], o))
            if self.cross_path is not None:
                self.cross_path.allreduce(w, [w], sum_op, what, SYNC)
            if self.group is not None:
                o = _c10d.BroadcastOptions()
                o.rootRank, o.rootTensor = 0, 0
                self._lib_op(what, "broadcast from the leader", lambda: self.group.broadcast([w], o))
            if op == _lib.AVG:
                w.div_(world)
            if back is not None:
                back()
        return self._issue(t, result, what, mode, chain)

    def broadcast(self, t, result, root, what, mode):
        types = self.pg._types
        root_type = types[root]
        me = self.pg._rank
        source = self.leader.get(root_type, root)  # who crosses for the root's type

        def chain():
            w, back = self._on_library_device(t) if self.group is not None else (t, None)
            if self.group is not None and self.type == root_type:
                o = _c10d.BroadcastOptions()
                o.rootRank, o.rootTensor = self.members[self.type].index(root), 0
                self._lib_op(what, f"broadcast from rank {root}", lambda: self.group.broadcast([w], o))
            if self.cross_path is not None:
                self.cross_path.broadcast(w, [w], self.cross.index(source), what, SYNC)
            if self.group is not None and self.type != root_type:
                o = _c10d.BroadcastOptions()
                o.rootRank, o.rootTensor = 0, 0
                self._lib_op(what, "broadcast from the leader", lambda: self.group.broadcast([w], o))
            if back is not None and me != root:
                back()
        return self._issue(t, result, what, mode, chain)

    # ---- issuing --------------------------------------------------------------------
    def _stream_for(self, t):
        """(context making a stream of the chain's own current, after the
        caller's current stream) for a device tensor; a null context else."""
        if t.device.type == "cpu" or not S.Streams.supports(t.device):
            return S._Nothing()
        mod = getattr(torch, t.device.type)
        s = self.streams.get(t.device)
        if s is None:
            with mod.device(t.device):
                s = self.streams[t.device] = mod.Stream()
        ev = mod.Event()
        ev.record(mod.current_stream(t.device))
        s.wait_event(ev)
        t.record_stream(s)
        return mod.stream(s)

    def _issue(self, t, result, what, mode, chain):
        if mode == SYNC:
            if self.stager.try_inline():
                try:
                    chain()
                finally:
                    self.stager.end_inline()
                return _DoneWork(result)
            ctx = self._stream_for(t)

            def job():
                with ctx:
                    chain()
                    return _fence(t)
            _order_after(t, self.stager.run_and_wait(job))
            return _DoneWork(result)
        ctx = self._stream_for(t)
        fut, user = C.new_op_futures(result)
        pending = C.Pending(None, fut, None, result, [t], what)
        work = Work(user, pending) if mode == PYTHON else _work_from_future(user)
        counter = self.pg._outstanding
        counter.add(1)

        def job():
            with ctx:
                exc = None
                try:
                    chain()
                except Exception as e:  # noqa: BLE001 - handed to the waiter
                    exc = e
                _devpath.complete(pending, fut, result, exc, counter)
        self.stager.submit(job)
        return work


def _fence(t):
    if t.device.type == "cpu" or not S.Streams.supports(t.device):
        return None
    mod = getattr(torch, t.device.type)
    ev = mod.Event()
    ev.record(mod.current_stream(t.device))
    return ev


def _order_after(t, ev):
    if ev is not None:
        getattr(torch, t.device.type).current_stream(t.device).wait_event(ev)
