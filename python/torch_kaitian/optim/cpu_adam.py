"""cpu_adam.py - Adam and AdamW on CPU tensors through the C kernels of
src/optim (kt_adam_step): one pass over each parameter, split across threads,
the same formula and rounding as torch.optim.Adam / AdamW.

CPUAdam is a torch.optim.Optimizer. float32 parameters are stepped in place.
bfloat16 and float16 parameters keep a float32 master copy in the state
("master"); each step updates the master and the moments and writes the
rounded result into the parameter in the same pass. adam_step() is the same
step on flat tensors, for callers that keep their own master weights and
state (ZeRO offload: a flat fp32 shard on the CPU, its bf16 copy beside it).
"""
import ctypes
import math

import torch

from .. import _lib
from .._completion import KaitianError

__all__ = ["CPUAdam", "adam_step"]

_KT_DTYPE = {torch.float32: _lib.FLOAT32, torch.float16: _lib.FLOAT16,
             torch.bfloat16: _lib.BFLOAT16}
_LOW_PRECISION = (torch.float16, torch.bfloat16)
_STATE_FP32 = ("exp_avg", "exp_avg_sq", "master")


def _check_tensor(t, what, dtypes):
    """t must be a dense, contiguous CPU tensor of one of dtypes."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{what}: expected a torch.Tensor, got {type(t).__name__}")
    if t.layout != torch.strided:
        raise ValueError(f"{what}: {t.layout} tensors are not supported (dense tensors only; "
                         "for sparse gradients use torch.optim.SparseAdam)")
    if t.device.type != "cpu":
        raise ValueError(f"{what}: tensor is on {t.device}; CPUAdam steps CPU tensors only "
                         "(move the parameters, or keep a CPU master copy)")
    if t.dtype not in dtypes:
        names = ", ".join(str(d).replace("torch.", "") for d in dtypes)
        raise ValueError(f"{what}: dtype {str(t.dtype).replace('torch.', '')} is not supported "
                         f"({names})")
    if not t.is_contiguous():
        raise ValueError(f"{what}: tensor of shape {tuple(t.shape)} and strides {t.stride()} is "
                         "not contiguous; the kernel steps contiguous memory only")


def adam_step(param, grad, exp_avg, exp_avg_sq, *, step, lr, beta1=0.9, beta2=0.999, eps=1e-8,
              weight_decay=0.0, adamw=True, bias_correction=True, param_copy=None, threads=0):
    """One Adam/AdamW step in place on param, exp_avg and exp_avg_sq (float32,
    contiguous, on the CPU, equal numel; the moments zero before step 1).
    grad: float32, float16 or bfloat16 of the same numel. param_copy: None, or
    a float32/float16/bfloat16 tensor of the same numel that receives the
    updated param (rounded to nearest even) in the same pass. step: this
    step's number (1 for the first). threads: 0 for KAITIAN_OPTIM_THREADS or
    the CPUs this thread may use. Hyperparameters are checked by the kernel;
    a bad one raises KaitianError naming it, with nothing changed."""
    _check_tensor(param, "param", (torch.float32,))
    _check_tensor(grad, "grad", tuple(_KT_DTYPE))
    _check_tensor(exp_avg, "exp_avg", (torch.float32,))
    _check_tensor(exp_avg_sq, "exp_avg_sq", (torch.float32,))
    tensors = [("grad", grad), ("exp_avg", exp_avg), ("exp_avg_sq", exp_avg_sq)]
    if param_copy is not None:
        _check_tensor(param_copy, "param_copy", tuple(_KT_DTYPE))
        tensors.append(("param_copy", param_copy))
    n = param.numel()
    for name, t in tensors:
        if t.numel() != n:
            raise ValueError(f"{name} has {t.numel()} elements, param has {n}")
    cfg = _lib.AdamConfig(ctypes.sizeof(_lib.AdamConfig), float(lr), float(beta1), float(beta2),
                          float(eps), float(weight_decay), int(bool(adamw)),
                          int(bool(bias_correction)), int(step), int(threads))
    copy_ptr = param_copy.data_ptr() if param_copy is not None else None
    copy_dtype = _KT_DTYPE[param_copy.dtype] if param_copy is not None else _lib.FLOAT32
    rc = _lib.lib.kt_adam_step(ctypes.byref(cfg), param.data_ptr(), grad.data_ptr(),
                               _KT_DTYPE[grad.dtype], exp_avg.data_ptr(), exp_avg_sq.data_ptr(),
                               copy_ptr, copy_dtype, n)
    if rc != _lib.SUCCESS:
        raise KaitianError(rc, f"{_lib.strerror(rc)}: {_lib.last_error()}")


def _check_hyper(lr, betas, eps, weight_decay):
    """As torch.optim.Adam checks them (and finite, as the kernel wants)."""
    if not (0.0 <= lr < math.inf):
        raise ValueError(f"Invalid learning rate: {lr}")
    if not (0.0 <= eps < math.inf):
        raise ValueError(f"Invalid epsilon value: {eps}")
    if len(betas) != 2:
        raise ValueError(f"betas must be a pair (beta1, beta2), got {betas!r}")
    for i, b in enumerate(betas):
        if not (0.0 <= b < 1.0):
            raise ValueError(f"Invalid beta parameter at index {i}: {b}")
    if not (0.0 <= weight_decay < math.inf):
        raise ValueError(f"Invalid weight_decay value: {weight_decay}")


class CPUAdam(torch.optim.Optimizer):
    """Adam (adamw=False: weight decay added to the gradient) or AdamW
    (adamw=True: decoupled weight decay) over CPU parameters, on KaiTian's C
    kernels. With bias_correction=False the moments are used as they are.

    Parameters: float32, or bfloat16/float16 with a float32 master copy in
    the state. Gradients: dense, of the parameter's dtype. Parameters and
    gradients must be contiguous CPU tensors. state_dict() has torch.optim.
    Adam's layout ("step" as a float32 tensor, "exp_avg", "exp_avg_sq"; plus
    "master" for low-precision parameters), so states load both ways.
    threads: 0 for KAITIAN_OPTIM_THREADS or the CPUs this process may use."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0,
                 adamw=True, bias_correction=True, *, threads=0):
        _check_hyper(lr, betas, eps, weight_decay)
        if int(threads) < 0:
            raise ValueError(f"threads must be >= 0 (0: automatic), got {threads}")
        if not hasattr(_lib.lib, "kt_adam_step"):
            raise RuntimeError(f"CPUAdam: {_lib.path} predates kt_adam_step; rebuild libkaitian")
        self.threads = int(threads)
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay,
                        adamw=bool(adamw), bias_correction=bool(bias_correction))
        super().__init__(params, defaults)

    def add_param_group(self, param_group):
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        _check_hyper(group["lr"], group["betas"], group["eps"], group["weight_decay"])
        gi = len(self.param_groups) - 1
        for pi, p in enumerate(group["params"]):
            _check_tensor(p, f"CPUAdam: param {pi} of group {gi}", tuple(_KT_DTYPE))

    def __setstate__(self, state):
        super().__setstate__(state)
        for group in self.param_groups:
            group.setdefault("adamw", self.defaults.get("adamw", True))
            group.setdefault("bias_correction", self.defaults.get("bias_correction", True))

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for gi, group in enumerate(self.param_groups):
            if group.get("amsgrad") or group.get("maximize"):
                raise ValueError(f"CPUAdam: group {gi} asks for amsgrad or maximize, which "
                                 "CPUAdam does not implement")
            for pi, p in enumerate(group["params"]):
                if p.grad is not None:
                    self._step_param(p, group, f"CPUAdam: param {pi} of group {gi}")
        return loss

    def _step_param(self, p, group, what):
        _check_tensor(p, what, tuple(_KT_DTYPE))
        grad = p.grad
        if grad.dtype != p.dtype:
            raise ValueError(f"{what}: grad dtype {str(grad.dtype).replace('torch.', '')} differs "
                             f"from the parameter's {str(p.dtype).replace('torch.', '')}")
        _check_tensor(grad, f"{what}: grad", tuple(_KT_DTYPE))
        state = self._state_for(p, what)
        master = state.get("master")
        beta1, beta2 = group["betas"]
        adam_step(p if master is None else master, grad, state["exp_avg"], state["exp_avg_sq"],
                  step=int(state["step"].item()) + 1, lr=group["lr"], beta1=beta1, beta2=beta2,
                  eps=group["eps"], weight_decay=group["weight_decay"], adamw=group["adamw"],
                  bias_correction=group["bias_correction"],
                  param_copy=None if master is None else p, threads=self.threads)
        state["step"] += 1  # only once the step succeeded: a failed one changes nothing

    def _state_for(self, p, what):
        """p's state, made on first use; state loaded from elsewhere is
        checked (and a missing master made from the parameter)."""
        state = self.state[p]
        if "step" not in state:
            state["step"] = torch.tensor(0.0)
        elif not isinstance(state["step"], torch.Tensor):
            state["step"] = torch.tensor(float(state["step"]))
        for key in ("exp_avg", "exp_avg_sq"):
            if key not in state:
                state[key] = torch.zeros(p.shape, dtype=torch.float32)
        if p.dtype in _LOW_PRECISION and "master" not in state:
            state["master"] = p.detach().to(torch.float32, copy=True).contiguous()
        for key in _STATE_FP32:
            if key in state:
                t = state[key]
                _check_tensor(t, f"{what}: state {key!r}", (torch.float32,))
                if t.numel() != p.numel():
                    raise ValueError(f"{what}: state {key!r} has {t.numel()} elements, the "
                                     f"parameter {p.numel()} (a state_dict of other parameters?)")
        return state

    def load_state_dict(self, state_dict):
        """torch's load_state_dict, except that the moments and master copies
        stay float32 whatever the parameter's dtype (torch casts them to it),
        and that groups saved without CPUAdam's keys (a torch.optim.Adam
        state) keep this optimizer's adamw and bias_correction."""
        saved_groups = state_dict["param_groups"]
        if len(saved_groups) == len(self.param_groups):
            groups = []
            for saved, mine in zip(saved_groups, self.param_groups):
                g = dict(saved)
                for key in ("adamw", "bias_correction"):
                    g.setdefault(key, mine[key])
                groups.append(g)
            state_dict = dict(state_dict, param_groups=groups)
        super().load_state_dict(state_dict)
        ids = [i for g in state_dict["param_groups"] for i in g["params"]]
        params = [p for g in self.param_groups for p in g["params"]]
        by_id = dict(zip(ids, params))
        for pid, saved in state_dict["state"].items():
            p = by_id.get(pid)
            if p is None:
                continue
            for key in _STATE_FP32:
                if isinstance(saved.get(key), torch.Tensor):
                    self.state[p][key] = saved[key].detach().to(
                        device="cpu", dtype=torch.float32, copy=True).contiguous()
