#!/usr/bin/python3
"""install.py - `make install`'s Python part, and `make uninstall`.

    install.py --prefix PREFIX [--manifest BUILD/install_manifest.txt]
    install.py --uninstall --manifest BUILD/install_manifest.txt

Install: copy the torch_kaitian package into PREFIX's site directory for
this interpreter and link the library that `cmake --install` put under PREFIX
next to it, so `import torch_kaitian` works without PYTHONPATH or ldconfig
(the `kaitian` command is CMake's PREFIX/bin/kaitian); when this interpreter
does not look in that directory, say in one line what to set. Every file made is appended to
the manifest, after CMake's own, so that the manifest lists the whole
install. (pip is not used: Debian marks its Python "externally managed";
`pip install .` is the way for a virtual environment, docs/install.md.)

Uninstall: remove every file the manifest lists, then the directories that
are KaiTian's alone (torch_kaitian/ and its subdirectories, lib/cmake/kaitian/)
once empty; shared directories (bin/, lib/pkgconfig/, site-packages/) stay.

Honours $DESTDIR (staged installs): files go under it, the link points at the
final location, the manifest names the final paths.
"""
import argparse
import os
import re
import shutil
import site
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGE = "torch_kaitian"


def site_dir(prefix):
    """(the directory of PREFIX this interpreter imports from, whether it does).
    Debian: PREFIX/lib/python3.X/dist-packages for /usr/local; a user's
    ~/.local/lib/python3.X/site-packages counts even before it exists (Python
    adds it at start-up once it does)."""
    ver = f"python{sys.version_info[0]}.{sys.version_info[1]}"
    candidates = [os.path.join(prefix, "lib", ver, "dist-packages"),
                  os.path.join(prefix, "lib", "python3", "dist-packages"),
                  os.path.join(prefix, "lib", ver, "site-packages")]
    on_path = {os.path.realpath(p) for p in sys.path if p}
    if site.ENABLE_USER_SITE:
        on_path.add(os.path.realpath(site.getusersitepackages()))
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


def install(prefix, manifest):
    destdir = os.environ.get("DESTDIR", "")
    site_path, on_path = site_dir(prefix)
    target = destdir + os.path.join(site_path, PACKAGE)
    if os.path.isdir(target):
        shutil.rmtree(target)
    shutil.copytree(os.path.join(HERE, PACKAGE), target,
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "libkaitian.so*", "bin"))
    lib = installed_library(prefix, manifest)
    if lib:
        os.symlink(lib, os.path.join(target, "libkaitian.so"))
    if manifest:
        made = []
        for root, _, files in os.walk(target):
            made += [os.path.join(root, f)[len(destdir):] for f in files]
        with open(manifest, "a+") as f:
            f.seek(0)
            ends_open = (f.read()[-1:] or "\n") != "\n"  # CMake ends its last line without one
            f.write(("\n" if ends_open else "") + "".join(p + "\n" for p in sorted(made)))
    print(f"installed torch_kaitian to {site_path}" + (f" (library: {lib})" if lib else
          " (no installed libkaitian found: the package will ask the system loader)"))
    if not on_path:
        print(f"note: {sys.executable} does not look in {site_path}: "
              f"export PYTHONPATH={site_path}{os.pathsep}$PYTHONPATH")
    return 0


def uninstall(manifest):
    if not manifest or not os.path.exists(manifest):
        sys.exit(f"install.py --uninstall: no manifest {manifest}: nothing is known to be installed "
                 "(make install writes it in the build directory)")
    destdir = os.environ.get("DESTDIR", "")
    with open(manifest) as f:
        paths = [destdir + line.strip() for line in f if line.strip()]
    # KaiTian's own directories: the package's, and CMake's package files'.
    roots = {os.path.dirname(p) for p in paths
             if p.endswith(os.path.join(PACKAGE, "__init__.py")) or p.endswith("kaitianConfig.cmake")}
    removed, dirs = 0, set()
    for p in paths:
        if os.path.lexists(p):
            os.unlink(p)
            removed += 1
        for r in roots:
            d = os.path.dirname(p)
            while d == r or d.startswith(r + os.sep):
                dirs.add(d)
                d = os.path.dirname(d)
    for d in sorted(dirs, key=len, reverse=True):  # deepest first
        try:
            os.rmdir(d)
        except OSError:
            pass  # not empty (a file that is not ours) or already gone
    print(f"removed {removed} of the {len(paths)} files in {manifest}")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prefix")
    ap.add_argument("--manifest", help="CMake's install_manifest.txt: finds the installed library; "
                    "the files made here are appended to it")
    ap.add_argument("--uninstall", action="store_true", help="remove every file the manifest lists")
    args = ap.parse_args()
    if args.uninstall:
        return uninstall(args.manifest)
    if not args.prefix:
        ap.error("--prefix is required to install")
    return install(os.path.abspath(args.prefix), args.manifest)


if __name__ == "__main__":
    sys.exit(main())
