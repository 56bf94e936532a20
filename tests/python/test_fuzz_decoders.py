"""test_fuzz_decoders.py - the Python layer's decoders fuzzed in process with
Python's own tools (random, struct; no extra package), one process, no ranks:

  pipeline  Pipeline._parse and _parse_error, the header a stage receives from
            its neighbour (parallel/pipeline.py): random int64 words, headers
            re-encoded from random valid tensors (Pipeline._header on meta
            tensors) with one field mutated, and error headers (a failed
            stage and its text's length: Pipeline._error_header) likewise;
  caps      hetero._parse_caps, KAITIAN_CAPABILITIES: random text, and lists of
            random numbers spelled in random ways;
  device    _device._plan, KAITIAN_DEVICE (the launcher's --devices plan as a
            rank sees it): random text, and TYPE:INDEX spellings;
  store     the store bridge's readers (_store._StoreBridge: get into a buffer
            of the C side's capacity, add), against a store whose values and
            counters are random.

Every input either decodes to what a re-encode gives back (a header re-encoded
from the decoded tensors has the same words; a capability list parsed again
from its repr gives the same numbers; a device reads back as the text said; a
store value arrives whole or as KT_ERR_TRUNCATED with its length) or raises
ValueError naming the field, never another exception, never a hang (each call
under a 2 s alarm).

Usage: test_fuzz_decoders.py [SECONDS per decoder, default 3] [--seed N]
Prints the executions per decoder; exits 1 on the first finding, printing
the input (repr) to make a regression case of it (REGRESSIONS: run first,
every time).
"""
import argparse
import ctypes
import math
import os
import random
import re
import signal
import sys
import time
import types

import torch

import torch_kaitian  # noqa: F401  (the package, as a rank imports it)
from torch_kaitian import _device, _lib, _store, hetero
from torch_kaitian.parallel import pipeline as pp

FINDINGS = []


class Hang(Exception):
    pass


def _alarm(_sig, _frm):
    raise Hang()


def call(fn, *args):
    """fn(*args) under a 2 s alarm: ('ok', result) or ('raise', exception)."""
    signal.setitimer(signal.ITIMER_REAL, 2.0)
    try:
        return "ok", fn(*args)
    except Hang:
        return "hang", None
    except Exception as e:  # noqa: BLE001 - the type is what is checked
        return "raise", e
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)


def finding(what, inp, detail):
    FINDINGS.append(what)
    print(f"FINDING {what}: {detail}\n  input: {inp!r}", file=sys.stderr)


def expect_value_error(what, inp, kind, res, names):
    """A rejection must be a ValueError whose text names one of names."""
    if kind == "hang":
        finding(what, inp, "hangs (2 s)")
    elif kind == "raise" and not isinstance(res, ValueError):
        finding(what, inp, f"raises {type(res).__name__}: {res}")
    elif kind == "raise" and not any(n in str(res) for n in names):
        finding(what, inp, f"ValueError names no field ({names}): {res}")


# ---- pipeline headers ------------------------------------------------------------
_ENC = types.SimpleNamespace(_ctl=torch.device("cpu"))
_HDR_FIELDS = ("count", "dtype", "requires_grad", "dimensions", "size", "padding")
_ERR_FIELDS = ("kind", "error text length", "failed stage", "padding")


def encode(meta):
    ts = []
    for dt, rg, shape in meta:
        t = torch.empty(shape, dtype=dt, device="meta")
        if rg:
            t.requires_grad_(True)
        ts.append(t)
    return pp.Pipeline._header(_ENC, ts)


def random_meta(rng):
    meta = []
    for _ in range(rng.randint(0, pp._MAX_TENSORS)):
        dt = rng.choice(pp._DTYPES)
        rg = rng.random() < 0.5 and (dt.is_floating_point or dt.is_complex)
        shape = tuple(rng.choice([0, 1, 2, 3, 7, 1024, 2 ** 20]) for _ in range(rng.randint(0, 8)))
        while math.prod(max(x, 1) for x in shape) >= 2 ** 58:  # a tensor torch can describe
            shape = shape[1:]
        meta.append((dt, rg, shape))
    return meta


def header_words(rng):
    r = rng.random()
    if r < 0.3:  # anything
        w = [rng.choice([0, 1, -1, 2, 9, 10, 11, 12, 2 ** 31, -2 ** 63, 2 ** 63 - 1, rng.getrandbits(64) - 2 ** 63])
             for _ in range(pp._HDR)]
        w[0] = pp._OK
        return w
    w = encode(random_meta(rng)).tolist()
    for _ in range(rng.randint(1, 3)):  # mutate a word a decoder reads
        i = rng.randrange(1, min(pp._HDR, 2 + 11 * pp._MAX_TENSORS))
        w[i] = rng.choice([-1, 0, 1, 2, 8, 9, 11, 12, 2 ** 40, -2 ** 63, 2 ** 63 - 1, len(pp._DTYPES)])
    return w


_WORDS = [0, 1, -1, 2, 3, 4000, 4001, 2 ** 31 - 1, 2 ** 31, -2 ** 63, 2 ** 63 - 1]


