"""zero.py - ZeroOptimizer: ZeRO stage 1 and 2 over torch.distributed, wrapping
any torch optimizer class.

    opt = ZeroOptimizer(model.parameters(), torch.optim.AdamW, stage=2, lr=1e-3)
    loss.backward(); opt.step(); opt.zero_grad()

Layout. The trainable parameters of each (parameter group, dtype) are packed, in
reverse order (the order backward produces their gradients), into buckets of
whole parameters; each bucket is one flat buffer, padded to a multiple of the
shard-group size s, and the parameters become views into it. Rank i of the
shard group owns chunk i of every bucket: it keeps the optimizer state (and an
fp32 master copy for bf16/fp16 parameters) of its chunks only, steps them with
an inner `optimizer_class`, and the updated chunks are all-gathered back into
the buckets, so every rank holds every parameter again.

Gradients. Stage 1 reduces them in step(): each bucket's gradients are
reduce-scattered (averaged) so each rank receives its chunks (pass
reduce_gradients=False when DDP already averaged them: then only the state is
sharded). Stage 2 replaces DDP's all-reduce: a hook on each parameter's
gradient accumulation copies a bucket's gradients as soon as all of them are
there, frees them, and starts the bucket's reduce-scatter while backward goes
on (overlap=True), so a rank holds full gradients only for buckets in flight.
Do not wrap the model in DDP at stage 2 (it would all-reduce every gradient
first; the result is the same, at twice the traffic); ZeroOptimizer broadcasts
the parameters from the group's first rank when it is built, as DDP does.

Shares by weight. shard_weights=[w0, w1, ...] (one per rank of the shard
group) gives rank i a contiguous part of every bucket in proportion to w_i
(largest remainder: every part floor(n w_i / sum w) or one more, a weight of
0 holds no state); "memory" takes the weights from each rank's free memory
where its state lives (its device's, or for the CPU the host's available
memory shared among the host's CPU ranks), measured when the optimizer is
built, after the model is placed. The reduce-scatter and all-gather then run
with uneven blocks: over "kaitian" kt_reduce_scatterv and kt_allgatherv, over
"nccl" torch's uneven list forms; over other backends (gloo) the documented
fallback: the gradients all-reduced whole and this rank's part kept, the
parameters all-gathered in parts padded to the largest. Equal weights (the
default) keep the even layout.

Node-local sharding. With shard_group="node" (or a process group), the state is
sharded inside each node only: gradients are reduce-scattered inside the node,
each chunk all-reduced across the nodes (the ranks with the same position in
the other nodes), and parameters all-gathered inside the node; the traffic that
crosses nodes is that of plain DDP, and each node holds one copy of the state.
"""
import math
from fractions import Fraction

import torch
import torch.distributed as dist

from .. import _log
from .._device import _collective_device, _group_ranks
from ._memory import free_memory

__all__ = ["ZeroOptimizer"]

_LOW = (torch.float16, torch.bfloat16)


def _reduce_scatter(out, inp, group):
    """out = this rank's block of the sum of inp over the group."""
    if dist.get_backend(group) == "gloo":  # no reduce_scatter in gloo
        tmp = inp.clone()
        dist.all_reduce(tmp, group=group)
        r, n = dist.get_rank(group), out.numel()
        out.copy_(tmp[r * n:(r + 1) * n])
        return
    dist.reduce_scatter_tensor(out, inp, group=group)


def _bits(t):
    """bf16/fp16 as bytes for pure data movement (gloo moves neither bf16 nor int16)."""
    return t.view(torch.uint8) if t.dtype in _LOW else t


def _all_gather(out, inp, group):
    """out = the concatenation of every rank's inp (inp may be a view of out)."""
    out, inp = _bits(out), _bits(inp)
    if dist.get_backend(group) == "gloo":
        n = inp.numel()
        parts = [out[i * n:(i + 1) * n] for i in range(dist.get_world_size(group))]
        src = inp.clone()
        dist.all_gather(parts, src, group=group)
        return
    dist.all_gather_into_tensor(out, inp, group=group)


