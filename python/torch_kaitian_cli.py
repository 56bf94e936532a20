"""torch_kaitian_cli - the `kaitian` command of a pip install (pyproject.toml's
console entry point): replaces this process with the C launcher that the
wheel ships in torch_kaitian/bin/kaitian, with the same arguments, so that
`kaitian run`'s signals, output and exit status are exactly the launcher's.

One thing is added: `.py` programs run under this interpreter (the one the
package is installed for, a virtual environment's included) unless $PYTHON
says otherwise; the C launcher alone would use /usr/bin/python3.

A module of its own beside the package, not torch_kaitian._cli: importing
anything inside torch_kaitian imports torch (seconds), and `kaitian` starts
once per rank in `kaitian run -n 4 kaitian bench`.
"""
import importlib.util
import os
import sys


def launcher():
    """The launcher inside the torch_kaitian this interpreter imports, or None."""
    spec = importlib.util.find_spec("torch_kaitian")  # finds, does not import
    for d in (spec.submodule_search_locations or []) if spec else []:
        exe = os.path.join(d, "bin", "kaitian")
        if os.path.isfile(exe) and os.access(exe, os.X_OK):
            return exe
    return None


def main():
    exe = launcher()
    if exe is None:
        sys.stderr.write("kaitian: this torch_kaitian has no launcher (torch_kaitian/bin/kaitian): it "
                         "was installed without CMake. Install cmake and reinstall with pip, or use "
                         "the `kaitian` of `make install` (docs/install.md)\n")
        return 127
    env = os.environ
    if not env.get("PYTHON") and sys.executable:
        env = dict(env, PYTHON=sys.executable)
    try:
        os.execve(exe, [exe] + sys.argv[1:], env)
    except OSError as e:
        sys.stderr.write(f"kaitian: cannot run the launcher {exe}: {e.strerror}\n")
        return 126


if __name__ == "__main__":
    sys.exit(main())
