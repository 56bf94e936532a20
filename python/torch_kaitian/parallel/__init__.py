"""torch_kaitian.parallel - the training toolkit for models that outgrow plain
data parallelism, over torch.distributed (any backend; fastest over "kaitian"):
Topology (process groups of a multi-dimensional job, in the order you choose),
ZeroOptimizer (ZeRO stage 1 and 2, node-local sharding, CPU offload).
See docs/parallel.md."""
from .pipeline import Pipeline, PipelineError, average_gradients
from .topology import Topology
from .zero import ZeroOptimizer

__all__ = ["Topology", "ZeroOptimizer", "Pipeline", "PipelineError", "average_gradients"]
