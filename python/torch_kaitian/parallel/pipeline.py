"""pipeline.py - pipeline parallelism: each rank of a pipe group runs one stage
of the model (the user splits it), microbatches flow forward and their
gradients backward between neighbouring stages, in the 1F1B or GPipe order.

    pipe = Pipeline(my_stage, topo.group("pipe"), num_microbatches=8, loss_fn=F.cross_entropy)
    loss = pipe.step(x if first else None, y if last else None)   # then opt.step()

Messages between stages are point-to-point (isend/irecv: the forward direction
and the backward one never wait for each other). Every message is a small
header (status, then each tensor's dtype, requires_grad and shape) and its
tensors, so stages may pass several tensors of any shape, some needing no
gradient, and shapes may change between steps.

Failures never hang the pipeline: a stage whose forward, loss or backward
raises keeps following the schedule "hollow" (sending an error header instead
of each tensor message and draining what it receives), every stage that
receives an error header does the same, and at the end of the step the stages
agree (one all_reduce) and all raise PipelineError naming the failing stage.
"""
import math
import traceback

import torch
import torch.distributed as dist

from .._device import _collective_device, _group_ranks
from .balance import StagePlan

__all__ = ["Pipeline", "PipelineError", "average_gradients"]

_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32,
           torch.int16, torch.int8, torch.uint8, torch.bool, torch.complex64, torch.complex128]
_HDR = 128          # int64 words of a header
_MAX_TENSORS = 10   # tensors per message
_OK, _ERROR = 0, 1  # header word 0: tensors follow, or an error's text
_ERR_TEXT = 4000    # bytes of an error's text (UTF-8) a header announces, at most


class PipelineError(RuntimeError):
    """A stage of the pipeline failed during step(); raised on every stage."""

    def __init__(self, stage, message):
        super().__init__(f"pipeline stage {stage} failed: {message}")
        self.stage = stage


def average_gradients(params, group):
    """All-reduce the gradients of `params` (a module or an iterable) over `group`
    and divide by its size: data parallelism around a pipeline stage."""
    if isinstance(params, torch.nn.Module):
        params = params.parameters()
    params = [p for p in params if p.requires_grad]
    if not params:
        return
    # Every trainable parameter takes part (a missing gradient as zeros), so the
    # ranks' buffers agree even when a parameter got no gradient on some of them.
    flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
                      for p in params])
    dist.all_reduce(flat, group=group)
    flat.div_(dist.get_world_size(group))
    o = 0
    for p in params:
        g = flat[o:o + p.numel()].view_as(p)
        if p.grad is None:
            p.grad = g.clone()
        else:
            p.grad.copy_(g)
        o += p.numel()


def _as_tuple(x):
    if x is None:
        return ()
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


