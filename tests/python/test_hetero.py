"""test_hetero.py - heterogeneous data parallelism (torch_kaitian/hetero.py).

  sampler   one process: HeteroSampler's shares, disjoint and complete epochs for
            odd dataset sizes and world sizes 1-5, identical views, determinism,
            lengths, the DataLoader paths and their errors; KAITIAN_CAPABILITIES.
  exact     under `kaitian run -n P` (--caps 1,3 ...; --on-device: on each rank's
            device of the launcher's plan, e.g. --devices cuda:1,cpu:2): a float64 model trained
            5 steps with HeteroSampler + HeteroDDP (uneven shares, a short last
            batch of an epoch, a rank with an empty batch, no_sync accumulation)
            ends with the parameters of one process trained on the union of each
            step's batches (relative difference <= 1e-10; the loss has a weight
            penalty besides the model's output); plain DDP on the same
            batches ends elsewhere (the weighting is real); weighted_mean gives
            the union's loss.
  slow      under `kaitian run -n 2`: rank 1 shares its CPU with a busy process
            this test starts; measure_capability ranks it below rank 0 (ratio
            >= 1.3) and HeteroSampler gives it the smaller share.
"""
import argparse
import os
import subprocess
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset

import torch_kaitian as tk


def fail(msg):
    rank = dist.get_rank() if dist.is_initialized() else 0
    print(f"FAIL rank {rank}: {msg}", file=sys.stderr, flush=True)
    sys.exit(1)


def check(cond, msg):
    if not cond:
        fail(msg)


# ---- sampler (one process) -------------------------------------------------------------

def check_epoch(n, b, caps, drop_last, shuffle, epoch):
    p = len(caps)
    samplers = [tk.HeteroSampler(list(range(n)), b, shuffle=shuffle, seed=7, drop_last=drop_last,
                                 capabilities=caps, rank=r, world_size=p) for r in range(p)]
    for s in samplers:
        s.set_epoch(epoch)
    what = f"n={n} B={b} caps={caps} drop_last={drop_last} shuffle={shuffle} epoch={epoch}"
    steps = {s.num_steps for s in samplers}
    check(len(steps) == 1, f"{what}: num_steps differ across ranks: {steps}")
    nsteps = steps.pop()
    want_steps = n // b if drop_last or n % b == 0 else n // b + 1
    check(nsteps == want_steps, f"{what}: {nsteps} steps, expected {want_steps}")
    views = [s.rank_batches() for s in samplers]
    # Every rank's instance computes every rank's view identically.
    for r in range(p):
        for s in samplers:
            check(s.rank_batches(r) == views[r], f"{what}: rank {s.rank}'s view of rank {r} differs")
    seen = []
    for step in range(nsteps):
        sh = samplers[0].step_shares(step)
        size = b if step < n // b else n % b
        check(sum(sh) == size, f"{what}: step {step} shares {sh} sum to {sum(sh)}, not {size}")
        whole = sum(caps)
        for r in range(p):
            q = size * caps[r] / whole
            check(len(views[r][step]) == sh[r], f"{what}: rank {r} step {step} size")
            check(sh[r] >= 0, f"{what}: negative share")
            if size == b:  # full steps: largest remainder, within 1 of the quota
                check(q - 1 < sh[r] < q + 1, f"{what}: share {sh[r]} of rank {r} vs quota {q}")
            else:          # the short last step never exceeds a full step's share
                check(sh[r] <= samplers[0].full_shares[r], f"{what}: last share over full")
        for r in range(p):
            seen += views[r][step]
    want = n if not drop_last else nsteps * b
    check(len(seen) == len(set(seen)) == want,
          f"{what}: {len(seen)} indices, {len(set(seen))} distinct, expected {want}")
    if not drop_last:
        check(sorted(seen) == list(range(n)), f"{what}: epoch does not cover the dataset")
    for r, s in enumerate(samplers):
        check(len(s) == sum(len(x) for x in views[r]), f"{what}: len(sampler) of rank {r}")
        batches = list(s.batches())
        check(batches == views[r] and len(s.batches()) == nsteps, f"{what}: batches() of rank {r}")
    return views


