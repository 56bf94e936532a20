#!/usr/bin/python3
"""torch2_venv.py - the virtual environment with torch 2.x from PyPI that the
suite's second Python pass (tests `python2_*`, `make conformance`) runs in.

    torch2_venv.py VENV [--base-python PY] [--print-python]

Creates VENV once (`PY -m venv`, then `pip install torch numpy scikit-learn`,
the current torch 2.x) and reuses it afterwards: a venv whose stamp file
exists and whose interpreter imports torch 2.x is left as it is, so the
network is needed only the first time. A failed or interrupted install
removes the half-made venv and says what pip said. Concurrent callers (ctest
and `make conformance`) wait for each other on a lock of VENV's parent.

Why the whole torch, CUDA wheels included (5.6 GB in the venv; 93 s on the
2-CPU VM from PyPI, torch 2.15.0): PyPI has only CUDA builds of torch for Linux x86_64, and
their torch/_C needs the nvidia-* libraries to import at all, also on a host
without a GPU (`pip install --no-deps torch` plus the pure-Python
dependencies fails with "libcufile.so.0: cannot open shared object file");
the CPU-only wheels live on download.pytorch.org, which CI does not reach.

Exit status 0 with the venv ready (--print-python: its interpreter on
stdout), 1 when it cannot be made.
"""
import argparse
import fcntl
import os
import shutil
import subprocess
import sys
import time

STAMP = "kaitian-torch2.stamp"
# What the Python tests import besides torch: numpy everywhere, scikit-learn's
# digits data in the training examples (examples/train_*.py).
PACKAGES = ["torch>=2,<3", "numpy", "scikit-learn"]
CHECK = ("import sys, torch, numpy, sklearn, torch.distributed as d\n"
         "v = torch.__version__\n"
         "print(v)\n"
         "sys.exit(0 if int(v.split('.')[0]) == 2 and d.is_available() else "
         "f'torch {v} is not a 2.x with torch.distributed')\n")


def imports_torch2(venv):
    """(True, torch version) when VENV's interpreter imports torch 2.x and the
    other packages; else (False, what went wrong)."""
    py = os.path.join(venv, "bin", "python")
    if not os.access(py, os.X_OK):
        return False, f"no interpreter {py}"
    p = subprocess.run([py, "-c", CHECK], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True)
    out = p.stdout.strip().splitlines()
    return p.returncode == 0, (out[-1] if out else f"exit status {p.returncode}")


def create(venv, base):
    t0 = time.monotonic()
    if os.path.lexists(venv):
        shutil.rmtree(venv)
    try:
        subprocess.run([base, "-m", "venv", venv], check=True, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True)
        pip = [os.path.join(venv, "bin", "python"), "-m", "pip", "install", "--no-input",
               "--disable-pip-version-check", "--progress-bar", "off", "--no-cache-dir", *PACKAGES]
        sys.stderr.write(f"torch2_venv: installing {' '.join(PACKAGES)} into {venv} (once; "
                         "about 5.6 GB from PyPI)\n")
        subprocess.run(pip, check=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    except subprocess.CalledProcessError as e:
        shutil.rmtree(venv, ignore_errors=True)
        tail = "\n".join((e.stdout or "").splitlines()[-25:])
        sys.exit(f"torch2_venv: {' '.join(e.cmd)} failed with status {e.returncode}; removed "
                 f"{venv}. Its output ended:\n{tail}")
    ok, what = imports_torch2(venv)
    if not ok:
        shutil.rmtree(venv, ignore_errors=True)
        sys.exit(f"torch2_venv: the new venv does not import torch 2.x: {what}; removed {venv}")
    with open(os.path.join(venv, STAMP), "w") as f:
        f.write(f"torch {what}, installed in {time.monotonic() - t0:.0f} s\n")
    sys.stderr.write(f"torch2_venv: torch {what} ready in {venv} after "
                     f"{time.monotonic() - t0:.0f} s\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("venv")
    ap.add_argument("--base-python", default=sys.executable,
                    help="the interpreter the venv is made from (default: this one)")
    ap.add_argument("--print-python", action="store_true", help="print the venv's interpreter")
    args = ap.parse_args()
    venv = os.path.abspath(args.venv)
    parent = os.path.dirname(venv)
    os.makedirs(parent, exist_ok=True)
    lock = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        ok, what = (imports_torch2(venv) if os.path.isfile(os.path.join(venv, STAMP))
                    else (False, "never finished"))
        if ok:
            sys.stderr.write(f"torch2_venv: reusing {venv} (torch {what})\n")
        else:
            if os.path.lexists(venv):
                sys.stderr.write(f"torch2_venv: {venv} is not usable ({what}): making it again\n")
            create(venv, args.base_python)
    finally:
        os.close(lock)
    if args.print_python:
        print(os.path.join(venv, "bin", "python"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
