#!/usr/bin/python3
"""test_bench_hetero.py - `python -m torch_kaitian.bench --hetero` runs, a few
steps each: forked with --no-slow (the alias of --slow 0) and with --slow 1
(where the ranks can be bound apart), and under `kaitian run -n 2`; each
prints its table and ends with the one summary line. Asked to slow a rank on
more ranks than CPUs, it refuses (exit 2) with a message.
Usage: test_bench_hetero.py KAITIAN_CLI PYTHON."""
import os
import re
import subprocess
import sys

LAST = re.compile(r"^(\[0\] )?hetero/best_solo=\d+\.\d\d hetero/sum=\d+\.\d\d "
                  r"predicted/measured=\d+\.\d\d$")
SMALL = ["--steps", "5", "--warmup", "2", "--batch", "64", "--width", "64"]


def run(cmd, want_rc=0):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       timeout=120)
    print(f"$ {' '.join(cmd)}\n{p.stdout}{p.stderr}", flush=True)
    if p.returncode != want_rc:
        sys.exit(f"FAIL: exited with {p.returncode}, expected {want_rc}: {' '.join(cmd)}")
    return p


def check_table(out, what):
    lines = out.strip().splitlines()
    if not lines or not LAST.match(lines[-1]):
        sys.exit(f"FAIL {what}: the last line is not the summary: {lines[-1:]}")
    for row in ("rank 0 alone", "rank 1 alone", "even split (DDP)", "planned (HeteroDDP)",
                "plan: "):
        if row not in out:
            sys.exit(f"FAIL {what}: no '{row}' in the table")


def main():
    cli, py = sys.argv[1], sys.argv[2]
    bench = [py, "-m", "torch_kaitian.bench", "--hetero"] + SMALL
    if "RANK" in os.environ:
        sys.exit("FAIL: run this test plainly (RANK is set)")
    check_table(run(bench + ["--no-slow"]).stdout, "forked, --no-slow")
    cpus = len(os.sched_getaffinity(0))
    if cpus >= 2:
        out = run(bench + ["--slow", "1"]).stdout
        check_table(out, "forked, --slow 1")
        if "rank 1 slowed by 1 busy process" not in out:
            sys.exit("FAIL: --slow 1 does not say it slowed rank 1")
    check_table(run([cli, "run", "-n", "2"] + bench + ["--slow", "0"]).stdout, "kaitian run -n 2")
    p = run(bench + ["-n", str(cpus + 1), "--slow", "1"], want_rc=2)
    if "cannot be bound apart" not in p.stderr:
        sys.exit("FAIL: --slow 1 on more ranks than CPUs did not say why it refused")
    print("PASS bench --hetero")


if __name__ == "__main__":
    main()
