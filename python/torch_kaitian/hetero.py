"""hetero.py - heterogeneous data parallelism: ranks of different speeds (CUDA,
CPU, any torch device) training one model, each given a share of every global
batch in proportion to its speed, with gradients that are the exact mean over
the global batch however uneven the shares are.

    caps = torch_kaitian.measure_capability(model, sample)   # samples/s per rank
    sampler = torch_kaitian.HeteroSampler(dataset, global_batch_size=256)
    loader = DataLoader(dataset, batch_size=sampler.local_batch_size, sampler=sampler)
    model = torch_kaitian.HeteroDDP(model)                   # instead of DistributedDataParallel

Works over any torch.distributed backend (fastest over "kaitian"). See
docs/heterogeneous.md.
"""
import copy
import dataclasses
import math
import os
import sys
import time
import warnings
from fractions import Fraction

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Sampler
from torch.utils.data._utils.collate import default_collate

from . import _device
from ._device import _collective_device as _coll_device
from .planner import StepCurve, decide, equalize, predict, scale, speed_order

__all__ = ["measure_capability", "capabilities", "plan", "HeteroPlan", "HeteroSampler",
           "HeteroDDP", "weighted_mean", "shares", "memory_per_sample", "max_local_batch"]

_ENV_CAPS = "KAITIAN_CAPABILITIES"
_last_caps = None    # the figures of the last measure_capability (a list of floats)
_last_curves = None  # and its step-time curves (planner.StepCurve per rank)
_last_max_batch = None  # the last max_local_batch() (a list of ints per rank)


# ---- helpers ---------------------------------------------------------------------------

def _world(group=None):
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(group), dist.get_world_size(group)
    return _device.global_rank(), _device.global_world_size()


def _synchronize(dev):
    """Wait for the device's queued work (a no-op on the CPU)."""
    if dev.type == "cpu":
        return
    mod = getattr(torch, dev.type, None)
    sync = getattr(mod, "synchronize", None)
    if sync is not None:
        sync()


def _first_tensor(obj):
    """The first tensor in a (nested) argument structure, or None."""
    if isinstance(obj, torch.Tensor):
        return obj
    if isinstance(obj, dict):
        obj = list(obj.values())
    if isinstance(obj, (list, tuple)):
        for x in obj:
            t = _first_tensor(x)
            if t is not None:
                return t
    return None


def _parse_caps(text, world):
    """KAITIAN_CAPABILITIES: one non-negative number per rank, in rank order."""
    rank = _device.global_rank()
    parts = [p.strip() for p in text.split(",")]
    try:
        vals = [float(p) for p in parts]
    except ValueError:
        raise ValueError(f"rank {rank}: {_ENV_CAPS}={text!r} is not a comma-separated list of "
                         f"numbers (e.g. 1,1,3,3)") from None
    if len(vals) != world:
        raise ValueError(f"rank {rank}: {_ENV_CAPS}={text!r} gives {len(vals)} capabilities for "
                         f"{world} ranks (one per rank, in rank order)")
    if any(not math.isfinite(v) or v < 0 for v in vals) or sum(vals) <= 0:
        raise ValueError(f"rank {rank}: {_ENV_CAPS}={text!r}: capabilities must be finite, >= 0, "
                         f"and not all 0")
    return vals


def _env_caps(world):
    text = os.environ.get(_ENV_CAPS, "").strip()
    return _parse_caps(text, world) if text else None


def _check_caps(caps, world, what="capabilities"):
    caps = [float(c) for c in caps]
    if len(caps) != world:
        raise ValueError(f"rank {_world()[0]}: {what} has {len(caps)} entries for {world} ranks")
    if any(not math.isfinite(c) or c < 0 for c in caps) or sum(caps) <= 0:
        raise ValueError(f"rank {_world()[0]}: {what} must be finite, >= 0 and not all 0: {caps}")
    return caps


# ---- capabilities -----------------------------------------------------------------------

def _default_workload(dev):
    """A GEMM-bound stand-in for a model: a 256-1024-256 MLP, batch 32, float32."""
    g = torch.Generator().manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(),
                                torch.nn.Linear(1024, 256)).to(dev)
    sample = torch.randn(32, 256, generator=g).to(dev)
    return model, sample


def _model_device(model):
    for p in model.parameters():
        return p.device
    return _device.device()


def _to(obj, dev):
    if isinstance(obj, torch.Tensor):
        return obj.to(dev)
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to(x, dev) for x in obj)
    if isinstance(obj, dict):
        return {k: _to(v, dev) for k, v in obj.items()}
    return obj


def _scalar_loss(out):
    """A scalar from whatever the model returns, so backward reaches every parameter
    that produced a floating-point output."""
    t = [x for x in (out if isinstance(out, (list, tuple)) else
                     out.values() if isinstance(out, dict) else [out])
         if isinstance(x, torch.Tensor) and x.is_floating_point()]
    if not t:
        raise TypeError("measure_capability: the model returned no floating-point tensor; pass "
                        "loss_fn=")
    return sum(x.float().square().mean() for x in t)


def _time_steps(step, dev, steps, seconds, warmup):
    for _ in range(warmup):
        step()
    _synchronize(dev)
    t0 = time.perf_counter()
    k = 0
    # A fixed count when asked; else a wall-clock window of several scheduler
    # slices, so a rank that shares its CPU shows its share (the median of short
    # steps would not: a step often fits in one slice).
    while (k < steps) if steps else (k < 3 or time.perf_counter() - t0 < seconds):
        step()
        _synchronize(dev)
        k += 1
    return k, time.perf_counter() - t0


def measure_capability(model=None, sample=None, steps=None, loss_fn=None, warmup=2,
                       seconds=0.3, group=None, global_batch_size=None, optimizer=None):
    """Samples per second of forward + backward of `model` on this rank's
    device, at the share of the global batch this rank would get: returns a
    list with one figure per rank of `group` (default: the whole job), the same
    on every rank, and keeps it for capabilities() and HeteroSampler, with
    each rank's step-time curve for plan().

    Each rank is timed at two or more batch sizes: the sample's own, then the
    share the job would give it at `global_batch_size` (default: the sample's
    batch times the number of ranks), then, where the fitted curve moves that
    share far from both, there too; t(b) = a + b c is fitted per rank (see
    planner.StepCurve) and the shares that make the ranks finish together
    give the figures returned (samples/s at each rank's share).

    model: an nn.Module on the device this rank computes on (default: a GEMM
      workload on torch_kaitian.device()). sample: one batch, a tensor or a
      tuple of forward's arguments, or (inputs, target) with loss_fn; its dim 0
      is the batch size (larger batches repeat it). loss_fn(output, target):
      the loss (default: the mean square of the outputs). steps: timed steps
      per batch size (default: as many as fit in `seconds`, at least 3), after
      `warmup` untimed ones. optimizer: the training's optimizer, stepped in
      each timed step (its parameters and state are restored afterwards);
      without it a step ends with one in-place pass over the gradients, what
      a plain SGD step costs.
    The model's gradients and buffers (BatchNorm statistics) are restored
    afterwards. With KAITIAN_CAPABILITIES set, nothing is measured: its figures
    are returned. Every rank of the group must call it (a few all_gathers)."""
    global _last_caps, _last_curves
    rank, world = _world(group)
    override = _env_caps(world)
    flag = torch.tensor([1.0 if override is not None else 0.0], dtype=torch.float64,
                        device=_coll_device(group))
    every = [torch.zeros_like(flag) for _ in range(world)]
    dist.all_gather(every, flag, group=group)
    unset = [r for r, v in enumerate(every) if v.item() == 0.0]
    if override is not None or len(unset) < world:
        if unset:
            raise ValueError(f"rank {rank}: {_ENV_CAPS} is set on some ranks and not on ranks "
                             f"{unset}: set it on all or none")
        _last_caps = list(override)
        _last_curves = [StepCurve(0.0, 1.0 / c) if c > 0 else None for c in override]
        return list(override)
    with _Stepper(rank, model, sample, loss_fn, optimizer) as stepper:
        total = (int(global_batch_size) if global_batch_size is not None
                 else stepper.batch * world)
        if total < 1:
            raise ValueError(f"rank {rank}: measure_capability: global_batch_size must be a "
                             f"positive integer, not {global_batch_size!r}")
        curves, _ = _measure_curves(stepper, total, group, steps, seconds, warmup)
    share = equalize(curves, range(world), total)
    rates = [curves[r].rate(share[r]) for r in range(world)]
    _last_caps, _last_curves = rates, curves
    return list(rates)


