"""balance.py - pipeline stages sized by each device's speed.

    plan = balance(layers, sample, topo.group("pipe"))   # every rank of the pipe group
    pipe = Pipeline(plan, topo.group("pipe"), num_microbatches=8, loss_fn=...)

balance() times every layer (forward + backward on one microbatch, `sample`)
on each pipeline rank's own device, the ranks one after another so that
ranks sharing a host do not disturb each other's figures, and cuts the
ordered list of layers into consecutive stages, stage s on the group's rank s,
that minimise the slowest stage's time: an exact dynamic program over the cut
points (not a greedy split), each stage within its rank's memory budget when
one is given. Among the cuts whose slowest stage is within `tolerance` of the
best (the figures' own noise), the one with the most even layer counts is
taken, so equal layers on equal devices are cut equally. cut() is the same
program on given figures.
"""
import math
import time

import torch
import torch.distributed as dist

from .. import _log
from .._device import _collective_device, _group_ranks
from ._memory import saved_bytes

__all__ = ["balance", "cut", "StagePlan", "Stage"]


def _check_times(times):
    p = len(times)
    if p < 1:
        raise ValueError("cut: no stage")
    n = len(times[0])
    if any(len(t) != n for t in times):
        raise ValueError(f"cut: every stage needs a time per layer: {[len(t) for t in times]}")
    if n < p:
        raise ValueError(f"cut: {n} layers cannot make {p} stages (a stage holds one or more)")
    for t in times:
        for v in t:
            if not (math.isfinite(v) and v >= 0):
                raise ValueError(f"cut: layer times must be finite and >= 0, got {v!r}")
    return p, n


def cut(times, memory=None, budgets=None, tolerance=0.0):
    """The cut of n layers into len(times) consecutive non-empty stages.

    times[s][i]: layer i's seconds on the device of stage s. memory[s][i]
    (optional): the bytes layer i needs on stage s, budgets[s] the bytes
    stage s may use (None: no limit). Returns (bounds, stage_times): bounds a
    list of (first, end) layer indices per stage. Exact: the slowest stage
    is as fast as any cut allows; among the cuts within (1 + tolerance) of
    that, the one whose layer counts are nearest n / stages (least squares).
    Raises ValueError when no cut fits the budgets."""
    p, n = _check_times(times)
    if memory is not None and budgets is None:
        raise ValueError("cut: memory given without budgets")
    pre = [[0.0] * (n + 1) for _ in range(p)]
    for s in range(p):
        for i in range(n):
            pre[s][i + 1] = pre[s][i] + float(times[s][i])
    mpre = None
    if memory is not None:
        mpre = [[0.0] * (n + 1) for _ in range(p)]
        for s in range(p):
            for i in range(n):
                mpre[s][i + 1] = mpre[s][i] + float(memory[s][i])

    def fits(s, i, j):
        if mpre is None or budgets[s] is None:
            return True
        return mpre[s][j] - mpre[s][i] <= budgets[s]

    def span(s, i, j):
        return pre[s][j] - pre[s][i]

    inf = math.inf
    # best[s][j]: the least slowest-stage time of layers [0, j) in stages 0..s.
    best = [[inf] * (n + 1) for _ in range(p)]
    for j in range(1, n - p + 2):
        if fits(0, 0, j):
            best[0][j] = span(0, 0, j)
    for s in range(1, p):
        for j in range(s + 1, n - (p - 1 - s) + 1):
            v = inf
            for i in range(s, j):
                if best[s - 1][i] < inf and fits(s, i, j):
                    v = min(v, max(best[s - 1][i], span(s, i, j)))
            best[s][j] = v
    bound = best[p - 1][n]
    if bound == inf:
        raise ValueError(f"cut: no cut of {n} layers into {p} stages fits the memory budgets "
                         f"{budgets}")
    limit = bound * (1 + tolerance) + 1e-12 * abs(bound)
    even = n / p
    # dev[s][j]: the least sum of squared deviations from n/p, every stage <= limit.
    dev = [[inf] * (n + 1) for _ in range(p)]
    back = [[-1] * (n + 1) for _ in range(p)]
    for j in range(1, n - p + 2):
        if fits(0, 0, j) and span(0, 0, j) <= limit:
            dev[0][j] = (j - even) ** 2
    for s in range(1, p):
        for j in range(s + 1, n - (p - 1 - s) + 1):
            for i in range(s, j):
                if dev[s - 1][i] < inf and fits(s, i, j) and span(s, i, j) <= limit:
                    v = dev[s - 1][i] + (j - i - even) ** 2
                    if v < dev[s][j]:
                        dev[s][j], back[s][j] = v, i
    bounds, j = [], n
    for s in range(p - 1, 0, -1):
        i = back[s][j]
        bounds.append((i, j))
        j = i
    bounds.append((0, j))
    bounds.reverse()
    return bounds, [span(s, a, b) for s, (a, b) in enumerate(bounds)]


