"""test_solo.py - the "kaitian" group of one rank (torch_kaitian/_solo.py), under
`kaitian run -n 1` (or alone: it sets up a one-rank job itself).

Every collective, in place and out of place, blocking and with async_op=True,
for every dtype the backend takes, on CPU tensors (and CUDA tensors where a GPU
is present): the result is what one rank's collective gives (compared with the
expected tensor computed here), and nothing goes to the core: the core's
collective entry points and the host staging are replaced by functions that
fail the test for the duration. In-place ops leave the tensor's storage as it
was (no copy). The refusals stay those of a group of several ranks (a root out
of range, a ReduceOp a dtype does not have, wrong list lengths). DDP over the
group trains exactly as the plain module does. Prints the per-call time of
all_reduce of 4 KiB (the C call it no longer makes is not timed).
"""
import os
import sys
import time
import warnings

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

import torch_kaitian as tk
from torch_kaitian import process_group as PG
from torch_kaitian import _tensors as T


def fail(msg):
    print(f"FAIL: {msg}", file=sys.stderr, flush=True)
    sys.exit(1)


def check(cond, msg):
    if not cond:
        fail(msg)


class NoCore:
    """While active, any call into the core's collectives or any host staging fails."""

    def __enter__(self):
        self.saved = (dict(PG._BLOCKING), dict(PG._NONBLOCKING), T.stage, T.flat_stage)

        def boom(name):
            def f(*a, **k):
                raise AssertionError(f"the group of one rank called {name}")
            return f
        for n in PG._BLOCKING:
            PG._BLOCKING[n] = boom("kt_" + n)
            PG._NONBLOCKING[n] = boom("kt_i" + n)
        T.stage, T.flat_stage = boom("stage"), boom("flat_stage")
        return self

    def __exit__(self, *exc):
        PG._BLOCKING.clear()
        PG._BLOCKING.update(self.saved[0])
        PG._NONBLOCKING.clear()
        PG._NONBLOCKING.update(self.saved[1])
        T.stage, T.flat_stage = self.saved[2], self.saved[3]
        return False


DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8,
          torch.int32, torch.int64, torch.bool, torch.int16, torch.complex64]


def sample(dtype, n, dev, seed):
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return (torch.rand(n, generator=g) > 0.5).to(dev)
    if dtype.is_floating_point or dtype.is_complex:
        return (torch.randn(n, generator=g, dtype=torch.float64) * 10).to(dtype).to(dev)
    return torch.randint(0, 100, (n,), generator=g).to(dtype).to(dev)


def run(fn, asyn):
    """Call a collective as torch's API does, blocking or with async_op=True."""
    if asyn:
        w = fn(True)
        check(w is not None, "async_op=True gave no work")
        w.wait()
        done = w.is_completed() if hasattr(w, "is_completed") else w.done()  # a Future (1.13's
        check(done, "the work is not completed after wait()")               # coalesced)
    else:
        check(fn(False) is None, "a blocking call returned a work")


def ops_on(dev):
    count = 0
    for dtype in DTYPES:
        for n in (0, 1, 7, 1000):
            for asyn in (False, True):
                what = f"{dtype} x {n} on {dev}, async_op={asyn}"
                x = sample(dtype, n, dev, n + 1)
                ops = ["SUM"] if dtype.is_complex else (
                    ["SUM", "MAX", "MIN"] + (["BAND"] if dtype in (torch.int32, torch.bool) else []))
                if dtype.is_floating_point and dtype != torch.bfloat16:
                    ops.append("AVG")
                for op in ops:
                    rop = getattr(dist.ReduceOp, op)
                    t = x.clone()
                    ptr = t.data_ptr()
                    run(lambda a: dist.all_reduce(t, op=rop, async_op=a), asyn)
                    check(torch.equal(t, x) and t.data_ptr() == ptr, f"all_reduce {op} {what}")
                    t = x.clone()
                    run(lambda a: dist.reduce(t, 0, op=rop, async_op=a), asyn)
                    check(torch.equal(t, x), f"reduce {op} {what}")
                t = x.clone()
                run(lambda a: dist.broadcast(t, 0, async_op=a), asyn)
                check(torch.equal(t, x), f"broadcast {what}")
                out = [torch.empty_like(x)]
                run(lambda a: dist.all_gather(out, x, async_op=a), asyn)
                check(torch.equal(out[0], x), f"all_gather {what}")
                flat = torch.empty_like(x)
                run(lambda a: dist.all_gather_into_tensor(flat, x, async_op=a)
                    if hasattr(dist, "all_gather_into_tensor")
                    else dist._all_gather_base(flat, x, async_op=a), asyn)
                check(torch.equal(flat, x), f"all_gather_into_tensor {what}")
                out = [torch.empty_like(x)]
                run(lambda a: dist.gather(x, out, dst=0, async_op=a), asyn)
                check(torch.equal(out[0], x), f"gather {what}")
                o = torch.empty_like(x)
                run(lambda a: dist.scatter(o, [x], src=0, async_op=a), asyn)
                check(torch.equal(o, x), f"scatter {what}")
                if not dtype.is_complex and dtype != torch.bool:
                    o = torch.empty_like(x)
                    run(lambda a: dist.reduce_scatter(o, [x], async_op=a), asyn)
                    check(torch.equal(o, x), f"reduce_scatter {what}")
                    o = torch.empty_like(x)
                    fn = getattr(dist, "reduce_scatter_tensor", None) or dist._reduce_scatter_base
                    run(lambda a: fn(o, x, async_op=a), asyn)
                    check(torch.equal(o, x), f"reduce_scatter_tensor {what}")
                o = torch.empty_like(x)
                run(lambda a: dist.all_to_all_single(o, x, async_op=a), asyn)
                check(torch.equal(o, x), f"all_to_all_single {what}")
                if n:
                    o = torch.empty_like(x)
                    run(lambda a: dist.all_to_all_single(o, x, [n], [n], async_op=a), asyn)
                    check(torch.equal(o, x), f"all_to_all_single with splits {what}")
                    t = x.clone()  # in place: output and input the same tensor
                    run(lambda a: dist.all_to_all_single(t, t, async_op=a), asyn)
                    check(torch.equal(t, x), f"all_to_all_single in place {what}")
                out = [torch.empty_like(x)]
                run(lambda a: dist.all_to_all(out, [x], async_op=a), asyn)
                check(torch.equal(out[0], x), f"all_to_all {what}")
                ts = [x.clone(), x.clone()[: max(0, n - 1)]]
                run(lambda a: dist.all_reduce_coalesced(ts, async_op=a), asyn)
                check(torch.equal(ts[0], x), f"all_reduce_coalesced {what}")
                run(lambda a: dist.barrier(async_op=a), asyn)
                count += 1
    # Objects go through the same paths.
    objs = [None]
    dist.all_gather_object(objs, {"a": 1})
    check(objs == [{"a": 1}], f"all_gather_object: {objs}")
    return count


