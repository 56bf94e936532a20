#!/usr/bin/python3
"""test_import.py - the package imports (and re-imports) cleanly, registers
"kaitian" once, finds the library in the documented order and names every
place it looked when it cannot; the seed API works without a process group.
Usage: test_import.py (KAITIAN_LIBRARY may point at the library under test)."""
import importlib
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
PKG_ROOT = os.path.join(HERE, "..", "..", "python")
sys.path.insert(0, PKG_ROOT)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import torch_kaitian  # noqa: E402

assert "KAITIAN" in dist.Backend._plugins, dist.Backend._plugins
assert dist.Backend("kaitian") == "kaitian"
importlib.reload(torch_kaitian)  # a second registration must not fail
import torch_kaitian as again  # noqa: E402,F811
assert again.core_version.count(".") == 2, again.core_version
assert os.path.exists(again.library_path), again.library_path
if os.environ.get("KAITIAN_LIBRARY"):
    assert os.path.samefile(again.library_path, os.environ["KAITIAN_LIBRARY"]), again.library_path

# Seed API before any process group.
assert torch_kaitian.global_rank() == int(os.environ.get("RANK", "0"))
assert torch_kaitian.global_world_size() == int(os.environ.get("WORLD_SIZE", "1"))
assert torch_kaitian.local_device_count() >= 1
torch_kaitian.set_device(0)
assert torch_kaitian.device().type == ("cuda" if torch.cuda.is_available() else "cpu")
torch_kaitian.manual_seed(5)
a = torch.rand(3)
torch_kaitian.manual_seed(5)
assert torch.equal(a, torch.rand(3)), "manual_seed does not reproduce"
try:
    torch_kaitian.set_device(torch_kaitian.local_device_count())
except ValueError as e:
    assert "set_device" in str(e), e
else:
    raise AssertionError("set_device out of range did not raise")

# A library that cannot be loaded: the error names it and what to do.
env = dict(os.environ, KAITIAN_LIBRARY="/nonexistent/libkaitian.so", PYTHONPATH=PKG_ROOT)
p = subprocess.run([sys.executable, "-c", "import torch_kaitian"], env=env, capture_output=True, text=True)
assert p.returncode != 0, "import succeeded without a library"
assert "/nonexistent/libkaitian.so" in p.stderr and "KAITIAN_LIBRARY" in p.stderr, p.stderr
print("PASS import, registration, library lookup, seed API")