def _uneven_ok(group):
    """Whether the backend has reduce_scatter / all_gather with uneven blocks."""
    return dist.get_backend(group) in ("kaitian", "nccl")


def _parts(n, weights):
    """n elements cut by weight: largest remainder, ties to the lower rank."""
    whole = sum(weights)
    quota = [Fraction(n) * w / whole for w in weights]
    out = [int(math.floor(q)) for q in quota]
    order = sorted(range(len(weights)), key=lambda r: (-(quota[r] - out[r]), r))
    for r in order[:n - sum(out)]:
        out[r] += 1
    return out


def _reduce_scatter_v(out, flat, b, group, async_op=False):
    """out = this rank's part of the sum of flat (b.cnt/b.lo: the parts)."""
    if b.even:
        if dist.get_backend(group) == "gloo":
            _reduce_scatter(out, flat, group)
            return None
        return dist.reduce_scatter_tensor(out, flat, group=group, async_op=async_op)
    if _uneven_ok(group):
        ins = [flat[lo:lo + c] for lo, c in zip(b.lo, b.cnt)]
        return dist.reduce_scatter(out, ins, group=group, async_op=async_op)
    tmp = flat.clone()  # the fallback: the whole sum, this rank's part kept
    dist.all_reduce(tmp, group=group)
    r = dist.get_rank(group)
    out.copy_(tmp[b.lo[r]:b.lo[r] + b.cnt[r]])
    return None


def _all_gather_v(dst, b, src, group):
    """dst (a bucket-sized flat buffer) = every rank's part, rank r's from its
    src (src may be a view of dst)."""
    if b.even:
        _all_gather(dst[:b.chunk * len(b.cnt)], src, group)
        return
    r = dist.get_rank(group)
    dbits, sbits = _bits(dst), _bits(src)
    k = dbits.numel() // dst.numel() if dst.numel() else 1
    if _uneven_ok(group):
        outs = [dbits[lo * k:(lo + c) * k] for lo, c in zip(b.lo, b.cnt)]
        dist.all_gather(outs, sbits, group=group)  # in place where src is this rank's part
        return
    most = max(b.cnt) * k  # the fallback: parts padded to the largest
    pad = torch.zeros(most, dtype=dbits.dtype, device=dbits.device)
    pad[:sbits.numel()].copy_(sbits)
    got = torch.empty(most * len(b.cnt), dtype=dbits.dtype, device=dbits.device)
    _all_gather(got, pad, group)
    for i, (lo, c) in enumerate(zip(b.lo, b.cnt)):
        if i != r and c:
            dbits[lo * k:(lo + c) * k].copy_(got[i * most:i * most + c * k])
    if src.data_ptr() != dst[b.lo[r]:].data_ptr() and b.cnt[r]:
        dbits[b.lo[r] * k:(b.lo[r] + b.cnt[r]) * k].copy_(sbits)


