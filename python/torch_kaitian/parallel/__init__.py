"""torch_kaitian.parallel - the training toolkit for models that outgrow plain
data parallelism, over torch.distributed (any backend; fastest over "kaitian"):
Topology (process groups of a multi-dimensional job, in the order you choose).
See docs/parallel.md."""
from .topology import Topology

__all__ = ["Topology"]
