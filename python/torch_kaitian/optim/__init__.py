"""torch_kaitian.optim - optimizers on KaiTian's C kernels (src/optim).

    from torch_kaitian.optim import CPUAdam
    opt = CPUAdam(model.parameters(), lr=1e-3, weight_decay=0.01)   # AdamW

CPUAdam is torch.optim.Adam/AdamW for CPU parameters (float32, or bfloat16 /
float16 with a float32 master copy), bit for bit torch's float32 results;
adam_step() is the same step on flat tensors. See docs/api.md
("Optimizer kernels")."""
from .cpu_adam import CPUAdam, adam_step

__all__ = ["CPUAdam", "adam_step"]
