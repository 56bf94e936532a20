#!/usr/bin/python3
"""test_async.py - asynchronous for real, and DDP on top of it. Run as
`kaitian run -n 2 test_async.py`.

  - async_op=True returns at once although the peer joins 1.5 s later;
  - the torch Future completes with nobody waiting on it (a callback fires
    while the caller only sleeps);
  - a future callback may itself wait for another op (no deadlock);
  - DDP: after a few steps every rank's parameters equal those of one process
    training on the whole batch; with a comm hook over async all_reduce the
    first bucket's communication completes before the last bucket is even
    ready (communication overlaps backward);
  - DDP's gradient buckets move into shared memory and are registered, with
    and without gradient_as_bucket_view, and training still matches a float64
    single process; a tensor all-reduced from Python never moves.
"""
import copy
import os
import sys
import threading
import time

import torch
import torch.distributed as dist
import torch.nn as nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import torch_kaitian  # noqa: E402,F401

RANK = int(os.environ["RANK"])
WS = int(os.environ["WORLD_SIZE"])


def returns_at_once():
    x = torch.ones(1 << 16)
    if RANK == 0:
        t0 = time.monotonic()
        w = dist.all_reduce(x, async_op=True)
        issued = time.monotonic() - t0
        assert issued < 0.5, f"async all_reduce took {issued:.2f} s to return"
        assert not w.is_completed(), "completed although the peer has not joined"
        w.wait()
        waited = time.monotonic() - t0
        assert waited > 1.0, f"wait() returned after {waited:.2f} s, before the peer joined"
        assert torch.equal(x, torch.full((1 << 16,), float(WS)))
        print(f"rank 0: async all_reduce returned in {issued * 1e3:.1f} ms, completed after {waited:.2f} s")
    else:
        time.sleep(1.5)
        dist.all_reduce(x)


def completes_alone():
    x = torch.full((1000,), float(RANK))
    fired = threading.Event()
    seen = {}

    def cb(fut):
        seen["value"] = fut.value()[0].clone()
        seen["thread"] = threading.current_thread().name
        fired.set()

    fut = dist.all_reduce(x, async_op=True).get_future()
    fut.add_done_callback(cb)
    assert fired.wait(30), "the future never completed while nobody waited on it"
    assert torch.equal(seen["value"], torch.full((1000,), float(sum(range(WS))))), seen
    print(f"rank {RANK}: future completed alone (callback ran on thread {seen['thread']})")


def callback_waits():
    a, b = torch.ones(10), torch.ones(10)
    out = {}

    def cb(fut):
        w = dist.all_reduce(b, async_op=True)  # issued and waited for inside a callback
        w.wait()
        out["b"] = b.clone()
        return fut.value()

    fut = dist.all_reduce(a, async_op=True).get_future().then(cb)
    fut.wait()
    assert torch.equal(out["b"], torch.full((10,), float(WS))), out
    assert torch.equal(a, torch.full((10,), float(WS)))
    print(f"rank {RANK}: a callback waited for another op")


def train_both(model, ref, steps, lr, batch, seed):
    """SGD steps of the DDP model on this rank's batch and of ref, one process
    in ref's dtype, on every rank's batches at once (the same data)."""
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    ropt = torch.optim.SGD(ref.parameters(), lr=lr)
    dtype = next(ref.parameters()).dtype
    first, last = model.module[0], model.module[-1]
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        xs = [torch.randn(batch, first.in_features, generator=g) for _ in range(WS)]
        ys = [torch.randn(batch, last.out_features, generator=g) for _ in range(WS)]
        opt.zero_grad(set_to_none=False)
        nn.functional.mse_loss(model(xs[RANK]), ys[RANK]).backward()
        opt.step()
        ropt.zero_grad()
        nn.functional.mse_loss(ref(torch.cat(xs).to(dtype)), torch.cat(ys).to(dtype)).backward()
        ropt.step()


def ddp_matches_single_process():
    torch.manual_seed(0)
    ref = nn.Sequential(nn.Linear(20, 32), nn.Tanh(), nn.Linear(32, 4))
    model = nn.parallel.DistributedDataParallel(
        nn.Sequential(nn.Linear(20, 32), nn.Tanh(), nn.Linear(32, 4)))
    model.module.load_state_dict(ref.state_dict())
    train_both(model, ref, steps=4, lr=0.1, batch=6, seed=1)
    for (name, p), q in zip(model.module.named_parameters(), ref.parameters()):
        assert torch.allclose(p, q, atol=1e-5), f"rank {RANK}: {name} differs from the single process"
    print(f"rank {RANK}: DDP parameters equal the single-process ones")