class Stage(torch.nn.Module):
    """Consecutive layers as one stage: each layer's outputs (a tuple is
    spread into arguments) are the next one's inputs."""

    def __init__(self, layers):
        super().__init__()
        self.layers = torch.nn.ModuleList(layers)

    def forward(self, *x):
        for layer in self.layers:
            x = _as_args(layer(*x))
        return x[0] if len(x) == 1 else x


class StagePlan:
    """What balance() chose: bounds[s] = (first, end) of stage s's layers;
    stage_times[s]: its predicted seconds per microbatch (forward + backward);
    layer_times[s][i]: layer i timed on stage s's device; equal_times: the
    stages' predicted seconds under the equal cut; memory / budgets: the
    bytes each stage needs and may use (None when not asked). Give it to
    Pipeline in place of a stage module: it builds this rank's stage."""

    def __init__(self, layers, bounds, stage_times, layer_times, equal_times, group,
                 memory=None, budgets=None):
        self.layers, self.bounds = layers, bounds
        self.stage_times, self.layer_times = stage_times, layer_times
        self.equal_times = equal_times
        self.group, self.memory, self.budgets = group, memory, budgets

    @property
    def sizes(self):
        return [b - a for a, b in self.bounds]

    def stage(self, s=None):
        """Stage s's layers (default: this rank's in the pipe group) as one
        module (a Stage of the layers themselves, not copies)."""
        if s is None:
            s = dist.get_rank(self.group)
        a, b = self.bounds[s]
        return Stage(self.layers[a:b])

    def describe(self):
        ms = ", ".join(f"stage {s}: layers {a}-{b - 1} ({t * 1e3:.2f} ms)"
                       for s, ((a, b), t) in enumerate(zip(self.bounds, self.stage_times)))
        gain = max(self.equal_times) / max(self.stage_times) if max(self.stage_times) > 0 else 1.0
        return (f"pipeline stages by speed: {ms}; slowest {max(self.stage_times) * 1e3:.2f} ms "
                f"against {max(self.equal_times) * 1e3:.2f} ms for the equal cut "
                f"({gain:.2f}x)")

    def __repr__(self):
        return f"StagePlan(sizes={self.sizes}, bounds={self.bounds})"


def _equal_bounds(n, p):
    per, extra = divmod(n, p)
    out, a = [], 0
    for s in range(p):
        b = a + per + (1 if s < extra else 0)
        out.append((a, b))
        a = b
    return out


def _as_args(x):
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def _prepare_inputs(args):
    """Detached inputs; floating ones require grad (as a stage's received ones do)."""
    out = []
    for t in args:
        if torch.is_tensor(t):
            t = t.detach()
            if t.is_floating_point() or t.is_complex():
                t.requires_grad_(True)
        out.append(t)
    return tuple(out)


def _sync(dev):
    if dev.type != "cpu":
        mod = getattr(torch, dev.type, None)
        if mod is not None and callable(getattr(mod, "synchronize", None)):
            mod.synchronize()


def _fwd_bwd(layer, args):
    outs = _as_args(layer(*args))
    need = [o for o in outs if torch.is_tensor(o) and o.requires_grad]
    if need:
        torch.autograd.backward(need, [torch.ones_like(o) for o in need])
    return outs


def _saved_bytes(layer, args):
    """Bytes autograd keeps from this layer's forward for its backward (its
    own parameters not counted), plus its outputs."""
    with saved_bytes(layer) as total:
        outs = _as_args(layer(*args))
    return total[0] + sum(o.numel() * o.element_size() for o in outs if torch.is_tensor(o))


def _time_layers(layers, sample, dev, seconds, warmup, min_reps):
    """Per layer: mean seconds of forward + backward, and bytes (parameters,
    saved activations); each layer moved to dev in turn and back where it was
    (modules move in place: no copy of layers that hold process groups), its
    gradients restored."""
    x = tuple(t.to(dev) if torch.is_tensor(t) else t for t in _as_args(sample))
    times, params, acts = [], [], []
    for layer in layers:
        home = next((q.device for q in layer.parameters()), dev)
        grads = [q.grad for q in layer.parameters()]
        try:
            out = _time_one(layer.to(dev), x, dev, seconds, warmup, min_reps)
        finally:
            layer.to(home)
            for q, g in zip(layer.parameters(), grads):
                q.grad = g
        x, t, pb, ab = out
        times.append(t)
        params.append(pb)
        acts.append(ab)
    return times, params, acts