def test_sampler():
    import random
    rnd = random.Random(5)
    count = 0
    for p in range(1, 6):
        for n in (1, 7, 97, 101, 255):
            for b in (1, 3, 16, 33):
                caps = [rnd.choice([0.5, 1, 1, 2, 3, 5.5]) for _ in range(p)]
                if p > 2 and rnd.random() < 0.3:
                    caps[rnd.randrange(p)] = 0  # a rank without work
                for drop_last in (False, True):
                    for shuffle in (True, False):
                        check_epoch(n, b, caps, drop_last, shuffle, epoch=rnd.randrange(4))
                        count += 1
    # Deterministic from (seed, epoch, capabilities); epochs differ.
    mk = lambda seed, caps=(1, 3): tk.HeteroSampler(list(range(50)), 10, seed=seed,  # noqa: E731
                                                    capabilities=list(caps), rank=1, world_size=2)
    a, b = mk(3), mk(3)
    check(list(a) == list(b), "same seed and epoch give different orders")
    a.set_epoch(1)
    check(list(a) != list(b), "set_epoch does not reshuffle")
    check(list(mk(4)) != list(b), "another seed gives the same order")
    check(list(mk(3, (1, 1))) != list(b), "other capabilities give the same shares")
    # Shares in proportion: 1:3 of 64 -> 16:48; largest remainder ties go low.
    check(tk.shares(64, [1, 3]) == [16, 48], f"shares(64, 1:3) = {tk.shares(64, [1, 3])}")
    check(tk.shares(10, [1, 3]) == [3, 7], f"shares(10, 1:3) = {tk.shares(10, [1, 3])}")
    check(tk.shares(8, [1, 2, 5]) == [1, 2, 5], "shares(8, 1:2:5)")
    check(tk.shares(5, [1, 2, 5], cap=[1, 2, 5]) == [1, 1, 3], "capped shares")

    # The DataLoader paths: batch_size=local_batch_size gives num_steps batches
    # of exactly the step shares on every rank.
    ds = TensorDataset(torch.arange(101).double().unsqueeze(1), torch.arange(101))
    for caps in ([1, 3], [1, 2, 5], [2, 1, 1, 3]):
        p = len(caps)
        for r in range(p):
            s = tk.HeteroSampler(ds, 16, capabilities=caps, rank=r, world_size=p)
            dl = DataLoader(ds, batch_size=s.local_batch_size, sampler=s)
            got = [x[1].tolist() for x in dl]
            check(len(dl) == len(got) == s.num_steps, f"caps {caps} rank {r}: {len(got)} batches "
                  f"(len {len(dl)}), expected {s.num_steps}")
            check(got == s.rank_batches(), f"caps {caps} rank {r}: DataLoader batches differ")
    # A rank with an empty share: the plain DataLoader path refuses clearly;
    # loader() yields an empty batch shaped like the samples.
    ds = TensorDataset(torch.arange(98).double().unsqueeze(1), torch.arange(98))
    s = tk.HeteroSampler(ds, 16, capabilities=[1, 2, 5], rank=0, world_size=3, shuffle=False)
    check(s.step_shares(s.num_steps - 1) == [0, 1, 1], f"last shares {s.step_shares(6)}")
    try:
        list(DataLoader(ds, batch_size=s.local_batch_size, sampler=s))
        fail("a zero share through DataLoader(batch_size=...) was not refused")
    except ValueError as e:
        check("rank 0 gets no sample in step 6" in str(e) and "loader()" in str(e), f"message: {e}")
    got = list(s.loader())
    check(len(got) == s.num_steps == len(s.loader()), "loader(): one batch per step")
    check(got[-1][0].shape == (0, 1) and got[-1][0].dtype == torch.float64
          and got[-1][1].shape == (0,), f"loader(): empty batch {got[-1]}")
    check([x[1].tolist() for x in got] == s.rank_batches(), "loader(): batches differ")
    zero = tk.HeteroSampler(ds, 4, capabilities=[0, 1], rank=0, world_size=2)
    try:
        zero.local_batch_size
        fail("a zero local_batch_size was returned")
    except ValueError as e:
        check("share of every global batch of 4 is 0" in str(e), f"message: {e}")
    # Bad arguments.
    for kwargs, text in (({"global_batch_size": 0}, "global_batch_size must be a positive"),
                         ({"global_batch_size": 4, "capabilities": [1]}, "1 entries for 2 ranks"),
                         ({"global_batch_size": 4, "capabilities": [0, 0]}, "not all 0"),
                         ({"global_batch_size": 4, "capabilities": [1, -1]}, ">= 0"),
                         ({"global_batch_size": 4, "rank": 2}, "rank 2 is not in 0..1")):
        kw = dict(rank=0, world_size=2)
        kw.update(kwargs)
        try:
            tk.HeteroSampler(ds, **kw)
            fail(f"HeteroSampler({kwargs}) was accepted")
        except ValueError as e:
            check(text in str(e), f"HeteroSampler({kwargs}): message {e!r} lacks {text!r}")
    # KAITIAN_CAPABILITIES: the override, and its errors.
    os.environ["KAITIAN_CAPABILITIES"] = "1, 1,3,3"
    check(tk.capabilities(4) == [1.0, 1.0, 3.0, 3.0], f"override: {tk.capabilities(4)}")
    for bad, text in (("1,2", "gives 2 capabilities for 4 ranks"), ("1,x,1,1", "not a comma"),
                      ("0,0,0,0", "not all 0"), ("1,-1,1,1", ">= 0"), ("1,nan,1,1", "finite")):
        os.environ["KAITIAN_CAPABILITIES"] = bad
        try:
            tk.capabilities(4)
            fail(f"KAITIAN_CAPABILITIES={bad} was accepted")
        except ValueError as e:
            check(text in str(e) and "KAITIAN_CAPABILITIES" in str(e), f"{bad}: message {e}")
    del os.environ["KAITIAN_CAPABILITIES"]
    check(tk.capabilities(3) == [1.0, 1.0, 1.0], "default capabilities are equal")
    print(f"PASS sampler ({count} epochs checked)")