class _Bucket:
    """Whole parameters of one group and dtype, packed in one flat buffer;
    rank r of the shard group owns elements [lo[r], lo[r] + cnt[r]). Equal
    weights: parts of `chunk` elements, the buffer padded to shards x chunk
    (even: the even collectives); else parts by weight, no padding."""

    def __init__(self, params, group_index, shards, device, dtype, weights=None):
        self.params, self.group_index, self.dtype = params, group_index, dtype
        self.offsets, n = [], 0
        for p in params:
            self.offsets.append(n)
            n += p.numel()
        self.numel = n
        if weights is None:
            self.chunk = -(-n // shards)  # ceil
            self.cnt = [self.chunk] * shards
            size = self.chunk * shards
        else:
            self.cnt = _parts(n, weights)
            self.chunk = max(self.cnt)
            size = n
        self.lo = [sum(self.cnt[:i]) for i in range(shards)]
        self.even = weights is None
        self.flat = torch.zeros(size, dtype=dtype, device=device)
        for p, o in zip(params, self.offsets):
            self.flat[o:o + p.numel()].copy_(p.detach().reshape(-1))
            p.data = self.flat[o:o + p.numel()].view_as(p)
        self.ready = set()    # ids of the parameters whose gradient arrived (stage 2)

    def gather_grads(self, dtype):
        """The bucket's gradients as one flat buffer (zeros where a parameter has none)."""
        g = torch.zeros(self.flat.numel(), dtype=dtype, device=self.flat.device)
        for p, o in zip(self.params, self.offsets):
            if p.grad is not None:
                g[o:o + p.numel()].copy_(p.grad.reshape(-1))
        return g


class ZeroOptimizer(torch.optim.Optimizer):
    """ZeRO stage 1 or 2 around `optimizer_class` (any torch.optim optimizer).

    params: parameters or parameter groups (each group keeps its own options).
    group: the data-parallel group (default: every rank). shard_group: None
    (shard across `group`), "node" (shard inside each host, all-reduce across
    hosts), or a process group inside `group`. overlap: stage 2 starts each
    bucket's reduction during backward. offload: the fp32 master parameters,
    their gradients and the optimizer state live on the CPU (pinned when CUDA
    is there) and the inner optimizer steps there (torch_kaitian.optim.CPUAdam
    is the fast choice); the model stays on its device. bucket_mb: bucket size.
    reduce_gradients (stage 1): False when the gradients are already averaged
    across `group` (DDP). shard_weights: None (equal parts), "memory" (by each
    rank's free memory) or one weight per rank of the shard group (a 0 holds
    no state); see the module doc. Every rank of the job must build it (it may create
    process groups)."""

    def __init__(self, params, optimizer_class, stage=1, group=None, shard_group=None,
                 overlap=True, offload=False, bucket_mb=25, reduce_gradients=True,
                 shard_weights=None, **optimizer_kwargs):
        super().__init__(params, dict(optimizer_kwargs))
        me = dist.get_rank()
        if stage not in (1, 2):
            raise ValueError(f"rank {me}: ZeroOptimizer: stage must be 1 or 2, not {stage!r}")
        if stage == 2 and not reduce_gradients:
            raise ValueError(f"rank {me}: ZeroOptimizer: stage 2 is the gradient reduction; "
                             f"reduce_gradients=False applies to stage 1 only")
        self.stage, self.overlap, self.offload = stage, bool(overlap), bool(offload)
        self.reduce_gradients = bool(reduce_gradients)
        self.group = group if group is not None else dist.group.WORLD
        self._setup_groups(shard_group)
        self.shard_weights = self._resolve_weights(shard_weights)
        self._build_buckets(int(bucket_mb * (1 << 20)))
        self._describe_layout(shard_weights)
        if self.reduce_gradients:  # no DDP around: start from the same parameters, as DDP does
            self._sync_params()
        self._build_inner(optimizer_class, optimizer_kwargs)
        self._pending = []   # (work, bucket, output, input) of reductions in flight
        self._hooks = []
        self._next = 0       # stage 2: the next bucket to reduce (always in bucket order)
        self._stage1_reduced = False  # stage 1: this step's gradients are in the masters
        if stage == 2:
            with torch.enable_grad():  # the hooks hang on autograd nodes, absent under no_grad
                self._install_hooks()

    # ---- groups ----------------------------------------------------------------------
    def _setup_groups(self, shard_group):
        """self.shard (owners of the chunks), self.replica (the same chunk on other
        shards; None when there is one shard group)."""
        me = dist.get_rank()
        data = _group_ranks(self.group)
        if me not in data:
            raise ValueError(f"rank {me}: ZeroOptimizer: this rank is not in `group`")
        if shard_group is None:
            self.shard, self.replica = self.group, None
            return
        world = dist.get_world_size()
        if shard_group == "node":
            import socket
            mine = socket.gethostname()
        elif isinstance(shard_group, str):
            raise ValueError(f"rank {me}: ZeroOptimizer: shard_group must be None, 'node' or a "
                             f"process group, not {shard_group!r}")
        else:
            mine = tuple(_group_ranks(shard_group))
        # Every rank learns every data group's split, and creates every group in
        # the same order (torch's rule for new_group).
        views = [None] * world
        dist.all_gather_object(views, (tuple(data), mine))
        layouts = {}
        for r, (d, key) in enumerate(views):
            layouts.setdefault(d, {}).setdefault(key, []).append(r)
        created = {}
        for d in sorted(layouts):
            shards = sorted(sorted(v) for v in layouts[d].values())
            sizes = {len(s) for s in shards}
            if len(sizes) != 1:
                raise ValueError(f"rank {me}: ZeroOptimizer: shard groups of unequal sizes in the "
                                 f"data group {list(d)}: {shards} (nodes must run as many ranks)")
            if any(not set(s) <= set(d) for s in shards):
                raise ValueError(f"rank {me}: ZeroOptimizer: shard_group {shards} is not inside "
                                 f"the data-parallel group {list(d)}")
            replicas = [sorted(s[i] for s in shards) for i in range(len(shards[0]))]
            for members in shards + replicas:
                t = tuple(members)
                if t not in created:
                    created[t] = (dist.group.WORLD if len(t) == world else dist.new_group(list(t)))
        d = tuple(data)
        self.shard = next(created[tuple(sorted(v))] for v in layouts[d].values() if me in v)
        shards = sorted(sorted(v) for v in layouts[d].values())
        pos = next(s.index(me) for s in shards if me in s)
        rep = tuple(sorted(s[pos] for s in shards))
        self.replica = created[rep] if len(rep) > 1 else None

    # ---- layout ------------------------------------------------------------------------
    def _state_device(self):
        if self.offload:
            return torch.device("cpu")
        for g in self.param_groups:
            for p in g["params"]:
                if p.requires_grad:
                    return p.device
        return torch.device("cpu")

    def _resolve_weights(self, weights):
        """The shard group's weights (a list, one per shard rank), or None for
        equal parts. Every rank of the data group must give the same."""
        me = dist.get_rank()
        s = dist.get_world_size(self.shard)
        if weights is None:
            return None
        if isinstance(weights, str):
            if weights != "memory":
                raise ValueError(f"rank {me}: ZeroOptimizer: shard_weights must be None, 'memory' or "
                                 f"a list of {s} weights, not {weights!r}")
            free = free_memory(self._state_device(), self.shard)
            if self.replica is not None:  # the same position on every node: the least memory
                t = torch.tensor(free, dtype=torch.float64, device=_collective_device(self.replica))
                dist.all_reduce(t, op=dist.ReduceOp.MIN, group=self.replica)
                free = [int(v) for v in t.tolist()]
            self.free_memory = free
            w = [Fraction(int(v)) for v in free]
            if sum(w) <= 0:
                raise ValueError(f"rank {me}: ZeroOptimizer: shard_weights='memory': no rank "
                                 f"reports free memory ({free})")
        else:
            try:
                w = [Fraction(x) for x in weights]
            except (TypeError, ValueError):
                raise ValueError(f"rank {me}: ZeroOptimizer: shard_weights must be None, 'memory' or "
                                 f"a list of {s} numbers, not {weights!r}") from None
            if len(w) != s:
                raise ValueError(f"rank {me}: ZeroOptimizer: shard_weights has {len(w)} weights for "
                                 f"a shard group of {s} ranks")
            bad = [x for x in weights if not (math.isfinite(float(x)) and float(x) >= 0)]
            if bad or sum(w) <= 0:
                raise ValueError(f"rank {me}: ZeroOptimizer: shard_weights {list(weights)}: each "
                                 f"must be a finite number >= 0, and one > 0")
            views = [None] * dist.get_world_size(self.group)
            dist.all_gather_object(views, [str(x) for x in w], group=self.group)
            if any(v != views[0] for v in views):
                raise ValueError(f"rank {me}: ZeroOptimizer: the ranks give different shard_weights: "
                                 f"{[list(map(str, v)) for v in views]} (every rank must pass the same)")
        return None if all(x == w[0] for x in w) else w

    def _describe_layout(self, asked):
        """The split, once at INFO (KAITIAN_DEBUG=INFO) from the group's first rank."""
        if dist.get_rank() != _group_ranks(self.group)[0] or not _log.info_enabled():
            return
        s = dist.get_world_size(self.shard)
        total = sum(b.numel for b in self.buckets)
        per = [sum(b.cnt[r] if r < len(b.cnt) else 0 for b in self.buckets) for r in range(s)]
        how = ("equal" if self.shard_weights is None else
               "by free memory" if asked == "memory" else "by weight")
        extra = ""
        if getattr(self, "free_memory", None) is not None:
            extra = "; free memory (MiB) " + ", ".join(f"{v / 2**20:.0f}" for v in self.free_memory)
        _log.info(f"ZeroOptimizer stage {self.stage}: {total} elements of state sharded over {s} "
                  f"ranks {how}: " + ", ".join(f"rank {r} {n}" for r, n in enumerate(per)) + extra)

    def _build_buckets(self, bucket_bytes):
        s = dist.get_world_size(self.shard)
        self.buckets = []
        for gi, g in enumerate(self.param_groups):
            by_dtype = {}
            for p in reversed(g["params"]):
                if p.requires_grad:
                    by_dtype.setdefault((p.dtype, p.device), []).append(p)
            for (dtype, device), ps in by_dtype.items():
                if not dtype.is_floating_point:
                    raise ValueError(f"rank {dist.get_rank()}: ZeroOptimizer: parameter of dtype "
                                     f"{dtype} (only floating point parameters are trained)")
                cur, size = [], 0
                for p in ps:
                    nb = p.numel() * p.element_size()
                    if cur and size + nb > bucket_bytes:
                        self.buckets.append(_Bucket(cur, gi, s, device, dtype, self.shard_weights))
                        cur, size = [], 0
                    cur.append(p)
                    size += nb
                if cur:
                    self.buckets.append(_Bucket(cur, gi, s, device, dtype, self.shard_weights))
        for i, b in enumerate(self.buckets):
            b.index = i  # its master chunk is self.masters[i]

    def _chunk(self, b):
        r = dist.get_rank(self.shard)
        return b.flat[b.lo[r]:b.lo[r] + b.cnt[r]]

    def _build_inner(self, optimizer_class, optimizer_kwargs):
        """Per bucket an fp32 master chunk (a view of the bucket when it is fp32 on
        the device the state lives on) and its gradient; one inner optimizer over
        them, one inner group per outer group."""
        self.masters, self.grads = [], []
        inner_groups = [{**{k: v for k, v in g.items() if k != "params"}, "params": []}
                        for g in self.param_groups]
        pin = self.offload and torch.cuda.is_available()
        for b in self.buckets:
            chunk = self._chunk(b)
            if not self.offload and b.dtype not in _LOW:
                master = chunk
            else:
                dev = torch.device("cpu") if self.offload else chunk.device
                dt = torch.float32 if b.dtype in _LOW else b.dtype
                master = torch.empty(chunk.numel(), dtype=dt, device=dev, pin_memory=pin)
                master.copy_(chunk)
            master.requires_grad_(True)
            master.grad = torch.zeros_like(master)
            self.masters.append(master)
            inner_groups[b.group_index]["params"].append(master)
        inner_groups = [g for g in inner_groups if g["params"]] or [{"params": []}]
        self._inner_index = [gi for gi, g in enumerate(self.param_groups)
                             if any(b.group_index == gi for b in self.buckets)]
        try:
            self.inner = optimizer_class(inner_groups, **optimizer_kwargs)
        except ValueError as e:
            if "empty parameter list" in str(e):
                raise ValueError(f"rank {dist.get_rank()}: ZeroOptimizer: no trainable "
                                 f"parameter") from None
            raise

    # ---- gradients ------------------------------------------------------------------------
    def _install_hooks(self):
        for b in self.buckets:
            for p in b.params:
                acc = p.expand_as(p).grad_fn.next_functions[0][0]
                acc.register_hook(self._make_hook(p, b))
                self._hooks.append(acc)  # the node must outlive the parameter's first use

    def _make_hook(self, p, b):
        def hook(*_):
            b.ready.add(id(p))
            # Buckets are reduced strictly in their order, as DDP's reducer does,
            # so every rank issues the same collectives in the same order even
            # when a bucket's gradients arrive early or a parameter gets none.
            while (self._next < len(self.buckets)
                   and len(self.buckets[self._next].ready) == len(self.buckets[self._next].params)):
                self._reduce_bucket(self.buckets[self._next])
                self._next += 1
            if self._next == len(self.buckets):  # a whole backward pass: the next one restarts
                self._next = 0
        return hook

    def _reduce_bucket(self, b):
        """Start (or run) the averaged reduction of b's gradients into its master
        gradient; the full gradients are dropped."""
        b.ready = set()
        flat = b.gather_grads(self._grad_dtype(b))
        for p in b.params:
            p.grad = None
        out = torch.empty(self._chunk(b).numel(), dtype=flat.dtype, device=flat.device)
        if self.stage == 2 and self.overlap:
            work = self._start_reduce(out, flat, b)
            self._pending.append((work, b, out, flat))
        else:
            self._finish_reduce(self._start_reduce(out, flat, b), b, out)

    @staticmethod
    def _grad_dtype(b):
        """Gradients are reduced in fp32 for bf16/fp16 parameters."""
        return torch.float32 if b.dtype in _LOW else b.dtype

    def _start_reduce(self, out, flat, b):
        # The reduce-scatter runs asynchronously where the backend allows it.
        return _reduce_scatter_v(out, flat, b, self.shard, async_op=True)

    def _finish_reduce(self, work, b, out):
        if work is not None:
            work.wait()
        if self.replica is not None:
            dist.all_reduce(out, group=self.replica)
        out.div_(dist.get_world_size(self.group))
        m = self.masters[b.index]
        m.grad.add_(out.to(m.device))

    def _drain(self):
        """Reduce, in bucket order, what backward left (buckets with a parameter
        that got no gradient, and those after them), then finish every
        reduction in flight."""
        if self._next or any(b.ready for b in self.buckets):
            for b in self.buckets[self._next:]:
                self._reduce_bucket(b)
        self._next = 0
        for work, b, out, _ in self._pending:
            self._finish_reduce(work, b, out)
        self._pending = []

    def _reduce_stage1(self):
        for i, b in enumerate(self.buckets):
            if self.reduce_gradients:
                flat = b.gather_grads(self._grad_dtype(b))
                out = torch.empty(self._chunk(b).numel(), dtype=flat.dtype, device=flat.device)
                self._finish_reduce(self._start_reduce(out, flat, b), b, out)
            else:  # DDP averaged them already: take this rank's chunk
                flat = b.gather_grads(self._grad_dtype(b))
                r = dist.get_rank(self.shard)
                self.masters[i].grad.add_(flat[b.lo[r]:b.lo[r] + b.cnt[r]]
                                          .to(self.masters[i].device))

    def _gradients_ready(self):
        if self.stage == 2:
            self._drain()
        elif not self._stage1_reduced:
            self._reduce_stage1()
            self._stage1_reduced = True

    # ---- the step ---------------------------------------------------------------------------
    def clip_grad_norm(self, max_norm, norm_type=2.0):
        """Clip the gradients by their global norm, as torch.nn.utils.clip_grad_norm_
        does on one process (call after backward, before step); returns the norm."""
        self._gradients_ready()
        norm_type = float(norm_type)
        dev = _collective_device(self.shard)
        if norm_type == math.inf:
            local = max([m.grad.abs().max() for m in self.masters if m.numel()],
                        default=torch.tensor(0.0))
            total = torch.tensor([float(local)], dtype=torch.float64, device=dev)
            dist.all_reduce(total, op=dist.ReduceOp.MAX, group=self.shard)
            norm = total.item()
        else:
            local = sum((m.grad.double().abs() ** norm_type).sum() for m in self.masters)
            total = torch.tensor([float(local)], dtype=torch.float64, device=dev)
            dist.all_reduce(total, group=self.shard)  # every chunk once (padding is zero)
            norm = total.item() ** (1.0 / norm_type)
        coef = float(max_norm) / (norm + 1e-6)
        if coef < 1:
            for m in self.masters:
                m.grad.mul_(coef)
        return torch.tensor(norm)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._gradients_ready()
        for gi, ig in zip(self._inner_index, self.inner.param_groups):
            for k, v in self.param_groups[gi].items():  # schedulers change the outer groups
                if k != "params":
                    ig[k] = v
        self.inner.step()
        for b, m in zip(self.buckets, self.masters):
            chunk = self._chunk(b)
            if m.data_ptr() != chunk.data_ptr():
                chunk.copy_(m)
            _all_gather_v(b.flat, b, chunk, self.shard)
            m.grad.zero_()  # the next step's gradients start from zero
        self._stage1_reduced = False
        return loss

    def zero_grad(self, set_to_none=True):
        for work, _, _, _ in self._pending:  # a skipped step: its reductions are dropped
            if work is not None:
                work.wait()
        self._pending = []
        self._next = 0
        for b in self.buckets:
            b.ready = set()
        for m in self.masters:
            m.grad.zero_()
        for g in self.param_groups:
            for p in g["params"]:
                if p.grad is not None:
                    if set_to_none:
                        p.grad = None
                    else:
                        p.grad.zero_()
        self._stage1_reduced = False

    def _sync_params(self):
        """Every parameter (frozen ones too) from the group's first rank."""
        src = _group_ranks(self.group)[0]
        for b in self.buckets:
            dist.broadcast(_bits(b.flat), src=src, group=self.group)
        with torch.no_grad():
            for g in self.param_groups:
                for p in g["params"]:
                    if not p.requires_grad:
                        t = p.detach().contiguous()
                        dist.broadcast(_bits(t), src=src, group=self.group)
                        if t.data_ptr() != p.data_ptr():
                            p.copy_(t)

    # ---- state ------------------------------------------------------------------------------
    def memory_bytes(self):
        """This rank's optimizer memory: {'state': bytes of the inner optimizer's
        state, 'master': fp32 master copies that are not the parameters
        themselves, 'grad': gradient bytes held now (full gradients of the
        parameters and the master gradients)}."""
        state = sum(t.numel() * t.element_size() for st in self.inner.state.values()
                    for t in st.values() if torch.is_tensor(t))
        master = sum(m.numel() * 4 for b, m in zip(self.buckets, self.masters)
                     if m.data_ptr() != self._chunk(b).data_ptr())
        grad = sum(m.grad.numel() * m.grad.element_size() for m in self.masters)
        grad += sum(p.grad.numel() * p.grad.element_size() for g in self.param_groups
                    for p in g["params"] if p.grad is not None)
        return {"state": state, "master": master, "grad": grad}

    def _gather_chunk(self, b, t):
        """The full bucket (unpadded, fp32) from every shard's chunk `t`."""
        out = torch.empty(b.flat.numel(), dtype=t.dtype, device=self._chunk(b).device)
        _all_gather_v(out, b, t.to(out.device).contiguous(), self.shard)
        return out[:b.numel]

    def state_dict(self):
        """The consolidated state, in the layout of `optimizer_class`'s own
        state_dict (per parameter, indexed as torch indexes them), on every rank
        (collective: every rank of the group calls it). Loadable by a
        ZeroOptimizer of any world size or stage, or by the plain optimizer."""
        index = {}
        for g in self.param_groups:
            for p in g["params"]:
                index.setdefault(id(p), len(index))
        state = {}
        for b, m in zip(self.buckets, self.masters):
            st = self.inner.state.get(m, {})
            for key in sorted(st):
                v = st[key]
                if torch.is_tensor(v) and v.shape == m.shape and key != "step":
                    full = self._gather_chunk(b, v)
                    for p, o in zip(b.params, b.offsets):
                        state.setdefault(index[id(p)], {})[key] = \
                            full[o:o + p.numel()].view(p.shape).cpu().clone()
                else:
                    for p in b.params:
                        state.setdefault(index[id(p)], {})[key] = (v.clone() if torch.is_tensor(v)
                                                                   else v)
        groups = []
        inner = dict(zip(self._inner_index, self.inner.param_groups))
        for gi, g in enumerate(self.param_groups):
            # every option the wrapped optimizer's own groups carry (its defaults
            # included), so that it can load and step this state too
            d = {k: v for k, v in inner.get(gi, self.inner.defaults).items() if k != "params"}
            d.update((k, v) for k, v in g.items() if k != "params")
            d["params"] = [index[id(p)] for p in g["params"]]
            groups.append(d)
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict):
        """Load a consolidated state (ZeroOptimizer.state_dict() of any world
        size or stage, or the wrapped optimizer's own state_dict)."""
        groups = state_dict["param_groups"]
        if len(groups) != len(self.param_groups) or any(
                len(a["params"]) != len(b["params"]) for a, b in zip(groups, self.param_groups)):
            raise ValueError(f"rank {dist.get_rank()}: ZeroOptimizer.load_state_dict: the saved "
                             f"parameter groups do not match this optimizer's")
        ids = {}
        for sg, g in zip(groups, self.param_groups):
            for i, p in zip(sg["params"], g["params"]):
                ids[id(p)] = i
            for k, v in sg.items():
                if k != "params":
                    g[k] = v
        saved = state_dict["state"]
        r = dist.get_rank(self.shard)
        for b, m in zip(self.buckets, self.masters):
            per = [saved.get(ids[id(p)], saved.get(str(ids[id(p)]), {})) for p in b.params]
            keys = set().union(*[set(s) for s in per]) if per else set()
            new = {}
            for key in sorted(keys):
                pairs = [(s[key], p) for s, p in zip(per, b.params) if key in s]
                # Per element: a tensor of its parameter's shape for every parameter
                # that has it (a parameter without saved state starts from zeros).
                if all(torch.is_tensor(v) and v.shape == p.shape for v, p in pairs) and \
                        key != "step":
                    dtype = pairs[0][0].dtype
                    flat = torch.zeros(b.flat.numel(), dtype=dtype)
                    for st, p, o in zip(per, b.params, b.offsets):
                        if key in st:
                            flat[o:o + p.numel()] = st[key].reshape(-1).cpu()
                    new[key] = flat[b.lo[r]:b.lo[r] + b.cnt[r]].to(m.device).clone()
                else:  # per parameter (a step count): the first parameter's
                    v = pairs[0][0]
                    new[key] = v.clone() if torch.is_tensor(v) else v
            if new:
                self.inner.state[m] = new
        for gi, ig in zip(self._inner_index, self.inner.param_groups):
            for k, v in self.param_groups[gi].items():
                if k != "params":
                    ig[k] = v

    def __repr__(self):
        s = dist.get_world_size(self.shard)
        w = "" if self.shard_weights is None else ", weights " + ":".join(
            f"{float(x):.3g}" for x in self.shard_weights)
        return (f"ZeroOptimizer(stage={self.stage}, {type(self.inner).__name__}, {len(self.buckets)}"
                f" bucket(s), shards of {s}{', node-local' if self.replica is not None else ''}"
                f"{', offload' if self.offload else ''}{w})")
