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
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))

# Tests kaitian skips on purpose, with the documented reason (docs/pytorch.md).
KAITIAN_SKIPS = {
}


def _setup_suite():
    """Import the suite for $BACKEND and build the test class. Runs at import in
    the child run and again in every rank a spawn start creates (which imports
    this file as __mp_main__ and must find the class here)."""
    backend = os.environ["BACKEND"]
    sys.path.insert(0, os.path.join(HERE, "stubs"))  # expecttest stand-in
    if backend == "kaitian":
        sys.path.insert(0, os.path.join(REPO, "python"))
    argv, sys.argv[:] = sys.argv[:], sys.argv[:1]  # common_utils parses sys.argv at import
    import unittest

    import torch  # noqa: F401
    from torch.testing._internal import common_distributed
    from torch.testing._internal.distributed import distributed_test as dt
    sys.argv[:] = argv

    if backend == "kaitian":
        import torch_kaitian  # noqa: F401 - registers the backend
        for feature in ("plugin", "ddp", "subgroup"):
            common_distributed.DistTestCases.backend_feature[feature].add("kaitian")

    start = os.environ.get("KT_CONFORMANCE_START", "fork")

    class TestDistBackendWithSpawn(dt.TestDistBackend, dt.DistributedTest._DistTestBase):
        def setUp(self):
            super().setUp()
            if start == "fork":  # torch 1.13's harness only spawns; forking saves the re-imports
                self._start_processes(torch.multiprocessing.get_context("fork").Process)
            else:
                self._spawn_processes()

    if backend == "kaitian":
        for name, reason in KAITIAN_SKIPS.items():
            if hasattr(TestDistBackendWithSpawn, name):
                setattr(TestDistBackendWithSpawn, name, unittest.skip("kaitian: " + reason)(
                    getattr(TestDistBackendWithSpawn, name)))
    return TestDistBackendWithSpawn


if os.environ.get("KT_CONFORMANCE_CHILD") == "1":
    TestDistBackendWithSpawn = _setup_suite()


def _child(args):
    """Run the suite for one backend in this interpreter; write per-test outcomes."""
    import unittest

    cls = TestDistBackendWithSpawn
    loader = unittest.TestLoader()
    names = sorted(n for n in loader.getTestCaseNames(cls))
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


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--world-size", default="2", help="comma-separated world sizes (default 2)")
    ap.add_argument("--backends", default="gloo,kaitian")
    ap.add_argument("-k", action="append", help="run only tests whose name contains this (repeatable)")
    ap.add_argument("--start", choices=("fork", "spawn"), default="fork",
                    help="how ranks start: fork (fast; default) or spawn (as torch's CI)")
    ap.add_argument("--json", help="write every outcome to this file")
    ap.add_argument("--log-dir", help="keep each run's unittest output here")
    ap.add_argument("--json-child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.json_child:
        _child(args)
        return 0

    python = os.environ.get("PYTHON", "/usr/bin/python3")
    results = {}
    status = 0
    for ws in [int(w) for w in args.world_size.split(",")]:
        for backend in args.backends.split(","):
            out = f"/tmp/kt-conformance-{os.getpid()}-{backend}-{ws}.json"
            env = dict(os.environ, BACKEND=backend, WORLD_SIZE=str(ws), KT_CONFORMANCE_CHILD="1",
                       KT_CONFORMANCE_START=args.start)
            cmd = [python, os.path.abspath(__file__), "--json-child", out]
            for k in args.k or []:
                cmd += ["-k", k]
            t0 = time.time()
            log = None
            if args.log_dir:
                os.makedirs(args.log_dir, exist_ok=True)
                log = open(os.path.join(args.log_dir, f"{backend}-ws{ws}.log"), "w")
            rc = subprocess.call(cmd, env=env, stdout=log or subprocess.DEVNULL,
                                 stderr=log or subprocess.DEVNULL)
            took = time.time() - t0
            try:
                with open(out) as f:
                    outcomes = json.load(f)
                os.unlink(out)
            except OSError:
                print(f"{backend} WORLD_SIZE={ws}: the run crashed (exit {rc})")
                status = 1
                continue
            results.setdefault(str(ws), {})[backend] = outcomes
            c = _counts(outcomes)
            print(f"{backend:8s} WORLD_SIZE={ws}: {len(outcomes)} tests: {c['pass']} pass, "
                  f"{c['fail']} fail, {c['error']} error, {c['skip']} skip  ({took:.0f} s)", flush=True)
        per = results.get(str(ws), {})
        if "gloo" in per and "kaitian" in per:
            lost = sorted(n for n, v in per["gloo"].items()
                          if v[0] == "pass" and per["kaitian"].get(n, ["missing"])[0] != "pass")
            for n in lost:
                v = per["kaitian"].get(n, ["missing", ""])
                print(f"  passes for gloo, {v[0]} for kaitian: {n}")
                if v[0] in ("fail", "error"):
                    print("    " + v[1].strip().splitlines()[-1][:300] if v[1].strip() else "")
            if lost:
                status = 1
            else:
                print(f"  WORLD_SIZE={ws}: every test that passes for gloo passes for kaitian")
        for backend, outcomes in per.items():
            if backend == "kaitian":
                for n, v in sorted(outcomes.items()):
                    if v[0] in ("fail", "error"):
                        print(f"  kaitian {v[0]}: {n}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1, sort_keys=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
