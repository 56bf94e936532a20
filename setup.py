"""setup.py - build hook for `pip install .` / `pip wheel .` (offline:
`--no-build-isolation`, Debian's setuptools): the Python code is pure
(python/torch_kaitian, metadata in pyproject.toml), but the package ships the
C library and the `kaitian` launcher inside itself, so that a pip install is
the whole product without `make install`:

    torch_kaitian/libkaitian.so   loaded by torch_kaitian/_lib.py (next to the package)
    torch_kaitian/bin/kaitian     run by the `kaitian` command (python/torch_kaitian_cli.py)

Both are built here with CMake (Release, targets `kaitian` and `kaitian_cli`,
tests off, in build-pip/cmake/). $KAITIAN_LIBRARY, when set, is bundled
instead of a built library, with the `kaitian` beside it when there is one (a
build directory has both). Without CMake the package is installed alone: it
then finds libkaitian through the system loader and the `kaitian` command says
that it has no launcher (`make install` gives both).

The wheel is tagged for this platform (py3-none-linux_x86_64, say): it holds
machine code, but nothing that depends on the Python version."""
import os
import shutil
import subprocess
import sys

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

try:
    from setuptools.command.bdist_wheel import bdist_wheel  # setuptools >= 70.1
except ImportError:
    try:
        from wheel.bdist_wheel import bdist_wheel  # Debian's python3-wheel
    except ImportError:
        bdist_wheel = None

ROOT = os.path.dirname(os.path.abspath(__file__))


def _build(build_dir):
    """(library, launcher) built with CMake in build_dir; None for what could not be."""
    cmake = shutil.which("cmake")
    if cmake is None:
        sys.stderr.write("torch-kaitian: cmake not found: cannot build libkaitian and the launcher\n")
        return None, None
    subprocess.check_call([cmake, "-S", ROOT, "-B", build_dir, "-DCMAKE_BUILD_TYPE=Release",
                           "-DKT_BUILD_TESTS=OFF"])
    subprocess.check_call([cmake, "--build", build_dir, "--target", "kaitian", "kaitian_cli", "-j",
                           str(os.cpu_count() or 1)])
    lib, exe = os.path.join(build_dir, "libkaitian.so"), os.path.join(build_dir, "kaitian")
    return (os.path.realpath(lib) if os.path.exists(lib) else None,
            exe if os.access(exe, os.X_OK) else None)


class BuildPyWithLibrary(build_py):
    def run(self):
        super().run()
        lib = os.environ.get("KAITIAN_LIBRARY") or None
        exe = None
        if lib:
            beside = os.path.join(os.path.dirname(os.path.realpath(lib)), "kaitian")
            exe = beside if os.path.isfile(beside) and os.access(beside, os.X_OK) else None
        if lib is None or exe is None:
            try:
                built_lib, exe = _build(os.path.join(ROOT, "build-pip", "cmake"))
                lib = lib or built_lib
            except (OSError, subprocess.CalledProcessError) as e:
                sys.stderr.write(f"torch-kaitian: could not build libkaitian and the launcher ({e})\n")
        pkg = os.path.join(self.build_lib, "torch_kaitian")
        if lib:
            self.copy_file(lib, os.path.join(pkg, "libkaitian.so"))
        else:
            sys.stderr.write("torch-kaitian: no libkaitian bundled: the package will look for an "
                             "installed one (make install)\n")
        if exe:
            self.mkpath(os.path.join(pkg, "bin"))
            self.copy_file(exe, os.path.join(pkg, "bin", "kaitian"))  # keeps the mode (x)
        else:
            sys.stderr.write("torch-kaitian: no launcher bundled: the `kaitian` command will say so\n")


class BinaryDistribution(Distribution):
    """Machine code inside: installed to platlib, a wheel tagged for the platform."""

    def has_ext_modules(self):
        return True


cmdclass = {"build_py": BuildPyWithLibrary}
if bdist_wheel is not None:
    class PlatformWheel(bdist_wheel):
        """Tied to the platform, not to the Python version or ABI: py3-none-PLATFORM."""

        def get_tag(self):
            return ("py3", "none") + tuple(super().get_tag()[2:])

    cmdclass["bdist_wheel"] = PlatformWheel

os.makedirs(os.path.join(ROOT, "build-pip"), exist_ok=True)  # ignored by git (/build*/)
setup(cmdclass=cmdclass, distclass=BinaryDistribution,
      options={"build": {"build_base": os.path.join("build-pip", "setuptools")},
               "egg_info": {"egg_base": "build-pip"}})
