"""test_devpath.py - the device path of the kaitian backend on a CPU machine:
ranks that declare a device type (KAITIAN_TEST_DEVICE_TYPE) send their CPU
tensors through the same staging engine a CUDA rank uses, with copies on the
CPU (torch_kaitian/_staging.py, _devpath.py), and a device type with several
ranks reduces within itself over gloo standing in for its library (_hier.py).

  test_devpath.py unit              the staging engine alone, one process:
                                    piece boundaries, odd sizes, every dtype
                                    through the engine, the host pool, the
                                    KAITIAN_DEVICE_PIECE_BYTES checks
  kaitian run -n 3 test_devpath.py paths      (KAITIAN_TEST_DEVICE_TYPE=x,cpu,cpu)
                                    every rank cuts an op into the same pieces,
                                    issue order kept across async and blocking
                                    ops, a CPU-only subgroup has no device path
  kaitian run -n 4 test_devpath.py hier       (KAITIAN_TEST_DEVICE_TYPE=a,b,a,b or
                                    a,a,a,cpu; KAITIAN_DEVICE_LIBRARY=gloo)
                                    the layout, which ranks cross through the
                                    core, float64 sums against one process
  kaitian run -n 4 test_devpath.py hier_dead  a rank dies: every other rank's
                                    next op raises, within the bound, no hang
  kaitian run --devices cuda:1,cpu:2 test_devpath.py cuda   (tests/gpu/check.sh)
                                    the pipelined ops on CUDA tensors against
                                    the CPU ranks, with torch's sync debug mode
                                    set to error: no device synchronisation
"""
import os
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import torch_kaitian  # noqa: E402,F401
from torch_kaitian import _devpath, _lib, _staging as S  # noqa: E402

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8,
          torch.int16, torch.int32, torch.int64, torch.bool, torch.complex64, torch.complex128]


def fail(msg):
    print(f"FAIL: {msg}", file=sys.stderr, flush=True)
    sys.exit(1)


def check(cond, msg):
    if not cond:
        fail(msg)


def sample(dtype, n, seed):
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.rand(n, generator=g) > 0.5
    if dtype.is_floating_point or dtype.is_complex:
        return (torch.randn(n, generator=g, dtype=torch.float64) * 10).to(dtype)
    return torch.randint(0, 100, (n,), generator=g).to(dtype)