def error_header_words(rng):
    if rng.random() < 0.3:  # anything after the kind
        w = [rng.choice(_WORDS + [rng.getrandbits(64) - 2 ** 63]) for _ in range(pp._HDR)]
    else:  # a stage's own, with a word mutated
        w = pp.Pipeline._error_header(rng.randrange(0, 64), rng.randrange(0, pp._ERR_TEXT + 1)).tolist()
        for _ in range(rng.randint(0, 2)):
            w[rng.randrange(1, pp._HDR)] = rng.choice(_WORDS)
    w[0] = pp._ERROR if rng.random() < 0.9 else rng.choice(_WORDS[2:])
    return w


def fuzz_pipeline_error(rng):
    w = error_header_words(rng)
    kind, res = call(pp.Pipeline._parse_error, torch.tensor(w, dtype=torch.int64))
    if kind != "ok":
        return expect_value_error("pipeline error header", w, kind, res, _ERR_FIELDS)
    stage, n = res
    if not (0 <= n <= pp._ERR_TEXT and stage >= 0):
        return finding("pipeline error header", w, f"accepted stage {stage}, {n} bytes of text")
    back = pp.Pipeline._error_header(stage, n).tolist()
    if back != w:
        finding("pipeline error header", w, f"decoded to {res}; re-encoded differs: {back}")


def fuzz_pipeline(rng):
    if rng.random() < 0.3:
        return fuzz_pipeline_error(rng)
    w = header_words(rng)
    h = torch.tensor(w, dtype=torch.int64)
    kind, res = call(pp.Pipeline._parse, h)
    if kind != "ok":
        return expect_value_error("pipeline", w, kind, res, _HDR_FIELDS)
    kind2, back = call(encode, res)
    if kind2 != "ok":
        return finding("pipeline", w, f"decoded to {res}, which cannot be re-encoded: {back!r}")
    if back.tolist()[1:] != w[1:]:
        finding("pipeline", w, f"decoded to {res}; re-encoded differs: {back.tolist()}")


# ---- KAITIAN_CAPABILITIES ----------------------------------------------------------
_ALPHABET = "0123456789.,-+eE _infatyINFNAxj\t\n\x00"


def caps_text(rng):
    if rng.random() < 0.4:
        return "".join(rng.choice(_ALPHABET) for _ in range(rng.randint(0, 40))), rng.randint(1, 6)
    world = rng.randint(1, 6)
    vals = [rng.choice([0, 1, 2.5, 1e-300, 1e300, rng.random() * 100, -1, float("inf"), float("nan")])
            for _ in range(world + rng.choice([0, 0, 0, -1, 1]))]
    spell = [rng.choice(["{!r}", "{:.3g}", " {} ", "{:e}"]).format(v) for v in vals]
    return ",".join(spell), world


def fuzz_caps(rng):
    text, world = caps_text(rng)
    kind, res = call(hetero._parse_caps, text, world)
    if kind != "ok":
        return expect_value_error("caps", (text, world), kind, res, ("KAITIAN_CAPABILITIES",))
    if len(res) != world or any(not math.isfinite(v) or v < 0 for v in res) or sum(res) <= 0:
        return finding("caps", (text, world), f"accepted {res}")
    kind, again = call(hetero._parse_caps, ",".join(repr(v) for v in res), world)
    if kind != "ok" or again != res:
        finding("caps", (text, world), f"{res} does not read back: {again!r}")


# ---- KAITIAN_DEVICE -----------------------------------------------------------------
_TYPES = ["cpu", "cuda", "xpu", "mps", "meta", "nn", "optim", "foo", "Cuda", "privateuseone", "_C"]


def device_text(rng):
    if rng.random() < 0.3:
        return "".join(rng.choice("acpuda:0123456789x_- \n") for _ in range(rng.randint(0, 12)))
    t = rng.choice(_TYPES)
    r = rng.random()
    if r < 0.3:
        return t
    idx = rng.choice(["0", "1", "7", "-1", "00", "99999999999999999999", "", "1.5", "0x1"])
    return f"{t}:{idx}"


def fuzz_device(rng):
    text = device_text(rng)
    os.environ["KAITIAN_DEVICE"] = text
    try:
        kind, res = call(_device._plan)
    finally:
        del os.environ["KAITIAN_DEVICE"]
    if kind != "ok":
        return expect_value_error("device", text, kind, res, ("KAITIAN_DEVICE",))
    if not text:
        return None if res is None else finding("device", text, f"empty text gave {res}")
    m = re.fullmatch(r"([a-z][a-z0-9_]*)(?::([0-9]+))?", text)
    ok = m and res[0] == m.group(1) and (res[1] is None if res[0] == "cpu" else res[1] == int(m.group(2) or 0))
    if not ok:
        finding("device", text, f"decoded to {res[:2]}")


