#!/usr/bin/python3
"""mutate.py - the mutation smoke: bugs planted on purpose, one at a time, in a
temporary copy of the Python package, each of which the matching test must
catch (exit non-zero). It guards the claims users rely on most: the exact
heterogeneous mean, ZeroOptimizer equals DDP + the same optimizer, pipeline
gradients equal one process; and the places issue 43 found unguarded.

Usage: mutate.py KAITIAN_CLI [NAME ...]   (make mutation; names: --list)
       mutate.py --check                  (make test: every plant still applies)
Each plant replaces one exact piece of text (it must occur once: a plant that
no longer applies is an error, not a pass). Nothing is left behind.
"""
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))

# name: (file under python/, text, replacement, test command under tests/python,
#        ranks for `kaitian run -n` (0: plain python))
PLANTS = {
    "hetero_weighting": (
        "torch_kaitian/hetero.py", "return grad * ctx.state.weight(), None", "return grad, None",
        ["test_hetero.py", "exact", "--caps", "1,3"], 2),
    "hetero_plan_group": (
        "torch_kaitian/hetero.py",
        "            st = _CountState(count_n, work, count, "
        "dist.get_world_size(self.process_group))",
        "            st = _CountState(count_n, work, count, dist.get_world_size())",
        ["test_hetero.py", "exact", "--caps", "1,2,5", "--plan-out", "1"], 3),
    "zero_skip_shard_step": (
        "torch_kaitian/parallel/zero.py", "        self.inner.step()\n",
        "        if dist.get_rank(self.shard) != 1:\n            self.inner.step()\n",
        ["test_zero.py", "check"], 2),
    "zero_drain_drops_grads": (
        "torch_kaitian/parallel/zero.py",
        "            for b in self.buckets[self._next:]:\n                self._reduce_bucket(b)",
        "            for b in self.buckets[self._next:]:\n"
        "                [p.grad.zero_() for p in b.params if p.grad is not None]\n"
        "                self._reduce_bucket(b)",
        ["test_zero.py", "check"], 2),
    "pipeline_microbatch_grad": (
        "torch_kaitian/parallel/pipeline.py",
        "                torch.autograd.backward(outs, list(grads[:len(outs)]))",
        "                torch.autograd.backward(outs, [g * (1 + (i == 1)) for g in grads[:len(outs)]])",
        ["test_pipeline.py"], 2),
}


def planted_copy(tmp, name):
    """A copy of the Python package under tmp with the plant `name` applied:
    the copy's root (its python/ goes on PYTHONPATH)."""
    tree = os.path.join(tmp, name)
    shutil.copytree(os.path.join(ROOT, "python"), os.path.join(tree, "python"),
                    ignore=shutil.ignore_patterns("__pycache__"))
    plant(tree, name)
    return tree


def plant(tree, name):
    rel, old, new, _, _ = PLANTS[name]
    path = os.path.join(tree, "python", rel)
    with open(path) as f:
        text = f.read()
    n = text.count(old)
    if n != 1:
        raise SystemExit(f"FAIL {name}: the text to replace occurs {n} times in {rel} (expected "
                         f"once): the plant no longer applies; update tests/mutation/mutate.py")
    with open(path, "w") as f:
        f.write(text.replace(old, new))


def main():
    args = sys.argv[1:]
    if args and args[0] == "--list":
        print("\n".join(PLANTS))
        return 0
    if args and args[0] == "--check":  # make test: every plant still applies (no test is run)
        with tempfile.TemporaryDirectory(prefix="kt_mutation.") as tmp:
            for name in PLANTS:
                planted_copy(tmp, name)
        print(f"PASS mutation plants: all {len(PLANTS)} apply (make mutation runs them)")
        return 0
    if not args:
        print(__doc__, file=sys.stderr)
        return 2
    cli, names = os.path.abspath(args[0]), args[1:] or list(PLANTS)
    unknown = [n for n in names if n not in PLANTS]
    if unknown:
        print(f"unknown plants {unknown}; known: {', '.join(PLANTS)}", file=sys.stderr)
        return 2
    python = os.environ.get("PYTHON", "/usr/bin/python3")
    missed = []
    with tempfile.TemporaryDirectory(prefix="kt_mutation.") as tmp:
        for name in names:
            tree = planted_copy(tmp, name)
            test, ranks = PLANTS[name][3], PLANTS[name][4]
            script = os.path.join(ROOT, "tests", "python", test[0])
            cmd = ([cli, "run", "-n", str(ranks), script] if ranks else [python, script]) + test[1:]
            env = dict(os.environ, PYTHONPATH=os.path.join(tree, "python"), PYTHON=python,
                       PYTHONDONTWRITEBYTECODE="1")
            try:
                p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   text=True, timeout=600)
                rc, out = p.returncode, p.stdout
            except subprocess.TimeoutExpired:
                rc, out = None, "(timed out after 600 s)"
            fails = [ln for ln in out.splitlines() if "FAIL" in ln][:2]
            if rc == 0:
                missed.append(name)
                print(f"MISSED {name}: {' '.join(test)} passed with the bug planted", flush=True)
            else:
                print(f"caught {name}: {' '.join(test)} exited {rc}: "
                      f"{fails[0].strip() if fails else out.strip().splitlines()[-1:]}", flush=True)
    if missed:
        print(f"FAIL mutation smoke: {len(missed)} of {len(names)} planted bugs passed the tests: "
              f"{', '.join(missed)}")
        return 1
    print(f"PASS mutation smoke: {len(names)} of {len(names)} planted bugs caught")
    return 0


if __name__ == "__main__":
    sys.exit(main())
