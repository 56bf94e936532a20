#!/usr/bin/python3
"""test_ops.py - every torch.distributed operation over "kaitian", checked
against values each rank computes itself from every rank's (deterministic)
inputs. Run as `kaitian run -n N test_ops.py [--init env|tcp|file] [--quick]`.

Covers: each reduce op x dtype (native ones, int16, complex), sync and async,
contiguous / non-contiguous / offset views (memory around a view is left
alone), every collective incl. uneven all_gather / reduce_scatter /
all_to_all_single splits, object collectives, send/recv (tags, simultaneous
large exchanges, from any source), subgroups, and CUDA tensors when present.
"""
import argparse
import os
import sys
import tempfile

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import torch_kaitian  # noqa: E402

R = dist.ReduceOp
RANK = int(os.environ["RANK"])
WS = int(os.environ["WORLD_SIZE"])
checks = 0


def fail(what, exp, got):
    exp, got = exp.reshape(-1), got.reshape(-1)
    bad = (exp != got).nonzero()
    i = bad[0].item() if len(bad) else -1
    raise AssertionError(f"rank {RANK}: {what}: first wrong element {i}: expected "
                         f"{exp[i].item() if i >= 0 else exp}, got {got[i].item() if i >= 0 else got} "
                         f"({len(bad)} wrong of {exp.numel()})")


def check(what, exp, got, tol=0.0):
    global checks
    checks += 1
    got = got.cpu()
    exp = exp.to(got.dtype) if exp.dtype != got.dtype else exp
    if exp.shape != got.shape:
        raise AssertionError(f"rank {RANK}: {what}: shape {tuple(got.shape)}, expected {tuple(exp.shape)}")
    if tol and (exp.is_floating_point() or exp.is_complex()):
        if not torch.allclose(got.to(torch.complex128 if exp.is_complex() else torch.float64),
                              exp.to(torch.complex128 if exp.is_complex() else torch.float64),
                              rtol=tol, atol=tol):
            fail(what, exp, got)
    elif not torch.equal(exp, got):
        fail(what, exp, got)


def inp(rank, n, dtype, op=None):
    """Rank `rank`'s input: small values, so products and sums stay exact."""
    base = torch.arange(n, dtype=torch.int64) % 3 + rank + 1
    if dtype == torch.bool:
        return (torch.arange(n) + rank) % 3 == 0
    if op in ("BAND", "BOR", "BXOR"):
        base = (torch.arange(n, dtype=torch.int64) * 7 + rank * 5) % 16
    if dtype.is_complex:
        return torch.complex(base.double(), -base.double()).to(dtype)
    return base.to(dtype)


def reference(op, dtype, n):
    xs = [inp(r, n, dtype, op) for r in range(WS)]
    if dtype.is_complex:
        s = sum(x.to(torch.complex128) for x in xs)
        return (s / WS if op == "AVG" else s).to(dtype)
    if dtype == torch.bool:
        st = torch.stack(xs)
        return {"SUM": st.any(0), "MAX": st.any(0), "PRODUCT": st.all(0), "MIN": st.all(0),
                "BOR": st.any(0), "BAND": st.all(0), "BXOR": st.sum(0) % 2 == 1}[op]
    wide = [x.to(torch.float64) if dtype.is_floating_point else x.to(torch.int64) for x in xs]
    st = torch.stack(wide)
    if op == "SUM":
        out = st.sum(0)
    elif op == "PRODUCT":
        out = st.prod(0)
    elif op == "MIN":
        out = st.min(0).values
    elif op == "MAX":
        out = st.max(0).values
    elif op == "AVG":
        out = st.sum(0) / WS if dtype.is_floating_point else torch.div(st.sum(0), WS, rounding_mode="trunc")
    else:
        out = xs[0].to(torch.int64)
        for x in xs[1:]:
            x = x.to(torch.int64)
            out = {"BAND": out & x, "BOR": out | x, "BXOR": out ^ x}[op]
    return out.to(dtype)