def _time_one(mod, x, dev, seconds, warmup, min_reps):
    """(the layer's outputs on x, seconds per forward + backward, parameter
    bytes, saved-activation bytes)."""
    args = _prepare_inputs(x)
    for _ in range(warmup):
        _fwd_bwd(mod, args)
    mod.zero_grad(set_to_none=True)
    _sync(dev)
    k, total = 0, 0.0
    t_start = time.perf_counter()
    # A wall-clock window per layer: a rank that shares its CPU shows its share.
    while k < min_reps or time.perf_counter() - t_start < seconds:
        args = _prepare_inputs(x)
        t0 = time.perf_counter()
        _fwd_bwd(mod, args)
        _sync(dev)
        total += time.perf_counter() - t0
        k += 1
    pbytes = sum(q.numel() * q.element_size() for q in mod.parameters())
    abytes = _saved_bytes(mod, _prepare_inputs(x))
    with torch.no_grad():
        x = _as_args(mod(*x))
    mod.zero_grad(set_to_none=True)
    return x, total / k, pbytes, abytes


def balance(layers, sample, group=None, device=None, memory=None, state_factor=4,
            in_flight=None, tolerance=0.10, seconds=0.05, warmup=1, min_reps=3):
    """Cut `layers` (an ordered list of modules whose composition is the
    model: layer i's outputs are layer i + 1's inputs) into consecutive stages,
    one per rank of the pipe `group`, by each rank's measured speed. A
    collective: every rank of the group calls it with the same layers.

    sample: one microbatch's inputs to the first layer (a tensor or a tuple).
    device: where this rank runs its stage (default: torch_kaitian.device()).
    memory: None (no limit), "device" (each rank's free memory:
    parallel._memory.free_memory) or a list of bytes per rank. A stage needs
    state_factor x its parameters' bytes (weights, gradients and two Adam
    moments: 4) plus its layers' saved activations per microbatch x
    in_flight[s] (default: p - s, what 1F1B keeps on stage s).
    tolerance: cuts whose slowest stage is within this fraction of the best
    count as equal (the most even of them is taken). seconds / warmup /
    min_reps: the timing of each layer. The chosen plan is printed once at
    KAITIAN_DEBUG=INFO. Returns a StagePlan."""
    from .._device import device as _default_device
    layers = list(layers)
    me = dist.get_rank()
    p = dist.get_world_size(group)
    s_me = dist.get_rank(group)
    if s_me < 0:
        raise ValueError(f"rank {me}: balance: this rank is not in the pipe group")
    if len(layers) < p:
        raise ValueError(f"rank {me}: balance: {len(layers)} layers cannot make {p} stages")
    if not 0 <= tolerance < 1:
        raise ValueError(f"rank {me}: balance: tolerance must be in [0, 1), not {tolerance!r}")
    dev = torch.device(device) if device is not None else _default_device()
    ctl = _collective_device(group)
    n = len(layers)
    mine = None
    for turn in range(p):  # one rank at a time
        if turn == s_me:
            mine = _time_layers(layers, sample, dev, seconds, warmup, min_reps)
        dist.barrier(group=group)
    row = torch.tensor([v for part in mine for v in part], dtype=torch.float64, device=ctl)
    rows = [torch.zeros_like(row) for _ in range(p)]
    dist.all_gather(rows, row, group=group)
    rows = [r.cpu().tolist() for r in rows]
    times = [r[:n] for r in rows]
    params = [r[n:2 * n] for r in rows]
    acts = [r[2 * n:] for r in rows]
    mem = budgets = None
    if memory is not None:
        if memory == "device":
            from ._memory import free_memory
            budgets = [float(b) for b in free_memory(dev, group)]
        elif isinstance(memory, str):
            raise ValueError(f"rank {me}: balance: memory must be None, 'device' or a list of "
                             f"bytes per rank, not {memory!r}")
        else:
            budgets = [None if b is None else float(b) for b in memory]
            if len(budgets) != p:
                raise ValueError(f"rank {me}: balance: {len(budgets)} memory budgets for {p} "
                                 f"stages")
        flight = list(in_flight) if in_flight is not None else [p - s for s in range(p)]
        mem = [[state_factor * params[s][i] + flight[s] * acts[s][i] for i in range(n)]
               for s in range(p)]
    try:
        bounds, stage_times = cut(times, mem, budgets, tolerance)
    except ValueError as e:
        raise ValueError(f"rank {me}: balance: {e}") from None
    eq = _equal_bounds(n, p)
    equal_times = [sum(times[s][a:b]) for s, (a, b) in enumerate(eq)]
    plan = StagePlan(layers, bounds, stage_times, times, equal_times, group, mem, budgets)
    if me == _group_ranks(group)[0]:
        _log.info(plan.describe())
    return plan