class _Stepper:
    """Times forward + backward of a model on batches of any size made from one
    sample batch (cut, or repeated along dim 0); restores the model's gradients,
    buffers and the random streams when closed."""

    def __init__(self, rank, model, sample, loss_fn, optimizer=None):
        if isinstance(model, DistributedDataParallel):
            model = model.module  # time the module itself: DDP would communicate
        if model is None:
            if sample is not None:
                raise ValueError(f"rank {rank}: measure_capability: sample given without a model")
            model, sample = _default_workload(_device.device())
        elif sample is None:
            raise ValueError(f"rank {rank}: measure_capability(model): a sample batch is needed "
                             f"(sample=)")
        self.dev = _model_device(model)
        sample = _to(sample, self.dev)
        if loss_fn is not None:
            if not (isinstance(sample, (list, tuple)) and len(sample) == 2):
                raise ValueError(f"rank {rank}: measure_capability with loss_fn needs "
                                 f"sample=(inputs, target)")
        first = _first_tensor(sample)
        if first is None or first.dim() == 0:
            raise ValueError(f"rank {rank}: measure_capability: the sample has no batch dimension")
        self.model, self.sample, self.loss_fn = model, sample, loss_fn
        self.batch = int(first.shape[0])
        self.params = [p for p in model.parameters() if p.requires_grad]
        self._saved_grads = [p.grad for p in self.params]
        self._saved_bufs = [(b, b.detach().clone()) for b in model.buffers()]
        self.optimizer = optimizer
        if optimizer is not None:  # its steps change the parameters and its state: kept to undo
            self._saved_params = [p.detach().clone() for p in self.params]
            self._saved_opt = copy.deepcopy(optimizer.state_dict())
        self._rng = None
        self._sized = {}

    def __enter__(self):
        # The ranks time different numbers of steps: keep the random streams
        # (dropout) where they were, so that seeded code after this call agrees.
        devices = [self.dev.index or 0] if self.dev.type == "cuda" else []
        self._rng = torch.random.fork_rng(devices=devices)
        self._rng.__enter__()
        return self

    def __exit__(self, *exc):
        for p, g in zip(self.params, self._saved_grads):
            p.grad = g
        with torch.no_grad():
            for b, v in self._saved_bufs:
                b.copy_(v)
            if self.optimizer is not None:
                for p, v in zip(self.params, self._saved_params):
                    p.copy_(v)
                self.optimizer.load_state_dict(self._saved_opt)
        self._sized.clear()
        self._rng.__exit__(*exc)
        return False

    def _batch_of(self, b):
        """The sample cut or repeated to b rows (the last one made is kept)."""
        if b not in self._sized:
            self._sized.clear()
            self._sized[b] = _resize(self.sample, self.batch, b)
        return self._sized[b]

    def time(self, b, steps, seconds, warmup):
        """Seconds per step at a batch of b."""
        data = self._batch_of(b)
        if self.loss_fn is not None:
            inputs, target = data
        else:
            inputs, target = data, None
        args = inputs if isinstance(inputs, (list, tuple)) else (inputs,)

        def step():
            for p in self.params:
                p.grad = None
            out = self.model(*args)
            loss = self.loss_fn(out, target) if self.loss_fn is not None else _scalar_loss(out)
            loss.backward()
            self._update()

        k, elapsed = _time_steps(step, self.dev, steps, seconds, warmup)
        return elapsed / k

    def _update(self):
        """The optimizer's share of a step: the user's optimizer where given
        (its effects undone on close), else one in-place pass over the
        gradients, what a plain SGD step costs."""
        if self.optimizer is not None:
            self.optimizer.step()
            return
        grads = [p.grad for p in self.params if p.grad is not None]
        if grads:
            torch._foreach_mul_(grads, 1.0)