FLOATS = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
INTS = [torch.int8, torch.uint8, torch.int32, torch.int64, torch.int16]


def cases(quick):
    for dtype in FLOATS + INTS + [torch.bool, torch.complex64, torch.complex128]:
        for op in ("SUM", "PRODUCT", "MIN", "MAX", "AVG", "BAND", "BOR", "BXOR"):
            if dtype.is_complex and op not in ("SUM", "AVG"):
                continue
            if dtype in FLOATS and op in ("BAND", "BOR", "BXOR"):
                continue
            if op == "AVG" and (dtype == torch.bool or not (dtype.is_floating_point or dtype.is_complex)):
                continue
            if quick and dtype not in (torch.float32, torch.int16, torch.complex64, torch.bool):
                continue
            yield dtype, op


def test_all_reduce(quick, device):
    n = 37
    for dtype, op in cases(quick):
        tol = 1e-2 if dtype in (torch.float16, torch.bfloat16) else 1e-6
        exp = reference(op, dtype, n)
        what = f"all_reduce {op} {dtype} on {device}"
        # contiguous, sync
        x = inp(RANK, n, dtype, op).to(device)
        dist.all_reduce(x, op=getattr(R, op))
        check(what, exp, x, tol)
        # async, wait through the work
        x = inp(RANK, n, dtype, op).to(device)
        w = dist.all_reduce(x, op=getattr(R, op), async_op=True)
        w.wait()
        check(what + " async", exp, x, tol)
        # non-contiguous: a column of a 2-D tensor; the rest must stay untouched
        big = torch.full((n, 3), 9, dtype=torch.int64).to(dtype).to(device)
        col = big[:, 1]
        col.copy_(inp(RANK, n, dtype, op))
        dist.all_reduce(col, op=getattr(R, op))
        check(what + " strided view", exp, big[:, 1], tol)
        check(what + " around the view", torch.full((n, 2), 9, dtype=torch.int64).to(dtype),
              big[:, [0, 2]])
        # a view with a storage offset, via the future
        buf = torch.full((n + 5,), 9, dtype=torch.int64).to(dtype).to(device)
        view = buf[3:3 + n]
        view.copy_(inp(RANK, n, dtype, op))
        fut = dist.all_reduce(view, op=getattr(R, op), async_op=True).get_future()
        fut.wait()
        check(what + " offset view", exp, buf[3:3 + n], tol)
        check(what + " before the view", torch.full((3,), 9, dtype=torch.int64).to(dtype), buf[:3])
        check(what + " after the view", torch.full((2,), 9, dtype=torch.int64).to(dtype), buf[3 + n:])


def test_coalesced():
    xs = [inp(RANK, 5, torch.float32), inp(RANK, 3, torch.float32).view(3, 1)]
    dist.all_reduce_coalesced(xs, op=R.MAX)
    check("all_reduce_coalesced MAX 0", reference("MAX", torch.float32, 5), xs[0])
    check("all_reduce_coalesced MAX 1", reference("MAX", torch.float32, 3).view(3, 1), xs[1])
    # odd byte sizes (float16 x 3, x 5) and a non-contiguous input
    h = torch.float16
    outs = [[torch.zeros(3, dtype=h), torch.zeros(5, dtype=h)] for _ in range(WS)]
    col = torch.full((5, 2), float(RANK), dtype=h)[:, 1]
    dist.all_gather_coalesced(outs, [torch.full((3,), RANK + 0.5, dtype=h), col])
    for r in range(WS):
        check("all_gather_coalesced [0]", torch.full((3,), r + 0.5, dtype=h), outs[r][0])
        check("all_gather_coalesced [1]", torch.full((5,), float(r), dtype=h), outs[r][1])