# ---- exact mean (ranks) ------------------------------------------------------------------

N_DATA, BATCH, STEPS, LR = 33, 16, 5, 0.5  # epochs of 16 + 16 + 1: short, and empty on p - 1 ranks


def make_model():
    torch.manual_seed(11)
    return nn.Sequential(nn.Linear(5, 9), nn.Tanh(), nn.Linear(9, 3)).double()


def objective(model, x, y):
    """The batch's mean cross-entropy plus a weight penalty (a gradient term that
    does not flow through the model's output: it must count once, not p times)."""
    params = model.module.parameters() if hasattr(model, "module") else model.parameters()
    return F.cross_entropy(model(x), y) + 1e-3 * sum(p.square().sum() for p in params)


def make_data():
    g = torch.Generator().manual_seed(3)
    return TensorDataset(torch.randn(N_DATA, 5, generator=g, dtype=torch.float64),
                         torch.randint(0, 3, (N_DATA,), generator=g))


def plan(caps, accum):
    """The job's steps: for each optimizer step, the microbatches of every rank
    (lists of indices), taken from the samplers of every rank in turn."""
    ds = make_data()
    p = len(caps)
    samplers = [tk.HeteroSampler(ds, BATCH, seed=1, capabilities=caps, rank=r, world_size=p)
                for r in range(p)]
    micro = []  # [(epoch, step, [batch of rank r])]
    epoch = 0
    while len(micro) < STEPS * accum:
        for s in samplers:
            s.set_epoch(epoch)
        views = [s.rank_batches() for s in samplers]
        for step in range(samplers[0].num_steps):
            micro.append([views[r][step] for r in range(p)])
        epoch += 1
    return ds, [micro[i * accum:(i + 1) * accum] for i in range(STEPS)]


def reference(caps, accum):
    """One process, the union of each microstep's batches, the same optimizer."""
    ds, steps = plan(caps, accum)
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    losses = []
    for step in steps:
        opt.zero_grad()
        for mb in step:
            idx = [i for b in mb for i in b]
            x, y = ds[idx]
            loss = objective(model, x, y)
            loss.backward()
            losses.append(loss.item())
        opt.step()
    return model, losses, steps


def train(caps, accum, ddp_class, use_loader, dev):
    rank, p = dist.get_rank(), dist.get_world_size()
    ds = make_data()
    model = ddp_class(make_model().to(dev), device_ids=[dev.index] if dev.type == "cuda" else None)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    sampler = tk.HeteroSampler(ds, BATCH, seed=1, capabilities=caps)
    sizes, losses = [], []
    done, epoch = 0, 0
    while done < STEPS * accum:
        sampler.set_epoch(epoch)
        loader = (sampler.loader() if use_loader else
                  DataLoader(ds, batch_size=sampler.local_batch_size, sampler=sampler))
        for x, y in loader:
            if done == STEPS * accum:
                break
            x, y = x.to(dev), y.to(dev)
            last = (done + 1) % accum == 0
            if done % accum == 0:
                opt.zero_grad()
            if last:
                loss = objective(model, x, y)
                loss.backward()
            else:
                with model.no_sync():
                    loss = objective(model, x, y)
                    loss.backward()
            sizes.append(x.shape[0])
            losses.append(tk.weighted_mean(loss.item(), x.shape[0]))
            if last:
                opt.step()
            done += 1
        epoch += 1
    return model.module, sizes, losses


