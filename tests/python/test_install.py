#!/usr/bin/python3
"""test_install.py - the two ways to install the Python package work offline:
`make install`'s steps (cmake --install + python/install.py) and
`pip install --no-build-isolation .` (bundling $KAITIAN_LIBRARY); each
installed package imports from a clean directory and loads the library it
was installed with. Usage: test_install.py BUILD_DIR."""
import os
import subprocess
import sys
import tempfile

REPO = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))


def run(cmd, **kw):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)
    if p.returncode != 0:
        sys.exit(f"FAIL: {' '.join(cmd)} exited with {p.returncode}:\n{p.stdout}")
    return p.stdout


def imported_library(site, tmp):
    env = {k: v for k, v in os.environ.items() if k not in ("KAITIAN_LIBRARY", "PYTHONPATH")}
    env["PYTHONPATH"] = site
    return run([sys.executable, "-c", "import torch_kaitian as t; print(t.library_path)"],
               env=env, cwd=tmp).strip().splitlines()[-1]


def main():
    build = os.path.abspath(sys.argv[1])
    with tempfile.TemporaryDirectory() as tmp:
        prefix = os.path.join(tmp, "prefix")
        run(["cmake", "--install", build, "--prefix", prefix])
        out = run([sys.executable, os.path.join(REPO, "python", "install.py"), "--prefix", prefix])
        site = out.split("installed torch_kaitian to ", 1)[1].split()[0]
        lib = imported_library(site, tmp)
        if not lib.startswith(site) or not os.path.realpath(lib).startswith(prefix):
            sys.exit(f"FAIL: make-install layout loaded {lib} ({os.path.realpath(lib)}), not {prefix}'s")
        print(f"make install layout: {lib} -> {os.path.realpath(lib)}")

        target = os.path.join(tmp, "pip")
        env = dict(os.environ)  # KAITIAN_LIBRARY (set by CTest) is what the wheel bundles
        run([sys.executable, "-m", "pip", "install", "--no-build-isolation", "--no-deps", "--no-index",
             "--target", target, REPO], env=env, cwd=tmp)
        lib = imported_library(target, tmp)
        if lib != os.path.join(target, "torch_kaitian", "libkaitian.so"):
            sys.exit(f"FAIL: pip-installed package loaded {lib}, not its bundled library")
        print(f"pip install: {lib}")
    print("PASS install")


if __name__ == "__main__":
    main()