def test_rooted(device):
    for root in range(WS):
        for dtype in (torch.float32, torch.int16, torch.complex64, torch.bool):
            x = inp(RANK, 11, dtype).to(device)
            dist.broadcast(x, src=root)
            check(f"broadcast {dtype} root {root}", inp(root, 11, dtype), x)
        x = inp(RANK, 11, torch.float64).to(device)
        w = dist.reduce(x, dst=root, op=R.SUM, async_op=True)
        w.wait()
        if RANK == root:
            check(f"reduce SUM root {root}", reference("SUM", torch.float64, 11), x)
        x = inp(RANK, 6, torch.int32).to(device)
        gl = [torch.zeros(6, dtype=torch.int32, device=device) for _ in range(WS)] if RANK == root else None
        dist.gather(x, gather_list=gl, dst=root)
        if RANK == root:
            for r in range(WS):
                check(f"gather root {root} from {r}", inp(r, 6, torch.int32), gl[r])
        out = torch.zeros(6, dtype=torch.int32, device=device)
        sl = [inp(r, 6, torch.int32).to(device) * 10 for r in range(WS)] if RANK == root else None
        dist.scatter(out, scatter_list=sl, src=root)
        check(f"scatter root {root}", inp(RANK, 6, torch.int32) * 10, out)


def test_gathers(device):
    for dtype in (torch.float32, torch.int16, torch.complex128):
        outs = [torch.zeros(7, dtype=dtype, device=device) for _ in range(WS)]
        dist.all_gather(outs, inp(RANK, 7, dtype).to(device))
        for r in range(WS):
            check(f"all_gather {dtype} [{r}]", inp(r, 7, dtype), outs[r])
    # uneven: rank r contributes r + 2 elements
    outs = [torch.zeros(r + 2, device=device) for r in range(WS)]
    dist.all_gather(outs, inp(RANK, RANK + 2, torch.float32).to(device))
    for r in range(WS):
        check(f"all_gather uneven [{r}]", inp(r, r + 2, torch.float32), outs[r])
    # uneven parts of one buffer (the core writes them in place), the input
    # this rank's part (in place) and apart from it
    for inplace in (True, False):
        for dtype in (torch.float64, torch.bfloat16, torch.int8):
            buf = torch.zeros(sum(r + 2 for r in range(WS)), dtype=dtype, device=device)
            parts = list(buf.split([r + 2 for r in range(WS)]))
            mine = inp(RANK, RANK + 2, dtype).to(device)
            if inplace:
                parts[RANK].copy_(mine)
                mine = parts[RANK]
            dist.all_gather(parts, mine)
            check(f"all_gather uneven parts of one buffer {dtype} in place={inplace}",
                  torch.cat([inp(r, r + 2, dtype) for r in range(WS)]), buf)
    big = torch.zeros(WS * 5, device=device)
    dist.all_gather_into_tensor(big, inp(RANK, 5, torch.float32).to(device))
    check("all_gather_into_tensor", torch.cat([inp(r, 5, torch.float32) for r in range(WS)]), big)
    # in place: the input is this rank's slice of the output
    big = torch.zeros(WS * 5, device=device)
    big[RANK * 5:(RANK + 1) * 5] = inp(RANK, 5, torch.float32)
    dist.all_gather_into_tensor(big, big[RANK * 5:(RANK + 1) * 5])
    check("all_gather_into_tensor in place", torch.cat([inp(r, 5, torch.float32) for r in range(WS)]), big)
    if hasattr(dist, "gather_single"):  # torch >= 2.15: gather into one tensor on the root
        root = WS - 1
        for dtype in (torch.float32, torch.complex64):
            flat = torch.zeros(WS * 4, dtype=dtype, device=device) if RANK == root else None
            dist.gather_single(inp(RANK, 4, dtype).to(device), flat, dst=root)
            if RANK == root:
                check(f"gather_single {dtype}", torch.cat([inp(r, 4, dtype) for r in range(WS)]),
                      flat)
    objs = [None] * WS
    dist.all_gather_object(objs, {"rank": RANK, "s": "x" * RANK})
    assert objs == [{"rank": r, "s": "x" * r} for r in range(WS)], objs
    lst = [f"from root {RANK}", RANK] if RANK == 0 else [None, None]
    dist.broadcast_object_list(lst, src=0)
    assert lst == ["from root 0", 0], lst
    got = [None] * WS if RANK == 0 else None
    dist.gather_object(("g", RANK), got, dst=0)
    if RANK == 0:
        assert got == [("g", r) for r in range(WS)], got
    out = [None]
    dist.scatter_object_list(out, [("s", r) for r in range(WS)] if RANK == 0 else None, src=0)
    assert out == [("s", RANK)], out


