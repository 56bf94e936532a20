"""test_topology.py - torch_kaitian.parallel.Topology under `kaitian run -n W`:
for every ordered factorisation of W into 1-3 axes (and axes of size 1), every
group has the members a brute-force enumeration gives (last axis fastest), the
derived "model" group is every axis but "data", an all_reduce on each group
sums exactly its members, rank/size/coords agree, describe() lists every rank;
bad axes are clear errors. --backend gloo runs the same over gloo."""
import argparse
import itertools
import os
import sys

import torch
import torch.distributed as dist

import torch_kaitian  # noqa: F401
from torch_kaitian.parallel import Topology


def fail(msg):
    print(f"FAIL rank {dist.get_rank()}: {msg}", file=sys.stderr, flush=True)
    sys.exit(1)


def factorisations(w, parts):
    if parts == 1:
        yield (w,)
        return
    for d in range(1, w + 1):
        if w % d == 0:
            for rest in factorisations(w // d, parts - 1):
                yield (d,) + rest


def specs(w):
    out = [[("data", w)]]
    names = [["pipe", "data"], ["data", "tensor"], ["pipe", "tensor", "data"],
             ["data", "pipe", "tensor"], ["expert", "x", "y"]]
    for nm in names:  # the first and the last factorisation of each, at most one axis of 1
        fs = [f for f in factorisations(w, len(nm)) if f.count(1) <= 1 or w == 1]
        for f in dict.fromkeys(fs[:1] + fs[-1:]):
            out.append(list(zip(nm, f)))
    return out


def brute(axes, world):
    """rank -> coordinates tuple, enumerating in axis order (last fastest)."""
    sizes = [s for _, s in axes]
    return {r: c for r, c in enumerate(itertools.product(*[range(s) for s in sizes]))}


def expected(axes, coords, me, axis):
    names = [n for n, _ in axes]
    vary = [n for n in names if n != "data"] if axis == "model" else [axis]
    keep = [i for i, n in enumerate(names) if n not in vary]
    return sorted(r for r, c in coords.items() if all(c[i] == coords[me][i] for i in keep))


def check_spec(axes):
    me, w = dist.get_rank(), dist.get_world_size()
    topo = Topology(axes)
    coords = brute(axes, w)
    names = [n for n, _ in axes]
    got = topo.coords()
    if tuple(got[n] for n in names) != coords[me] or list(got) != names:
        fail(f"{axes}: coords {got}, expected {coords[me]}")
    for axis in names + ["model"]:
        want = expected(axes, coords, me, axis)
        if topo.ranks_in(axis) != want:
            fail(f"{axes}: group {axis} = {topo.ranks_in(axis)}, expected {want}")
        if topo.rank(axis) != want.index(me):
            fail(f"{axes}: rank({axis}) = {topo.rank(axis)}")
        size = len(want)
        if topo.size(axis) != size:
            fail(f"{axes}: size({axis}) = {topo.size(axis)}, expected {size}")
        x = torch.zeros(w, dtype=torch.float64)
        x[me] = 1.0
        dist.all_reduce(x, group=topo.group(axis))
        members = [i for i in range(w) if x[i] != 0]
        if members != want or any(x[i] != 1.0 for i in members):
            fail(f"{axes}: all_reduce on group {axis} reached {members} ({x.tolist()}), expected {want}")
        if dist.get_world_size(topo.group(axis)) != size:
            fail(f"{axes}: the group of {axis} has {dist.get_world_size(topo.group(axis))} ranks")
    table = topo.describe().splitlines()
    if len(table) != w + 1 or not table[0].split()[:1 + len(names)] == ["rank"] + names:
        fail(f"{axes}: describe() is\n{topo.describe()}")
    return topo


def check_errors():
    w = dist.get_world_size()
    cases = [([("data", w + 1)], f"= {w + 1} ranks, but there are {w}"),
             ([("data", w), ("data", 1)], "axis 'data' appears twice"),
             ([("data", 0)], "sizes are >= 1"),
             ([("model", w)], "derived axis"),
             ([], "non-empty list"),
             ([("data", "2")], "(name, size) pair")]
    for axes, text in cases:
        try:
            Topology(axes)
        except ValueError as e:
            if text not in str(e) or f"rank {dist.get_rank()}" not in str(e):
                fail(f"Topology({axes}): message {e!r} lacks {text!r}")
        else:
            fail(f"Topology({axes}) was accepted")
    topo = Topology([("data", w)])
    try:
        topo.group("tensor")
        fail("group('tensor') of a data-only topology was accepted")
    except KeyError as e:
        if "no axis 'tensor'" not in str(e):
            fail(f"message {e}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", default="kaitian")
    a = ap.parse_args()
    dist.init_process_group(a.backend)
    all_specs = specs(dist.get_world_size())
    for axes in all_specs:
        topo = check_spec(axes)
    check_errors()
    if dist.get_rank() == 0:
        print(topo.describe())
        print(f"PASS topology world {dist.get_world_size()} over {a.backend}: {len(all_specs)} "
              f"layouts, e.g. {all_specs[-1]}")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    if "gloo" in sys.argv:
        # torch 2.15's gloo aborts a rank now and then at interpreter exit, after
        # the group is destroyed ("terminate called without an active exception"):
        # the test is over, leave without the teardown.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
