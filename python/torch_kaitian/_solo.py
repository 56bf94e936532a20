"""_solo.py - the "kaitian" group of one rank: every collective's result is
known without the core, so nothing is staged, copied to the host or waited
for. Ops whose result is their input (allreduce, broadcast, reduce, barrier)
do nothing; ops that fill an output from an input copy it with torch on the
caller's current stream (for a CUDA tensor an asynchronous device copy: no
synchronisation, and wait() has nothing left to order). Arguments are checked
as the group of several ranks checks them, with the same messages.
"""
from . import _lib
from . import _tensors as T
from ._opts import _one, _opt, _reduce_op
from ._work import _caller_mode
from .process_group import ProcessGroupKaitian


def _same_memory(a, b):
    """a and b share any byte."""
    if a.numel() == 0 or b.numel() == 0:
        return False
    pa, pb = a.data_ptr(), b.data_ptr()
    return pa < pb + b.numel() * b.element_size() and pb < pa + a.numel() * a.element_size()


def _fill(out, src):
    """out gets src's elements (shapes may differ, counts agree)."""
    if out.data_ptr() == src.data_ptr() and out.shape == src.shape and out.stride() == src.stride():
        return
    if _same_memory(out, src):
        src = src.clone()
    out.copy_(src.reshape(out.shape))


