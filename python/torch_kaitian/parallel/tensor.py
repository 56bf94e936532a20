"""tensor.py - tensor parallelism: layers whose weight is split over the ranks of
a tensor group, and the communication they need as autograd functions.

    tp = topo.group("tensor")
    h = ColumnParallelLinear(1024, 4096, group=tp)(x)            # this rank's 4096/tp features
    y = RowParallelLinear(4096, 1024, group=tp)(F.gelu(h))       # 1 all-reduce forward, 1 backward

Every communication is one of four small autograd functions, named for what
they do to the tensor, in conjugate pairs (the backward of each is the forward
of its partner):

    copy_to_parallel       forward: identity         backward: all-reduce
    reduce_from_parallel   forward: all-reduce       backward: identity
    scatter_to_parallel    forward: keep my chunk    backward: all-gather
    gather_from_parallel   forward: all-gather       backward: keep my chunk

(chunks along the last dimension). The layers only compose them. Every function
and layer takes its process group explicitly (None: the default group); there
is no global state. Sizes that the group does not divide are a ValueError.
"""
import math

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

__all__ = ["copy_to_parallel", "reduce_from_parallel", "scatter_to_parallel",
           "gather_from_parallel", "ColumnParallelLinear", "RowParallelLinear",
           "VocabParallelEmbedding", "vocab_parallel_cross_entropy"]


# ---- the group ----------------------------------------------------------------------
def _size_rank(group, what):
    """(size, rank in group) of `group`; a clear error outside a job or the group."""
    if not dist.is_initialized():
        raise RuntimeError(f"{what}: call torch.distributed.init_process_group first")
    rank = dist.get_rank(group)
    if rank < 0:
        raise ValueError(f"rank {dist.get_rank()}: {what}: this rank is not in the given group")
    return dist.get_world_size(group), rank


def _per_rank(what, name, value, group):
    """value / (group size), or a ValueError naming the rank, the size and the group size."""
    size, _ = _size_rank(group, what)
    if value % size:
        raise ValueError(f"rank {dist.get_rank()}: {what}: {name}={value} is not divisible by the "
                         f"tensor group's size {size}")
    return value // size


# ---- the four conjugate functions -------------------------------------------------------
def _all_reduce(x, group):
    out = x.clone(memory_format=torch.contiguous_format)  # never reduce into a caller's tensor
    dist.all_reduce(out, group=group)
    return out


def _all_gather_last(x, group):
    size, _ = _size_rank(group, "gather")
    x = x.contiguous()
    parts = [torch.empty_like(x) for _ in range(size)]
    dist.all_gather(parts, x, group=group)
    return torch.cat(parts, dim=-1)


def _my_chunk_last(x, group, what):
    size, rank = _size_rank(group, what)
    n = x.shape[-1]
    if n % size:
        raise ValueError(f"rank {dist.get_rank()}: {what}: last dimension {n} is not divisible by "
                         f"the tensor group's size {size}")
    k = n // size
    return x.narrow(-1, rank * k, k).contiguous()