# ---- unit -------------------------------------------------------------------------------
def unit():
    # Piece boundaries: every element in exactly one piece, in order, none empty
    # (but for an empty message), none larger than asked.
    for es in (1, 2, 4, 8, 16):
        for pb in (0, 1, 3, 24, 4096):
            for n in list(range(0, 70)) + [1000, 4097]:
                cuts = S.pieces(n, es, pb)
                if n == 0:
                    check(cuts == [(0, 0)], f"pieces(0): {cuts}")
                    continue
                check(cuts[0][0] == 0 and cuts[-1][1] == n, f"pieces({n}, {es}, {pb}) ends: {cuts}")
                per = max(1, pb // es) if pb else None
                for (a, b), (c, _) in zip(cuts, cuts[1:] + [(n, n)]):
                    if not (b > a and b == c) or per and b - a > per:
                        fail(f"pieces({n}, {es}, {pb}): piece ({a}, {b}) in {cuts[:20]}...")
    # Default cut: an eighth of the message within 256 KiB-4 MiB.
    for nbytes, want in ((64 << 10, 1), (1 << 20, 4), (8 << 20, 8), (64 << 20, 16), (256 << 20, 64)):
        got = len(S.pieces(nbytes // 4, 4))
        check(got == want, f"{nbytes} bytes in {got} pieces, expected {want}")
    for bad in ("abc", "0", "-5", "1.5"):
        os.environ["KAITIAN_DEVICE_PIECE_BYTES"] = bad
        try:
            S.piece_bytes_env()
            fail(f"KAITIAN_DEVICE_PIECE_BYTES={bad} accepted")
        except ValueError as e:
            check("KAITIAN_DEVICE_PIECE_BYTES" in str(e), str(e))
    os.environ["KAITIAN_DEVICE_PIECE_BYTES"] = "40"
    check(S.piece_bytes_env() == 40, "KAITIAN_DEVICE_PIECE_BYTES=40 not read")
    del os.environ["KAITIAN_DEVICE_PIECE_BYTES"]

    # The engine: for every dtype and odd sizes, a tensor goes down into a host
    # block piece by piece, an "op" on each host piece (here: reverse the
    # bytes' order within the piece, an op no slicing mistake survives), and
    # back up; the result equals the same op applied piece by piece in torch.
    pool = S.pool()
    copies = S.Host()
    for dtype in DTYPES:
        for n in (1, 7, 37, 100):
            for pb in (1, 24, 40, 1 << 20):
                t = sample(dtype, n, n * 31 + pb)
                orig = t.clone()
                es = t.element_size()
                blk = pool.get(n * es, None)
                hv = blk.tensor[:n * es].view(dtype)
                cuts = S.pieces(n, es, pb)
                seen = []

                def op_for(a, b):
                    def op():
                        seen.append((a, b))
                        hv[a:b] = hv[a:b].flip(0).clone()
                        return _lib.SUCCESS
                    return op
                plan = [S.Piece([(hv[a:b], t[a:b])], op_for(a, b), [(t[a:b], hv[a:b])]) for a, b in cuts]
                events = S.queue_down(copies, plan)
                S.finish(copies, plan, events, lambda rc: RuntimeError(rc))
                pool.put(blk, None)
                want = torch.cat([orig[a:b].flip(0) for a, b in cuts])
                check(seen == cuts, f"{dtype} n={n}: pieces run {seen}, expected {cuts}")
                check(torch.equal(t, want), f"{dtype} n={n} pieces of {pb} B: wrong result")
    # A failing piece: the pieces after it never run, the error propagates.
    ran = []
    plan = [S.Piece(None, (lambda i=i: (ran.append(i), _lib.SUCCESS if i != 2 else _lib.ERR_TIMEOUT)[1]), None)
            for i in range(5)]
    try:
        S.finish(copies, plan, [None] * 5, lambda rc: RuntimeError(f"rc {rc}"))
        fail("a failed piece did not raise")
    except RuntimeError as e:
        check(str(e) == f"rc {_lib.ERR_TIMEOUT}" and ran == [0, 1, 2], f"{e}; ran {ran}")
    # The pool: a block is reused once given back, sizes round up to a class.
    a = pool.get(100, None)
    check(a.nbytes >= 100 and a.owner in ("kaitian", "torch"), f"block {a.nbytes} {a.owner}")
    pool.put(a, None)
    b = pool.get(90, None)
    check(b is a, "a free block of the same class was not reused")
    c = pool.get(90, None)
    check(c is not b, "a block in use was handed out twice")
    pool.put(b, None)
    pool.put(c, None)
    # The group's ranks declare their types: the list form picks $RANK's entry.
    os.environ["RANK"] = "2"
    os.environ[_devpath.TEST_TYPE_ENV] = "a,b,cpu"
    check(_devpath.test_type() is None and _devpath.local_type() in ("cpu", "cuda"), "cpu entry")
    os.environ["RANK"] = "1"
    check(_devpath.test_type() == "b", "list entry of rank 1")
    os.environ["RANK"] = "5"
    try:
        _devpath.test_type()
        fail("a rank beyond the list was accepted")
    except ValueError as e:
        check("rank 5" in str(e), str(e))
    del os.environ[_devpath.TEST_TYPE_ENV]
    print("PASS devpath unit: piece boundaries, every dtype through the engine, the pool, the settings")


# ---- multi-rank ---------------------------------------------------------------------------
class Count:
    """Count the core calls of the device path (blocking and non-blocking)."""

    def __init__(self):
        self.n = 0
        for table in (_devpath._BLOCKING, _devpath._NONBLOCKING):
            for k, fn in list(table.items()):
                table[k] = self._wrap(fn)

    def _wrap(self, fn):
        def f(*a):
            self.n += 1
            return fn(*a)
        return f


def gathered(x):
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, x)
    return out


def paths():
    dist.init_process_group("kaitian")
    rank, p = dist.get_rank(), dist.get_world_size()
    pg = dist.distributed_c10d._get_default_group()
    check(pg._dev is not None, f"rank {rank}: no device path in a group with device ranks {pg._types}")
    counter = Count()
    pb = S.piece_bytes_env()
    check(pb > 0, "run with KAITIAN_DEVICE_PIECE_BYTES set")
    # Every rank cuts alike: the same number of core calls for the same ops.
    for n, dtype in ((1, torch.float32), (1001, torch.float64), (4099, torch.int16),
                     (333, torch.complex64), (0, torch.float32)):
        before = counter.n
        x = sample(dtype, n, rank)
        want = sum(sample(dtype, n, r).to(torch.complex128 if dtype.is_complex else torch.float64)
                   for r in range(p))
        dist.all_reduce(x)
        exact = dtype == torch.int16
        check(torch.allclose(x.to(want.dtype), want, rtol=0 if exact else 1e-5, atol=0 if exact else 1e-4),
              f"rank {rank}: all_reduce {n} {dtype}")
        calls = counter.n - before
        es = torch.empty((), dtype=torch.int32 if dtype == torch.int16 else dtype).element_size()
        check(calls == len(S.pieces(n, es, pb)), f"rank {rank}: {n} {dtype}: {calls} core calls, "
              f"expected {len(S.pieces(n, es, pb))}")
        counts = gathered(calls)
        check(len(set(counts)) == 1, f"{n} {dtype}: ranks made {counts} core calls")
    # Issue order: async ops of varied sizes interleaved with blocking ones and
    # with ops of another communicator (gather); every result right.
    works, expect = [], []
    for i in range(24):
        n = 1 + (i * 977) % 5000
        x = torch.full((n,), float(rank + i), dtype=torch.float64)
        works.append((dist.all_reduce(x, async_op=True), x))
        expect.append(float(sum(r + i for r in range(p))))
        if i % 5 == 0:
            y = torch.full((7 + i,), float(rank), dtype=torch.float32)
            dist.broadcast(y, src=i % p)
            check(torch.all(y == float(i % p)), f"rank {rank}: broadcast {i} amid async ops")
        if i % 7 == 0:
            g = [torch.zeros(3) for _ in range(p)] if rank == 0 else None
            dist.gather(torch.full((3,), float(rank)), g, dst=0)
            if rank == 0:
                check(all(torch.all(g[r] == r) for r in range(p)), "gather amid async ops")
    for (w, x), e in zip(works, expect):
        w.wait()
        check(torch.all(x == e), f"rank {rank}: async all_reduce wrong: {x[:3]} expected {e}")
    # A futures chain and DDP-like concurrent issue from another thread.
    x = torch.ones(3000)
    fut = dist.all_reduce(x, async_op=True).get_future().then(lambda f: f.value()[0] * 2)
    check(torch.all(fut.wait() == 2 * p), f"rank {rank}: future chain")
    # all_gather_into_tensor / reduce_scatter_tensor in pieces, in place too.
    n = 1234
    out = torch.zeros(p * n, dtype=torch.float64)
    dist.all_gather_into_tensor(out, torch.arange(n, dtype=torch.float64) + 10000 * rank)
    check(torch.equal(out, torch.cat([torch.arange(n, dtype=torch.float64) + 10000 * r for r in range(p)])),
          f"rank {rank}: all_gather_into_tensor in pieces")
    out = torch.zeros(n, dtype=torch.float64)
    dist.reduce_scatter_tensor(out, torch.arange(p * n, dtype=torch.float64) * (rank + 1))
    full = torch.arange(p * n, dtype=torch.float64) * sum(r + 1 for r in range(p))
    check(torch.equal(out, full[rank * n:(rank + 1) * n]), f"rank {rank}: reduce_scatter_tensor in pieces")
    # A subgroup of CPU ranks only: no device path, nothing cut.
    cpu_ranks = [r for r, t in enumerate(pg._types) if t == "cpu"]
    if len(cpu_ranks) >= 2:
        sub = dist.new_group(cpu_ranks)
        if rank in cpu_ranks:
            check(sub._dev is None, f"rank {rank}: a group of CPU ranks got a device path")
            before = counter.n
            z = torch.ones(100000)
            dist.all_reduce(z, group=sub)
            check(counter.n == before and torch.all(z == len(cpu_ranks)), "CPU subgroup through pieces")
        dist.destroy_process_group(sub)
    dist.barrier()
    if rank == 0:
        print(f"PASS devpath paths p={p} types {pg._types}: pieces alike on every rank, order kept")
    dist.destroy_process_group()


def hier():
    dist.init_process_group("kaitian")
    rank, p = dist.get_rank(), dist.get_world_size()
    pg = dist.distributed_c10d._get_default_group()
    h = pg._hier
    check(h is not None, f"rank {rank}: no hierarchy for types {pg._types} "
          f"(KAITIAN_DEVICE_LIBRARY={os.environ.get('KAITIAN_DEVICE_LIBRARY')})")
    types = pg._types
    for t in set(types):
        rs = [r for r, x in enumerate(types) if x == t]
        if t != "cpu" and len(rs) >= 2:
            check(h.members[t] == rs and h.leader[t] == rs[0], f"{t}: {h.members} {h.leader}")
    crossing = rank in h.cross
    check((h.cross_path is not None) == (crossing and len(h.cross) > 1), f"rank {rank}: cross path")
    counter = Count()
    # float64 sums against one process: every rank's inputs made here.
    for n in (1, 17, 1000, 100003):
        x = sample(torch.float64, n, 1000 + rank)
        want = torch.zeros(n, dtype=torch.float64)
        scale = torch.zeros(n, dtype=torch.float64)
        for r in range(p):
            want += sample(torch.float64, n, 1000 + r)
            scale += sample(torch.float64, n, 1000 + r).abs()
        before = counter.n
        dist.all_reduce(x)
        # Sums in another order differ by rounding: at most a few ulps of the
        # sum of the terms' magnitudes.
        err = ((x - want).abs() / scale).max().item()
        check(err < 1e-15, f"rank {rank}: hierarchical all_reduce of {n}: error {err:.2e} of the "
                           "terms' magnitude")
        check((counter.n > before) == (crossing and len(h.cross) > 1),
              f"rank {rank} ({'crosses' if crossing else 'stays within its type'}): {counter.n - before} "
              f"core calls for one all_reduce")
        for op, ref in ((dist.ReduceOp.MAX, lambda a, b: torch.maximum(a, b)),
                        (dist.ReduceOp.MIN, lambda a, b: torch.minimum(a, b))):
            y = sample(torch.float64, n, 2000 + rank)
            w = y.clone()
            for r in range(p):
                w = ref(w, sample(torch.float64, n, 2000 + r))
            dist.all_reduce(y, op=op)
            check(torch.equal(y, w), f"rank {rank}: hierarchical all_reduce {op} of {n}")
        z = sample(torch.float32, n, 3000 + rank)
        dist.all_reduce(z, op=dist.ReduceOp.AVG) if hasattr(dist.ReduceOp, "AVG") else None
        if hasattr(dist.ReduceOp, "AVG"):
            avg = sum(sample(torch.float32, n, 3000 + r).double() for r in range(p)) / p
            check(torch.allclose(z.double(), avg, rtol=1e-5, atol=1e-5), f"rank {rank}: AVG of {n}")
    for root in range(p):
        for dtype in (torch.float32, torch.int64, torch.uint8):
            b = sample(dtype, 999, 7 * root + rank)
            dist.broadcast(b, src=root)
            check(torch.equal(b, sample(dtype, 999, 7 * root + root)), f"rank {rank}: broadcast {dtype} from {root}")
        w = dist.broadcast(torch.full((5,), float(rank)), src=root, async_op=True)
        w.wait()
    # async, many in flight
    ws = []
    for i in range(10):
        x = torch.full((100 + i,), float(rank * i), dtype=torch.float64)
        ws.append((dist.all_reduce(x, async_op=True), x, float(sum(r * i for r in range(p)))))
    for w, x, e in ws:
        w.wait()
        check(torch.all(x == e), f"rank {rank}: async hierarchical all_reduce")
    dist.barrier()
    if rank == 0:
        print(f"PASS devpath hier p={p} types {types}: {h.describe()}")
    dist.barrier()
    os._exit(0)  # torch 2.x's gloo may abort at interpreter exit once its group is gone


def hier_dead():
    dist.init_process_group("kaitian")
    rank, p = dist.get_rank(), dist.get_world_size()
    x = torch.ones(1000, dtype=torch.float64)
    dist.all_reduce(x)
    check(torch.all(x == p), "the first all_reduce")
    dist.barrier()
    if rank == p - 1:
        os._exit(0)
    t0 = time.monotonic()
    try:
        for _ in range(50):
            dist.all_reduce(torch.ones(1000, dtype=torch.float64))
            time.sleep(0.05)
    except Exception as e:  # noqa: BLE001 - any rank's error: the library's or the core's
        took = time.monotonic() - t0
        check(took < 30, f"rank {rank}: the error came after {took:.1f} s")
        print(f"rank {rank}: raised after {took:.1f} s: {type(e).__name__}: {str(e)[:300]}", flush=True)
        os._exit(0)  # at once: a rank waiting on this one fails when it ends
    fail(f"rank {rank}: rank {p - 1} died and no op raised")


def cuda():
    """Rank 0 on CUDA, the others on the CPU: every pipelined op, blocking and
    async, in sizes of one piece and of many, every kind of dtype (native,
    converted on the device, complex), with torch.cuda.set_sync_debug_mode
    ("error") while the ops are issued and waited for: any synchronising call
    on the op path raises. Results checked afterwards against values made here."""
    import torch_kaitian as tk
    dist.init_process_group("kaitian")
    rank, p = dist.get_rank(), dist.get_world_size()
    dev = tk.device()
    if rank == 0 and dev.type != "cuda":
        print("rank 0 is not on CUDA: the ops run, the sync check does not (on a GPU host: "
              "kaitian run --devices cuda:1,cpu:2)")
    pg = dist.distributed_c10d._get_default_group()
    check(pg._dev is not None, f"rank {rank}: no device path, types {pg._types}")
    sync_mode = getattr(torch.cuda, "set_sync_debug_mode", None) if dev.type == "cuda" else None
    for n in (1, 1001, 3 << 20):
        for dtype in (torch.float32, torch.float16, torch.int64, torch.int16, torch.complex64):
            base = [sample(dtype, n, 100 * r + n % 97) for r in range(p)]
            want_sum = sum(b.to(torch.complex128 if dtype.is_complex else torch.float64) for b in base)
            x = base[rank].to(dev, copy=True)
            xa = base[rank].to(dev, copy=True)
            b = base[rank].to(dev, copy=True)
            ag_out = torch.zeros(p * n, dtype=dtype, device=dev)
            rs_in = torch.cat([base[rank]] * p).to(dev)
            rs_out = torch.zeros(n, dtype=dtype, device=dev)
            if sync_mode:
                sync_mode("error")
            try:
                dist.all_reduce(x)
                w = dist.all_reduce(xa, async_op=True)
                dist.broadcast(b, src=p - 1)
                dist.all_gather_into_tensor(ag_out, base[rank].to(dev, copy=True))
                dist.reduce_scatter_tensor(rs_out, rs_in)
                w.wait()
            finally:
                if sync_mode:
                    sync_mode(0)
            tol = dict(rtol=1e-2, atol=1e-1) if dtype == torch.float16 else dict(rtol=1e-5, atol=1e-3)
            what = f"rank {rank} on {dev}: {n} {dtype}"
            for name, got in (("all_reduce", x), ("async all_reduce", xa)):
                check(torch.allclose(got.cpu().to(want_sum.dtype), want_sum, **tol), f"{what}: {name}")
            check(torch.equal(b.cpu(), base[p - 1]), f"{what}: broadcast")
            check(torch.equal(ag_out.cpu(), torch.cat(base)), f"{what}: all_gather_into_tensor")
            # rank r's input is p copies of its tensor: block r of the sum is want_sum
            check(torch.allclose(rs_out.cpu().to(want_sum.dtype), want_sum, **tol),
                  f"{what}: reduce_scatter_tensor")
    # An async op on a large tensor returns before it is done: the caller's
    # thread is free while the pieces travel.
    big = torch.ones(16 << 20, device=dev)
    t0 = time.perf_counter()
    w = dist.all_reduce(big, async_op=True)
    issued = time.perf_counter() - t0
    w.wait()
    torch.cuda.synchronize() if dev.type == "cuda" else None
    total = time.perf_counter() - t0
    check(torch.all(big == p).item(), f"rank {rank}: 64 MiB async all_reduce")
    if rank == 0:
        print(f"rank 0 on {dev}: async all_reduce of 64 MiB returned after {issued * 1e3:.2f} ms, done after "
              f"{total * 1e3:.1f} ms")
    dist.barrier()
    if rank == 0:
        print(f"PASS devpath cuda p={p} types {pg._types}: every pipelined op, no device sync")
    dist.destroy_process_group()


def main():
    what = sys.argv[1] if len(sys.argv) > 1 else "unit"
    {"unit": unit, "paths": paths, "hier": hier, "hier_dead": hier_dead, "cuda": cuda}[what]()


if __name__ == "__main__":
    main()