class Pipeline:
    """One stage of a pipeline over the ranks of `group` (group rank 0 reads the
    input, the last one computes loss_fn(output, target)).

    step(inputs, targets) splits the batch (dim 0 of every input tensor on the
    first stage, of every target on the last) into num_microbatches, runs their
    forwards and backwards in the schedule's order, and returns the mean of the
    microbatch losses on the last stage (None elsewhere; broadcast_loss=True:
    on every stage). The gradients of that mean accumulate in the stage's
    parameters; step any optimizer after it. schedule: "1f1b" (warm-up, then one
    forward one backward, then cool-down: at most p microbatches' activations
    live on the first stage) or "gpipe" (every forward, then every backward:
    all M live). Same numbers either way. stage: this rank's module, or the
    StagePlan of parallel.balance() (its cut of the layers by speed)."""

    def __init__(self, stage, group, num_microbatches, schedule="1f1b", loss_fn=None,
                 device=None):
        me = dist.get_rank()
        if schedule not in ("1f1b", "gpipe"):
            raise ValueError(f"rank {me}: Pipeline: schedule must be '1f1b' or 'gpipe', not "
                             f"{schedule!r}")
        if int(num_microbatches) != num_microbatches or num_microbatches < 1:
            raise ValueError(f"rank {me}: Pipeline: num_microbatches must be a positive integer, "
                             f"not {num_microbatches!r}")
        if isinstance(stage, StagePlan):  # balance()'s cut: this rank's layers
            if dist.get_rank(group) < 0 or len(stage.bounds) != dist.get_world_size(group):
                raise ValueError(f"rank {me}: Pipeline: the StagePlan has {len(stage.bounds)} "
                                 f"stages for a pipe group of {dist.get_world_size(group)}")
            stage = stage.stage(dist.get_rank(group))
        self.stage, self.group = stage, group
        self.m, self.schedule = int(num_microbatches), schedule
        self.s = dist.get_rank(group)
        self.p = dist.get_world_size(group)
        if self.s < 0:
            raise ValueError(f"rank {me}: Pipeline: this rank is not in the pipe group")
        self.first, self.last = self.s == 0, self.s == self.p - 1
        if self.last and loss_fn is None:
            raise ValueError(f"rank {me}: Pipeline: the last stage needs loss_fn")
        self.loss_fn = loss_fn
        ranks = _group_ranks(group)
        self._prev = ranks[self.s - 1] if not self.first else None
        self._next = ranks[self.s + 1] if not self.last else None
        self.max_live = 0  # most microbatches whose activations this stage held at once
        # Where received tensors go (the stage's device), and where the headers
        # go (the CPU, but NCCL moves GPU tensors only).
        if device is None:
            device = next((q.device for q in stage.parameters()), torch.device("cpu"))
        self.device = torch.device(device)
        self._ctl = _collective_device(group)
        # Every stage must run the same schedule, or the messages never pair up.
        mine = (self.m, self.schedule)
        every = [None] * self.p
        dist.all_gather_object(every, mine, group=group)
        if any(e != mine for e in every):
            raise ValueError(f"rank {me}: Pipeline: the stages disagree on (num_microbatches, "
                             f"schedule): {every}")

    # ---- messages -------------------------------------------------------------------
    def _header(self, tensors):
        h = torch.zeros(_HDR, dtype=torch.int64)
        if any(not torch.is_tensor(t) for t in tensors):
            raise TypeError(f"a stage returns tensors (one, or a tuple or list of them), got "
                            f"{[type(t).__name__ for t in tensors]}")
        if len(tensors) > _MAX_TENSORS:
            raise ValueError(f"a stage passes {len(tensors)} tensors; at most {_MAX_TENSORS}")
        h[1] = len(tensors)
        i = 2
        for t in tensors:
            if t.dtype not in _DTYPES or t.dim() > 8:
                raise ValueError(f"cannot pass a {t.dtype} tensor of {t.dim()} dimensions "
                                 f"between stages")
            h[i], h[i + 1], h[i + 2] = _DTYPES.index(t.dtype), int(t.requires_grad), t.dim()
            h[i + 3:i + 3 + t.dim()] = torch.tensor(t.shape, dtype=torch.int64)
            i += 11
        return h.to(self._ctl)

    @staticmethod
    def _parse(h):
        # A neighbour's header: what _header wrote, or ValueError naming the field.
        n = int(h[1])
        if not 0 <= n <= _MAX_TENSORS:
            raise ValueError(f"pipeline header: tensor count {n} is not 0..{_MAX_TENSORS}")
        out, i = [], 2
        for k in range(n):
            d, g, nd = int(h[i]), int(h[i + 1]), int(h[i + 2])
            if not 0 <= d < len(_DTYPES):
                raise ValueError(f"pipeline header: tensor {k}: dtype {d} is not 0..{len(_DTYPES) - 1}")
            dt = _DTYPES[d]
            if g not in (0, 1) or (g and not (dt.is_floating_point or dt.is_complex)):
                raise ValueError(f"pipeline header: tensor {k}: requires_grad {g} for {dt}")
            if not 0 <= nd <= 8:
                raise ValueError(f"pipeline header: tensor {k}: dimensions {nd} is not 0..8")
            shape = tuple(int(x) for x in h[i + 3:i + 3 + nd])
            if any(x < 0 for x in shape) or \
                    math.prod(max(x, 1) for x in shape) * torch.empty((), dtype=dt).element_size() >= 2 ** 63:
                raise ValueError(f"pipeline header: tensor {k}: size {shape} is not a tensor's")
            out.append((dt, bool(g), shape))
            i += 11
        pad = [j for j in range(2, len(h)) if h[j] != 0 and not any(
            2 + 11 * k <= j < 2 + 11 * k + 3 + len(out[k][2]) for k in range(n))]
        if pad:
            raise ValueError(f"pipeline header: word {pad[0]} (padding) is {int(h[pad[0]])}, not 0")
        return out

    @staticmethod
    def _error_header(stage, n):
        # The header of an error message: stage that failed, n bytes of text.
        h = torch.zeros(_HDR, dtype=torch.int64)
        h[0], h[1], h[2] = _ERROR, n, stage
        return h

    @staticmethod
    def _parse_error(h):
        # A neighbour's error header (word 0 not _OK): (stage, text bytes), what
        # _error_header wrote, or ValueError naming the field.
        kind, n, stage = int(h[0]), int(h[1]), int(h[2])
        if kind != _ERROR:
            raise ValueError(f"pipeline header: kind {kind} is not {_OK} (tensors) or {_ERROR} (an error)")
        if not 0 <= n <= _ERR_TEXT:
            raise ValueError(f"pipeline header: error text length {n} is not 0..{_ERR_TEXT}")
        if not 0 <= stage < 2 ** 31:
            raise ValueError(f"pipeline header: failed stage {stage} is not a stage")
        pad = [j for j in range(3, len(h)) if h[j] != 0]
        if pad:
            raise ValueError(f"pipeline header: word {pad[0]} (padding) is {int(h[pad[0]])}, not 0")
        return stage, n

    def _exchange(self, send_to, send_tensors, recv_from):
        """Send a message (a tuple of tensors, or None in hollow mode: an error
        header) and/or receive one, concurrently. Returns the received tensors
        with their requires_grad flags, or None for an error message (then
        self._error is set)."""
        ops, sh = [], None
        if send_to is not None:
            if self._error is None:
                sh = self._header(send_tensors)
            else:
                msg = torch.tensor(list(self._error[1].encode()[:_ERR_TEXT]), dtype=torch.uint8)
                sh = self._error_header(self._error[0], msg.numel())
                sh, msg = sh.to(self._ctl), msg.to(self._ctl)
            ops.append(dist.P2POp(dist.isend, sh, send_to, self.group))
        rh = torch.empty(_HDR, dtype=torch.int64, device=self._ctl) if recv_from is not None \
            else None
        if rh is not None:
            ops.append(dist.P2POp(dist.irecv, rh, recv_from, self.group))
        self._run(ops)
        ops = []
        if sh is not None:
            payload = ([t.detach().contiguous() for t in send_tensors] if sh[0] == _OK else [msg])
            ops += [dist.P2POp(dist.isend, t, send_to, self.group) for t in payload if t.numel()]
        got = None
        if rh is not None:
            rh = rh.cpu()
            if rh[0] == _OK:
                meta = self._parse(rh)
                got = [(torch.empty(shape, dtype=dt, device=self.device), rg)
                       for dt, rg, shape in meta]
                ops += [dist.P2POp(dist.irecv, t, recv_from, self.group) for t, _ in got
                        if t.numel()]
            else:
                stage, n = self._parse_error(rh)
                text = torch.empty(n, dtype=torch.uint8, device=self._ctl)
                if text.numel():
                    ops.append(dist.P2POp(dist.irecv, text, recv_from, self.group))
                got = ("error", stage, text)
        self._run(ops)
        if isinstance(got, tuple):
            if self._error is None:
                self._error = (got[1], bytes(got[2].cpu().tolist()).decode(errors="replace"))
            return None
        return got

    @staticmethod
    def _run(ops):
        if ops:
            for w in dist.batch_isend_irecv(ops):
                w.wait()

    # ---- compute ----------------------------------------------------------------------
    def _guard(self, fn, *args):
        if self._error is not None:
            return None
        try:
            return fn(*args)
        except Exception as e:  # noqa: BLE001 - any failure of user code ends the step cleanly
            tb = traceback.format_exception_only(type(e), e)[-1].strip()
            self._error = (self.s, f"{tb} (rank {dist.get_rank()})")
            return None

    def _forward(self, i, received):
        if self.first:
            args = tuple(x[i] for x in self._inputs)
        else:
            args = []
            for t, rg in received:
                args.append(t.requires_grad_(rg and (t.is_floating_point() or t.is_complex())))
            args = tuple(args)
        out = _as_tuple(self.stage(*args))
        if not self.last:
            self._header(out)  # a stage output that cannot travel fails here, guarded
        self._live[i] = (args, out)
        self.max_live = max(self.max_live, len(self._live))
        if self.last:
            loss = self.loss_fn(out[0] if len(out) == 1 else out, self._targets[i]) / self.m
            self._losses[i] = loss
            self._live[i] = (args, (loss,))
        return out

    def _backward(self, i, grads):
        args, out = self._live.pop(i)
        if self.last:
            torch.autograd.backward(out[0])
        else:
            outs = [o for o in out if o.requires_grad][:len(grads)]
            if outs:
                torch.autograd.backward(outs, list(grads[:len(outs)]))
        return tuple((a.grad if a.grad is not None else torch.zeros_like(a))
                     for a in args if a.requires_grad) if not self.first else ()

    # ---- the schedule -------------------------------------------------------------------
    def _send_fwd_recv_bwd(self, out, want_grad):
        """After forward of a microbatch: send its output on, get the gradient of
        the output of microbatch `want_grad` (or None) back."""
        send = [o for o in out] if out is not None else None
        got = self._exchange(self._next, send,
                             self._next if want_grad is not None else None)
        return [t for t, _ in got] if got else None

    def step(self, inputs=None, targets=None, broadcast_loss=False):
        """Forward and backward of every microbatch; see the class doc."""
        self._error, self._live, self._losses = None, {}, {}
        self._inputs, self._targets = None, None
        self.max_live = 0
        self._guard(self._split, inputs, targets)  # a bad batch fails the step on every stage
        warm = self.m if self.schedule == "gpipe" else min(self.p - self.s - 1, self.m)
        recv_prev = None if self.first else self._prev
        # Warm-up: forwards only.
        for i in range(warm):
            got = self._exchange(None, None, recv_prev) if recv_prev is not None else None
            out = self._guard(self._forward, i, got or [])
            self._exchange(self._next, list(out) if out is not None else (), None) \
                if self._next is not None else None
        # Steady state: one forward, one backward.
        rest = self.m - warm
        got = (self._exchange(None, None, recv_prev) if rest and recv_prev is not None else None)
        for j in range(rest):
            i = warm + j
            out = self._guard(self._forward, i, got or [])
            grads = None
            if self._next is not None:
                grads = self._send_fwd_recv_bwd(out if out is not None else (), j)
            gin = self._guard(self._backward, j, grads or [])
            last = j == rest - 1
            if recv_prev is not None:
                got = self._exchange(self._prev, list(gin) if gin is not None else (),
                                     None if last else self._prev)
        # Cool-down: the remaining backwards.
        for j in range(rest, self.m):
            grads = None
            if self._next is not None:
                got_g = self._exchange(None, None, self._next)
                grads = [t for t, _ in got_g] if got_g else None
            gin = self._guard(self._backward, j, grads or [])
            if recv_prev is not None:
                self._exchange(self._prev, list(gin) if gin is not None else (), None)
        return self._finish(broadcast_loss)

    def _split(self, inputs, targets):
        me = dist.get_rank()
        if self.first:
            xs = _as_tuple(inputs)
            if not xs:
                raise ValueError(f"rank {me}: Pipeline.step: the first stage needs inputs")
            self._inputs = [torch.tensor_split(x, self.m) if torch.is_tensor(x) and x.dim()
                            else [x] * self.m for x in xs]
            for x in xs:
                if torch.is_tensor(x) and x.dim() and x.shape[0] < self.m:
                    raise ValueError(f"rank {me}: Pipeline.step: a batch of {x.shape[0]} cannot "
                                     f"make {self.m} microbatches")
        if self.last:
            if targets is None:
                raise ValueError(f"rank {me}: Pipeline.step: the last stage needs targets")
            self._targets = (torch.tensor_split(targets, self.m) if torch.is_tensor(targets)
                             else [targets] * self.m)

    def _finish(self, broadcast_loss):
        failed = torch.tensor([1.0 if self._error is not None else 0.0], dtype=torch.float64)
        dist.all_reduce(failed, op=dist.ReduceOp.MAX, group=self.group)
        if failed.item():
            errs = [None] * self.p
            dist.all_gather_object(errs, self._error, group=self.group)
            stage, msg = min(e for e in errs if e is not None)
            self._live.clear()
            raise PipelineError(stage, msg)
        loss = None
        if self.last:
            loss = sum(l.detach() for l in self._losses.values())
        if broadcast_loss:
            t = torch.zeros(1, dtype=torch.float64)
            if self.last:
                t[0] = float(loss)
            src = _group_ranks(self.group)[-1]
            dist.broadcast(t, src=src, group=self.group)
            loss = loss if self.last else t[0]
        return loss
