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
import dataclasses
import math
import os
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

__all__ = ["measure_capability", "capabilities", "HeteroSampler", "HeteroDDP", "weighted_mean",
           "shares"]

_ENV_CAPS = "KAITIAN_CAPABILITIES"
_last_caps = None  # the figures of the last measure_capability (a list of floats)


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
                       seconds=0.3, group=None):
    """Samples per second of forward + backward of `model` on `sample` on this
    rank's device, all-gathered: returns a list with one figure per rank of
    `group` (default: the whole job), the same on every rank, and keeps it for
    capabilities() and HeteroSampler.

    model: an nn.Module on the device this rank computes on (default: a GEMM
      workload on torch_kaitian.device()). sample: one batch, a tensor or a
      tuple of forward's arguments, or (inputs, target) with loss_fn; its dim 0
      is the batch size. loss_fn(output, target): the loss (default: the mean
      square of the outputs). steps: timed steps (default: as many as fit in
      `seconds`, at least 3), after `warmup` untimed ones.
    The model's gradients and buffers (BatchNorm statistics) are restored
    afterwards. With KAITIAN_CAPABILITIES set, nothing is measured: its figures
    are returned. Every rank of the group must call it (one all_gather)."""
    global _last_caps
    rank, world = _world(group)
    override = _env_caps(world)
    if override is not None:
        rate = float("nan")  # nothing to measure; the gather still checks every rank agrees
    else:
        rate = _measure(rank, model, sample, steps, loss_fn, warmup, seconds)
    mine = torch.tensor([rate], dtype=torch.float64, device=_coll_device(group))
    every = [torch.zeros_like(mine) for _ in range(world)]
    dist.all_gather(every, mine, group=group)
    rates = [float(t.item()) for t in every]
    unset = [r for r, v in enumerate(rates) if not math.isnan(v)]
    if override is not None or any(math.isnan(v) for v in rates):
        if unset:
            raise ValueError(f"rank {rank}: {_ENV_CAPS} is set on some ranks and not on ranks "
                             f"{unset}: set it on all or none")
        _last_caps = override
        return list(override)
    _last_caps = rates
    return list(rates)


def _measure(rank, model, sample, steps, loss_fn, warmup, seconds):
    """This rank's samples/s (see measure_capability)."""
    if isinstance(model, DistributedDataParallel):
        model = model.module  # time the module itself: DDP would communicate
    if model is None:
        if sample is not None:
            raise ValueError(f"rank {rank}: measure_capability: sample given without a model")
        model, sample = _default_workload(_device.device())
    elif sample is None:
        raise ValueError(f"rank {rank}: measure_capability(model): a sample batch is needed "
                         f"(sample=)")
    dev = _model_device(model)
    sample = _to(sample, dev)
    if loss_fn is not None:
        if not (isinstance(sample, (list, tuple)) and len(sample) == 2):
            raise ValueError(f"rank {rank}: measure_capability with loss_fn needs "
                             f"sample=(inputs, target)")
        inputs, target = sample
    else:
        inputs, target = sample, None
    args = inputs if isinstance(inputs, (list, tuple)) else (inputs,)
    first = _first_tensor(args)
    if first is None or first.dim() == 0:
        raise ValueError(f"rank {rank}: measure_capability: the sample has no batch dimension")
    batch = first.shape[0]
    params = [p for p in model.parameters() if p.requires_grad]
    saved_grads = [p.grad for p in params]
    saved_bufs = [(b, b.detach().clone()) for b in model.buffers()]

    def step():
        for p in params:
            p.grad = None
        out = model(*args)
        loss = loss_fn(out, target) if loss_fn is not None else _scalar_loss(out)
        loss.backward()

    # The ranks time different numbers of steps: keep the random streams (dropout)
    # where they were, so that seeded code after this call agrees across ranks.
    devices = [dev.index or 0] if dev.type == "cuda" else []
    try:
        with torch.random.fork_rng(devices=devices):
            k, elapsed = _time_steps(step, dev, steps, seconds, warmup)
    finally:
        for p, g in zip(params, saved_grads):
            p.grad = g
        with torch.no_grad():
            for b, v in saved_bufs:
                b.copy_(v)
    return batch * k / elapsed if elapsed > 0 else float("inf")


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
                 capabilities=None, rank=None, world_size=None, group=None):
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
        self.full_shares = shares(b, self.capabilities)
        # A short last step never gives a rank more than a full step does, so a
        # DataLoader batching by local_batch_size never splits it in two.
        self.last_shares = (shares(self._steps[-1], self.capabilities, cap=self.full_shares)
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
        self._check_batching()
        for batch in self.rank_batches():
            yield from batch

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
        return DataLoader(self.dataset, batch_sampler=self.batches(), collate_fn=collate,
                          **dataloader_kwargs)


class _StepBatches(Sampler):
    def __init__(self, parent):
        self.parent = parent

    def __iter__(self):
        return iter(self.parent.rank_batches())

    def __len__(self):
        return self.parent.num_steps


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
    if isinstance(out, torch.Tensor):
        if out.requires_grad:
            state.wrapped += 1
            return _ScaleGrad.apply(out, state)
        return out
    if dataclasses.is_dataclass(out) and not isinstance(out, type):
        return dataclasses.replace(out, **{f.name: _scale_outputs(getattr(out, f.name), state)
                                           for f in dataclasses.fields(out) if f.init})
    if isinstance(out, tuple) and hasattr(out, "_fields"):  # namedtuple
        return type(out)(*(_scale_outputs(x, state) for x in out))
    if isinstance(out, (list, tuple)):
        return type(out)(_scale_outputs(x, state) for x in out)
    if isinstance(out, dict):
        new = out.copy()
        for k, v in out.items():
            new[k] = _scale_outputs(v, state)
        return new
    return out


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
    microstep's global mean. Every DDP argument is accepted."""

    def __init__(self, module, **ddp_kwargs):
        super().__init__(module, **ddp_kwargs)
        self._kt_next_n = None
        self.last_batch_size = None
        self._kt_state = None
        self.register_comm_hook(self.process_group, _avg_hook)
        self._kt_warned = False

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

    def forward(self, *inputs, **kwargs):
        n = self._batch_size(inputs, kwargs)
        self.last_batch_size = n
        if not torch.is_grad_enabled():
            self._kt_state = None
            return super().forward(*inputs, **kwargs)
        count = torch.tensor([float(n)], dtype=torch.float64,
                             device=_coll_device(self.process_group))
        work = dist.all_reduce(count, group=self.process_group, async_op=True)
        self._kt_state = st = _CountState(n, work, count, dist.get_world_size(self.process_group))
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