class ProcessGroupKaitianSolo(ProcessGroupKaitian):
    """ProcessGroupKaitian of size 1 (see the module's text)."""

    def __repr__(self):
        return "<ProcessGroupKaitian rank 0 of 1 (no communication)>"

    def _done(self, result):
        return self._completed(_caller_mode(3), result)

    def allreduce(self, tensors, opts=None):
        t, tensors = _one(tensors, "allreduce")
        op, opname = _reduce_op(opts)
        if not t.is_sparse:
            T.reduce_plan(t.dtype, op)  # the same refusals as with more ranks
        elif op != _lib.SUM:
            raise T.KaitianUnsupported(f"kaitian backend: sparse allreduce supports ReduceOp SUM "
                                       f"only, not {opname}")
        return self._done(tensors)

    def allreduce_coalesced(self, tensors, opts=None):
        op, _ = _reduce_op(opts)
        if tensors:
            T.reduce_plan(T.check_same(tensors, "allreduce_coalesced").dtype, op)
        return self._done(tensors)

    def broadcast(self, tensors, opts=None):
        _, tensors = _one(tensors, "broadcast")
        self._check_root(_opt(opts, "rootRank", 0), "broadcast")
        return self._done(tensors)

    def reduce(self, tensors, opts=None):
        t, tensors = _one(tensors, "reduce")
        op, _ = _reduce_op(opts)
        self._check_root(_opt(opts, "rootRank", 0), "reduce")
        T.reduce_plan(t.dtype, op)
        return self._done(tensors)

    def allgather(self, output_tensors, input_tensors, opts=None):
        t, _ = _one(input_tensors, "allgather")
        if len(output_tensors) != 1:
            raise ValueError("kaitian backend: allgather takes one output list per process, "
                             f"got {len(output_tensors)}")
        outs = output_tensors[0]
        self._check_list(outs, t, "allgather output")
        if outs[0].numel() != t.numel():
            raise ValueError(f"kaitian backend: allgather: output tensor 0 has {outs[0].numel()} "
                             f"elements but the input has {t.numel()}")
        _fill(outs[0], t)
        return self._done(output_tensors)

    def _allgather_base(self, output, input, opts=None, _mode=None):  # noqa: A002 - torch's names
        if output.numel() != input.numel():
            raise ValueError(f"kaitian backend: all_gather_into_tensor: output has {output.numel()} "
                             f"elements, expected 1 x {input.numel()}")
        if output.dtype != input.dtype:
            raise ValueError(f"kaitian backend: all_gather_into_tensor: output dtype {output.dtype} "
                             f"differs from input dtype {input.dtype}")
        _fill(output, input)
        return self._completed(_caller_mode() if _mode is None else _mode, [output])

    all_gather_into_tensor = _allgather_base
    all_gather_single = _allgather_base

    def allgather_coalesced(self, output_lists, input_list, opts=None):
        if len(output_lists) != 1:
            raise ValueError(f"kaitian backend: allgather_coalesced: {len(output_lists)} output "
                             f"lists, expected 1")
        outs = output_lists[0]
        if len(outs) != len(input_list):
            raise ValueError(f"kaitian backend: allgather_coalesced: output list 0 has "
                             f"{len(outs)} tensors, expected {len(input_list)}")
        for o, t in zip(outs, input_list):
            if o.numel() != t.numel() or o.dtype != t.dtype:
                raise ValueError(f"kaitian backend: allgather_coalesced: an output of "
                                 f"{o.numel()} {o.dtype} for an input of {t.numel()} {t.dtype}")
            _fill(o, t)
        return self._done(output_lists)

    def gather(self, output_tensors, input_tensors, opts=None, _mode=None):
        t, _ = _one(input_tensors, "gather")
        self._check_root(_opt(opts, "rootRank", 0), "gather")
        if len(output_tensors) != 1:
            raise ValueError("kaitian backend: gather: the root passes one output list")
        outs = output_tensors[0]
        self._check_list(outs, t, "gather output")
        if outs[0].numel() != t.numel():
            raise ValueError(f"kaitian backend: gather: output tensor 0 has {outs[0].numel()} "
                             f"elements, the input {t.numel()} (sizes must be equal)")
        _fill(outs[0], t)
        if _mode is not None:
            return self._completed(_mode, output_tensors)
        return self._done(output_tensors)

    def scatter(self, output_tensors, input_tensors, opts=None):
        t, output_tensors = _one(output_tensors, "scatter")
        self._check_root(_opt(opts, "rootRank", 0), "scatter")
        if len(input_tensors) != 1:
            raise ValueError("kaitian backend: scatter: the root passes one input list")
        ins = input_tensors[0]
        self._check_list(ins, t, "scatter input")
        if ins[0].numel() != t.numel():
            raise ValueError(f"kaitian backend: scatter: input tensor 0 has {ins[0].numel()} "
                             f"elements, the output {t.numel()} (sizes must be equal)")
        _fill(t, ins[0])
        return self._done(output_tensors)

    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        t, output_tensors = _one(output_tensors, "reduce_scatter")
        if len(input_tensors) != 1:
            raise ValueError("kaitian backend: reduce_scatter takes one input list per process")
        ins = input_tensors[0]
        self._check_list(ins, t, "reduce_scatter input")
        op, _ = _reduce_op(opts)
        T.reduce_plan(t.dtype, op)
        if ins[0].numel() != t.numel():
            raise ValueError(f"kaitian backend: reduce_scatter: input tensor 0 has "
                             f"{ins[0].numel()} elements, the output {t.numel()}")
        _fill(t, ins[0])
        return self._done(output_tensors)

    def _reduce_scatter_base(self, output, input, opts=None, _mode=None):  # noqa: A002
        if input.numel() != output.numel():
            raise ValueError(f"kaitian backend: reduce_scatter_tensor: input has {input.numel()} "
                             f"elements, expected 1 x {output.numel()}")
        if output.dtype != input.dtype:
            raise ValueError(f"kaitian backend: reduce_scatter_tensor: output dtype {output.dtype} "
                             f"differs from input dtype {input.dtype}")
        op, _ = _reduce_op(opts)
        T.reduce_plan(output.dtype, op)
        _fill(output, input)
        return self._completed(_caller_mode() if _mode is None else _mode, [output])

    reduce_scatter_tensor = _reduce_scatter_base
    reduce_scatter_single = _reduce_scatter_base

    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts=None,  # noqa: A002
                      _mode=None):
        if output.dtype != input.dtype:
            raise ValueError(f"kaitian backend: all_to_all_single: output dtype {output.dtype} "
                             f"differs from input dtype {input.dtype}")
        if not output_split_sizes and not input_split_sizes:
            if input.numel() != output.numel():
                raise ValueError(f"kaitian backend: all_to_all_single: input ({input.numel()}) and "
                                 f"output ({output.numel()}) must have the same size, divisible by "
                                 f"the group size 1")
        else:
            self._splits(input, input_split_sizes, 1, "input")
            self._splits(output, output_split_sizes, 1, "output")
            if input.numel() != output.numel():
                raise ValueError(f"kaitian backend: all_to_all_single: input ({input.numel()}) and "
                                 f"output ({output.numel()}) differ in size on a group of 1")
        _fill(output, input)
        if _mode is not None:
            return self._completed(_mode, [output])
        return self._done([output])

    def alltoall(self, output_tensors, input_tensors, opts=None):
        if len(output_tensors) != 1 or len(input_tensors) != 1:
            raise ValueError(f"kaitian backend: all_to_all: {len(input_tensors)} inputs and "
                             f"{len(output_tensors)} outputs, expected 1 each")
        o, i = output_tensors[0], input_tensors[0]
        if o.dtype != i.dtype:
            raise ValueError(f"kaitian backend: all_to_all: tensor dtypes differ ({o.dtype} vs "
                             f"{i.dtype})")
        if o.numel() != i.numel():
            raise ValueError(f"kaitian backend: all_to_all: output 0 has {o.numel()} elements, "
                             f"input 0 {i.numel()}")
        _fill(o, i)
        return self._done(list(output_tensors))

    def barrier(self, opts=None):
        return self._done([])
