"""process_group.py - the "kaitian" torch.distributed backend: a ProcessGroup
written in Python whose every operation runs in libkaitian.

Each group owns three communicators, bootstrapped through the store torch hands
to the backend creator: one for collectives and two for point-to-point messages
(one carries messages from lower to higher ranks, the other the reverse), so a
send never waits behind a collective and two ranks can send to each other at
the same time, as gloo allows.

Works: a call that torch's Python API makes with async_op=False (and send/recv)
runs as a blocking call of the core on the caller's thread. Otherwise the op is
issued non-blocking and a torch Future is completed by the completion thread
(_completion.py). torch's Python wrappers get a Work whose wait() raises the
core's error; C++ callers (DDP's reducer, broadcast_coalesced) get the Work of
torch._C._distributed_c10d._create_work_from_future, which C++ keeps alive.
"""
import ctypes
import os
import sys
import time
import weakref

import torch

from . import _completion as C
from . import _devpath
from . import _lib
from . import _tensors as T
from ._shared import Sharer
from ._opts import _ms, _one, _opt, _reduce_op  # noqa: F401 - _ms: tests read it here
from ._tensors import any_cuda as _any_cuda, consecutive as _consecutive
from ._tensors import flat_host as _flat_host
from ._work import OTHER, PYTHON, SYNC, Work, _DoneWork, _caller_mode, _work_from_future  # noqa: F401
from ._work import completed as _completed_work
from ._store import StoreBridge

_c10d = torch._C._distributed_c10d
_lib_ = _lib.lib

# A Python subclass of ProcessGroup: torch 1.13 uses what the creator returns
# as the group; torch 2.x does too when it is a ProcessGroup (rather than a
# per-device Backend), so torch's Python API calls these methods directly in both.
_Base = _c10d.ProcessGroup

_BLOCKING = {n: getattr(_lib_, "kt_" + n) for n in _lib.COLLECTIVES}
_NONBLOCKING = {n: getattr(_lib_, "kt_i" + n) for n in _lib.COLLECTIVES}


def _release_comms(comms, outstanding, pid=None, devpath=None, hier=None):
    """Free a group's communicators (finalizer: the group died or the process exits).
    Never in a forked child that exits normally: the sockets and shared memory
    it inherited are still its parent's."""
    if pid is not None and pid != os.getpid():
        return
    if outstanding.n == 0:
        for path in (hier, devpath):
            if path is not None:
                path.close()
    for comm in comms:
        if comm:
            if outstanding.n > 0:  # some op can never finish now: unblock it
                _lib_.kt_comm_abort(comm)
            _lib_.kt_comm_destroy(comm)