def test_reduce_scatter(device):
    n = 4
    full = [reference("SUM", torch.float32, n * WS)[r * n:(r + 1) * n] for r in range(WS)]
    src = inp(RANK, n * WS, torch.float32)
    out = torch.zeros(n, device=device)
    dist.reduce_scatter(out, [src[r * n:(r + 1) * n].to(device) for r in range(WS)], op=R.SUM)
    check("reduce_scatter", full[RANK], out)
    out = torch.zeros(n, device=device)
    dist.reduce_scatter_tensor(out, src.to(device), op=R.SUM)
    check("reduce_scatter_tensor", full[RANK], out)
    # uneven blocks: block r has r + 1 elements
    sizes = [r + 1 for r in range(WS)]
    tot = sum(sizes)
    srcu = inp(RANK, tot, torch.int64)
    refu = reference("MAX", torch.int64, tot)
    blocks = list(srcu.split(sizes))
    out = torch.zeros(sizes[RANK], dtype=torch.int64, device=device)
    dist.reduce_scatter(out, [b.to(device) for b in blocks], op=R.MAX)
    check("reduce_scatter uneven", refu.split(sizes)[RANK], out)
    # the same blocks apart in memory (staged into one buffer first)
    out = torch.zeros(sizes[RANK], dtype=torch.int64, device=device)
    dist.reduce_scatter(out, [b.clone().to(device) for b in blocks], op=R.MAX)
    check("reduce_scatter uneven, blocks apart", refu.split(sizes)[RANK], out)
    for dtype in (torch.float64, torch.float32, torch.int32):
        srcd = inp(RANK, tot, dtype).to(device)
        out = torch.zeros(sizes[RANK], dtype=dtype, device=device)
        dist.reduce_scatter(out, list(srcd.split(sizes)), op=R.SUM)
        check(f"reduce_scatter uneven {dtype} SUM", reference("SUM", dtype, tot).split(sizes)[RANK],
              out)


def test_alltoall(device):
    # equal blocks: block j of rank i holds 100 * i + j
    inp_ = torch.tensor([100 * RANK + j for j in range(WS) for _ in range(3)], dtype=torch.float32)
    out = torch.zeros(3 * WS, device=device)
    dist.all_to_all_single(out, inp_.to(device))
    check("all_to_all_single", torch.tensor([100 * i + RANK for i in range(WS) for _ in range(3)],
                                            dtype=torch.float32), out)
    # uneven splits, 2-D rows: rank i sends i + j + 1 rows to rank j
    send_splits = [RANK + j + 1 for j in range(WS)]
    recv_splits = [i + RANK + 1 for i in range(WS)]
    rows = torch.cat([torch.full((s, 2), 100 * RANK + j, dtype=torch.int64) for j, s in enumerate(send_splits)])
    out = torch.zeros(sum(recv_splits), 2, dtype=torch.int64, device=device)
    dist.all_to_all_single(out, rows.to(device), recv_splits, send_splits)
    exp = torch.cat([torch.full((s, 2), 100 * i + RANK, dtype=torch.int64) for i, s in enumerate(recv_splits)])
    check("all_to_all_single uneven", exp, out)
    # output and input partly sharing one buffer: the input's values as they
    # were before the call reach the peers (the backend copies it first)
    buf = torch.zeros(3 * WS + 2, device=device)
    buf[:3 * WS] = inp_.to(device)
    dist.all_to_all_single(buf[2:], buf[:3 * WS])
    check("all_to_all_single, overlapping", torch.tensor([100 * i + RANK for i in range(WS) for _ in range(3)],
                                                         dtype=torch.float32), buf[2:])
    ins = [torch.full((j + 1,), 10 * RANK + j, dtype=torch.int32, device=device) for j in range(WS)]
    outs = [torch.zeros(RANK + 1, dtype=torch.int32, device=device) for _ in range(WS)]
    dist.all_to_all(outs, ins)
    for i in range(WS):
        check(f"all_to_all from {i}", torch.full((RANK + 1,), 10 * i + RANK, dtype=torch.int32), outs[i])


