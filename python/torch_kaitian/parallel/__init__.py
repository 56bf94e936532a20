"""torch_kaitian.parallel - the training toolkit for models that outgrow plain
data parallelism, over torch.distributed (any backend; fastest over "kaitian"):
Topology (process groups of a multi-dimensional job, in the order you choose),
ZeroOptimizer (ZeRO stage 1 and 2, node-local sharding, CPU offload, state
shared out by weight or memory), Pipeline and balance() (stages sized by each
device's speed),
tensor-parallel layers (ColumnParallelLinear, RowParallelLinear,
VocabParallelEmbedding, vocab_parallel_cross_entropy) and their conjugate
autograd functions.
See docs/parallel.md."""
from .balance import StagePlan, balance, cut
from .pipeline import Pipeline, PipelineError, average_gradients
from .tensor import (ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding,
                     copy_to_parallel, gather_from_parallel, reduce_from_parallel,
                     scatter_to_parallel, vocab_parallel_cross_entropy)
from .topology import Topology
from .zero import ZeroOptimizer

__all__ = ["Topology", "ZeroOptimizer", "Pipeline", "PipelineError", "average_gradients",
           "balance", "cut", "StagePlan",
           "ColumnParallelLinear", "RowParallelLinear", "VocabParallelEmbedding",
           "vocab_parallel_cross_entropy", "copy_to_parallel", "reduce_from_parallel",
           "scatter_to_parallel", "gather_from_parallel"]