def refusals():
    x = torch.ones(4)
    for fn, text in (
            (lambda: dist.broadcast(x, 1), "root"),
            (lambda: dist.all_reduce(torch.ones(3), op=dist.ReduceOp.BAND), "not defined"),
            (lambda: dist.all_reduce(torch.ones(3, dtype=torch.complex64), op=dist.ReduceOp.MAX),
             "complex"),
            (lambda: dist.all_to_all([torch.ones(1), torch.ones(1)], [torch.ones(1)] * 2),
             "expected 1 each"),
            (lambda: dist.all_gather_into_tensor(torch.ones(8), x)
             if hasattr(dist, "all_gather_into_tensor") else dist._all_gather_base(torch.ones(8), x),
             "expected 1 x 4")):
        try:
            fn()
        except (ValueError, RuntimeError) as e:
            check(text in str(e), f"message {e!r} lacks {text!r}")
        else:
            fail(f"accepted: {text}")


def ddp_exact():
    torch.manual_seed(0)
    plain = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 3)).double()
    copy = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 3)).double()
    copy.load_state_dict(plain.state_dict())
    model = nn.parallel.DistributedDataParallel(copy)
    o1 = torch.optim.SGD(plain.parameters(), lr=0.1, momentum=0.9)
    o2 = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    g = torch.Generator().manual_seed(1)
    with NoCore():
        for _ in range(5):
            x = torch.randn(32, 8, generator=g, dtype=torch.float64)
            y = torch.randint(0, 3, (32,), generator=g)
            for m, o in ((plain, o1), (model, o2)):
                o.zero_grad()
                F.cross_entropy(m(x), y).backward()
                o.step()
    for a, b in zip(plain.parameters(), copy.parameters()):
        check(torch.equal(a, b), "DDP over a group of one rank differs from the plain module")


def per_call_us():
    t = torch.ones(1024)
    for _ in range(200):
        dist.all_reduce(t)
    n = 20000
    t0 = time.perf_counter()
    for _ in range(n):
        dist.all_reduce(t)
    return (time.perf_counter() - t0) / n * 1e6


def main():
    warnings.filterwarnings("ignore", message=".*all_reduce_coalesced will be deprecated")
    if "RANK" not in os.environ:
        os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=str(29400 + os.getpid() % 1000))
    dist.init_process_group("kaitian")
    check(dist.get_world_size() == 1, "run with one rank")
    pg = dist.distributed_c10d._get_default_group()
    check("no communication" in repr(pg) or "no communication" in repr(
        getattr(pg, "_get_backend", lambda d: pg)(torch.device("cpu"))),
          f"the group of one rank is not the solo group: {pg!r}")
    devs = [torch.device("cpu")] + ([torch.device("cuda", 0)] if torch.cuda.is_available() else [])
    count = 0
    with NoCore():
        for dev in devs:
            if dev.type == "cuda":
                torch.cuda.synchronize()
                torch.cuda.set_sync_debug_mode("error")  # no op may synchronise the device
            try:
                count += ops_on(dev)
            finally:
                if dev.type == "cuda":
                    torch.cuda.set_sync_debug_mode(0)
        refusals()
    ddp_exact()
    us = per_call_us()
    print(f"PASS solo: {count} cases on {[str(d) for d in devs]} without the core; DDP exact; "
          f"all_reduce of 4 KiB {us:.2f} us per call")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