def test_p2p(device):
    nxt, prv = (RANK + 1) % WS, (RANK - 1) % WS
    # ring exchange of 16 MiB each way at once: larger than socket buffers
    n = 4 << 20
    send = torch.full((n,), float(RANK), device=device)
    recv = torch.zeros(n, device=device)
    reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, send, nxt), dist.P2POp(dist.irecv, recv, prv)])
    for q in reqs:
        q.wait()
    check("ring exchange 16 MiB", torch.full((n,), float(prv)), recv)
    # two ranks sending to each other at the same time, blocking calls in opposite order
    if WS >= 2 and RANK < 2:
        peer = 1 - RANK
        a = torch.full((n,), RANK + 1.0, device=device)
        b = torch.zeros(n, device=device)
        w = dist.isend(a, peer)
        dist.recv(b, peer)
        w.wait()
        check("simultaneous send", torch.full((n,), peer + 1.0), b)
    # tags, in order
    for tag in (0, 3, 7):
        if RANK == 0:
            for dst in range(1, WS):
                dist.send(torch.full((5,), float(tag + dst), device=device), dst, tag=tag)
        else:
            t = torch.zeros(5, device=device)
            dist.recv(t, 0, tag=tag)
            check(f"recv tag {tag}", torch.full((5,), float(tag + RANK)), t)
    # from any source: every other rank sends two messages (1000 + r, then 2000 + r);
    # rank 0 takes them in whatever order they come, each rank's in its order
    if RANK == 0:
        got = {r: 0 for r in range(1, WS)}
        for i in range(2 * (WS - 1)):
            t = torch.zeros(3, dtype=torch.int64, device=device)
            if i % 2 == 0:
                src = dist.recv(t)
            else:
                w = dist.irecv(t)
                w.wait()
                src = w._source_rank()
            got[src] += 1
            check(f"recv from any source ({src}, message {got[src]})",
                  torch.full((3,), 1000 * got[src] + src, dtype=torch.int64), t)
        assert all(v == 2 for v in got.values()), got
    else:
        dist.send(torch.full((3,), 1000 + RANK, dtype=torch.int64, device=device), 0)
        dist.send(torch.full((3,), 2000 + RANK, dtype=torch.int64, device=device), 0)
    # a non-contiguous receive buffer
    if WS >= 2 and RANK < 2:
        m = torch.zeros(4, 4, device=device)
        if RANK == 0:
            dist.send(torch.arange(4.0, device=device), 1)
        else:
            dist.recv(m[:, 2], 0)
            exp = torch.zeros(4, 4)
            exp[:, 2] = torch.arange(4.0)
            check("recv into a column", exp, m)


