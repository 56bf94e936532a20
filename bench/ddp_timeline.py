"""ddp_timeline.py - where the communication time of a DDP step goes, per step and rank.

Run under the launcher:
    kaitian run -n 2 /usr/bin/python3 bench/ddp_timeline.py kaitian [--bucket-view] [--batch 8]
    kaitian run -n 2 /usr/bin/python3 bench/ddp_timeline.py gloo ...
Trains torch_kaitian.bench's MLP, alternating steps under no_sync and
synchronised steps, and records on every rank (one clock, CLOCK_MONOTONIC,
shared by the ranks of a host): the step's start, the moment the last gradient
is computed (a hook on the first layer's weight, the last one backward
reaches), the return of backward() and the end of the optimizer step. For
kaitian it also wraps the group's allreduce to record, per DDP bucket, the
issue call and the completion of its future. Rank 0 prints medians:
  start -> both ready   from the later rank's start to the later rank's last
                        gradient (backward's compute, slowed by whatever runs
                        beside it: the first buckets' all_reduce, DDP's copies)
  tail                  from then to the later rank's return from backward()
                        (the last bucket's all_reduce and DDP's finishing work)
Needs torch_kaitian importable (PYTHONPATH=python, KAITIAN_LIBRARY=build/libkaitian.so
in a build tree).
"""
import argparse
import statistics as st
import time

import torch
import torch.distributed as dist

import torch_kaitian  # noqa: F401 - registers "kaitian"
from torch_kaitian import process_group as pgm
from torch_kaitian.bench import _Model

now = time.perf_counter


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("backend", choices=("kaitian", "gloo"))
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--bucket-view", action="store_true", help="gradient_as_bucket_view=True")
    a = ap.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group(a.backend)

    buckets = []  # this step's [bytes, issue start, issue end, future done]
    if a.backend == "kaitian":
        orig = pgm.ProcessGroupKaitian.allreduce

        def traced(self, tensors, opts=None):
            t = tensors[0]
            rec = [t.numel() * t.element_size(), now(), None, None]
            work = orig(self, tensors, opts)
            rec[2] = now()
            buckets.append(rec)

            def done(fut, rec=rec):
                rec[3] = now()
                return fut.value()

            work.get_future().then(done)
            return work

        pgm.ProcessGroupKaitian.allreduce = traced

    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(_Model(), gradient_as_bucket_view=a.bucket_view)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(a.batch, 256), torch.randint(0, 10, (a.batch,))
    loss_fn = torch.nn.CrossEntropyLoss()
    mark = {}
    model.module.net[0].weight.register_hook(lambda g: mark.__setitem__("grad", now()))

    def step(sync):
        opt.zero_grad(set_to_none=True)
        del buckets[:]
        t0 = now()
        if sync:
            loss_fn(model(x), y).backward()
        else:
            with model.no_sync():
                loss_fn(model(x), y).backward()
        t1 = now()
        opt.step()
        return {"start": t0, "grad": mark["grad"], "bwd": t1, "end": now(),
                "buckets": [(b, s - t0, e - t0, (d - t0) if d else None) for b, s, e, d in buckets]}

    for _ in range(4):
        step(True)
        step(False)
    rec = {False: [], True: []}
    for _ in range(a.steps):
        for sync in (False, True):
            dist.barrier()
            rec[sync].append(step(sync))
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, rec)
    if dist.get_rank() == 0:
        report(a, everyone)
    # The model first: torch 1.13's gloo group, destroyed with the last DDP
    # reference during interpreter exit, can hang joining its worker thread.
    del model, opt
    dist.destroy_process_group()


def report(a, everyone):
    ms = 1e3
    print(f"{a.backend}, gradient_as_bucket_view={a.bucket_view}, batch {a.batch}, "
          f"{len(everyone)} ranks, medians of {a.steps} steps (ms)")
    totals = {}
    for sync in (False, True):
        steps = list(zip(*(r[sync] for r in everyone)))
        start = [max(s["start"] for s in ranks) for ranks in steps]
        ready = [max(s["grad"] for s in ranks) for ranks in steps]
        bwd = [max(s["bwd"] for s in ranks) for ranks in steps]
        end = [max(s["end"] for s in ranks) for ranks in steps]
        skew = [max(s["grad"] for s in ranks) - min(s["grad"] for s in ranks) for ranks in steps]
        totals[sync] = [e - s for e, s in zip(end, start)]
        print(f"  {'synchronised' if sync else 'no_sync':>12s}: start -> both ready "
              f"{st.median(r - s for r, s in zip(ready, start)) * ms:7.2f}, tail "
              f"{st.median(b - r for b, r in zip(bwd, ready)) * ms:5.2f}, step "
              f"{st.median(totals[sync]) * ms:7.2f}, ranks' last gradients apart {st.median(skew) * ms:5.2f}")
    print(f"  communication (median of synchronised - no_sync step): "
          f"{st.median(s - n for s, n in zip(totals[True], totals[False])) * ms:.2f}")
    for rank, r in enumerate(everyone):
        steps = r[True]
        for i in range(min(len(s["buckets"]) for s in steps)):
            size = steps[0]["buckets"][i][0]
            issue = st.median(s["buckets"][i][2] - s["buckets"][i][1] for s in steps)
            done = st.median((s["buckets"][i][3] or s["buckets"][i][2]) - s["buckets"][i][1] for s in steps)
            after = st.median(s["bwd"] - s["start"] - (s["buckets"][i][3] or s["buckets"][i][2]) for s in steps)
            print(f"  rank {rank} bucket {i} ({size / 2**20:.1f} MiB): issue call {issue * ms:.2f}, "
                  f"issue -> future done {done * ms:.2f}, future done -> backward returns {after * ms:.2f}")


if __name__ == "__main__":
    main()
