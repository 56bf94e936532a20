#!/usr/bin/python3
"""test_torchrun.py - torchrun starts a "kaitian" job that knows nothing of
KaiTian's launcher: 2 ranks whose script says only `import torch_kaitian` and
`dist.init_process_group("kaitian")` (torchrun's env://, its agent's store)
all-reduce, take one DDP step equal to one process's mean gradient, and
leave. Started twice: by the `torchrun` command beside this interpreter and
by `python -m torch.distributed.run`, both with --standalone (a free port).

Debian's torch 1.13 has a torchrun that cannot start anything under Python
3.11 (torch/distributed/elastic/multiprocessing/api.py to_map: AttributeError:
'NoneType' object has no attribute 'get', from an Enum that 3.11 changed):
there the test skips (exit 77) and says so, but only when torchrun fails in
exactly that way. The torch-2 pass (python2_torchrun) runs it.

Usage: test_torchrun.py (under CTest: PYTHONPATH and KAITIAN_LIBRARY of the
build); test_torchrun.py --job is one rank."""
import os
import re
import subprocess
import sys
import tempfile

BROKEN_113 = ("to_map", "'NoneType' object has no attribute 'get'")


def job():
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import torch_kaitian  # noqa: F401 - registers "kaitian"

    dist.init_process_group("kaitian")
    r, n = dist.get_rank(), dist.get_world_size()
    assert n == 2, f"world size {n}, expected 2"
    assert os.environ.get("TORCHELASTIC_RUN_ID"), "not started by torchrun"
    assert int(os.environ["LOCAL_RANK"]) == r, (os.environ["LOCAL_RANK"], r)
    assert dist.get_backend() == "kaitian", dist.get_backend()

    t = torch.full((5,), float(r + 1))
    dist.all_reduce(t)
    assert t.tolist() == [3.0] * 5, f"rank {r}: all_reduce gave {t.tolist()}, expected 3.0 x 5"

    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    ddp = DDP(model)
    x = torch.arange(6.0).reshape(2, 3) + 10 * r   # rank 0: 0..5, rank 1: 10..15
    ddp(x).sum().backward()
    # d/dW of sum(W x + b) is the sum of the rows; DDP averages over ranks.
    rows = [torch.arange(6.0).reshape(2, 3).sum(0) + 20 * k for k in range(n)]
    want = torch.stack(rows).mean(0)
    got = model.weight.grad.reshape(-1)
    assert torch.allclose(got, want), f"rank {r}: DDP weight gradient {got.tolist()}, expected {want.tolist()}"
    assert torch.allclose(model.bias.grad, torch.tensor([2.0])), f"rank {r}: bias gradient {model.bias.grad}"
    dist.barrier()
    dist.destroy_process_group()
    print(f"rank {r}: ok under torchrun (torch {torch.__version__})", flush=True)


def launch(cmd):
    # torchrun's agent makes a log directory (torchelastic_*) under TMPDIR and
    # leaves it: give it one of ours, removed after.
    with tempfile.TemporaryDirectory(prefix="kt-torchrun-") as tmp:
        env = dict(os.environ, TMPDIR=tmp)
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=240,
                           env=env)
    return p.returncode, p.stdout


def main():
    import torch
    major = int(torch.__version__.split(".")[0])
    here = os.path.abspath(__file__)
    args = ["--standalone", "--nproc_per_node", "2", here, "--job"]
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    runs = [("python -m torch.distributed.run", [sys.executable, "-m", "torch.distributed.run", *args])]
    if os.access(torchrun, os.X_OK):
        runs.append((torchrun, [torchrun, *args]))
    elif major >= 2:
        sys.exit(f"FAIL: no torchrun command beside {sys.executable}")
    for name, cmd in runs:
        rc, out = launch(cmd)
        if rc != 0 and major < 2 and all(s in out for s in BROKEN_113):
            print(f"SKIP: torch {torch.__version__}'s torchrun is broken on Python "
                  f"{sys.version.split()[0]} (torch/distributed/elastic/multiprocessing/api.py "
                  f"to_map: AttributeError: 'NoneType' object has no attribute 'get'); "
                  f"torchrun is tested under torch 2.x (python2_torchrun)")
            sys.exit(77)
        # torchrun passes the ranks' output through as it comes: two lines may
        # end up on one, so count the reports, not the lines.
        oks = sorted(set(re.findall(r"rank (\d+): ok under torchrun \(torch [^)]*\)", out)))
        if rc != 0 or oks != ["0", "1"]:
            sys.exit(f"FAIL: {name} exited with {rc}; ranks that reported ok: {oks or 'none'} "
                     f"(expected 0 and 1):\n{out}")
        print(f"{name}: ranks 0 and 1 ok")
    print("PASS torchrun")


if __name__ == "__main__":
    job() if sys.argv[1:] == ["--job"] else main()