def rel_diff(a, b):
    return max(((x.cpu() - y).abs().max() / y.abs().max().clamp_min(1e-300)).item()
               for x, y in zip(a.parameters(), b.parameters()))


def test_exact(caps, accum, backend_note, on_device):
    rank, p = dist.get_rank(), dist.get_world_size()
    check(len(caps) == p, f"--caps {caps} for {p} ranks")
    ref, ref_losses, steps = reference(caps, accum)
    sizes_all = [[len(b) for b in mb] for st in steps for mb in st]
    check(p == 1 or any(0 in s for s in sizes_all), f"the plan has no empty batch: {sizes_all}")
    use_loader = any(0 in s for s in sizes_all)
    dev = tk.device() if on_device else torch.device("cpu")
    got, sizes, losses = train(caps, accum, tk.HeteroDDP, use_loader, dev)
    mine = [s[rank] for s in sizes_all]
    check(sizes == mine, f"local batch sizes {sizes}, expected {mine}")
    d = rel_diff(got, ref)
    check(d <= 1e-10, f"HeteroDDP vs one process: relative difference {d:.3e} > 1e-10")
    dl = max(abs(a - b) / abs(b) for a, b in zip(losses, ref_losses))
    check(dl <= 1e-12, f"weighted_mean of the losses vs the union's loss: {dl:.3e}")
    dp = 0.0
    if p > 1:  # one rank: plain DDP is the union too
        plain, _, _ = train(caps, accum, DDP, use_loader, dev)
        dp = rel_diff(plain, ref)
        check(dp > 1e-6, f"plain DDP matches the union too ({dp:.3e}): the test cannot tell")
    devs = [None] * p
    dist.all_gather_object(devs, str(dev))
    if rank == 0:
        print(f"PASS exact p={p} caps={caps} accum={accum} {backend_note} on {devs}: HeteroDDP {d:.2e}, "
              f"plain DDP {dp:.2e}; batches per step {sizes_all}", flush=True)


# ---- a slowed rank ------------------------------------------------------------------------

def test_slow():
    rank, p = dist.get_rank(), dist.get_world_size()
    check(p == 2, "slow runs on 2 ranks")
    cpus = [None, None]
    dist.all_gather_object(cpus, sorted(os.sched_getaffinity(0)))
    busy = None
    if rank == 1:
        # A CPU-bound process on every CPU of this rank, so it runs at about half speed.
        busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"],
                                 preexec_fn=(lambda c=c: os.sched_setaffinity(0, {c})))
                for c in cpus[1]]
        time.sleep(0.2)
    try:
        dist.barrier()
        caps = tk.measure_capability(seconds=1.0)
        dist.barrier()
    finally:
        for b in busy or []:
            b.kill()
            b.wait()
    ratio = caps[0] / caps[1]
    s = tk.HeteroSampler(list(range(1000)), 64)
    if rank == 0:
        print(f"slow: capabilities {caps[0]:.0f} and {caps[1]:.0f} samples/s (ratio {ratio:.2f}); "
              f"CPUs {cpus}; shares of 64: {s.full_shares}", flush=True)
    if set(cpus[0]) & set(cpus[1]):
        print("SKIP: the two ranks share CPUs (not bound apart); the ratio is not checked")
        dist.destroy_process_group()
        sys.exit(77)
    check(ratio >= 1.3, f"the slowed rank measured {caps[1]:.0f} samples/s against {caps[0]:.0f} "
          f"(ratio {ratio:.2f} < 1.3)")
    check(s.full_shares[1] < s.full_shares[0], f"shares {s.full_shares}: slowed rank not smaller")
    check(tk.capabilities() == caps, "capabilities() is not the last measurement")
    if rank == 0:
        print(f"PASS slow (ratio {ratio:.2f})")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=["sampler", "exact", "slow"])
    ap.add_argument("--caps", default="1,3")
    ap.add_argument("--accum", type=int, default=1)
    ap.add_argument("--backend", default="kaitian")
    ap.add_argument("--on-device", action="store_true",
                    help="exact: train on torch_kaitian.device() (the launcher's plan)")
    a = ap.parse_args()
    if a.what == "sampler":
        return test_sampler()
    dist.init_process_group(a.backend)
    try:
        if a.what == "exact":
            test_exact([float(c) for c in a.caps.split(",")], a.accum, a.backend, a.on_device)
        else:
            test_slow()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
