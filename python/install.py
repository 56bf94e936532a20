#!/usr/bin/python3
"""install.py - `make install`'s Python part: copy the torch_kaitian package
into PREFIX's site directory for this interpreter and link the library that
`cmake --install` put under PREFIX next to it, so `import torch_kaitian`
works without PYTHONPATH or ldconfig. (pip is not used: Debian marks its
Python "externally managed"; `pip install --no-build-isolation .` remains the
way for a virtual environment.)

    install.py --prefix PREFIX [--manifest BUILD/install_manifest.txt]

Honours $DESTDIR (staged installs): files go under it, the link points at the
final location.
"""
import argparse
import os
import re
import shutil
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def site_dir(prefix):
    """The directory of PREFIX this interpreter imports from (Debian: dist-packages)."""
    ver = f"python{sys.version_info[0]}.{sys.version_info[1]}"
    candidates = [os.path.join(prefix, "lib", ver, "dist-packages"),
                  os.path.join(prefix, "lib", "python3", "dist-packages"),
                  os.path.join(prefix, "lib", ver, "site-packages")]
    on_path = {os.path.realpath(p) for p in sys.path if p}
    for c in candidates:
        if os.path.realpath(c) in on_path:
            return c, True
    return candidates[-1], False


def installed_library(prefix, manifest):
    if manifest and os.path.exists(manifest):
        with open(manifest) as f:
            for line in f:
                p = line.strip()
                if re.fullmatch(r"libkaitian\.so\.\d+", os.path.basename(p)):
                    return p  # the soname link, e.g. .../libkaitian.so.0
    for libdir in ("lib", "lib64", os.path.join("lib", "x86_64-linux-gnu"), os.path.join("lib", "aarch64-linux-gnu")):
        p = os.path.join(prefix, libdir, "libkaitian.so.0")
        if os.path.exists(os.environ.get("DESTDIR", "") + p):
            return p
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prefix", required=True)
    ap.add_argument("--manifest", help="CMake's install_manifest.txt (to find the installed library)")
    args = ap.parse_args()
    prefix = os.path.abspath(args.prefix)
    destdir = os.environ.get("DESTDIR", "")
    site, on_path = site_dir(prefix)
    target = destdir + os.path.join(site, "torch_kaitian")
    if os.path.isdir(target):
        shutil.rmtree(target)
    shutil.copytree(os.path.join(HERE, "torch_kaitian"), target,
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "libkaitian.so*"))
    lib = installed_library(prefix, args.manifest)
    if lib:
        os.symlink(lib, os.path.join(target, "libkaitian.so"))
    print(f"installed torch_kaitian to {site}" + (f" (library: {lib})" if lib else
          " (no installed libkaitian found: the package will ask the system loader)"))
    if not on_path:
        print(f"note: {site} is not on this Python's path: add it to PYTHONPATH")
    return 0


if __name__ == "__main__":
    sys.exit(main())