def ddp_overlaps():
    torch.manual_seed(0)
    layers = []
    for _ in range(8):
        layers += [nn.Linear(512, 512), nn.ReLU()]
    model = nn.parallel.DistributedDataParallel(nn.Sequential(*layers), bucket_cap_mb=1)
    issued, done = [], []

    def hook(state, bucket):
        buf = bucket.buffer()
        issued.append(time.monotonic())
        fut = dist.all_reduce(buf, async_op=True).get_future()

        def fin(f):
            done.append(time.monotonic())
            return f.value()[0].div_(WS)
        return fut.then(fin)

    model.register_comm_hook(None, hook)
    # Enough work between buckets, on one thread, that a fast many-core host
    # cannot finish backward before the first 1 MiB allreduce returns.
    x = torch.randn(512, 512)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    for _ in range(3):  # first iterations rebuild buckets
        issued.clear()
        done.clear()
        model(x).sum().backward()
    torch.set_num_threads(threads)
    assert len(issued) >= 3, f"only {len(issued)} buckets"
    overlapped = min(done) < max(issued)
    print(f"rank {RANK}: {len(issued)} buckets; first completion {1e3 * (min(done) - min(issued)):.1f} ms "
          f"after the first issue, last issue at {1e3 * (max(issued) - min(issued)):.1f} ms: "
          f"{'overlapped' if overlapped else 'NOT overlapped'}")
    assert overlapped, "no bucket's communication completed before backward issued the last one"


def ddp_shared_buckets():
    pg = dist.distributed_c10d._get_default_group()
    for view in (False, True):
        pg._sharer.registered.clear()
        torch.manual_seed(0)
        net = nn.Sequential(nn.Linear(96, 640), nn.Tanh(), nn.Linear(640, 640), nn.Tanh(), nn.Linear(640, 7))
        ref = copy.deepcopy(net).double()
        # 2 MiB of gradients: DDP's 1 MiB first bucket, then 0.25 MiB ones.
        model = nn.parallel.DistributedDataParallel(net, bucket_cap_mb=0.25, gradient_as_bucket_view=view)
        train_both(model, ref, steps=6, lr=0.05, batch=5, seed=2)
        for (name, p), q in zip(model.module.named_parameters(), ref.parameters()):
            err = (p.double() - q).abs().max().item()
            assert err < 1e-5, f"rank {RANK}: bucket view {view}: {name} is {err:.2e} off the float64 reference"
        moved = len(pg._sharer.registered)
        assert moved >= 2, f"rank {RANK}: bucket view {view}: {moved} bucket(s) registered, expected several"
        if view:
            unshared = [n for n, p in model.module.named_parameters() if not p.grad.is_shared()]
            assert not unshared, f"rank {RANK}: gradients not in shared memory: {unshared}"
        # The core mapped the peers' buckets (torch names its shared memory
        # /torch_<pid>_...): the all_reduce did run in them.
        pids = [None] * WS
        dist.all_gather_object(pids, os.getpid())
        with open("/proc/self/maps") as f:
            maps = f.read()
        unmapped = [r for r in range(WS) if r != RANK and f"/dev/shm/torch_{pids[r]}_" not in maps]
        assert not unmapped, f"rank {RANK}: bucket view {view}: no bucket of rank(s) {unmapped} mapped here"
        print(f"rank {RANK}: bucket view {view}: {moved} buckets in shared memory, the peers' mapped, "
              f"parameters match float64")
        del model
    t = torch.ones(1 << 16)
    for _ in range(3):
        dist.all_reduce(t)
    assert not t.is_shared(), "a tensor all-reduced from Python was moved into shared memory"
    assert torch.equal(t, torch.full_like(t, float(WS ** 3))), "wrong all_reduce result"


def main():
    dist.init_process_group("kaitian")
    for test in (returns_at_once, completes_alone, callback_waits, ddp_matches_single_process,
                 ddp_overlaps, ddp_shared_buckets):
        dist.barrier()
        test()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
