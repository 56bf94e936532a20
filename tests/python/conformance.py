#!/usr/bin/python3
"""conformance.py - PyTorch's own distributed test suite against a backend.

Runs torch.testing._internal.distributed.distributed_test.DistributedTest._DistTestBase
(shipped by Debian's python3-torch) the way torch's test_distributed_spawn.py
does, for BACKEND=gloo and/or BACKEND=kaitian (registered as a plugin backend,
with the "ddp" and "subgroup" features on, as third-party backends do).

  conformance.py [--world-size 2,3] [--backends gloo,kaitian] [-k PATTERN]
                 [--start fork|spawn] [--json FILE] [--jobs N]

For each world size it runs every backend (each in its own interpreter, since
the suite reads BACKEND and WORLD_SIZE at import), prints pass/fail/skip/error
counts per backend, and lists the tests that pass for gloo but not for kaitian.
Exit status: 0 when every test that passes for gloo passes for kaitian.

Tests that kaitian skips on purpose are listed in KAITIAN_SKIPS below with the
reason; they are reported as skips.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))

# Tests kaitian skips on purpose, with the documented reason (docs/pytorch.md).
KAITIAN_SKIPS = {
}
# Gloo-only tests (skipped for a plugin backend by name) that cannot pass on
# kaitian even under gloo's name, with the reason.
_MONITORED = ("torch.distributed.monitored_barrier refuses every backend but gloo (torch checks "
              "the backend's name before calling the process group)")
AS_GLOO_SKIPS = {
    "test_monitored_barrier_gloo": _MONITORED,
    "test_monitored_barrier_gloo_subgroup": _MONITORED,
    "test_monitored_barrier_gloo_rank_0_timeout": _MONITORED,
    "test_monitored_barrier_failure_order": _MONITORED,  # WORLD_SIZE >= 3
    "test_monitored_barrier_wait_all_ranks": _MONITORED,  # WORLD_SIZE >= 3
}


def _fix_py311_dataclass():
    """Debian's torch 1.13 under Python 3.11: importing
    torch.distributed._shard.sharded_tensor.metadata fails ("mutable default ...
    TensorProperties ... use default_factory"), which errors every DDP test that
    turns on DDP's ReplicatedTensor mode, for every backend. Import it once with
    that default turned into a default_factory."""
    import copy
    import dataclasses
    orig = dataclasses._get_field

    def get_field(cls, name, *rest):
        f = cls.__dict__.get(name)
        if (isinstance(f, dataclasses.Field) and f.default is not dataclasses.MISSING
                and type(f.default).__name__ == "TensorProperties"):
            value = f.default
            f.default = dataclasses.MISSING
            f.default_factory = lambda: copy.deepcopy(value)
        return orig(cls, name, *rest)

    dataclasses._get_field = get_field
    try:
        import torch.distributed._shard.sharded_tensor.metadata  # noqa: F401
    except Exception:  # noqa: BLE001 - a torch without the problem or the module
        pass
    finally:
        dataclasses._get_field = orig


def _setup_suite():
    """Import the suite for $BACKEND and build the test class. Runs at import in
    the child run and again in every rank a spawn start creates (which imports
    this file as __mp_main__ and must find the class here).

    KT_CONFORMANCE_AS=gloo (with BACKEND=kaitian): import the suite as gloo's, so
    tests that name gloo are not skipped, but create every process group with
    kaitian: the gloo-only tests then run on kaitian."""
    backend = os.environ["BACKEND"]
    as_gloo = backend == "kaitian" and os.environ.get("KT_CONFORMANCE_AS") == "gloo"
    sys.path.insert(0, os.path.join(HERE, "stubs"))  # expecttest stand-in
    if backend == "kaitian":
        sys.path.insert(0, os.path.join(REPO, "python"))
    argv, sys.argv[:] = sys.argv[:], sys.argv[:1]  # common_utils parses sys.argv at import
    import unittest

    import torch
    import torch.distributed as dist
    if os.environ.get("KT_CONFORMANCE_PY311_FIX", "1") == "1":
        _fix_py311_dataclass()
    from torch.testing._internal import common_distributed
    if backend == "kaitian":
        import torch_kaitian  # noqa: F401 - registers the backend
        if not as_gloo:
            # Before the suite is imported: its decorators read these sets.
            for feature in ("plugin", "ddp", "subgroup"):
                common_distributed.DistTestCases.backend_feature[feature].add("kaitian")
    if as_gloo:
        os.environ["BACKEND"] = "gloo"
    from torch.testing._internal.distributed import distributed_test as dt
    sys.argv[:] = argv
    if as_gloo:
        os.environ["BACKEND"] = "kaitian"
        _redirect_gloo_to_kaitian(dist)

    start = os.environ.get("KT_CONFORMANCE_START", "fork")

    class TestDistBackendWithSpawn(dt.TestDistBackend, dt.DistributedTest._DistTestBase):
        def setUp(self):
            super().setUp()
            if start == "fork":  # torch 1.13's harness only spawns; forking saves the re-imports
                self._start_processes(torch.multiprocessing.get_context("fork").Process)
            else:
                self._spawn_processes()

    # Picklable by name, for spawned ranks (which import this file as __main__'s stand-in).
    TestDistBackendWithSpawn.__qualname__ = "TestDistBackendWithSpawn"
    TestDistBackendWithSpawn.__module__ = "__main__"
    if backend == "kaitian":
        for name, reason in (AS_GLOO_SKIPS if as_gloo else KAITIAN_SKIPS).items():
            if hasattr(TestDistBackendWithSpawn, name):
                setattr(TestDistBackendWithSpawn, name, unittest.skip("kaitian: " + reason)(
                    getattr(TestDistBackendWithSpawn, name)))
    return TestDistBackendWithSpawn


def _redirect_gloo_to_kaitian(dist):
    """Process groups asked for as "gloo" are created as "kaitian"."""
    def swap(backend):
        return "kaitian" if backend is not None and str(backend).lower() == "gloo" else backend

    init, new_group = dist.init_process_group, dist.new_group

    def init_process_group(backend, *args, **kwargs):
        return init(swap(backend), *args, **kwargs)

    def new_group_(*args, **kwargs):
        if "backend" in kwargs:
            kwargs["backend"] = swap(kwargs["backend"])
        elif len(args) >= 3:
            args = args[:2] + (swap(args[2]),) + args[3:]
        return new_group(*args, **kwargs)

    dist.init_process_group = init_process_group
    dist.new_group = new_group_
    dist.distributed_c10d.new_group = new_group_  # new_subgroups* call it from the module


if os.environ.get("KT_CONFORMANCE_CHILD") == "1":
    TestDistBackendWithSpawn = _setup_suite()


def _child(args):
    """Run the suite for one backend in this interpreter; write per-test outcomes."""
    import unittest

    cls = TestDistBackendWithSpawn
    loader = unittest.TestLoader()
    names = sorted(n for n in loader.getTestCaseNames(cls))
    only = os.environ.get("KT_CONFORMANCE_ONLY")
    if only is not None:
        keep = set(only.split(","))
        names = [n for n in names if n in keep]
    if args.k:
        names = [n for n in names if any(k in n for k in args.k)]
    suite = unittest.TestSuite(cls(n) for n in names)

    outcomes = {}

    class Result(unittest.TextTestResult):
        def addSuccess(self, test):  # noqa: N802
            super().addSuccess(test)
            outcomes[test._testMethodName] = ["pass", ""]

        def addFailure(self, test, err):  # noqa: N802
            super().addFailure(test, err)
            outcomes[test._testMethodName] = ["fail", self._exc_info_to_string(err, test)[-2000:]]

        def addError(self, test, err):  # noqa: N802
            super().addError(test, err)
            outcomes[test._testMethodName] = ["error", self._exc_info_to_string(err, test)[-2000:]]

        def addSkip(self, test, reason):  # noqa: N802
            super().addSkip(test, reason)
            outcomes[test._testMethodName] = ["skip", reason]

        def addExpectedFailure(self, test, err):  # noqa: N802
            super().addExpectedFailure(test, err)
            outcomes[test._testMethodName] = ["pass", "expected failure"]

        def addUnexpectedSuccess(self, test):  # noqa: N802
            super().addUnexpectedSuccess(test)
            outcomes[test._testMethodName] = ["fail", "unexpected success"]

        def startTest(self, test):  # noqa: N802
            self._t0 = time.time()
            super().startTest(test)

        def stopTest(self, test):  # noqa: N802
            super().stopTest(test)
            if test._testMethodName in outcomes:
                outcomes[test._testMethodName].append(round(time.time() - self._t0, 2))

    runner = unittest.TextTestRunner(stream=sys.stderr, verbosity=2, resultclass=Result)
    runner.run(suite)
    with open(args.json_child, "w") as f:
        json.dump(outcomes, f, indent=1, sort_keys=True)


def _counts(outcomes):
    c = {"pass": 0, "fail": 0, "error": 0, "skip": 0}
    for v in outcomes.values():
        c[v[0]] += 1
    return c


def _run_child(python, backend, ws, args, tag, as_gloo=False, only=None):
    """One backend at one world size in its own interpreter: (outcomes, seconds)."""
    # torch's tests leave their FileStore files in the temporary directory: give
    # the child one of its own and remove it afterwards.
    tmp = tempfile.mkdtemp(prefix="kt-conformance-")
    out = os.path.join(tmp, f"{tag}-{ws}.json")
    env = dict(os.environ, BACKEND=backend, WORLD_SIZE=str(ws), KT_CONFORMANCE_CHILD="1",
               TMPDIR=tmp,
               KT_CONFORMANCE_START=args.start,
               KT_CONFORMANCE_PY311_FIX="0" if args.no_py311_fix else "1")
    if as_gloo:
        env["KT_CONFORMANCE_AS"] = "gloo"
    if only is not None:
        env["KT_CONFORMANCE_ONLY"] = ",".join(only)
    cmd = [python, os.path.abspath(__file__), "--json-child", out]
    for k in args.k or []:
        cmd += ["-k", k]
    log = None
    if args.log_dir:
        os.makedirs(args.log_dir, exist_ok=True)
        log = open(os.path.join(args.log_dir, f"{tag}-ws{ws}.log"), "w")
    t0 = time.time()
    rc = subprocess.call(cmd, env=env, stdout=log or subprocess.DEVNULL, stderr=log or subprocess.DEVNULL)
    took = time.time() - t0
    try:
        with open(out) as f:
            outcomes = json.load(f)
    except OSError:
        print(f"{tag} WORLD_SIZE={ws}: the run crashed (exit {rc})")
        return None, took
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return outcomes, took


def _line(label, ws, outcomes, took):
    c = _counts(outcomes)
    print(f"{label:8s} WORLD_SIZE={ws}: {len(outcomes)} tests: {c['pass']} pass, {c['fail']} fail, "
          f"{c['error']} error, {c['skip']} skip  ({took:.0f} s)", flush=True)
    reasons = {}
    for v in outcomes.values():
        if v[0] == "skip":
            r = _last_line(v[1])[:120]
            reasons[r] = reasons.get(r, 0) + 1
    for r, k in sorted(reasons.items(), key=lambda x: -x[1])[:3]:
        print(f"    skipped {k:3d} x: {r}", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--world-size", default="2", help="comma-separated world sizes (default 2)")
    ap.add_argument("--backends", default="gloo,kaitian")
    ap.add_argument("-k", action="append", help="run only tests whose name contains this (repeatable)")
    ap.add_argument("--start", choices=("fork", "spawn"), default="fork",
                    help="how ranks start: fork (fast; default) or spawn (as torch's CI)")
    ap.add_argument("--no-py311-fix", action="store_true",
                    help="do not work around torch 1.13's dataclass error under Python 3.11 "
                         "(then 9 DDP tests error for every backend)")
    ap.add_argument("--json", help="write every outcome to this file")
    ap.add_argument("--log-dir", help="keep each run's unittest output here")
    ap.add_argument("--json-child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.json_child:
        _child(args)
        return 0

    python = os.environ.get("PYTHON", "/usr/bin/python3")
    backends = args.backends.split(",")
    results = {}
    status = 0
    for ws in [int(w) for w in args.world_size.split(",")]:
        per = results.setdefault(str(ws), {})
        for backend in backends:
            outcomes, took = _run_child(python, backend, ws, args, backend)
            if outcomes is None:
                status = 1
                continue
            per[backend] = outcomes
            _line(backend, ws, outcomes, took)
        if "kaitian" in per:
            for n, v in sorted(per["kaitian"].items()):
                if v[0] in ("fail", "error"):
                    print(f"  kaitian {v[0]}: {n}: {_last_line(v[1])}")
        if "gloo" not in per or "kaitian" not in per:
            continue
        gloo, kt = per["gloo"], per["kaitian"]
        if not any(v[0] == "pass" for v in gloo.values()):
            # Nothing to compare against: the comparison below would pass vacuously.
            status = 1
            print(f"  WORLD_SIZE={ws}: no test passed for gloo: the suite did not run under this "
                  f"runner on this torch (see the skip reasons above); nothing was compared")
            continue
        named = sorted(n for n, v in gloo.items() if v[0] == "pass" and kt.get(n, ["?"])[0] == "skip")
        if named:
            # Skipped for a plugin only because the suite names gloo: run them on
            # kaitian under gloo's name.
            extra, took = _run_child(python, "kaitian", ws, args, "kaitian-as-gloo", True, named)
            if extra is None:
                status = 1
                extra = {}
            per["kaitian-as-gloo"] = extra
            _line("  +gloo-named tests on kaitian", ws, extra, took)
            for n, v in sorted(extra.items()):
                if v[0] != "pass":
                    print(f"    {v[0]}: {n}: {_last_line(v[1])}")
        else:
            extra = {}
        lost = sorted(n for n, v in gloo.items() if v[0] == "pass" and kt.get(n, ["?"])[0] != "pass"
                      and extra.get(n, ["?"])[0] != "pass")
        documented = [n for n in lost if n in KAITIAN_SKIPS or n in AS_GLOO_SKIPS]
        lost = [n for n in lost if n not in documented]
        if lost:
            status = 1
            for n in lost:
                v = extra.get(n) or kt.get(n) or ["missing", ""]
                print(f"  passes for gloo, {v[0]} for kaitian: {n}: {_last_line(v[1])}")
        else:
            print(f"  WORLD_SIZE={ws}: every test that passes for gloo passes for kaitian "
                  f"({len(named) - len(documented)} of them under gloo's name), except "
                  f"{len(documented)} documented skips")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1, sort_keys=True)
    return status


def _last_line(text):
    lines = [ln for ln in str(text).strip().splitlines() if ln.strip()]
    return lines[-1][:240] if lines else ""


if __name__ == "__main__":
    sys.exit(main())