class _CopyToParallel(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return _all_reduce(grad, ctx.group), None


class _ReduceFromParallel(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        return _all_reduce(x, group)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class _ScatterToParallel(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _my_chunk_last(x, group, "scatter_to_parallel")

    @staticmethod
    def backward(ctx, grad):
        return _all_gather_last(grad, ctx.group), None


class _GatherFromParallel(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _all_gather_last(x, group)

    @staticmethod
    def backward(ctx, grad):
        return _my_chunk_last(grad, ctx.group, "gather_from_parallel (backward)"), None


def _single(group):
    return dist.get_world_size(group) == 1


def copy_to_parallel(x, group=None):
    """Identity forward; the gradient is all-reduced over `group` (a replicated
    input entering a layer whose ranks each use all of it)."""
    return x if _single(group) else _CopyToParallel.apply(x, group)


def reduce_from_parallel(x, group=None):
    """All-reduce (sum) over `group` forward; identity backward (partial results
    leaving a layer, summed into the replicated output)."""
    return x if _single(group) else _ReduceFromParallel.apply(x, group)


def scatter_to_parallel(x, group=None):
    """Keep this rank's chunk of the last dimension forward; all-gather the
    gradient backward."""
    return x if _single(group) else _ScatterToParallel.apply(x, group)


def gather_from_parallel(x, group=None):
    """All-gather the last dimension (rank order) forward; keep this rank's
    chunk of the gradient backward."""
    return x if _single(group) else _GatherFromParallel.apply(x, group)


# ---- initialisation ---------------------------------------------------------------------
def _shard_generator(rank, device):
    """For skip_full_init: a generator of its own for this rank's shard, seeded
    from one draw of torch's current RNG (the same on every rank seeded alike)
    plus the rank, so the shards differ and the job is reproducible. None on
    the meta device (nothing to draw)."""
    if torch.device(device).type == "meta":
        return None
    seed = int(torch.randint(0, 2 ** 62, (1,)).item())
    return torch.Generator(device=device).manual_seed(seed + rank)


def _uniform_(t, bound, gen):
    if gen is not None:
        with torch.no_grad():
            t.uniform_(-bound, bound, generator=gen)


def _check_last_dim(x, want, what):
    if x.dim() == 0 or x.shape[-1] != want:
        got = "a scalar" if x.dim() == 0 else f"last dimension {x.shape[-1]}"
        raise ValueError(f"rank {dist.get_rank()}: {what}: the input has {got} "
                         f"(shape {tuple(x.shape)}), expected {want}")


# ---- layers -------------------------------------------------------------------------------
class ColumnParallelLinear(nn.Module):
    """y = x A^T + b with A's rows (the output features) split over `group`:
    rank r holds rows [r*out/tp, (r+1)*out/tp) of the weight and of the bias.

    The input is replicated (the same on every rank); the output is this rank's
    out/tp features, or all of them with gather_output=True (one all-gather
    forward). Backward all-reduces the input's gradient (copy_to_parallel).

    Initialisation: a whole nn.Linear(in, out) is made under torch's current
    RNG and this rank keeps its rows, so with the same seed on every rank the
    concatenation of the shards equals the nn.Linear one process makes with
    that seed. The whole weight exists briefly during construction;
    skip_full_init=True draws only the shard, from the same distribution
    (uniform, bound 1/sqrt(in_features)), but not the same numbers as a
    single-process nn.Linear. from_linear() shards an existing nn.Linear.

    Raises ValueError when the group's size does not divide out_features, and
    in forward when the input's last dimension is not in_features."""

    def __init__(self, in_features, out_features, bias=True, gather_output=False, group=None, *,
                 skip_full_init=False, device=None, dtype=None):
        super().__init__()
        what = "ColumnParallelLinear"
        self.out_per_rank = _per_rank(what, "out_features", out_features, group)
        self.tp_size, self.tp_rank = _size_rank(group, what)
        self.in_features, self.out_features = in_features, out_features
        self.gather_output, self.group = gather_output, group
        lo, n = self.tp_rank * self.out_per_rank, self.out_per_rank
        if skip_full_init:
            self.weight = nn.Parameter(torch.empty(n, in_features, device=device, dtype=dtype))
            self.bias = nn.Parameter(torch.empty(n, device=device, dtype=dtype)) if bias else None
            gen = _shard_generator(self.tp_rank, self.weight.device)
            for p in (self.weight, self.bias):
                if p is not None:
                    _uniform_(p, 1 / math.sqrt(in_features) if in_features else 0, gen)
        else:
            full = nn.Linear(in_features, out_features, bias, device=device, dtype=dtype)
            self.weight = nn.Parameter(full.weight.detach()[lo:lo + n].clone())
            self.bias = nn.Parameter(full.bias.detach()[lo:lo + n].clone()) if bias else None

    @classmethod
    def from_linear(cls, linear, gather_output=False, group=None):
        """This rank's shard of `linear` (any rank may pass its own copy; they
        should be equal). Draws no random numbers."""
        w = linear.weight
        layer = cls(linear.in_features, linear.out_features, linear.bias is not None,
                    gather_output, group, device="meta", dtype=w.dtype).to_empty(device=w.device)
        lo, n = layer.tp_rank * layer.out_per_rank, layer.out_per_rank
        with torch.no_grad():
            layer.weight.copy_(w[lo:lo + n])
            if layer.bias is not None:
                layer.bias.copy_(linear.bias[lo:lo + n])
        return layer

    def forward(self, x):
        _check_last_dim(x, self.in_features, "ColumnParallelLinear")
        y = F.linear(copy_to_parallel(x, self.group), self.weight, self.bias)
        return gather_from_parallel(y, self.group) if self.gather_output else y

    def extra_repr(self):
        return (f"in_features={self.in_features}, out_features={self.out_features} "
                f"({self.out_per_rank} here, rank {self.tp_rank} of {self.tp_size}), "
                f"bias={self.bias is not None}, gather_output={self.gather_output}")


class RowParallelLinear(nn.Module):
    """y = x A^T + b with A's columns (the input features) split over `group`:
    rank r holds columns [r*in/tp, (r+1)*in/tp) of the weight, and the whole
    bias.

    The input is this rank's in/tp features (input_is_parallel=True, e.g. the
    output of a ColumnParallelLinear) or the whole replicated input, of which
    each rank keeps its chunk (input_is_parallel=False; its gradient is
    all-gathered backward). The partial products are all-reduced
    (reduce_from_parallel) and the bias is added once, after the sum; the
    output is replicated.

    Initialisation as ColumnParallelLinear, keeping columns; skip_full_init
    uses the bound of the whole layer (1/sqrt(in_features)). from_linear()
    shards an existing nn.Linear.

    Raises ValueError when the group's size does not divide in_features, and
    in forward when the input's last dimension is wrong."""

    def __init__(self, in_features, out_features, bias=True, input_is_parallel=True, group=None, *,
                 skip_full_init=False, device=None, dtype=None):
        super().__init__()
        what = "RowParallelLinear"
        self.in_per_rank = _per_rank(what, "in_features", in_features, group)
        self.tp_size, self.tp_rank = _size_rank(group, what)
        self.in_features, self.out_features = in_features, out_features
        self.input_is_parallel, self.group = input_is_parallel, group
        lo, n = self.tp_rank * self.in_per_rank, self.in_per_rank
        if skip_full_init:
            self.weight = nn.Parameter(torch.empty(out_features, n, device=device, dtype=dtype))
            self.bias = (nn.Parameter(torch.empty(out_features, device=device, dtype=dtype))
                         if bias else None)
            bound = 1 / math.sqrt(in_features) if in_features else 0
            _uniform_(self.weight, bound, _shard_generator(self.tp_rank, self.weight.device))
            if bias:  # the bias is replicated: every rank draws the same one
                _uniform_(self.bias, bound, _shard_generator(0, self.bias.device))
        else:
            full = nn.Linear(in_features, out_features, bias, device=device, dtype=dtype)
            self.weight = nn.Parameter(full.weight.detach()[:, lo:lo + n].clone())
            self.bias = nn.Parameter(full.bias.detach().clone()) if bias else None

    @classmethod
    def from_linear(cls, linear, input_is_parallel=True, group=None):
        """This rank's shard of `linear` (and its whole bias). Draws no random
        numbers."""
        w = linear.weight
        layer = cls(linear.in_features, linear.out_features, linear.bias is not None,
                    input_is_parallel, group, device="meta", dtype=w.dtype)
        layer = layer.to_empty(device=w.device)
        lo, n = layer.tp_rank * layer.in_per_rank, layer.in_per_rank
        with torch.no_grad():
            layer.weight.copy_(w[:, lo:lo + n])
            if layer.bias is not None:
                layer.bias.copy_(linear.bias)
        return layer

    def forward(self, x):
        what = "RowParallelLinear"
        if self.input_is_parallel:
            _check_last_dim(x, self.in_per_rank, what + " (input_is_parallel=True: in_features/tp)")
        else:
            _check_last_dim(x, self.in_features, what + " (input_is_parallel=False)")
            x = scatter_to_parallel(x, self.group)
        y = reduce_from_parallel(F.linear(x, self.weight), self.group)
        return y + self.bias if self.bias is not None else y

    def extra_repr(self):
        return (f"in_features={self.in_features} ({self.in_per_rank} here, rank {self.tp_rank} of "
                f"{self.tp_size}), out_features={self.out_features}, bias={self.bias is not None}, "
                f"input_is_parallel={self.input_is_parallel}")


class VocabParallelEmbedding(nn.Module):
    """nn.Embedding with the vocabulary split over `group`: rank r holds rows
    [r*V/tp, (r+1)*V/tp) of the table. Each rank looks up the ids in its range
    (zeros for the others) and the results are all-reduced, so the output is
    replicated. Ids outside [0, num_embeddings) give zero vectors (checking
    would cost a device synchronisation); padding_idx and max_norm are not
    supported.

    Initialisation as ColumnParallelLinear: a whole nn.Embedding under torch's
    current RNG, this rank's rows kept (skip_full_init: only the shard, drawn
    from N(0, 1)). Raises ValueError when the group's size does not divide
    num_embeddings."""

    def __init__(self, num_embeddings, embedding_dim, group=None, *, skip_full_init=False,
                 device=None, dtype=None):
        super().__init__()
        what = "VocabParallelEmbedding"
        self.per_rank = _per_rank(what, "num_embeddings", num_embeddings, group)
        self.tp_size, self.tp_rank = _size_rank(group, what)
        self.num_embeddings, self.embedding_dim, self.group = num_embeddings, embedding_dim, group
        self.vocab_start = self.tp_rank * self.per_rank
        lo, n = self.vocab_start, self.per_rank
        if skip_full_init:
            self.weight = nn.Parameter(torch.empty(n, embedding_dim, device=device, dtype=dtype))
            gen = _shard_generator(self.tp_rank, self.weight.device)
            if gen is not None:
                with torch.no_grad():
                    self.weight.normal_(generator=gen)
        else:
            full = nn.Embedding(num_embeddings, embedding_dim, device=device, dtype=dtype)
            self.weight = nn.Parameter(full.weight.detach()[lo:lo + n].clone())

    @classmethod
    def from_embedding(cls, embedding, group=None):
        """This rank's rows of `embedding` (an nn.Embedding). Draws no random numbers."""
        w = embedding.weight
        layer = cls(embedding.num_embeddings, embedding.embedding_dim, group, device="meta",
                    dtype=w.dtype).to_empty(device=w.device)
        with torch.no_grad():
            layer.weight.copy_(w[layer.vocab_start:layer.vocab_start + layer.per_rank])
        return layer

    def forward(self, ids):
        outside = (ids < self.vocab_start) | (ids >= self.vocab_start + self.per_rank)
        local = (ids - self.vocab_start).masked_fill(outside, 0)
        out = F.embedding(local, self.weight).masked_fill(outside.unsqueeze(-1), 0)
        return reduce_from_parallel(out, self.group)

    def extra_repr(self):
        return (f"{self.num_embeddings}, {self.embedding_dim} (rows {self.vocab_start}.."
                f"{self.vocab_start + self.per_rank - 1} here, rank {self.tp_rank} of "
                f"{self.tp_size})")


# ---- cross-entropy over vocab-sharded logits ------------------------------------------------
class _VocabParallelCrossEntropy(torch.autograd.Function):
    """Per-position loss log(sum_v exp z_v) - z_target from logits whose last
    dimension is this rank's vocabulary range. Two all-reduces: MAX of the
    local maxima (for stability), then SUM of (exp-sums, target logits, owner
    counts) in one tensor. Backward: (softmax - onehot) * grad on the shard,
    no communication."""

    @staticmethod
    def forward(ctx, logits, target, group, ignore_index):
        size, rank = _size_rank(group, "vocab_parallel_cross_entropy")
        n = logits.shape[-1]
        z = logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits
        zmax = z.max(dim=-1).values
        dist.all_reduce(zmax, op=dist.ReduceOp.MAX, group=group)
        z = z - zmax.unsqueeze(-1)
        lo = rank * n
        owns = (target >= lo) & (target < lo + n)
        local = (target - lo).masked_fill(~owns, 0)
        picked = z.gather(-1, local.unsqueeze(-1)).squeeze(-1).masked_fill(~owns, 0)
        e = z.exp()
        stats = torch.stack([e.sum(dim=-1), picked, owns.to(z.dtype)])
        dist.all_reduce(stats, group=group)
        sum_exp, picked, owners = stats
        ignored = target == ignore_index
        if ((owners != 1) & ~ignored).any():
            bad = target[(owners != 1) & ~ignored]
            raise ValueError(f"rank {dist.get_rank()}: vocab_parallel_cross_entropy: target "
                             f"{int(bad[0])} is outside the vocabulary [0, {n * size}) "
                             f"(and is not ignore_index={ignore_index})")
        loss = (sum_exp.log() - picked).masked_fill(ignored, 0)
        ctx.save_for_backward(e.div_(sum_exp.unsqueeze(-1)), local, owns, ignored)
        ctx.in_dtype = logits.dtype
        return loss

    @staticmethod
    def backward(ctx, grad):
        softmax, local, owns, ignored = ctx.saved_tensors
        g = grad.to(softmax.dtype).masked_fill(ignored, 0)
        out = softmax * g.unsqueeze(-1)
        out.scatter_add_(-1, local.unsqueeze(-1), (-g * owns).unsqueeze(-1))
        return out.to(ctx.in_dtype), None, None, None


def vocab_parallel_cross_entropy(logits, target, group=None, reduction="mean", ignore_index=-100):
    """F.cross_entropy over a vocabulary split across `group`.

    logits: (..., V/tp), this rank's vocabulary range [r*V/tp, (r+1)*V/tp) in
    the LAST dimension (the output of a ColumnParallelLinear head with
    gather_output=False), not dimension 1 as in F.cross_entropy. target: (...)
    the class indices in [0, V), the same on every rank. reduction: "mean"
    (over the targets that are not ignore_index, as F.cross_entropy), "sum"
    or "none". float16/bfloat16 logits are computed in float32 (the loss is
    float32). The loss is the same on every rank; the gradient of the logits
    is this rank's shard of the whole gradient.

    Raises ValueError for a target shape that is not logits.shape[:-1], an
    unknown reduction, or a target outside [0, V) that is not ignore_index
    (raised on every rank of the group alike)."""
    what = "vocab_parallel_cross_entropy"
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"rank {dist.get_rank()}: {what}: reduction must be 'mean', 'sum' or "
                         f"'none', got {reduction!r}")
    if tuple(target.shape) != tuple(logits.shape[:-1]):
        raise ValueError(f"rank {dist.get_rank()}: {what}: target shape {tuple(target.shape)} "
                         f"must be the logits' shape without the last (vocabulary) dimension, "
                         f"{tuple(logits.shape[:-1])}")
    loss = _VocabParallelCrossEntropy.apply(logits, target, group, ignore_index)
    if reduction == "sum":
        return loss.sum()
    if reduction == "mean":
        return loss.sum() / (target != ignore_index).sum()
    return loss