def test_groups(count_keys):
    dist.barrier()
    if WS < 2:
        return
    # a subgroup in reverse order, and one every rank but the last belongs to
    members = list(reversed(range(WS)))
    g = dist.new_group(members)
    x = torch.tensor([float(RANK)])
    dist.all_reduce(x, group=g)
    check("all_reduce on reversed group", torch.tensor([float(sum(range(WS)))]), x)
    dist.broadcast(x, src=WS - 1, group=g)
    sub = list(range(WS - 1)) if WS > 2 else [0]
    g2 = dist.new_group(sub)
    if RANK in sub:
        y = torch.tensor([RANK + 1], dtype=torch.int64)
        dist.all_reduce(y, op=R.PRODUCT, group=g2)
        prod = 1
        for r in sub:
            prod *= r + 1
        check("all_reduce on subgroup", torch.tensor([prod]), y)
        dist.barrier(group=g2)
    dist.barrier()
    # Groups made and destroyed leave at most 1 key each in the store
    # (torch's own barrier key of new_group): not the addresses their
    # communicators were set up with, nor the backend's generation counter.
    # (Not over file://: a FileStore cannot delete keys.)
    global checks
    store = dist.distributed_c10d._get_default_store()
    if count_keys:
        dist.barrier()
        n0 = store.num_keys()
        dist.barrier()
        for _ in range(5):
            g3 = dist.new_group(list(range(WS)))
            dist.barrier(group=g3)
            dist.destroy_process_group(g3)
            del g3
        dist.barrier()
        grew = store.num_keys() - n0
        dist.barrier()
        checks += 1
        if grew > 5:
            raise AssertionError(f"rank {RANK}: 5 groups made and destroyed left {grew} keys in the store "
                                 "(at most 5 expected)")


def test_errors():
    try:
        dist.all_reduce(torch.ones(2), op=dist._make_nccl_premul_sum(2.0))
    except RuntimeError as e:
        assert "PREMUL_SUM" in str(e), e
    else:
        raise AssertionError("PREMUL_SUM did not raise")
    opts = dist.AllreduceOptions()
    opts.reduceOp = R.MAX
    try:  # torch's wrapper refuses this itself: ask the process group directly
        dist.distributed_c10d._get_default_group().allreduce([torch.ones(2, dtype=torch.complex64)], opts)
    except RuntimeError as e:
        assert "MAX" in str(e) and "complex64" in str(e), e
    else:
        raise AssertionError("MAX on complex did not raise")
    try:
        dist.all_reduce(torch.ones(2), op=R.BAND)
    except RuntimeError as e:
        assert "BAND" in str(e) and "float32" in str(e), e
    else:
        raise AssertionError("BAND on float32 did not raise")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--init", default="env", choices=("env", "tcp", "file"))
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--file", help="shared file for --init file")
    ap.add_argument("--own-device", action="store_true",
                    help="every case once, on this rank's own device (torch_kaitian.device()): "
                         "a job may mix CUDA and CPU ranks")
    args = ap.parse_args()
    if args.init == "env":
        dist.init_process_group("kaitian")
    elif args.init == "tcp":
        dist.init_process_group("kaitian", init_method=f"tcp://{os.environ['MASTER_ADDR']}:"
                                f"{os.environ['MASTER_PORT']}", rank=RANK, world_size=WS)
    else:
        path = args.file or os.path.join(tempfile.gettempdir(), f"kt-init-{os.environ.get('KAITIAN_JOB_ID', 'x')}")
        dist.init_process_group("kaitian", init_method=f"file://{path}", rank=RANK, world_size=WS)
    assert dist.get_backend() == "kaitian", dist.get_backend()
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    if args.own_device:
        torch_kaitian.set_device(int(os.environ.get("LOCAL_RANK", 0)) % torch_kaitian.local_device_count())
        devices = [torch_kaitian.device().type]
    elif torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)) % torch.cuda.device_count())
    elif RANK == 0:
        print("CUDA is not available: CUDA cases skipped")
    for device in devices:
        test_all_reduce(args.quick, device)
        if args.quick:
            continue
        test_rooted(device)
        test_gathers(device)
        test_reduce_scatter(device)
        test_alltoall(device)
        if WS > 1:
            test_p2p(device)
    if not args.quick:
        test_coalesced()
        test_groups(count_keys=args.init != "file")
    test_errors()
    dist.barrier()
    print(f"rank {RANK}: {checks} checks passed ({args.init}://, devices {devices})")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