class ProcessGroupKaitian(_Base):
    """A torch ProcessGroup over KaiTian communicators. Created by torch through
    the backend creator registered as "kaitian" (see torch_kaitian.__init__)."""

    def __init__(self, store, rank, size, timeout=None):
        super().__init__(rank, size)
        self._rank, self._size = rank, size
        self._store = store
        self._timeout_ms = _ms(timeout)
        self._outstanding = C.InFlight()
        self._sharer = Sharer()
        self._recv_counts = {}  # (src, tag) -> messages received (for recv from any source)
        # A generation per creation over this store, the same on every rank: a
        # group created again (after destroy) over a reused store never reads
        # the keys of the previous one. (A creation that succeeded leaves no
        # key and deletes the counter: _forget_addresses.)
        gen = (int(store.add("kaitian/generation", 1)) - 1) // size
        self._prefix = f"kaitian/{gen}"
        bridge = StoreBridge(store)
        comms = []
        parts = ("coll", "p2p-up", "p2p-down") if size > 1 else ("coll",)
        self._types = [_devpath.local_type()] * size
        self._dev = None
        self._hier = None
        try:
            for part in parts:
                comms.append(self._init_comm(bridge, f"{self._prefix}/{part}"))
            if size > 1:
                self._types = self._exchange_types(comms[0])
                self._forget_addresses(parts)
                if any(t != "cpu" for t in self._types):
                    # Some rank computes on a device: large ops in pieces on a
                    # communicator of their own (_devpath.py).
                    comms.append(self._init_comm(bridge, f"{self._prefix}/dev"))
                    self._barrier(comms[-1], "the device communicator")
                    self._forget_addresses(["dev"], generation=False)
                    self._dev = _devpath.DevicePath(self, comms[-1])
                    self._hier = self._make_hierarchy(store, bridge, comms)
            else:
                self._forget_keys(["kaitian/generation"])  # one rank: nothing published
        except BaseException:
            _release_comms(comms, C.InFlight())
            raise
        finally:
            bridge.free()
        self._comm = comms[0]
        self._p2p_up = comms[1] if size > 1 else None    # lower rank -> higher rank
        self._p2p_down = comms[2] if size > 1 else None  # higher rank -> lower rank
        self._comms = comms
        self._completer = C.completer()
        self._finalizer = weakref.finalize(self, _release_comms, comms, self._outstanding, os.getpid(),
                                           self._dev, self._hier)

    _TYPE_BYTES = 32

    def _make_hierarchy(self, store, bridge, comms):
        """Within a device type its library, across types the core (_hier.py),
        where KAITIAN_DEVICE_LIBRARY and the ranks' types call for it; the
        cross-type communicator joins comms (released with the group)."""
        from . import _hier
        libs = _hier.layout(self._types, _hier.setting())
        if not libs:
            return None
        h = _hier.Hierarchy(self, store, bridge, libs)
        if h.cross_comm is not None:
            comms.append(h.cross_comm)
            self._barrier(h.cross_comm, "the communicator across device types")
            self._forget_addresses(["cross"], generation=False, rank=h.cross.index(self._rank))
        if self._rank == 0 and os.environ.get("KAITIAN_DEBUG", "").upper() in ("INFO", "TRACE"):
            sys.stderr.write(f"kaitian backend: device libraries: {h.describe()}\n")
        return h

    def _exchange_types(self, comm):
        """Every rank's device type (_devpath.local_type), gathered on comm.
        Past it every rank has set up all of this group's first communicators."""
        n = self._TYPE_BYTES
        mine = _devpath.local_type().encode()[:n].ljust(n, b"\0")
        send = ctypes.create_string_buffer(mine, n)
        recv = ctypes.create_string_buffer(n * self._size)
        rc = _lib_.kt_allgather(send, recv, n, _lib.UINT8, comm)
        if rc != _lib.SUCCESS:
            raise C.KaitianError(rc, f"kaitian backend: rank {self._rank} of {self._size}: exchanging the "
                                     f"ranks' device types after setting up the communicators failed: "
                                     f"{_lib.strerror(rc)}: {_lib.last_error()}")
        raw = recv.raw
        return [raw[i * n:(i + 1) * n].rstrip(b"\0").decode(errors="replace") or "cpu"
                for i in range(self._size)]

    def _barrier(self, comm, what):
        rc = _lib_.kt_barrier(comm)
        if rc != _lib.SUCCESS:
            raise C.KaitianError(rc, f"kaitian backend: rank {self._rank} of {self._size}: the barrier after "
                                     f"setting up {what} failed: {_lib.strerror(rc)}: {_lib.last_error()}")

    def _forget_addresses(self, parts, generation=True, rank=None):
        """Delete the keys this rank published to set its communicators up
        (each rank its address under <prefix>/<part>/tcp/<rank>; rank 0 also
        <prefix>/<part>/link and linkreq, where they span hosts), once every
        rank has read them (the caller has passed a collective on them). Else
        every group made and destroyed would leave its keys in the store
        (torch's TCPStore lives in rank 0's process) for good."""
        rank = self._rank if rank is None else rank
        keys = [f"{self._prefix}/{part}/tcp/{rank}" for part in parts]
        if rank == 0:
            # A communicator that spans hosts also left rank 0's link speed
            # (and its request) there: one made again under the same prefix
            # must not read the old one.
            keys += [f"{self._prefix}/{part}/{k}" for part in parts for k in ("link", "linkreq")]
            # Every rank has counted itself in the generation (before the
            # collective), and this creation left no address behind: one made
            # again over this store may start from generation 0.
            if generation:
                keys.append("kaitian/generation")
        self._forget_keys(keys)

    def _forget_keys(self, keys):
        for key in keys:
            try:
                self._store.delete_key(key)
            except Exception:  # noqa: BLE001 - some stores (FileStore) cannot delete; harmless
                pass

    def _init_comm(self, bridge, prefix, rank=None, size=None):
        """A communicator over the store (bridge) under prefix: of the whole
        group, or of `size` of its ranks, this one being `rank` among them."""
        comm = ctypes.c_void_p()
        pre = prefix.encode()
        cfg = _lib.Config(ctypes.sizeof(_lib.Config), self._timeout_ms, pre)
        rank = self._rank if rank is None else rank
        size = self._size if size is None else size
        rc = _lib_.kt_comm_init(ctypes.byref(comm), rank, size, bridge.handle, ctypes.byref(cfg))
        if rc != _lib.SUCCESS:
            msg = (f"kaitian backend: rank {self._rank} of {self._size}: communicator '{prefix}' "
                   f"could not be set up through torch's store: {_lib.strerror(rc)}: {_lib.last_error()}")
            if bridge.error:
                msg += f" ({bridge.error})"
            raise C.KaitianError(rc, msg)
        return comm

    # ---- torch's ProcessGroup interface: names -------------------------------------
    def getBackendName(self):  # noqa: N802 - the C++ name the trampoline looks up
        return "kaitian"

    def name(self):
        return "kaitian"

    _get_backend_name = name

    # torch 2.x names every group (_set_group_name) and reads the name back on
    # destroy_process_group; ProcessGroup keeps it in its per-device backends,
    # which a group implemented in Python has none of: keep it here.
    def _set_group_name(self, name):
        self._group_name = name

    @property
    def group_name(self):
        return getattr(self, "_group_name", "")

    def _set_group_desc(self, desc):
        self._group_desc = desc

    @property
    def group_desc(self):
        return getattr(self, "_group_desc", "")

    # torch >= 2.15 asks a group for its backend of a device (batch_isend_irecv,
    # abort) and reads supports_coalescing from it: a group implemented in
    # Python is its own backend for every device, and runs ops as issued.
    supports_coalescing = False
    supports_splitting = False

    def _get_backend(self, device=None):
        return self

    def _start_coalescing(self, *args, **kwargs):
        """batch_isend_irecv: ops run as issued (p2p directions never block each other)."""

    def _end_coalescing(self, *args, **kwargs):
        pass

    def __repr__(self):
        return f"<ProcessGroupKaitian rank {self._rank} of {self._size}>"

    # ---- issuing ---------------------------------------------------------------------
    def _submit(self, comm, name, args, what, mode, result, keep=None, finish=None, source=-1):
        """Run kt_<name>(*args, comm) blocking (SYNC) or kt_i<name> with a future.

        what: callable giving the op's description for error messages. finish:
        run after success (copy staged results back). result: the future's value.
        Raises on an error at issue time (nothing was started then)."""
        if mode == SYNC:
            rc = _BLOCKING[name](*args, comm)
            if rc != _lib.SUCCESS:
                raise C.make_error(rc, _lib.last_error(), what())
            if finish is not None:
                finish()
            return _DoneWork(result, source)
        # Everything but the completion queue's entry is made before the op
        # starts: once it runs, the progress thread wants this CPU, and a caller
        # preempted in Python would hold the GIL the completion thread needs.
        fut, user = C.new_op_futures(result)
        op = C.Pending(None, fut, finish, result, keep, what)
        op.source = source
        op.counter = self._outstanding
        work = Work(user, op) if mode == PYTHON else _work_from_future(user)
        req = ctypes.c_void_p()
        rc = _NONBLOCKING[name](*args, comm, ctypes.byref(req))
        if rc != _lib.SUCCESS:
            raise C.make_error(rc, _lib.last_error(), what())
        op.req = req
        self._outstanding.add(1)
        self._completer.add(op)
        return work

    def _desc(self, what):
        return lambda: f"rank {self._rank} of {self._size}: {what}"

    # ---- collectives -----------------------------------------------------------------
    def allreduce(self, tensors, opts=None):
        mode = _caller_mode()
        t, tensors = _one(tensors, "allreduce")
        op, opname = _reduce_op(opts)
        if t.is_sparse:
            return self._sparse_allreduce(t, tensors, op, opname, mode)
        # From C++ (DDP's reducer): a bucket may move into shared memory
        # (_shared.py), before its address is taken.
        if self._hier is not None and self._hier.takes(t.dtype, op):
            return self._hier.allreduce(
                t, tensors, op, self._desc(f"allreduce of {t.numel()} {t.dtype} ({opname})"), mode)
        shared = self._sharer.prepare(t) if mode == OTHER else None
        if self._dev is not None:
            return self._dev.allreduce(
                t, tensors, op, self._desc(f"allreduce of {t.numel()} {t.dtype} ({opname})"), mode,
                None if shared is None else (lambda: self._sharer.done(shared)))
        b = T.stage(t, op=op)
        finish = b.writeback if b._back else None
        if shared is not None:
            finish = self._sharer.after(shared, finish)
        return self._submit(
            self._comm, "allreduce", (b.ptr, b.ptr, b.count, b.dt, op),
            lambda: f"rank {self._rank} of {self._size}: allreduce of {t.numel()} {t.dtype} "
                    f"({opname})",
            mode, tensors, (b, tensors), finish)

    def _completed(self, mode, result):
        return _completed_work(mode, result)

    def _sparse_allreduce(self, t, tensors, op, opname, mode):
        """Sparse COO SUM, as gloo does it: gather every rank's indices and values,
        add them up, leave the coalesced sum in t. Runs to completion before
        returning (blocking calls of the core)."""
        if op != _lib.SUM:
            raise T.KaitianUnsupported(f"kaitian backend: sparse allreduce supports ReduceOp SUM "
                                       f"only, not {opname}")
        src = t.detach().cpu()
        idx = src._indices().contiguous()
        vals = src._values().contiguous()
        p = self._size
        what = self._desc(f"sparse allreduce of {tuple(t.shape)} {t.dtype}")

        def run(name, *args):
            rc = getattr(_lib_, "kt_" + name)(*args, self._comm)
            if rc != _lib.SUCCESS:
                raise C.make_error(rc, _lib.last_error(), what())

        nnz = torch.tensor([idx.shape[1]], dtype=torch.int64)
        all_nnz = torch.empty(p, dtype=torch.int64)
        run("allgather", nnz.data_ptr(), all_nnz.data_ptr(), 1, _lib.INT64)
        counts = all_nnz.tolist()

        def gatherv(local, per_item):
            n = [c * per_item for c in counts]
            bl = T.stage(local.reshape(-1), read=True, write=False)
            host, view, dt, k = _flat_host(sum(n), local.dtype, False)
            rc_, rd_ = T.size_array([x * k for x in n]), T.size_array([sum(n[:i]) * k for i in range(p)])
            run("allgatherv", bl.ptr, bl.count, view.data_ptr() or T.EMPTY_PTR, rc_, rd_, dt)
            return host, n

        sdim = idx.shape[0]
        dense = vals.shape[1:]
        per_val = 1
        for d in dense:
            per_val *= d
        ihost, _ = gatherv(idx, sdim)
        vhost, _ = gatherv(vals, per_val)
        parts_i, parts_v, oi, ov = [], [], 0, 0
        for c in counts:
            parts_i.append(ihost[oi:oi + c * sdim].view(sdim, c))
            parts_v.append(vhost[ov:ov + c * per_val].view((c,) + tuple(dense)))
            oi += c * sdim
            ov += c * per_val
        total = torch.sparse_coo_tensor(torch.cat(parts_i, 1), torch.cat(parts_v, 0), src.shape)
        total = total.coalesce()
        t.copy_(total.to(t.device))
        return self._completed(mode, tensors)

    def allreduce_coalesced(self, tensors, opts=None):
        mode = _caller_mode()
        if not tensors:
            return self._submit(self._comm, "barrier", (), self._desc("allreduce_coalesced"),
                                mode, [])
        op, opname = _reduce_op(opts)
        t0 = T.check_same(tensors, "allreduce_coalesced")
        work, dt, how = T.reduce_plan(t0.dtype, op)
        flat = T.flat_stage(tensors, work=work)
        view = torch.view_as_real(flat) if how == "complex" else (
            flat.view(torch.int64) if how == "uint64" else flat)
        n = view.numel()
        ptr = view.data_ptr() if n else T.EMPTY_PTR
        return self._submit(
            self._comm, "allreduce", (ptr, ptr, n, dt, op),
            self._desc(f"allreduce_coalesced of {len(tensors)} {t0.dtype} tensors ({opname})"),
            mode, tensors, (flat, tensors), lambda: T.unflatten_into(flat, tensors))

    def broadcast(self, tensors, opts=None):
        mode = _caller_mode()
        t, tensors = _one(tensors, "broadcast")
        root = _opt(opts, "rootRank", 0)
        self._check_root(root, "broadcast")
        is_root = root == self._rank
        if self._hier is not None and self._hier.takes(t.dtype):
            return self._hier.broadcast(t, tensors, root,
                                        self._desc(f"broadcast of {t.numel()} {t.dtype} from root {root}"),
                                        mode)
        if self._dev is not None:
            return self._dev.broadcast(t, tensors, root,
                                       self._desc(f"broadcast of {t.numel()} {t.dtype} from root {root}"), mode)
        b = T.stage(t, read=is_root, write=not is_root)
        return self._submit(
            self._comm, "broadcast", (b.ptr, b.ptr, b.count, b.dt, root),
            self._desc(f"broadcast of {t.numel()} {t.dtype} from root {root}"),
            mode, tensors, (b, tensors), b.writeback if b._back else None)

    def reduce(self, tensors, opts=None):
        mode = _caller_mode()
        t, tensors = _one(tensors, "reduce")
        op, opname = _reduce_op(opts)
        root = _opt(opts, "rootRank", 0)
        self._check_root(root, "reduce")
        is_root = root == self._rank
        if self._dev is not None:
            return self._dev.reduce(t, tensors, op, root, self._desc(
                f"reduce of {t.numel()} {t.dtype} ({opname}) to root {root}"), mode)
        b = T.stage(t, op=op, read=True, write=is_root)
        return self._submit(
            self._comm, "reduce", (b.ptr, b.ptr if is_root else None, b.count, b.dt, op, root),
            self._desc(f"reduce of {t.numel()} {t.dtype} ({opname}) to root {root}"),
            mode, tensors, (b, tensors), b.writeback if b._back else None)

    def allgather(self, output_tensors, input_tensors, opts=None):
        mode = _caller_mode()
        t, input_tensors = _one(input_tensors, "allgather")
        if len(output_tensors) != 1:
            raise ValueError("kaitian backend: allgather takes one output list per process, "
                             f"got {len(output_tensors)}")
        outs = output_tensors[0]
        self._check_list(outs, t, "allgather output")
        b = T.stage(t, read=True, write=False)
        counts = [o.numel() for o in outs]
        if counts[self._rank] != t.numel():
            raise ValueError(f"kaitian backend: allgather: output tensor {self._rank} has "
                             f"{counts[self._rank]} elements but the input has {t.numel()}")
        what = self._desc(f"allgather of {t.numel()} {t.dtype}")
        if not all(c == counts[0] for c in counts) and _consecutive(outs) and b.dt == \
                T.NATIVE[t.dtype] and outs[0].data_ptr():
            # Uneven parts of one buffer: the core writes them in place.
            rc = T.size_array(counts)
            rd = T.size_array([sum(counts[:i]) for i in range(len(counts))])
            args = (b.ptr, b.count, outs[0].data_ptr(), rc, rd, b.dt)
            return self._submit(self._comm, "allgatherv", args, what, mode, output_tensors,
                                (b, outs, rc, rd), None)
        host, view, dt, k = _flat_host(sum(counts), t.dtype, _any_cuda(outs))
        finish = lambda: T.unflatten_into(host, outs)  # noqa: E731
        if all(c == counts[0] for c in counts):
            args = (b.ptr, view.data_ptr() or T.EMPTY_PTR, b.count, dt)
            return self._submit(self._comm, "allgather", args, what, mode, output_tensors,
                                (b, host, outs), finish)
        rc = T.size_array([c * k for c in counts])
        rd = T.size_array([sum(counts[:i]) * k for i in range(len(counts))])
        args = (b.ptr, b.count, view.data_ptr() or T.EMPTY_PTR, rc, rd, dt)
        return self._submit(self._comm, "allgatherv", args, what, mode, output_tensors,
                            (b, host, outs, rc, rd), finish)

    def _allgather_base(self, output, input, opts=None, _mode=None):  # noqa: A002 - torch's names
        mode = _caller_mode() if _mode is None else _mode
        if output.numel() != input.numel() * self._size:
            raise ValueError(f"kaitian backend: all_gather_into_tensor: output has {output.numel()} "
                             f"elements, expected {self._size} x {input.numel()}")
        if output.dtype != input.dtype:
            raise ValueError(f"kaitian backend: all_gather_into_tensor: output dtype {output.dtype} "
                             f"differs from input dtype {input.dtype}")
        if self._dev is not None:
            return self._dev.allgather(output, input, [output], self._desc(
                f"all_gather_into_tensor of {input.numel()} {input.dtype}"), mode)
        bo = T.stage(output, read=False, write=True)
        bi = T.stage(input, read=True, write=False)
        return self._submit(
            self._comm, "allgather", (bi.ptr, bo.ptr, bi.count, bi.dt),
            self._desc(f"all_gather_into_tensor of {input.numel()} {input.dtype}"),
            mode, [output], (bi, bo, output, input), bo.writeback if bo._back else None)

    all_gather_into_tensor = _allgather_base
    all_gather_single = _allgather_base  # torch >= 2.15 calls the group's methods by these names

    def allgather_coalesced(self, output_lists, input_list, opts=None):
        mode = _caller_mode()
        # Every input as bytes, each at a 16-byte aligned offset, in one buffer.
        sizes = [t.numel() * t.element_size() for t in input_list]
        offs, off = [], 0
        for s in sizes:
            offs.append(off)
            off += (s + 15) // 16 * 16
        total = off
        pin = _any_cuda(list(input_list))
        send = torch.zeros(total, dtype=torch.uint8, pin_memory=pin)
        for t, o, s in zip(input_list, offs, sizes):
            if s:
                send[o:o + s].copy_(t.contiguous().reshape(-1).view(torch.uint8))
        if len(output_lists) != self._size:
            raise ValueError(f"kaitian backend: allgather_coalesced: {len(output_lists)} output "
                             f"lists, expected {self._size}")
        recv = torch.empty(total * self._size, dtype=torch.uint8)

        def finish():
            for r, outs in enumerate(output_lists):
                if len(outs) != len(input_list):
                    raise ValueError(f"kaitian backend: allgather_coalesced: output list {r} has "
                                     f"{len(outs)} tensors, expected {len(input_list)}")
                for o, t, of, s in zip(outs, input_list, offs, sizes):
                    chunk = recv[r * total + of: r * total + of + s]
                    o.copy_(chunk.view(t.dtype).view(o.shape) if s else o)
        return self._submit(
            self._comm, "allgather", (send.data_ptr() or T.EMPTY_PTR, recv.data_ptr() or T.EMPTY_PTR,
                                      total, _lib.UINT8),
            self._desc(f"allgather_coalesced of {len(input_list)} tensors ({total} bytes)"),
            mode, output_lists, (send, recv, input_list, output_lists), finish)

    def gather_single(self, output, input, opts=None):  # noqa: A002 - torch's names
        """torch >= 2.15: gather into one tensor of size x the input's elements
        on the root (an empty tensor elsewhere)."""
        mode = _caller_mode()
        root = _opt(opts, "rootRank", 0)
        self._check_root(root, "gather")
        if self._rank != root:
            return self.gather([], [input], opts, _mode=mode)
        if output.numel() != input.numel() * self._size:
            raise ValueError(f"kaitian backend: gather_single: the output has {output.numel()} "
                             f"elements, expected {self._size} x {input.numel()}")
        if not output.is_contiguous():
            raise ValueError("kaitian backend: gather_single: the output must be contiguous")
        outs = list(output.view(self._size, -1).view(self._size, *input.shape).unbind(0)) \
            if input.dim() else list(output.view(self._size))
        return self.gather([outs], [input], opts, _mode=mode)

    def gather(self, output_tensors, input_tensors, opts=None, _mode=None):
        mode = _caller_mode() if _mode is None else _mode
        t, input_tensors = _one(input_tensors, "gather")
        root = _opt(opts, "rootRank", 0)
        self._check_root(root, "gather")
        b = T.stage(t, read=True, write=False)
        what = self._desc(f"gather of {t.numel()} {t.dtype} to root {root}")
        if self._rank != root:
            if output_tensors and any(len(o) for o in output_tensors):
                raise ValueError("kaitian backend: gather: only the root passes output tensors")
            return self._submit(self._comm, "gather", (b.ptr, None, b.count, b.dt, root), what,
                                mode, [], (b, t))
        if len(output_tensors) != 1:
            raise ValueError("kaitian backend: gather: the root passes one output list")
        outs = output_tensors[0]
        self._check_list(outs, t, "gather output")
        for i, o in enumerate(outs):
            if o.numel() != t.numel():
                raise ValueError(f"kaitian backend: gather: output tensor {i} has {o.numel()} "
                                 f"elements, the input {t.numel()} (sizes must be equal)")
        host, view, dt, _k = _flat_host(t.numel() * self._size, t.dtype, _any_cuda(outs))
        return self._submit(
            self._comm, "gather", (b.ptr, view.data_ptr() or T.EMPTY_PTR, b.count, dt, root), what,
            mode, output_tensors, (b, host, outs), lambda: T.unflatten_into(host, outs))

    def scatter(self, output_tensors, input_tensors, opts=None):
        mode = _caller_mode()
        t, output_tensors = _one(output_tensors, "scatter")
        root = _opt(opts, "rootRank", 0)
        self._check_root(root, "scatter")
        b = T.stage(t, read=False, write=True)
        what = self._desc(f"scatter of {t.numel()} {t.dtype} from root {root}")
        fin = b.writeback if b._back else None
        if self._rank != root:
            if input_tensors and any(len(i) for i in input_tensors):
                raise ValueError("kaitian backend: scatter: only the root passes input tensors")
            return self._submit(self._comm, "scatter", (None, b.ptr, b.count, b.dt, root), what,
                                mode, output_tensors, (b, t), fin)
        if len(input_tensors) != 1:
            raise ValueError("kaitian backend: scatter: the root passes one input list")
        ins = input_tensors[0]
        self._check_list(ins, t, "scatter input")
        for i, x in enumerate(ins):
            if x.numel() != t.numel():
                raise ValueError(f"kaitian backend: scatter: input tensor {i} has {x.numel()} "
                                 f"elements, the output {t.numel()} (sizes must be equal)")
        flat = T.flat_stage(ins)
        view = flat if t.dtype in T.NATIVE else flat.view(torch.uint8)
        return self._submit(
            self._comm, "scatter", (view.data_ptr() or T.EMPTY_PTR, b.ptr, b.count, b.dt, root),
            what, mode, output_tensors, (b, flat, ins), fin)

    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        mode = _caller_mode()
        t, output_tensors = _one(output_tensors, "reduce_scatter")
        if len(input_tensors) != 1:
            raise ValueError("kaitian backend: reduce_scatter takes one input list per process")
        ins = input_tensors[0]
        self._check_list(ins, t, "reduce_scatter input")
        op, opname = _reduce_op(opts)
        work, dt, how = T.reduce_plan(t.dtype, op)
        counts0 = [x.numel() for x in ins]
        if how is None and work == t.dtype and len(set(counts0)) > 1 and _consecutive(ins) and \
                t.is_cpu and t.is_contiguous() and counts0[self._rank] == t.numel() and \
                ins[0].data_ptr():
            # Uneven parts of one buffer: the core reads them in place.
            rc = T.size_array(counts0)
            return self._submit(
                self._comm, "reduce_scatterv", (ins[0].data_ptr(), t.data_ptr() or T.EMPTY_PTR, rc,
                                                dt, op),
                self._desc(f"reduce_scatter of {t.numel()} {t.dtype} ({opname})"), mode,
                output_tensors, (ins, t, rc), None)
        flat = T.flat_stage(ins, work=work)
        fview = torch.view_as_real(flat) if how == "complex" else (
            flat.view(torch.int64) if how == "uint64" else flat)
        what = self._desc(f"reduce_scatter of {t.numel()} {t.dtype} ({opname})")
        counts = [x.numel() for x in ins]
        if counts[self._rank] != t.numel():
            raise ValueError(f"kaitian backend: reduce_scatter: input tensor {self._rank} has "
                             f"{counts[self._rank]} elements, the output {t.numel()}")
        if all(c == counts[0] for c in counts):
            b = T.stage(t, op=op, read=False, write=True)
            return self._submit(
                self._comm, "reduce_scatter", (fview.data_ptr() or T.EMPTY_PTR, b.ptr, b.count, dt, op),
                what, mode, output_tensors, (b, flat, ins), b.writeback if b._back else None)
        # Uneven blocks: kt_reduce_scatterv in place (this rank's block of flat
        # is the result; counts in elements of the reduction's dtype).
        k = fview.numel() // flat.numel() if flat.numel() else 1
        off = sum(counts[:self._rank])
        rc = T.size_array([c * k for c in counts])
        ptr = fview.data_ptr() or T.EMPTY_PTR
        return self._submit(
            self._comm, "reduce_scatterv", (ptr, ptr + off * k * fview.element_size(), rc, dt, op),
            what, mode, output_tensors, (flat, ins, rc),
            lambda: t.copy_(flat[off:off + t.numel()].view(t.shape)))

    def _reduce_scatter_base(self, output, input, opts=None, _mode=None):  # noqa: A002
        mode = _caller_mode() if _mode is None else _mode
        if input.numel() != output.numel() * self._size:
            raise ValueError(f"kaitian backend: reduce_scatter_tensor: input has {input.numel()} "
                             f"elements, expected {self._size} x {output.numel()}")
        if output.dtype != input.dtype:
            raise ValueError(f"kaitian backend: reduce_scatter_tensor: output dtype {output.dtype} "
                             f"differs from input dtype {input.dtype}")
        op, opname = _reduce_op(opts)
        if self._dev is not None:
            return self._dev.reduce_scatter(output, input, [output], op, self._desc(
                f"reduce_scatter_tensor of {output.numel()} {output.dtype} ({opname})"), mode)
        bi = T.stage(input, op=op, read=True, write=False)
        bo = T.stage(output, op=op, read=False, write=True)
        return self._submit(
            self._comm, "reduce_scatter", (bi.ptr, bo.ptr, bo.count, bo.dt, op),
            self._desc(f"reduce_scatter_tensor of {output.numel()} {output.dtype} ({opname})"),
            mode, [output], (bi, bo, input, output), bo.writeback if bo._back else None)

    reduce_scatter_tensor = _reduce_scatter_base
    reduce_scatter_single = _reduce_scatter_base

    def _each(self, mode, calls, result):
        """Run several ops as one: calls is a list of (method, args); one work."""
        if mode == SYNC:
            for fn, args in calls:
                fn(*args, _mode=SYNC)
            return _DoneWork(result)
        futs = [fn(*args, _mode=OTHER).get_future() for fn, args in calls]

        def all_done(f):
            for x in f.value():
                x.value()  # raises the first op's error
            return result
        done = torch.futures.collect_all(futs).then(all_done)
        return Work(done, None) if mode == PYTHON else _work_from_future(done)

    def allgather_into_tensor_coalesced(self, outputs, inputs, opts=None):
        """torch 2.x: all_gather_into_tensor on pairs of tensors."""
        mode = _caller_mode()
        return self._each(mode, [(self._allgather_base, (o, i)) for o, i in zip(outputs, inputs)],
                          outputs)

    all_gather_single_coalesced = allgather_into_tensor_coalesced  # torch >= 2.15

    def reduce_scatter_tensor_coalesced(self, outputs, inputs, opts=None):
        """torch 2.x: reduce_scatter_tensor on pairs of tensors."""
        mode = _caller_mode()
        return self._each(mode, [(self._reduce_scatter_base, (o, i, opts))
                                 for o, i in zip(outputs, inputs)], outputs)

    reduce_scatter_single_coalesced = reduce_scatter_tensor_coalesced  # torch >= 2.15

    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts=None,  # noqa: A002
                      _mode=None):
        mode = _caller_mode() if _mode is None else _mode
        if output.dtype != input.dtype:
            raise ValueError(f"kaitian backend: all_to_all_single: output dtype {output.dtype} "
                             f"differs from input dtype {input.dtype}")
        p = self._size
        # The core refuses buffers that share bytes (no in-place alltoall(v)
        # across different splits): an input that overlaps the output is
        # copied first, as torch's in-place all_to_all_single expects.
        ib, ob = input.data_ptr(), output.data_ptr()
        same = (output.numel() > 0 and input.numel() > 0 and
                ib < ob + output.numel() * output.element_size() and
                ob < ib + input.numel() * input.element_size())
        bi = T.stage(input.clone() if same else input, read=True, write=False)
        bo = T.stage(output, read=False, write=True)
        k = bo.count // output.numel() if output.numel() else (
            bi.count // input.numel() if input.numel() else 1)
        what = self._desc(f"all_to_all_single of {input.numel()} -> {output.numel()} {input.dtype}")
        fin = bo.writeback if bo._back else None
        if not output_split_sizes and not input_split_sizes:
            if input.numel() % p or input.numel() != output.numel():
                raise ValueError(f"kaitian backend: all_to_all_single: input ({input.numel()}) and "
                                 f"output ({output.numel()}) must have the same size, divisible by "
                                 f"the group size {p}")
            return self._submit(self._comm, "alltoall", (bi.ptr, bo.ptr, bi.count // p, bi.dt),
                                what, mode, [output], (bi, bo, input, output), fin)
        sc, sd = self._splits(input, input_split_sizes, k, "input")
        rc, rd = self._splits(output, output_split_sizes, k, "output")
        return self._submit(self._comm, "alltoallv", (bi.ptr, sc, sd, bo.ptr, rc, rd, bi.dt), what,
                            mode, [output], (bi, bo, input, output, sc, sd, rc, rd), fin)

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes,  # noqa: A002
                          opts=None):
        """torch >= 2.15's name for alltoall_base."""
        return self.alltoall_base(output, input, output_split_sizes, input_split_sizes, opts,
                                  _mode=_caller_mode())

    def _splits(self, t, splits, k, which):
        p = self._size
        rows = t.shape[0] if t.dim() else 1
        row = (t.numel() // rows) if rows else 0
        if not splits:
            if rows % p:
                raise ValueError(f"kaitian backend: all_to_all_single: {which} dim 0 ({rows}) is "
                                 f"not divisible by the group size {p} and no split sizes given")
            splits = [rows // p] * p
        if len(splits) != p or sum(splits) != rows:
            raise ValueError(f"kaitian backend: all_to_all_single: {which} split sizes {list(splits)} "
                             f"must have {p} entries summing to dim 0 ({rows})")
        counts = [s * row * k for s in splits]
        displs = [sum(counts[:i]) for i in range(p)]
        return T.size_array(counts), T.size_array(displs)

    def alltoall(self, output_tensors, input_tensors, opts=None):
        mode = _caller_mode()
        p = self._size
        if len(output_tensors) != p or len(input_tensors) != p:
            raise ValueError(f"kaitian backend: all_to_all: {len(input_tensors)} inputs and "
                             f"{len(output_tensors)} outputs, expected {p} each")
        dtype = input_tensors[0].dtype
        for i, x in enumerate(list(input_tensors) + list(output_tensors)):
            if x.dtype != dtype:
                raise ValueError(f"kaitian backend: all_to_all: tensor dtypes differ ({x.dtype} vs "
                                 f"{dtype})")
        send = T.flat_stage(list(input_tensors))
        recv_host, rview, dt, k = _flat_host(sum(o.numel() for o in output_tensors), dtype,
                                             _any_cuda(list(output_tensors)))
        sview = send if dtype in T.NATIVE else send.view(torch.uint8)
        scn = [x.numel() * k for x in input_tensors]
        rcn = [o.numel() * k for o in output_tensors]
        sc, sd = T.size_array(scn), T.size_array([sum(scn[:i]) for i in range(p)])
        rc, rd = T.size_array(rcn), T.size_array([sum(rcn[:i]) for i in range(p)])
        return self._submit(
            self._comm, "alltoallv",
            (sview.data_ptr() or T.EMPTY_PTR, sc, sd, rview.data_ptr() or T.EMPTY_PTR, rc, rd, dt),
            self._desc(f"all_to_all of {p} {dtype} tensors"), mode, list(output_tensors),
            (send, recv_host, input_tensors, output_tensors, sc, sd, rc, rd),
            lambda: T.unflatten_into(recv_host, output_tensors))

    def barrier(self, opts=None):
        mode = _caller_mode()
        return self._submit(self._comm, "barrier", (), self._desc("barrier"), mode, [])

    # ---- point to point --------------------------------------------------------------
    def _p2p_comm(self, peer, sending):
        if not 0 <= peer < self._size:
            raise ValueError(f"kaitian backend: rank {self._rank}: peer rank {peer} is not in "
                             f"[0, {self._size})")
        if peer == self._rank:
            raise ValueError(f"kaitian backend: rank {self._rank} cannot send to or receive from "
                             "itself")
        up = (self._rank < peer) if sending else (peer < self._rank)
        return self._p2p_up if up else self._p2p_down

    def _any_key(self, src, dst, tag):
        return f"{self._prefix}/any/{src}-{dst}/{tag}"

    def send(self, tensors, dstRank, tag=0):  # noqa: N803 - torch's names
        mode = _caller_mode()
        t, tensors = _one(tensors, "send")
        comm = self._p2p_comm(dstRank, True)
        if tag < 0:
            raise ValueError(f"kaitian backend: send: tag must be >= 0, got {tag}")
        b = T.stage(t, read=True, write=False)
        # Announce the message for a receiver that may not name its source.
        self._store.add(self._any_key(self._rank, dstRank, tag), 1)
        return self._submit(
            comm, "send", (b.ptr, b.count, b.dt, dstRank, tag),
            self._desc(f"send of {t.numel()} {t.dtype} to rank {dstRank} (tag {tag})"),
            mode, tensors, (b, tensors))

    def recv(self, tensors, srcRank, tag=0, _mode=None):  # noqa: N803
        mode = _caller_mode() if _mode is None else _mode
        t, tensors = _one(tensors, "recv")
        comm = self._p2p_comm(srcRank, False)
        if tag < 0:
            raise ValueError(f"kaitian backend: recv: tag must be >= 0, got {tag}")
        b = T.stage(t, read=False, write=True)
        key = (srcRank, tag)
        self._recv_counts[key] = self._recv_counts.get(key, 0) + 1
        return self._submit(
            comm, "recv", (b.ptr, b.count, b.dt, srcRank, tag),
            self._desc(f"recv of {t.numel()} {t.dtype} from rank {srcRank} (tag {tag})"),
            mode, tensors, (b, tensors), b.writeback if b._back else None, source=srcRank)

    def recv_anysource(self, tensors, tag=0):
        """Receive from whichever rank has sent a message (with this tag) not yet
        received here. Senders announce each message in the store; this waits
        (on the caller's thread, up to the group's timeout) until one has."""
        mode = _caller_mode()
        deadline = time.monotonic() + (self._timeout_ms or 1800000) / 1000.0
        pause = 0.0001
        order = [(self._rank + i) % self._size for i in range(1, self._size)]
        while True:
            for src in order:
                sent = int(self._store.add(self._any_key(src, self._rank, tag), 0))
                if sent > self._recv_counts.get((src, tag), 0):
                    return self.recv(tensors, src, tag, _mode=mode)
            if time.monotonic() > deadline:
                raise C.KaitianError(
                    _lib.ERR_TIMEOUT,
                    f"kaitian backend: rank {self._rank} of {self._size}: recv from any source "
                    f"(tag {tag}): no rank sent a message within {self._timeout_ms} ms")
            time.sleep(pause)
            pause = min(pause * 2, 0.01)

    # ---- checks ----------------------------------------------------------------------
    def _check_root(self, root, what):
        if not 0 <= root < self._size:
            raise ValueError(f"kaitian backend: {what}: root rank {root} is not in [0, {self._size})")

    def _check_list(self, lst, t, what):
        if len(lst) != self._size:
            raise ValueError(f"kaitian backend: {what} list has {len(lst)} tensors, expected the "
                             f"group size {self._size}")
        for i, o in enumerate(lst):
            if o.dtype != t.dtype:
                raise ValueError(f"kaitian backend: {what} tensor {i} has dtype {o.dtype}, "
                                 f"expected {t.dtype}")