def _resize(obj, have, want):
    """Every tensor in obj with `have` rows cut or repeated to `want` rows."""
    if isinstance(obj, torch.Tensor):
        if obj.dim() == 0 or obj.shape[0] != have:
            return obj
        if want <= have:
            return obj[:want]
        reps = -(-want // have)
        return obj.repeat(reps, *([1] * (obj.dim() - 1)))[:want]
    if isinstance(obj, (list, tuple)):
        return type(obj)(_resize(x, have, want) for x in obj)
    if isinstance(obj, dict):
        return {k: _resize(v, have, want) for k, v in obj.items()}
    return obj


# ---- memory per sample -------------------------------------------------------------------

def _bytes_of(t):
    return t.numel() * t.element_size() if isinstance(t, torch.Tensor) else 0


def memory_per_sample(model, sample, loss_fn=None):
    """Bytes of activations that one sample keeps alive from forward to
    backward on this rank: what autograd saves for backward in one forward
    (and loss) of `sample`, counted by saved-tensor hooks (any device; the
    parameters, which every batch shares, are not counted), divided by the
    sample's batch size. Nothing is communicated; the model is not changed."""
    if isinstance(model, DistributedDataParallel):
        model = model.module
    dev = _model_device(model)
    sample = _to(sample, dev)
    if loss_fn is not None:
        inputs, target = sample
    else:
        inputs, target = sample, None
    first = _first_tensor(inputs)
    if first is None or first.dim() == 0 or first.shape[0] == 0:
        raise ValueError(f"rank {_world()[0]}: memory_per_sample: the sample has no batch "
                         f"(dim 0 of its first tensor)")
    from .parallel._memory import saved_bytes
    args = inputs if isinstance(inputs, (list, tuple)) else (inputs,)
    with torch.random.fork_rng(devices=[dev.index or 0] if dev.type == "cuda" else []):
        with saved_bytes(model) as total:
            out = model(*args)
            loss = loss_fn(out, target) if loss_fn is not None else _scalar_loss(out)
    total = total[0] + sum(_bytes_of(t) for t in _flat_tensors(out)) + _bytes_of(loss)
    return total / int(first.shape[0])


def _flat_tensors(out):
    found = []
    _map_tensors(out, lambda t: found.append(t) or t)
    return found


def max_local_batch(model, sample, loss_fn=None, headroom=0.8, group=None):
    """The most samples each rank of `group` can run in one forward and
    backward: headroom x its free memory (parallel._memory.free_memory: the
    device's, or the host's shared among its CPU ranks, measured now, after
    the model and optimizer are placed) over memory_per_sample. A list in
    rank order, the same on every rank (a collective), kept for
    HeteroSampler(max_local_batch="memory")."""
    global _last_max_batch
    from .parallel._memory import free_memory
    if not 0 < headroom <= 1:
        raise ValueError(f"rank {_world()[0]}: max_local_batch: headroom must be in (0, 1], not "
                         f"{headroom!r}")
    per = memory_per_sample(model, sample, loss_fn)
    free = free_memory(_model_device(model.module if isinstance(model, DistributedDataParallel)
                                     else model), group)
    pers = _gather_floats([per], group)
    out = [max(1, int(headroom * f // max(p[0], 1.0))) for f, p in zip(free, pers)]
    _last_max_batch = out
    if _world(group)[0] == 0:
        from . import _log
        _log.info("max_local_batch: " + ", ".join(
            f"rank {r} {m} samples ({f / 2**20:.0f} MiB free, {p[0] / 1024:.1f} KiB per sample)"
            for r, (m, f, p) in enumerate(zip(out, free, pers))))
    return list(out)


def _gather_floats(values, group):
    """all_gather of a few floats per rank: a list of lists, in rank order."""
    mine = torch.tensor([float(v) for v in values], dtype=torch.float64,
                        device=_coll_device(group))
    every = [torch.zeros_like(mine) for _ in range(dist.get_world_size(group))]
    dist.all_gather(every, mine, group=group)
    return [[float(x) for x in t.cpu().tolist()] for t in every]


def _measure_curves(stepper, total, group, steps, seconds, warmup):
    """Every rank's StepCurve (the same list on every rank) and this rank's
    measured points [(batch, seconds)]: timed at the sample's batch, at the
    share the rates there would give, and once more at the planned share
    where it lies beyond half or twice every batch timed."""
    rank, world = _world(group)
    b0 = min(stepper.batch, total)
    points = [(b0, stepper.time(b0, steps, seconds, warmup))]
    rates = [b0 / t[0] for t in _gather_floats([points[0][1]], group)]
    b1 = shares(total, rates)[rank] if sum(rates) > 0 else b0
    if b1 < 1 or 0.75 * b0 <= b1 <= 1.5 * b0:
        b1 = min(total, 2 * b0) if 2 * b0 <= total else max(1, b0 // 2)
    if b1 != b0:
        points.append((b1, stepper.time(b1, steps, seconds, 1)))
    for _ in range(2):
        curve = StepCurve.fit(points)
        curves = [StepCurve(a, c) for a, c in _gather_floats([curve.a, curve.c], group)]
        want = equalize(curves, range(world), total)[rank]
        far = want > 0 and all(not 0.5 * b <= want <= 2 * b for b, _ in points)
        if not any(v[0] for v in _gather_floats([1.0 if far else 0.0], group)):
            return curves, points
        if far:
            points.append((want, stepper.time(want, steps, seconds, 1)))
    curve = StepCurve.fit(points)
    return [StepCurve(a, c) for a, c in _gather_floats([curve.a, curve.c], group)], points


def capabilities(world_size=None):
    """The capability of each rank: KAITIAN_CAPABILITIES when set, else the last
    measure_capability's figures, else equal weights (all 1.0)."""
    world = world_size if world_size is not None else _world()[1]
    override = _env_caps(world)
    if override is not None:
        return override
    if _last_caps is not None:
        if len(_last_caps) == world:
            return list(_last_caps)
        warnings.warn(f"rank {_world()[0]}: torch_kaitian.capabilities(): the last measurement "
                      f"has {len(_last_caps)} ranks, not {world} (measured on another group?); "
                      f"using equal weights", stacklevel=2)
    return [1.0] * world


_capabilities = capabilities  # HeteroSampler's argument of the same name hides it


# ---- the plan: shares, the ranks that pay, rebalancing ------------------------------------

def _grad_buckets(model, bucket_cap_mb):
    """(numel, dtype) of the gradient buckets DDP would make for `model`: per
    dtype, a first bucket of 1 MiB, then `bucket_cap_mb` MiB each."""
    per_dtype = {}
    for p in model.parameters():
        if p.requires_grad:
            per_dtype[p.dtype] = per_dtype.get(p.dtype, 0) + p.numel()
    first = getattr(dist, "_DEFAULT_FIRST_BUCKET_BYTES", 1 << 20)
    cap = int(bucket_cap_mb * (1 << 20))
    out = []
    for dt, n in per_dtype.items():
        size = torch.tensor([], dtype=dt).element_size()
        lim = max(1, first // size)
        while n > 0:
            k = min(n, lim)
            out.append((k, dt))
            n -= k
            lim = max(1, cap // size)
    return out


def _time_exchange(buckets, dev, group, reps=3):
    """Median seconds of one step's gradient exchange on `group`: every bucket's
    all_reduce issued at once (as DDP issues them), all waited for, the device
    synchronised. Every rank of the group calls it."""
    bufs = [torch.zeros(n, dtype=dt, device=dev) for n, dt in buckets]
    avg = dist.get_backend(group) == "kaitian"
    times = []
    for i in range(reps + 1):
        _synchronize(dev)
        t0 = time.perf_counter()
        works = [dist.all_reduce(b, op=dist.ReduceOp.AVG if avg else dist.ReduceOp.SUM,
                                 group=group, async_op=True) for b in bufs]
        for w in works:
            w.wait()
        _synchronize(dev)
        if i:
            times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def _measure_exchanges(model, curves, total, bucket_cap_mb):
    """The gradient exchange of `model` on each prefix of the ranks ordered
    fastest first (2 ranks and more), measured on the ranks' own devices:
    ({ranks: seconds}, {ranks: group}). Every rank of the job calls it (the
    groups are made on all of them)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    order = speed_order(curves, total)
    buckets = _grad_buckets(model, bucket_cap_mb)
    dev = _model_device(model)
    mine, groups = [], {}
    for k in range(2, world + 1):
        ranks = tuple(sorted(order[:k]))
        g = None if k == world else dist.new_group(list(ranks))
        groups[ranks] = g
        mine.append(_time_exchange(buckets, dev, g) if rank in ranks and buckets else 0.0)
    every = _gather_floats(mine, None) if mine else []
    exchange = {}
    for i, ranks in enumerate(groups):
        exchange[ranks] = max(every[r][i] for r in ranks)
    return exchange, groups


class HeteroPlan:
    """What plan() decided for this job, and how it changes while training.

    active: the ranks that compute and exchange gradients (sorted); left_out:
    the others (share 0 every step, no gradient exchange); shares: every
    rank's share of a full global batch now; leader: the first active rank,
    whose parameters are the job's; predicted_rate / predicted_step: the
    model's figures for the plan (samples/s, seconds); curves: each rank's
    StepCurve; exchange: {ranks: seconds} measured; devices: each rank's
    device; history: the rebalancing steps taken [(step, shares)].
    Give it to HeteroSampler(plan=) and HeteroDDP(plan=)."""

    def __init__(self, decision, exchange, devices, groups=None, rebalance=True, window=20,
                 drift=0.10, lag=2, verbose=True):
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.total = decision.total
        self.decision = decision
        self.curves = list(decision.curves)
        self.exchange = dict(exchange or {})
        self.devices = list(devices)
        self.active = decision.active
        self.left_out = decision.left_out
        self.leader = self.active[0]
        self.shares = decision.shares
        self.predicted_rate = decision.chosen.rate
        self.predicted_step = decision.chosen.step
        self.rebalance, self.window, self.drift = bool(rebalance), int(window), float(drift)
        if self.window < 1:
            raise ValueError(f"rank {self.rank}: plan: window must be >= 1, not {window}")
        self.lag = int(lag)
        self.history = []
        self.verbose = verbose
        self._schedule = [(0, list(self.shares))]  # (from step, shares), steps counted by the sampler
        self._yielded = 0                          # steps the sampler has handed out
        self._lag_needed = self.lag
        # The exchange group of the active ranks: the default one when every
        # rank is active, none when only one is (it exchanges nothing).
        groups = dict(groups or {})
        key = tuple(self.active)
        if len(self.active) == self.world:
            self.group = None
        elif len(self.active) == 1:
            self.group = None
        elif key in groups:
            self.group = groups.pop(key)
        else:
            self.group = dist.new_group(self.active)
        for ranks, g in groups.items():
            if g is not None and self.rank in ranks:
                dist.destroy_process_group(g)

    @property
    def is_active(self):
        return self.rank in self.active

    def describe(self):
        return self.decision.describe(self.devices)

    def shares_at(self, step):
        """Every rank's share of a full global batch at sampler step `step`."""
        out = self._schedule[0][1]
        for start, sh in self._schedule:
            if start <= step:
                out = sh
        return list(out)

    def _next_step(self):
        """The sampler hands out one more step: its number."""
        s = self._yielded
        self._yielded += 1
        return s

    def _change(self, step, new, at_step, busy):
        """New shares from sampler step `at_step` on (decided at step `step`,
        the same on every rank)."""
        if self._yielded > at_step:
            raise RuntimeError(
                f"rank {self.rank}: HeteroPlan: the shares change at step {at_step}, but this "
                f"rank's sampler has already handed out step {self._yielded - 1} (DataLoader "
                f"prefetch); give plan(..., lag=) more than prefetch_factor * num_workers + 1")
        self._schedule.append((at_step, list(new)))
        old, self.shares = self.shares, list(new)
        self.history.append((at_step, list(new)))
        if self.verbose and self.rank == 0:
            times = ", ".join(f"{b * 1e3:.1f}" if b is not None else "-" for b in busy)
            print(f"torch_kaitian: rebalanced at step {step}: observed step times (ms) {times}; "
                  f"shares {':'.join(map(str, old))} -> {':'.join(map(str, new))} from step "
                  f"{at_step}", file=sys.stderr, flush=True)

    def _observe(self, step, ratios, busy):
        """One check of the observed step times (a list per rank: the mean ratio
        of observed to predicted step time, the mean observed seconds, or None):
        rebalance when the active ranks drifted more than `drift` apart."""
        seen = [busy[r] for r in self.active if busy[r] is not None and self.shares[r] > 0]
        if not self.rebalance or len(seen) < 2 or len(seen) < len(
                [r for r in self.active if self.shares[r] > 0]):
            return False
        if max(seen) <= min(seen) * (1 + self.drift):
            return False
        self.curves = scale(self.curves, ratios)
        d = decide(self.curves, self.total, self.exchange or None, allowed=self.active)
        # A change must be worth it on the curves just corrected: at least half
        # the drift, so that a share of a few samples does not swing back and forth.
        now = predict(self.curves, self.shares)
        if d.shares == self.shares or d.chosen.compute > now / (1 + self.drift / 2):
            return False
        self.decision = d
        self.predicted_rate, self.predicted_step = d.chosen.rate, d.chosen.step
        self._change(step, d.shares, step + self._lag_needed, busy)
        return True


def plan(model, sample, global_batch_size, loss_fn=None, optimizer=None, steps=None, warmup=2,
         seconds=0.3, bucket_cap_mb=25, min_gain=0.10, rebalance=True, window=20, drift=0.10,
         lag=2, curves=None, exchange=None, verbose=True):
    """Plan a heterogeneous job: measure each rank's step time against its
    batch on its own device (two or more batch sizes, see
    measure_capability), measure the gradient exchange of `model` on the
    ranks ordered fastest first, and choose the ranks and shares of every
    global batch of `global_batch_size` samples that maximise the predicted
    samples/s (see planner.py for the model). A rank that cannot pay for the
    exchange it causes is left out: share 0, no gradient exchange. The verdict
    is printed once on rank 0 (verbose=False: not). Every rank of the job
    calls it. Returns a HeteroPlan for HeteroSampler(plan=) and
    HeteroDDP(plan=).

    optimizer: the training's optimizer, so that each timed step includes its
    step (see measure_capability; it matters where a slow rank's optimizer
    step is a large part of its step, as with Adam on a large model).
    rebalance/window/drift: every `window` steps HeteroDDP compares the step
    times the active ranks observed; more than `drift` apart, the shares are
    recomputed from them (the same on every rank), taking effect `lag` steps
    later (more with DataLoader workers: the sampler's loader() says how
    many). min_gain: a larger set of ranks is chosen only when predicted this
    much faster. curves / exchange: numbers to plan with instead of measuring
    (a StepCurve or (a, c) per rank; {tuple of ranks: seconds}, sets of one
    rank cost 0). KAITIAN_CAPABILITIES set: shares in proportion to it, every
    rank active, nothing measured."""
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError("torch_kaitian.plan: call dist.init_process_group first")
    rank, world = dist.get_rank(), dist.get_world_size()
    if int(global_batch_size) != global_batch_size or global_batch_size < 1:
        raise ValueError(f"rank {rank}: plan: global_batch_size must be a positive integer, not "
                         f"{global_batch_size!r}")
    total = int(global_batch_size)
    devices = [None] * world
    dist.all_gather_object(devices, str(_model_device(model) if model is not None
                                        else _device.device()))
    groups = {}
    override = _env_caps(world)
    if override is not None:
        curves = [StepCurve(0.0, 1.0 / c if c > 0 else math.inf) for c in override]
        exchange = None
    elif curves is None:
        measure_capability(model, sample, steps=steps, loss_fn=loss_fn, warmup=warmup,
                           seconds=seconds, global_batch_size=total, optimizer=optimizer)
        curves = list(_last_curves)
    else:
        curves = [c if isinstance(c, StepCurve) else StepCurve(*map(float, c)) for c in curves]
        if len(curves) != world:
            raise ValueError(f"rank {rank}: plan: {len(curves)} curves for {world} ranks")
    if override is None and exchange is None and world > 1:
        if model is None:
            raise ValueError(f"rank {rank}: plan: a model is needed to measure its gradient "
                             f"exchange (or give exchange=)")
        module = model.module if isinstance(model, DistributedDataParallel) else model
        exchange, groups = _measure_exchanges(module, curves, total, bucket_cap_mb)
    decision = decide(curves, total, exchange, min_gain=min_gain)
    p = HeteroPlan(decision, exchange, devices, groups, rebalance=rebalance, window=window,
                   drift=drift, lag=lag, verbose=verbose)
    if verbose and rank == 0:
        print(f"torch_kaitian: {p.describe()}", file=sys.stderr, flush=True)
    return p


# ---- shares of a batch --------------------------------------------------------------------

def shares(total, caps, cap=None):
    """Split `total` samples among ranks in proportion to `caps`, by largest
    remainder: every share is floor(total * c_r / sum c) or one more, the shares
    sum to `total`, ties go to the lower rank. With `cap` (a list), share r never
    exceeds cap[r] (sum(cap) must be >= total). Exact arithmetic (fractions), so
    every rank computes the same shares from the same capabilities."""
    fr = [Fraction(c) for c in caps]
    whole = sum(fr)
    quota = [Fraction(total) * c / whole for c in fr]
    out = [int(math.floor(q)) for q in quota]
    if cap is not None:
        out = [min(o, c) for o, c in zip(out, cap)]
    left = total - sum(out)
    order = sorted(range(len(caps)), key=lambda r: (-(quota[r] - math.floor(quota[r])), r))
    while left > 0:
        moved = False
        for r in order:
            if left == 0:
                break
            if cap is not None and out[r] >= cap[r]:
                continue
            out[r] += 1
            left -= 1
            moved = True
        if not moved:
            raise ValueError(f"shares: cannot place {left} of {total} samples under caps {cap}")
    return out


class HeteroSampler(Sampler):
    """A Sampler giving each rank a share of every global batch in proportion to
    its capability.

    Each epoch the dataset's indices are shuffled (seeded by seed + epoch) and cut
    into steps of `global_batch_size` (a short last one unless drop_last); step s
    is shared out by `shares()` in rank order, so over an epoch the ranks'
    indices are disjoint and cover the dataset exactly once, every rank runs
    `num_steps` steps, and nothing is communicated: every rank computes every
    rank's view from (seed, epoch, capabilities).

    rank/world_size: default, this rank in `group` (default: the job).
    Use it as DataLoader(dataset, batch_size=sampler.local_batch_size,
    sampler=sampler) (then no rank may get an empty share in any step: checked,
    with a clear error), or sampler.loader(**kwargs), whose batches follow the
    steps exactly and may be empty. len(sampler) is the number of indices this
    rank gets per epoch (the Sampler contract); num_steps is the same on every rank.
    """

    def __init__(self, dataset, global_batch_size, shuffle=True, seed=0, drop_last=False,
                 capabilities=None, rank=None, world_size=None, group=None, plan=None,
                 max_local_batch=None):
        if plan is not None and (capabilities is not None or group is not None):
            raise ValueError(f"rank {_world()[0]}: HeteroSampler: give plan= or "
                             f"capabilities=/group=, not both")
        self.plan = plan
        r, w = _world(group)
        self.rank = r if rank is None else int(rank)
        self.world_size = w if world_size is None else int(world_size)
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"HeteroSampler: rank {self.rank} is not in 0..{self.world_size - 1}")
        who = f"rank {self.rank}: HeteroSampler"
        if int(global_batch_size) != global_batch_size or global_batch_size < 1:
            raise ValueError(f"{who}: global_batch_size must be a positive integer, "
                             f"not {global_batch_size!r}")
        self.dataset = dataset
        self.global_batch_size = int(global_batch_size)
        self.shuffle = bool(shuffle)
        self.seed = int(seed)
        self.drop_last = bool(drop_last)
        if plan is not None:
            if plan.world != self.world_size or plan.total != self.global_batch_size:
                raise ValueError(f"{who}: the plan is for {plan.world} ranks and a global batch of "
                                 f"{plan.total}, not {self.world_size} and "
                                 f"{self.global_batch_size}")
            caps = plan.shares
        else:
            caps = _capabilities(self.world_size) if capabilities is None else capabilities
        self.capabilities = _check_caps(caps, self.world_size, "HeteroSampler capabilities")
        self.epoch = 0
        n = len(dataset)
        b = self.global_batch_size
        full, tail = divmod(n, b)
        if self.drop_last or tail == 0:
            self._steps = [b] * full
        else:
            self._steps = [b] * full + [tail]
        self._set_shares(shares(b, self.capabilities))
        self.max_local_batch = self._resolve_max(max_local_batch, who)

    def _resolve_max(self, value, who):
        if value is None:
            return None
        if value == "memory":
            if _last_max_batch is None:
                raise ValueError(f"{who}: max_local_batch='memory' takes this rank's limit from "
                                 f"torch_kaitian.max_local_batch(model, sample), which has not "
                                 f"run (call it on every rank first, or give an int)")
            if len(_last_max_batch) != self.world_size:
                raise ValueError(f"{who}: max_local_batch='memory': the last "
                                 f"max_local_batch() measured {len(_last_max_batch)} ranks, not "
                                 f"{self.world_size}")
            return int(_last_max_batch[self.rank])
        if isinstance(value, (bool, str)) or not isinstance(value, (int, float)) or \
                int(value) != value or value < 1:
            raise ValueError(f"{who}: max_local_batch must be None, 'memory' or an integer >= 1, "
                             f"not {value!r}")
        return int(value)

    def micro_counts(self, step, rank=None):
        """How many micro-batches `rank` (default: this one) runs step `step`
        in: ceil(share / max_local_batch), at least 1 (an empty share runs one
        empty micro-batch). Each rank has its own limit; the count of another
        rank is computed with this rank's limit, so ask each rank for its own."""
        n = self.step_shares(step)[self.rank if rank is None else rank]
        if self.max_local_batch is None or n == 0:
            return 1
        return -(-n // self.max_local_batch)

    def micro_batches(self, batch):
        """This rank's batch of a step cut along dim 0 into
        ceil(n / max_local_batch) micro-batches as even as can be (sizes differ
        by at most 1), each small enough to run; [batch] when it fits (or
        without a limit). Give them to HeteroDDP.micro_steps()."""
        n = _batch_len(batch)
        if self.max_local_batch is None or n <= self.max_local_batch:
            return [batch]
        k = -(-n // self.max_local_batch)
        sizes = [n // k + (1 if i < n % k else 0) for i in range(k)]
        out, lo = [], 0
        for m in sizes:
            out.append(_slice_batch(batch, lo, lo + m))
            lo += m
        return out

    def _set_shares(self, full):
        self.full_shares = list(full)
        # A short last step never gives a rank more than a full step does, so a
        # DataLoader batching by local_batch_size never splits it in two.
        b = self.global_batch_size
        self.last_shares = (shares(self._steps[-1], self.full_shares, cap=self.full_shares)
                            if self._steps and self._steps[-1] != b else list(self.full_shares))

    @property
    def num_steps(self):
        """Steps per epoch, the same on every rank."""
        return len(self._steps)

    def step_shares(self, step):
        """Every rank's share of step `step` (a list in rank order)."""
        b = self._steps[step]
        return list(self.full_shares) if b == self.global_batch_size else list(self.last_shares)

    @property
    def local_batch_size(self):
        """This rank's share of a full global batch: the batch_size to give a
        DataLoader over this sampler."""
        k = self.full_shares[self.rank]
        if k == 0:
            raise ValueError(f"rank {self.rank}: HeteroSampler: this rank's share of every global "
                             f"batch of {self.global_batch_size} is 0 (capabilities "
                             f"{self.capabilities}); a DataLoader cannot batch 0 samples: use "
                             f"sampler.loader(), or a larger global_batch_size")
        return k

    def set_epoch(self, epoch):
        """Reshuffle for `epoch` (call on every rank before each epoch, as with
        DistributedSampler)."""
        self.epoch = int(epoch)

    def _order(self):
        n = len(self.dataset)
        if not self.shuffle:
            return list(range(n))
        g = torch.Generator()
        g.manual_seed(self.seed + self.epoch)
        return torch.randperm(n, generator=g).tolist()

    def rank_batches(self, rank=None):
        """The list of index lists, one per step, that `rank` (default: this one)
        gets this epoch. Empty lists where its share is 0."""
        rank = self.rank if rank is None else rank
        order = self._order()
        out, pos = [], 0
        for s, b in enumerate(self._steps):
            sh = self.step_shares(s)
            lo = pos + sum(sh[:rank])
            out.append(order[lo:lo + sh[rank]])
            pos += b
        return out

    def _check_batching(self):
        """With DataLoader(batch_size=local_batch_size) every rank must get a
        non-empty share of every step, or it runs fewer steps than the others."""
        for s in range(self.num_steps):
            sh = self.step_shares(s)
            for r, k in enumerate(sh):
                if k == 0:
                    raise ValueError(
                        f"rank {self.rank}: HeteroSampler: rank {r} gets no sample in step {s} of "
                        f"{self.num_steps} (global batch {self._steps[s]}, shares {sh}); a "
                        f"DataLoader with batch_size=local_batch_size would give it fewer steps "
                        f"than the others. Use sampler.loader() (empty batches allowed), "
                        f"drop_last=True or a larger global_batch_size")

    def __iter__(self):
        if self.plan is not None and self.plan.rebalance:
            raise ValueError(f"rank {self.rank}: HeteroSampler: a plan that rebalances changes "
                             f"the shares while training, which a DataLoader with a fixed "
                             f"batch_size cannot follow: use sampler.loader() (or "
                             f"sampler.batches() as batch_sampler), or plan(..., rebalance=False)")
        self._check_batching()
        for batch in self.rank_batches():
            yield from batch

    def _planned_batches(self):
        """This rank's batches, each step's shares taken from the plan as the
        step is handed out (they may change while training)."""
        order = self._order()
        pos = 0
        for b in self._steps:
            step = self.plan._next_step()
            full = self.plan.shares_at(step)
            if full != self.full_shares:
                self._set_shares(full)
            sh = self.full_shares if b == self.global_batch_size else self.last_shares
            lo = pos + sum(sh[:self.rank])
            yield order[lo:lo + sh[self.rank]]
            pos += b

    def __len__(self):
        return sum(self.step_shares(s)[self.rank] for s in range(self.num_steps))

    def batches(self):
        """A batch sampler over the steps of this rank (len: num_steps); empty
        steps give empty lists."""
        return _StepBatches(self)

    def loader(self, collate_fn=None, **dataloader_kwargs):
        """A DataLoader over self.dataset yielding exactly one batch per step
        (num_steps on every rank), an empty batch where this rank's share is 0
        (tensors with 0 rows, shaped like the dataset's samples)."""
        for bad in ("batch_size", "sampler", "batch_sampler", "shuffle", "drop_last"):
            if bad in dataloader_kwargs:
                raise TypeError(f"HeteroSampler.loader(): {bad}= is set by the sampler")
        collate = _EmptySafeCollate(self.dataset, collate_fn or default_collate)
        if self.plan is not None:
            workers = int(dataloader_kwargs.get("num_workers", 0) or 0)
            ahead = workers * int(dataloader_kwargs.get("prefetch_factor") or 2) if workers else 0
            self.plan._lag_needed = max(self.plan._lag_needed, ahead + 2)
        return DataLoader(self.dataset, batch_sampler=self.batches(), collate_fn=collate,
                          **dataloader_kwargs)


class _StepBatches(Sampler):
    def __init__(self, parent):
        self.parent = parent

    def __iter__(self):
        if self.parent.plan is not None:
            return self.parent._planned_batches()
        return iter(self.parent.rank_batches())

    def __len__(self):
        return self.parent.num_steps


def _batch_len(batch):
    t = _first_tensor(batch)
    if t is None or t.dim() == 0:
        raise ValueError(f"rank {_world()[0]}: HeteroSampler.micro_batches: the batch has no "
                         f"tensor with a batch dimension")
    return int(t.shape[0])


def _slice_batch(x, lo, hi):
    """Rows lo:hi of every tensor in a batch (lists of per-sample values too)."""
    if isinstance(x, torch.Tensor):
        return x[lo:hi] if x.dim() > 0 else x
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return dataclasses.replace(x, **{f.name: _slice_batch(getattr(x, f.name), lo, hi)
                                         for f in dataclasses.fields(x) if f.init})
    if isinstance(x, tuple) and hasattr(x, "_fields"):
        return type(x)(*(_slice_batch(v, lo, hi) for v in x))
    if isinstance(x, (list, tuple)):
        if x and not any(isinstance(v, (torch.Tensor, list, tuple, dict)) for v in x):
            return type(x)(x[lo:hi])  # one entry per sample (strings)
        return type(x)(_slice_batch(v, lo, hi) for v in x)
    if isinstance(x, dict):
        return {k: _slice_batch(v, lo, hi) for k, v in x.items()}
    return x


def _empty_like(x):
    if isinstance(x, torch.Tensor):
        return x[:0] if x.dim() > 0 else x.reshape(1)[:0]
    if isinstance(x, (list, tuple)):
        if x and not any(isinstance(v, (torch.Tensor, list, tuple, dict)) for v in x):
            return type(x)()  # one entry per sample (strings): none
        return type(x)(_empty_like(v) for v in x)
    if isinstance(x, dict):
        return {k: _empty_like(v) for k, v in x.items()}
    return x


class _EmptySafeCollate:
    """collate_fn that turns an empty batch into the collated form of one sample
    cut to 0 rows (default_collate cannot collate nothing)."""

    def __init__(self, dataset, collate):
        self.dataset, self.collate, self.template = dataset, collate, None

    def __call__(self, batch):
        if batch:
            return self.collate(batch)
        if self.template is None:
            self.template = _empty_like(self.collate([self.dataset[0]]))
        return self.template


# ---- the exact mean -------------------------------------------------------------------------

class _CountState:
    """This forward's local batch size and the all_reduce giving the global one."""

    __slots__ = ("n", "work", "total", "count", "p", "wrapped")

    def __init__(self, n, work, count, p):
        self.n, self.work, self.count, self.p, self.total = n, work, count, p, None

    def weight(self):
        """p * n / N: the comm hook's average then weighs this rank's samples by n / N."""
        if self.total is None:
            self.work.wait()
            self.total = int(round(float(self.count.item())))
        return self.p * self.n / self.total if self.total > 0 else 0.0


class _MicroState:
    """A micro-batch of n samples in a step counted by `step` (a _CountState
    of this rank's whole step): weight p * n / N."""

    __slots__ = ("step", "n", "wrapped")

    def __init__(self, step, n):
        self.step, self.n = step, n

    @property
    def total(self):
        return self.step.total

    def weight(self):
        self.step.weight()
        return self.step.p * self.n / self.step.total if self.step.total > 0 else 0.0


class _ScaleGrad(torch.autograd.Function):
    """Identity forward; backward multiplies the gradient by p * n / N (p ranks,
    this rank's batch size n, the global one N), so that the average over the
    ranks is the mean over the global batch."""

    @staticmethod
    def forward(ctx, x, state):
        ctx.state = state
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad * ctx.state.weight(), None


def _scale_outputs(out, state):
    def scale(t):
        if t.requires_grad:
            state.wrapped += 1
            return _ScaleGrad.apply(t, state)
        return t
    return _map_tensors(out, scale)


def _avg_hook(group, bucket):
    """DDP comm hook: the average of the bucket over the ranks (the weights are
    already in the gradients). Over "kaitian" the division is fused into the
    reduction (ReduceOp.AVG: no pass of its own); elsewhere it is DDP's own
    divide-then-sum. Calls the process group itself, as DDP's reducer does, so
    a "kaitian" group sees a gradient bucket (shared memory, single copy)."""
    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    buf = bucket.buffer() if hasattr(bucket, "buffer") else bucket.get_tensor()
    if dist.get_backend(group) == "kaitian":
        opts = dist.AllreduceOptions()
        opts.reduceOp = dist.ReduceOp.AVG
        work = pg.allreduce([buf], opts)
    else:
        buf.div_(pg.size())
        work = pg.allreduce([buf])
    return work.get_future().then(lambda fut: fut.value()[0])


class _Observer:
    """This rank's observed step times, for rebalancing: per gradient exchange,
    the time from the end of the last exchange to the last bucket's hook (the
    rank's own work: optimizer step, data, forward and backward, without the
    wait for the others), on the device's clock (CUDA events on a CUDA device,
    so that no device is synchronised), divided by the microsteps it held."""

    def __init__(self, dev):
        self.cuda = dev.type == "cuda"
        self.done = None     # stamp at the end of the last exchange
        self.pending = []    # (start event, end event, microsteps, samples) not yet read
        self.samples = []    # (seconds per microstep, samples per microstep)
        self.n = self.m = 0  # samples and microsteps since the last exchange

    def _stamp(self):
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev
        return time.perf_counter()

    def forward(self, n):
        self.n += n
        self.m += 1

    def last_bucket(self):
        end = self._stamp()
        if self.done is not None and self.m > 0:
            if self.cuda:
                self.pending.append((self.done, end, self.m, self.n))
            else:
                self.samples.append(((end - self.done) / self.m, self.n / self.m))
        self.n = self.m = 0
        self.done = None
        try:
            torch.autograd.Variable._execution_engine.queue_callback(self._requeue)
        except Exception:  # noqa: BLE001 - no stamp: the next step is not observed
            pass

    def _requeue(self):
        # DDP queues its end-of-backward callback (which waits for every bucket)
        # after this hook's: queued again from here, the stamp comes after it.
        torch.autograd.Variable._execution_engine.queue_callback(self._finished)

    def _finished(self):
        self.done = self._stamp()

    def reset(self):
        self.samples.clear()
        self.pending.clear()

    def summary(self, curve):
        """(mean observed / predicted, mean observed seconds), or None."""
        keep = []
        for start, end, m, n in self.pending:
            if end.query():
                self.samples.append((start.elapsed_time(end) / 1e3 / m, n / m))
            else:
                keep.append((start, end, m, n))
        self.pending = keep
        if not self.samples:
            return None
        busy = sum(t for t, _ in self.samples) / len(self.samples)
        # A step that held no sample, on a curve without a fixed part, has no
        # predicted time to compare with (the last batch of an epoch can give
        # a rank nothing): judged by the others.
        ratios = []
        for t, b in self.samples:
            predicted = curve.time(b)
            if predicted > 0:
                ratios.append(t / predicted)
        if not ratios:
            return None
        return sum(ratios) / len(ratios), busy


def _observing_hook(state, bucket):
    """_avg_hook that also stamps the end of this rank's backward for the plan."""
    group, obs = state
    if bucket.is_last():
        obs.last_bucket()
    return _avg_hook(group, bucket)


def _map_tensors(out, fn):
    """out with fn applied to every tensor in it (tensors, tuples, named tuples,
    lists, dicts, dataclasses)."""
    if isinstance(out, torch.Tensor):
        return fn(out)
    if dataclasses.is_dataclass(out) and not isinstance(out, type):
        return dataclasses.replace(out, **{f.name: _map_tensors(getattr(out, f.name), fn)
                                           for f in dataclasses.fields(out) if f.init})
    if isinstance(out, tuple) and hasattr(out, "_fields"):  # namedtuple
        return type(out)(*(_map_tensors(x, fn) for x in out))
    if isinstance(out, (list, tuple)):
        return type(out)(_map_tensors(x, fn) for x in out)
    if isinstance(out, dict):
        new = out.copy()
        for k, v in out.items():
            new[k] = _map_tensors(v, fn)
        return new
    return out


def _leaf(t):
    """A left-out rank's output: backward works on it and reaches no parameter."""
    return t.detach().requires_grad_() if t.is_floating_point() or t.is_complex() else t


class HeteroDDP(DistributedDataParallel):
    """DistributedDataParallel whose gradients are the exact mean over the global
    batch when each rank's loss is the mean over its own batch, however uneven
    (or empty) the batches are.

    Each forward takes its local batch size n from dim 0 of its first tensor
    argument (or from set_batch_size(n), for that forward only) and starts an
    all_reduce of it (8 bytes, one per step, finished long before backward). In
    backward the gradient of the model's outputs is scaled by p * n / N (p
    ranks, N the global batch size) and a comm hook averages the buckets (over
    "kaitian" the division is fused into the reduction): no extra collective
    per bucket and no extra pass over the gradients. Gradient terms that do not
    flow through the outputs (a weight penalty added to the loss) are averaged
    as plain DDP averages them. Gradient accumulation with no_sync() gives what
    plain DDP gives with even batches: the sum over microsteps of each
    microstep's global mean. Every DDP argument is accepted.

    plan: a HeteroPlan (torch_kaitian.plan). Only its active ranks exchange
    gradients (over a group of their own; a plan of one active rank exchanges
    nothing: that rank trains as the plain module). A rank left out runs its
    (empty) batches with no autograd graph from the model's output to its
    parameters, so its parameters stay as they were unless the loss has terms
    of its own in them (a weight penalty); they are not the job's either way:
    sync_parameters() brings every rank the leader's, and checkpoints of the
    optimizer state are the leader's (plan.leader) to save. Every
    `plan.window` steps every rank of the job
    meets in one small all_gather, where the active ranks' observed step times
    rebalance the shares when they drift apart (see plan()); a rank that
    failed is seen there by every other."""

    def __init__(self, module, plan=None, **ddp_kwargs):
        mode = "ddp"
        if plan is not None:
            if "process_group" in ddp_kwargs:
                raise ValueError(f"rank {dist.get_rank()}: HeteroDDP: give plan= or "
                                 f"process_group=, not both (the plan chooses the group)")
            if not plan.is_active:
                mode = "out"
            elif len(plan.active) == 1:
                mode = "alone"
        if mode == "ddp":
            if plan is not None:
                ddp_kwargs["process_group"] = plan.group
            super().__init__(module, **ddp_kwargs)
        else:
            torch.nn.Module.__init__(self)
            self.module = module
            self.process_group = None
            self.require_backward_grad_sync = True
            self.require_forward_param_sync = True
        self._kt_mode = mode
        self._kt_plan = plan
        self._kt_next_n = None
        self.last_batch_size = None
        self._kt_state = None
        self._kt_warned = False
        self._kt_forwards = 0
        self._kt_reset_at = None
        self._kt_obs = None
        self._kt_micro = None        # micro_steps: (first, n, rank's step total, state)
        self._kt_micro_state = None
        if mode == "ddp" and plan is not None:
            self._kt_obs = _Observer(_model_device(module))
            self.register_comm_hook((self.process_group, self._kt_obs), _observing_hook)
        elif mode == "ddp":
            self.register_comm_hook(self.process_group, _avg_hook)

    @property
    def plan(self):
        return self._kt_plan

    def micro_steps(self, micro_batches, batch_sizes=None):
        """Run one step as several micro-batches (a rank whose share does not
        fit in memory: HeteroSampler.micro_batches()); yields them in turn,
        the caller runs forward and backward on each:

            for x, y in model.micro_steps(sampler.micro_batches(batch)):
                loss_fn(model(x), y).backward()
            opt.step(); opt.zero_grad()

        Every micro-batch but the last runs under no_sync; the step's global
        batch is counted once (one all_reduce of this rank's total), and each
        micro-batch's gradient is weighted by its own size, so the gradients
        are the exact mean over the global batch whatever number of
        micro-batches each rank runs (each rank's loss the mean over its
        micro-batch, as usual). batch_sizes: the micro-batches' sizes where
        dim 0 of the first tensor is not the batch."""
        batches = list(micro_batches)
        if not batches:
            raise ValueError(f"rank {dist.get_rank()}: HeteroDDP.micro_steps: no micro-batch "
                             f"(an empty share is one empty micro-batch)")
        if batch_sizes is None:
            sizes = []
            for b in batches:
                args = b if isinstance(b, (list, tuple)) else (b,)
                sizes.append(self._batch_size(args, {}))
        else:
            sizes = [int(n) for n in batch_sizes]
            if len(sizes) != len(batches) or any(n < 0 for n in sizes):
                raise ValueError(f"rank {dist.get_rank()}: HeteroDDP.micro_steps: batch_sizes "
                                 f"{list(batch_sizes)} for {len(batches)} micro-batches")
        total = sum(sizes)
        st = None
        try:
            for i, (b, n) in enumerate(zip(batches, sizes)):
                last = i == len(batches) - 1
                self._kt_micro = (i == 0, n, total, st)
                if last or self._kt_mode != "ddp":
                    yield b
                else:
                    with self.no_sync():
                        yield b
                st = self._kt_micro_state
                self._kt_micro = None
        finally:  # left early (an exception, a break): the next forward is a plain one
            self._kt_micro = None
            self._kt_micro_state = None

    def set_batch_size(self, n):
        """This rank's batch size for the next forward (when dim 0 of its first
        tensor argument is not the batch)."""
        if int(n) != n or n < 0:
            raise ValueError(f"rank {dist.get_rank()}: HeteroDDP.set_batch_size({n!r}): a batch "
                             f"size is an integer >= 0")
        self._kt_next_n = int(n)

    def _batch_size(self, inputs, kwargs):
        if self._kt_next_n is not None:
            n, self._kt_next_n = self._kt_next_n, None
            return n
        t = _first_tensor(inputs)
        if t is None:
            t = _first_tensor(kwargs)
        if t is None or t.dim() == 0:
            raise ValueError(f"rank {dist.get_rank()}: HeteroDDP: forward has no tensor argument "
                             f"with a batch dimension; call model.set_batch_size(n) before it")
        return int(t.shape[0])

    def global_batch_size(self):
        """N of the last forward (waits for its all_reduce)."""
        st = self._kt_state
        if st is None:
            return None
        st.weight()
        return st.total

    def sync_parameters(self):
        """Every rank of the job gets the parameters and buffers of the plan's
        leader (without a plan: of rank 0). A collective: every rank calls it,
        e.g. before saving a checkpoint on a rank that may have been left out,
        or before evaluating on every rank."""
        src = self._kt_plan.leader if self._kt_plan is not None else 0
        tensors = [t.data for t in self.module.parameters()] + list(self.module.buffers())
        if tensors:
            pg = dist.distributed_c10d._get_default_group()
            dist._broadcast_coalesced(pg, tensors, 250 * (1 << 20), src)

    def _kt_tick(self):
        """Every grad-enabled forward: count it; every plan.window of them, the
        job's one all_gather of what each rank observed (the rebalancing)."""
        plan = self._kt_plan
        k = self._kt_forwards
        self._kt_forwards += 1
        if self._kt_reset_at is not None and k >= self._kt_reset_at:
            self._kt_reset_at = None
            if self._kt_obs is not None:
                self._kt_obs.reset()
        if k == 0 or k % plan.window:
            return
        seen = self._kt_obs.summary(plan.curves[plan.rank]) if self._kt_obs is not None else None
        nan = float("nan")
        rows = _gather_floats([seen[0] if seen else nan, seen[1] if seen else nan,
                               plan._lag_needed], None)
        plan._lag_needed = max(int(r[2]) for r in rows)
        ratios = [None if math.isnan(r[0]) else r[0] for r in rows]
        busy = [None if math.isnan(r[1]) else r[1] for r in rows]
        if self._kt_obs is not None:
            self._kt_obs.reset()  # each window is judged on its own steps
        if plan._observe(k, ratios, busy):
            self._kt_reset_at = k + plan._lag_needed

    def forward(self, *inputs, **kwargs):
        micro = self._kt_micro if torch.is_grad_enabled() else None
        if micro is not None:
            self._kt_next_n = None
            first, n, rank_total, st = micro
        else:
            n = self._batch_size(inputs, kwargs)
        self.last_batch_size = n
        if not torch.is_grad_enabled():
            self._kt_state = None
            if self._kt_mode != "ddp":
                return self.module(*inputs, **kwargs)
            return super().forward(*inputs, **kwargs)
        if self._kt_plan is not None and (micro is None or first):
            self._kt_tick()  # once per step: every rank of the job counts alike
        if self._kt_mode == "out":
            self._kt_state = None
            with torch.no_grad():
                out = self.module(*inputs, **kwargs)
            return _map_tensors(out, _leaf)
        if self._kt_mode == "alone":
            self._kt_state = None
            return self.module(*inputs, **kwargs)
        if self._kt_obs is not None:
            self._kt_obs.forward(n)
        if micro is not None and not first and st is not None:
            # a later micro-batch of the step: the step's count, its own weight
            st = _MicroState(st, n)
        else:
            count_n = rank_total if micro is not None else n
            count = torch.tensor([float(count_n)], dtype=torch.float64,
                                 device=_coll_device(self.process_group))
            work = dist.all_reduce(count, group=self.process_group, async_op=True)
            st = _CountState(count_n, work, count, dist.get_world_size(self.process_group))
            if micro is not None:
                self._kt_micro_state = st
                st = _MicroState(st, n)
        self._kt_state = st
        st.wrapped = 0
        out = _scale_outputs(super().forward(*inputs, **kwargs), st)
        if not st.wrapped and not self._kt_warned:
            self._kt_warned = True
            warnings.warn(f"rank {dist.get_rank()}: HeteroDDP: forward returned no tensor that "
                          f"needs a gradient in a tensor, tuple, list, dict or dataclass "
                          f"({type(out).__name__}); its gradients are averaged as plain DDP does, "
                          f"not weighted by batch size", stacklevel=2)
        return out


def weighted_mean(value, n, group=None):
    """The mean over the global batch of a per-rank mean: sum(value_r * n_r) /
    sum(n_r) over the ranks of `group`. value: a number or a tensor (elementwise);
    n: this rank's batch size (0: its value, even NaN, is left out). Returns a
    float for a number, else a tensor like value (NaN where every n is 0)."""
    if int(n) != n or n < 0:
        raise ValueError(f"rank {dist.get_rank()}: weighted_mean: n must be an integer >= 0, "
                         f"not {n!r}")
    is_tensor = isinstance(value, torch.Tensor)
    v = value.detach().to(torch.float64) if is_tensor else torch.tensor(value, dtype=torch.float64)
    flat = v.reshape(-1).cpu()
    part = flat * n if n > 0 else torch.zeros_like(flat)
    buf = torch.cat([part, torch.tensor([float(n)], dtype=torch.float64)])
    buf = buf.to(_coll_device(group))
    dist.all_reduce(buf, group=group)
    buf = buf.cpu()
    total = buf[-1].item()
    mean = buf[:-1] / total if total > 0 else torch.full_like(buf[:-1], float("nan"))
    if not is_tensor:
        return float(mean.item()) if mean.numel() == 1 else mean.tolist()
    return mean.reshape(v.shape).to(dtype=value.dtype if value.is_floating_point()
                                    else torch.float64, device=value.device)
