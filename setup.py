"""setup.py - build hook for `pip install --no-build-isolation .`: the package
(python/torch_kaitian, metadata in pyproject.toml) is pure Python, but it ships
the C library next to itself so the install works without `make install`.

Which library is bundled: $KAITIAN_LIBRARY when set, else one built here with
CMake (Release, target `kaitian`, in build-pip/). Without CMake the package is
installed alone and finds libkaitian through the system loader (`make install`)."""
import os
import shutil
import subprocess
import sys

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = os.path.dirname(os.path.abspath(__file__))


def _build_library(build_dir):
    cmake = shutil.which("cmake")
    if cmake is None:
        return None
    subprocess.check_call([cmake, "-S", ROOT, "-B", build_dir, "-DCMAKE_BUILD_TYPE=Release",
                           "-DKT_BUILD_TESTS=OFF"])
    subprocess.check_call([cmake, "--build", build_dir, "--target", "kaitian", "-j",
                           str(os.cpu_count() or 1)])
    lib = os.path.join(build_dir, "libkaitian.so")
    return os.path.realpath(lib) if os.path.exists(lib) else None


class BuildPyWithLibrary(build_py):
    def run(self):
        super().run()
        lib = os.environ.get("KAITIAN_LIBRARY") or None
        if lib is None:
            try:
                lib = _build_library(os.path.join(ROOT, "build-pip", "cmake"))
            except (OSError, subprocess.CalledProcessError) as e:
                sys.stderr.write(f"torch-kaitian: could not build libkaitian ({e}); the package will "
                                 "look for an installed one (make install)\n")
        if lib:
            dest = os.path.join(self.build_lib, "torch_kaitian", "libkaitian.so")
            self.copy_file(lib, dest)
        else:
            sys.stderr.write("torch-kaitian: no libkaitian bundled\n")


os.makedirs(os.path.join(ROOT, "build-pip"), exist_ok=True)  # ignored by git (/build*/)
setup(cmdclass={"build_py": BuildPyWithLibrary},
      options={"build": {"build_base": os.path.join("build-pip", "setuptools")},
               "egg_info": {"egg_base": "build-pip"}})
