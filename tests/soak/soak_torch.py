#!/usr/bin/python3
"""soak_torch.py - process groups made and destroyed through torch, whose
memory and descriptors must stay flat (tests/soak/soak.sh; make soak).

Run as `kaitian run -n N soak_torch.py [groups=G] [rss_slack_kb=K] [warmup=W]
[seed=S]`. After dist.init_process_group("kaitian"), every rank draws the same
G random subsets of the ranks (seed S) and for each one calls
dist.new_group(subset); the members allreduce a small tensor on it (rank r
gives r + 1, so the sum is known) and check it; then every rank calls
dist.destroy_process_group(group). Each group is 3 communicators bootstrapped
through torch's store, so the churn runs communicator creation and
destruction, the store bridge and the Python finalizers 3 G times.

The rank samples its resident set (VmRSS), heap (RssAnon) and open
descriptors (/proc/self/fd) at the start, after group W (the warm-up: the
first groups grow torch's and Python's caches), about every 0.5 s and at the
end, and prints, as soak_prog does,
  SOAK rank=R phase=new_group samples=K rss_kb first=A warm=W last=B max=C
       slope_kb_per_min=S anon_kb warm=X last=Y fds first=D last=E max=F
(slope: least squares over the samples after the warm-up) and the number of
keys in torch's store at the start and the end. Flat means: the
heap grew by at most K KiB (default 8192) from the warm-up to the end, and no
more descriptors were open at the end than at the start (rank 0 may end with
fewer: it hosts torch's TCPStore, whose accepted connections close when their
clients do), and the groups left at most 1 key each in the store (torch's
own barrier key of new_group; rank 0 hosts the store, so this is the growth
of its heap that is expected). Exit 0 and SOAK_OK when flat and every
result was right; SOAK_FAILED lines on stderr and exit 1 otherwise.
"""
import gc
import os
import random
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import torch_kaitian  # noqa: E402,F401  (registers the "kaitian" backend)


def arg(key, default):
    for a in sys.argv[1:]:
        if a.startswith(key + "="):
            return int(a.split("=", 1)[1])
    return default


def memory_kb():
    """(VmRSS, RssAnon) of this process in KiB."""
    rss = anon = -1
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1])
            elif line.startswith("RssAnon:"):
                anon = int(line.split()[1])
    return rss, anon


def open_fds():
    return len(os.listdir("/proc/self/fd")) - 1  # less the listing's own descriptor


def fd_targets():
    """{descriptor: what it is} (for a message when the count is not flat)."""
    out = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            out[fd] = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # the listing's own descriptor, closed by now
            pass
    return out


class Sampler:
    def __init__(self):
        self.s = []  # (time, rss, anon, fds)
        self.next = 0.0

    def take(self, force=False):
        t = time.monotonic()
        if not force and t < self.next:
            return
        self.next = t + 0.5
        rss, anon = memory_kb()
        self.s.append((t, rss, anon, open_fds()))


def slope_kb_per_min(samples):
    if len(samples) < 2:
        return 0.0
    t0 = samples[0][0]
    ts = [s[0] - t0 for s in samples]
    rs = [s[1] for s in samples]
    n = len(ts)
    mt, mr = sum(ts) / n, sum(rs) / n
    den = sum((t - mt) ** 2 for t in ts)
    return sum((t - mt) * (r - mr) for t, r in zip(ts, rs)) / den * 60.0 if den > 0 else 0.0


def main():
    groups, slack = arg("groups", 1000), arg("rss_slack_kb", 8192)
    warmup, seed = arg("warmup", 50), arg("seed", 1)
    dist.init_process_group("kaitian")
    rank, size = dist.get_rank(), dist.get_world_size()
    rng = random.Random(seed)  # the same draws on every rank
    failed = 0
    samp = Sampler()
    gc.collect()
    samp.take(True)
    fds0, fdmap0 = samp.s[0][3], fd_targets()
    store = dist.distributed_c10d._get_default_store()
    keys0 = store.num_keys()
    warm = 0
    t_start = time.monotonic()
    for i in range(groups):
        members = sorted(rng.sample(range(size), rng.randint(1, size)))
        g = dist.new_group(members)
        if rank in members:
            t = torch.full((1 + i % 7,), float(rank + 1))
            dist.all_reduce(t, group=g)
            want = float(sum(r + 1 for r in members))
            if not torch.all(t == want):
                print(f"SOAK_FAILED rank={rank}: group {i} of ranks {members}: allreduce gave "
                      f"{t.tolist()}, expected {want}", file=sys.stderr, flush=True)
                failed += 1
        dist.destroy_process_group(g)
        del g
        if i + 1 == warmup:
            warm = len(samp.s)
            samp.take(True)
        samp.take()
    dist.barrier()
    keys1 = store.num_keys()
    gc.collect()  # what a cycle still holds is not leaked, only not yet freed
    samp.take(True)
    s = samp.s
    if warm == 0 or warm >= len(s):
        warm = len(s) - 1
    after = s[warm:]
    print(f"SOAK rank={rank} phase=new_group samples={len(s)} rss_kb first={s[0][1]} warm={s[warm][1]} "
          f"last={s[-1][1]} max={max(x[1] for x in s)} slope_kb_per_min={slope_kb_per_min(after):.1f} "
          f"anon_kb warm={s[warm][2]} last={s[-1][2]} fds first={fds0} last={s[-1][3]} "
          f"max={max(x[3] for x in s)} store_keys first={keys0} last={keys1}", flush=True)
    print(f"SOAK rank={rank} total: {time.monotonic() - t_start:.1f} s, {groups} groups of random "
          f"subsets of {size} ranks made, used and destroyed", flush=True)
    if keys1 - keys0 > groups:
        print(f"SOAK_FAILED rank={rank} phase=new_group: {groups} groups left {keys1 - keys0} keys in the "
              f"store (at most 1 each: torch's own barrier key of new_group)",
              file=sys.stderr, flush=True)
        failed += 1
    grew = s[-1][2] - s[warm][2]
    if grew > slack:
        print(f"SOAK_FAILED rank={rank} phase=new_group: the heap (RssAnon) grew by {grew} KiB after "
              f"the warm-up (slack {slack} KiB)", file=sys.stderr, flush=True)
        failed += 1
    # Fewer is no leak: rank 0 hosts torch's TCPStore, and connections its
    # clients open and close elsewhere come and go on its side.
    if s[-1][3] > fds0:
        now = fd_targets()
        gone = {k: v for k, v in fdmap0.items() if now.get(k) != v}
        new = {k: v for k, v in now.items() if fdmap0.get(k) != v}
        print(f"SOAK_FAILED rank={rank} phase=new_group: {s[-1][3]} descriptors open at the end, "
              f"{fds0} at the start (closed since: {gone}; opened since: {new})", file=sys.stderr, flush=True)
        failed += 1
    dist.destroy_process_group()
    if failed:
        return 1
    print(f"SOAK_OK rank={rank}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
