#!/usr/bin/python3
"""test_device.py - the seed API follows KAITIAN_DEVICE, the launcher's device
plan: cpu; an accelerator type (a fake torch.xpu module standing in for any
torch.<type>, so the generic path is checked without a GPU); CUDA asked for on
a host without it; malformed values and types this torch lacks are errors that
name the variable and the rank; without the variable nothing changes.
Usage: test_device.py (KAITIAN_LIBRARY may point at the library under test)."""
import importlib
import os
import sys
import types

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))

import torch  # noqa: E402

import torch_kaitian  # noqa: E402
from torch_kaitian import _device  # noqa: E402


def fresh(value):
    """_device as a new process would see it with KAITIAN_DEVICE=value (None: unset)."""
    if value is None:
        os.environ.pop("KAITIAN_DEVICE", None)
    else:
        os.environ["KAITIAN_DEVICE"] = value
    return importlib.reload(_device)


def raises(exc, words, fn, *args):
    try:
        fn(*args)
    except exc as e:
        for w in words:
            assert w in str(e), f"{fn.__name__}{args}: {w!r} not in: {e}"
        return
    raise AssertionError(f"{fn.__name__}{args} did not raise {exc.__name__}")


os.environ["RANK"] = "5"

# Unset: as before the plan existed (CUDA when torch sees it, else the CPU).
d = fresh(None)
want = "cuda" if torch.cuda.is_available() else "cpu"
assert d.device().type == want, d.device()
assert d.local_device_count() == (torch.cuda.device_count() if want == "cuda" else 1)
d.set_device(0)

# cpu: one device, index 0 only; the top-level names are the same functions.
d = fresh("cpu")
assert d.device() == torch.device("cpu"), d.device()
assert d.local_device_count() == 1
d.set_device(0)
assert d.device() == torch.device("cpu")
raises(ValueError, ["set_device(1)", "KAITIAN_DEVICE=cpu", "rank 5"], d.set_device, 1)
d.manual_seed(3)
a = torch.rand(4)
d.manual_seed(3)
assert torch.equal(a, torch.rand(4)), "manual_seed does not reproduce under KAITIAN_DEVICE=cpu"
assert torch_kaitian.device() == torch.device("cpu")  # the package's own binding
assert fresh("cpu:0").device() == torch.device("cpu")

# Malformed values: ValueError naming the variable, the value and the rank.
for bad in ["cuda:x", "cuda:-1", ":1", "CUDA:0", "cuda:1:2", "cpu:1", "cuda 0"]:
    d = fresh(bad)
    raises(ValueError, ["KAITIAN_DEVICE=" + bad, "rank 5"], d.device)
    raises(ValueError, ["KAITIAN_DEVICE=" + bad], d.local_device_count)

# A type this torch lacks.
d = fresh("nosuchdev:0")
raises(RuntimeError, ["KAITIAN_DEVICE=nosuchdev:0", "rank 5", "'nosuchdev'"], d.device)
raises(RuntimeError, ["nosuchdev"], d.local_device_count)

# CUDA planned where torch sees fewer devices.
n = torch.cuda.device_count()
d = fresh(f"cuda:{n}")
raises(RuntimeError, [f"KAITIAN_DEVICE=cuda:{n}", "rank 5", f"has {n} cuda device"], d.device)


# Any torch.<type> module: a fake xpu with 3 devices (torch.device("xpu", i)
# exists in every torch this package supports).
class FakeXpu(types.ModuleType):
    def __init__(self):
        super().__init__("torch.xpu")
        self.calls, self.seeds, self.cur = [], [], 0

    def device_count(self):
        return 3

    def set_device(self, i):
        self.calls.append(i)
        self.cur = i

    def manual_seed_all(self, s):
        self.seeds.append(s)

    def _is_in_bad_fork(self):  # torch >= 2.15's torch.manual_seed asks every device module
        return False

    def is_available(self):
        return True


had = getattr(torch, "xpu", None)
torch.xpu = fake = FakeXpu()
try:
    d = fresh("xpu:2")
    assert d.local_device_count() == 3
    assert fake.calls == [], "local_device_count selected a device"
    assert d.device() == torch.device("xpu", 2), d.device()
    assert d.device() == torch.device("xpu", 2)
    assert fake.calls == [2], f"the plan's device made current {fake.calls}, expected once"
    d.set_device(1)  # the user's choice wins over the plan
    assert d.device() == torch.device("xpu", 1) and fake.cur == 1, (d.device(), fake.cur)
    raises(ValueError, ["set_device(3)", "3 xpu devices"], d.set_device, 3)
    d.manual_seed(7)
    # Seeded with 7 (torch >= 2.15's own manual_seed seeds every device module too).
    assert fake.seeds and set(fake.seeds) == {7}, fake.seeds

    # set_device before device(): the plan's index is never applied.
    fake.calls.clear()
    d = fresh("xpu:2")
    d.set_device(0)
    assert d.device() == torch.device("xpu", 0) and fake.calls == [0], fake.calls

    # Out of this host's range.
    d = fresh("xpu:3")
    raises(RuntimeError, ["KAITIAN_DEVICE=xpu:3", "rank 5", "has 3 xpu devices"], d.device)
finally:
    if had is None:
        del torch.xpu
    else:
        torch.xpu = had
    fresh(None)
print("PASS device: KAITIAN_DEVICE cpu, fake xpu, errors; unset unchanged")