# ---- the store bridge's readers -------------------------------------------------------
class RandomStore:
    """torch's Store interface as the bridge uses it, with random answers."""

    def __init__(self, rng):
        self.rng = rng
        self.values = {}

    def set(self, k, v):
        self.values[k] = v

    def get(self, k):
        r = self.rng.random()
        if r < 0.05:
            raise RuntimeError("store: connection reset")  # what torch raises on a lost store
        return self.values.setdefault(k, bytes(self.rng.getrandbits(8) for _ in range(self.rng.choice([0, 1, 7, 64, 300]))))

    def wait(self, keys, timeout=None):
        if self.rng.random() < 0.05:
            raise RuntimeError("Wait timeout")

    def add(self, k, d):
        r = self.rng.random()
        if r < 0.05:
            raise RuntimeError("store: connection reset")
        return self.rng.choice([0, 1, 2 ** 62, -2 ** 62, 2 ** 63 - 2]) + d  # torch's counters are int64

    def check(self, keys):
        return self.rng.random() < 0.5


def fuzz_store(rng):
    bridge = _store.StoreBridge(RandomStore(rng))
    try:
        store_calls(rng, bridge)
    finally:
        bridge.free()


def store_calls(rng, bridge):
    key = ("k%d" % rng.randrange(4)).encode()
    cap = rng.choice([0, 1, 16, 64, 4096])
    buf = ctypes.create_string_buffer(max(cap, 1))
    length = (ctypes.c_size_t * 1)()
    kind, rc = call(bridge._get, None, key, buf, cap, length, rng.choice([-1, 0, 100]))
    if kind != "ok":
        return finding("store", (key, cap), f"get raised {type(rc).__name__}: {rc}")
    v = bridge.store.values.get(key.decode())
    if rc == _lib.SUCCESS:
        if v is None or length[0] != len(v) or buf.raw[:len(v)] != v:
            finding("store", (key, cap), f"get: SUCCESS but the buffer is not the value {v!r}")
    elif rc == _lib.ERR_TRUNCATED:
        if v is None or length[0] != len(v) or len(v) <= cap:
            finding("store", (key, cap), "get: TRUNCATED without a longer value and its length")
    res = (ctypes.c_int64 * 1)()
    kind, rc = call(bridge._add, None, key, rng.choice([0, 1, -1]), res)
    if kind != "ok":
        finding("store", key, f"add raised {type(rc).__name__}: {rc}")


def _hdr(*words):
    return list(words) + [0] * (pp._HDR - len(words))


# Inputs that once decoded wrongly (each fixed), run first every time: each
# must raise ValueError naming the field.
REGRESSIONS = [
    (pp.Pipeline._parse, _hdr(0, 12), "count"),                       # was IndexError
    (pp.Pipeline._parse, _hdr(0, 1, -1, 0, 1, 4), "dtype"),           # was the last dtype
    (pp.Pipeline._parse, _hdr(0, 1, 0, 0, 1, -4), "size"),            # went on to torch.empty
    (pp.Pipeline._parse, _hdr(0, 1, 0, 0, 2, 2 ** 40, 2 ** 40), "size"),  # storage beyond 2^63 bytes
    (pp.Pipeline._parse, _hdr(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 7), "padding"),  # was ignored
    (pp.Pipeline._parse_error, _hdr(1, -1, 0), "error text length"),  # was RuntimeError
    (pp.Pipeline._parse_error, _hdr(1, 2 ** 40, 0), "error text length"),  # was allocated
    (pp.Pipeline._parse_error, _hdr(2, 10, 0), "kind"),               # counted as an error
]


def run_regressions():
    for fn, words, field in REGRESSIONS:
        kind, res = call(fn, torch.tensor(words, dtype=torch.int64))
        if kind != "raise" or not isinstance(res, ValueError) or field not in str(res):
            finding(f"regression {fn.__name__}", words[:16], f"expected ValueError naming {field!r}, got {kind} {res!r}")
    print(f"regressions: {len(REGRESSIONS)} inputs, {len(FINDINGS)} findings")


DECODERS = [("pipeline", fuzz_pipeline), ("caps", fuzz_caps), ("device", fuzz_device), ("store", fuzz_store)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("seconds", nargs="?", type=float, default=3.0)
    ap.add_argument("--seed", type=int, default=None)
    a = ap.parse_args()
    seed = a.seed if a.seed is not None else random.randrange(2 ** 32)
    signal.signal(signal.SIGALRM, _alarm)
    os.environ.setdefault("RANK", "0")
    print(f"seed {seed}")
    run_regressions()
    for name, fn in DECODERS:
        rng = random.Random(f"{seed}-{name}")
        n, t0 = 0, time.monotonic()
        while time.monotonic() - t0 < a.seconds and not FINDINGS:
            fn(rng)
            n += 1
        print(f"{name}: {n} inputs in {time.monotonic() - t0:.1f} s, {len(FINDINGS)} findings")
        if FINDINGS:
            break
    if FINDINGS:
        print(f"FAIL: {FINDINGS[0]} (seed {seed})")
        sys.exit(1)
    print("PASS fuzz_decoders")


if __name__ == "__main__":
    main()
