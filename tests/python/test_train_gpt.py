#!/usr/bin/python3
"""test_train_gpt.py - examples/train_gpt.py, the 3-D parallel GPT: on 8 ranks
as pipe 2 x tensor 2 x data 2 its losses over the first 5 steps equal those of
1 rank (pipe 1 x tensor 1 x data 1) at the same seed and global batch (float32,
1e-4 relative), also with the GPipe schedule, and so do the plans for mixed
devices (--mixed: stages by measured speed, ZeRO state by free memory, batch
shares by speed) at pipe 2 x data 2 and pipe 1 x data 3; and a stage that raises in its
forward ends the job, with that stage's error reported by every rank.
Usage: test_train_gpt.py KAITIAN_CLI."""
import json
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLE = os.path.join(HERE, "..", "..", "examples", "train_gpt.py")


def run(cli, n, extra, log=None, ok=True):
    cmd = [cli, "run", "-n", str(n), EXAMPLE, "--steps", "5"] + extra
    if log:
        cmd += ["--loss-log", log]
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=300)
    print(p.stdout[-3000:])
    if ok and p.returncode != 0:
        sys.exit(f"FAIL: {' '.join(cmd)} exited with {p.returncode}")
    return p


def main():
    cli = sys.argv[1]
    with tempfile.TemporaryDirectory(prefix="kt-gpt-") as tmp:
        logs = {}
        for name, n, extra in (("1d", 1, []),
                               ("3d", 8, ["--pipe", "2", "--tensor", "2", "--data", "2"]),
                               ("3d-gpipe", 8, ["--pipe", "2", "--tensor", "2", "--data", "2",
                                                "--schedule", "gpipe"]),
                               ("mixed", 4, ["--pipe", "2", "--data", "2", "--mixed"]),
                               ("mixed-data3", 3, ["--pipe", "1", "--data", "3", "--mixed"])):
            path = os.path.join(tmp, name + ".json")
            run(cli, n, extra, path)
            with open(path) as f:
                logs[name] = json.load(f)["losses"]
    ref = logs["1d"]
    for name in ("3d", "3d-gpipe", "mixed", "mixed-data3"):
        worst = max(abs(a - b) / abs(b) for a, b in zip(logs[name], ref))
        if len(logs[name]) != 5 or worst > 1e-4:
            sys.exit(f"FAIL: {name} losses {logs[name]} against 1-D {ref} ({worst:.2e})")
        print(f"{name}: losses within {worst:.1e} of the 1-D run")
    if not ref[-1] < ref[0]:
        sys.exit(f"FAIL: the loss does not decrease: {ref}")
    p = run(cli, 8, ["--pipe", "2", "--tensor", "2", "--data", "2", "--fail-stage", "1"], ok=False)
    if p.returncode == 0:
        sys.exit("FAIL: a stage raising did not fail the job")
    ranks = set(int(r) for r in re.findall(
        r"^\[(\d+)\] rank \d+ \(stage \d\): pipeline stage 1 failed: RuntimeError: injected failure",
        p.stdout, re.M))
    if ranks != set(range(8)):
        sys.exit(f"FAIL: only ranks {sorted(ranks)} reported stage 1's failure")
    print(f"PASS train_gpt: 3-D (2x2x2, 1F1B and GPipe) and the mixed plans (2x2, 1x3) equal 1-D "
          f"over 5 steps {ref}; a failing "
          f"stage is reported by all 8 ranks (launcher exit {p.returncode})")


if __name__ == "__main__":
    main()
