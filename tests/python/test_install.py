#!/usr/bin/python3
"""test_install.py - every way to install KaiTian works as a newcomer types it,
each from a fresh copy of the tree (git's tracked and untracked, not ignored,
files, copied into a temporary directory that is removed at the end), none
using the checkout's build, its PYTHONPATH or KAITIAN_LIBRARY:

  wheel   `pip wheel --no-build-isolation .`: every package of
          python/torch_kaitian (each **/__init__.py) and each of their .py
          files is in it, with the library, the launcher (executable), the
          `kaitian` console entry point; tagged py3-none-<platform>.
  venv    `python3 -m venv --system-site-packages` (Debian's torch) and
          `pip install --no-build-isolation .`: the venv's `kaitian`, called
          by its path from another directory (the venv not activated, nothing
          set), runs a 2-rank job that imports torch_kaitian.parallel and
          takes one ZeroOptimizer step, under the venv's interpreter;
          `kaitian info` names that interpreter, its torch, the package and
          the library in the venv; `kaitian run -n 2 kaitian bench -c 1` checks
          clean; the command is the launcher itself (exec: same pid, its exit
          status).
  target  `pip install --target T` of the wheel: the same job by T/bin/kaitian
          with PYTHONPATH=T, which is what a --target directory needs.
  make    `make install PREFIX=$HOME/.local` (HOME a temporary directory) and
          the README's C example built and run exactly as the README's text
          says (4 ranks under the installed `kaitian run`; the program finds
          the prefix's libkaitian by its run path); `import torch_kaitian`
          from the prefix loads the prefix's library; `make uninstall` leaves
          no file under the prefix; installed into a prefix this Python does
          not search, install.py names the PYTHONPATH that makes it work.

Under Debian's python3 (the first pass, python_install) all four run. Under a
virtual environment's interpreter (the torch-2 pass, python2_install: torch
2.x from PyPI) wheel and target run with that interpreter, the job on its
torch; a venv made from it would see Debian's torch, not its own.

Usage: test_install.py. Exit status 0 when all pass."""
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile

REPO = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
IN_VENV = sys.prefix != sys.base_prefix

# The job every install runs: argv = install root, torch major expected.
JOB = r'''
import os, sys
import torch
import torch.distributed as dist
import torch_kaitian
from torch_kaitian.parallel import ZeroOptimizer

root, major = os.path.realpath(sys.argv[1]), int(sys.argv[2])
for what, path in (("torch_kaitian", torch_kaitian.__file__), ("libkaitian", torch_kaitian.library_path)):
    if not os.path.realpath(path).startswith(root + os.sep):
        sys.exit(f"{what} came from {path}, not from the install in {root}")
if int(torch.__version__.split(".")[0]) != major:
    sys.exit(f"torch {torch.__version__} from {torch.__file__}: expected torch {major}.x")
dist.init_process_group("kaitian")
r, n = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
model = torch.nn.Linear(4, 2)
opt = ZeroOptimizer(model.parameters(), torch.optim.SGD, lr=0.5)
w0, b0 = model.weight.detach().clone(), model.bias.detach().clone()
model(torch.full((3, 4), float(r + 1))).sum().backward()
opt.step()
# The mean over ranks of d/dW sum(W x + b) with x = r + 1 on 3 rows: 3 (r + 1); bias: 3.
gw = sum(3.0 * (k + 1) for k in range(n)) / n
if not (torch.allclose(model.weight, w0 - 0.5 * gw) and torch.allclose(model.bias, b0 - 0.5 * 3.0)):
    sys.exit(f"rank {r}: after one step weight {model.weight.tolist()} bias {model.bias.tolist()}; "
             f"expected {(w0 - 0.5 * gw).tolist()} and {(b0 - 1.5).tolist()}")
dist.destroy_process_group()
print(f"rank {r}: one ZeroOptimizer step over {n} ranks is right (torch {torch.__version__}, "
      f"{torch_kaitian.library_path})", flush=True)
'''


def fail(msg):
    sys.exit(f"FAIL: {msg}")


def run(cmd, expect=0, timeout=600, **kw):
    t0 = time.monotonic()
    try:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           timeout=timeout, **kw)
    except subprocess.TimeoutExpired as e:
        fail(f"{' '.join(map(str, cmd))} did not finish within {timeout} s:\n{e.stdout}")
    if expect is not None and p.returncode != expect:
        fail(f"{' '.join(map(str, cmd))} exited with {p.returncode}, expected {expect} "
             f"({time.monotonic() - t0:.1f} s):\n{p.stdout}")
    return p.stdout


def clean_env(tmp, **extra):
    """This environment without what points at the checkout (and without the
    outer make's job server), temporary files inside tmp, plus extra."""
    drop = ("KAITIAN_LIBRARY", "PYTHONPATH", "PYTHON", "MAKEFLAGS", "MFLAGS", "MAKELEVEL",
            "MAKEOVERRIDES", "VIRTUAL_ENV")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update(TMPDIR=os.path.join(tmp, "tmp"), PIP_NO_CACHE_DIR="1",
               PIP_DISABLE_PIP_VERSION_CHECK="1")
    env.update(extra)
    return env


def fresh_copy(dest):
    """The tree as a clone with this checkout's changes would have it."""
    try:
        out = subprocess.run(["git", "-C", REPO, "ls-files", "-z", "--cached", "--others",
                              "--exclude-standard"], check=True, stdout=subprocess.PIPE).stdout
        files = [f for f in out.decode().split("\0") if f]
    except (OSError, subprocess.CalledProcessError):
        files = None
    if not files:  # not a git checkout: everything but build trees and caches
        shutil.copytree(REPO, dest, symlinks=True, ignore=shutil.ignore_patterns(
            ".git", "build*", "__pycache__", "*.pyc"))
        return
    for f in files:
        src = os.path.join(REPO, f)
        if not os.path.lexists(src):
            continue  # deleted in the work tree
        os.makedirs(os.path.dirname(os.path.join(dest, f)), exist_ok=True)
        if os.path.islink(src):
            os.symlink(os.readlink(src), os.path.join(dest, f))
        else:
            shutil.copy2(src, os.path.join(dest, f))


def check_wheel(whl, src):
    with zipfile.ZipFile(whl) as z:
        infos = {re.sub(r"^[^/]+\.data/(purelib|platlib)/", "", i.filename): i for i in z.infolist()}
        meta = {os.path.basename(n): z.read(i).decode() for n, i in infos.items() if ".dist-info/" in n}
    missing = []
    pkg_root = os.path.join(src, "python")
    packages = 0
    for d, dirs, files in os.walk(os.path.join(pkg_root, "torch_kaitian")):
        dirs[:] = [x for x in dirs if x != "__pycache__"]
        if "__init__.py" not in files:
            continue
        packages += 1
        rel = os.path.relpath(d, pkg_root)
        missing += [f"{rel}/{f}" for f in sorted(files) if f.endswith(".py") and f"{rel}/{f}" not in infos]
    if missing:
        fail(f"the wheel {os.path.basename(whl)} lacks {', '.join(missing)}: a package or module of "
             "python/torch_kaitian was not discovered")
    for name, executable in (("torch_kaitian/libkaitian.so", False), ("torch_kaitian/bin/kaitian", True),
                             ("torch_kaitian_cli.py", False)):
        if name not in infos:
            fail(f"the wheel lacks {name}")
        if executable and not (infos[name].external_attr >> 16) & 0o111:
            fail(f"{name} is not executable in the wheel (mode {infos[name].external_attr >> 16:o})")
    if not re.search(r"^kaitian = torch_kaitian_cli:main$", meta.get("entry_points.txt", ""), re.M):
        fail(f"no `kaitian` console entry point: {meta.get('entry_points.txt')!r}")
    if not re.search(r"^Tag: py3-none-linux_\w+$", meta.get("WHEEL", ""), re.M):
        fail(f"the wheel is not tagged py3-none-<platform>: {meta.get('WHEEL')!r}")
    print(f"wheel: {os.path.basename(whl)}: {packages} packages, library, launcher, entry point")


def job_ok(out, ranks, what):
    oks = [line for line in out.splitlines() if "ZeroOptimizer step over" in line]
    if len(oks) != ranks:
        fail(f"{what}: {len(oks)} of {ranks} ranks reported a right ZeroOptimizer step:\n{out}")
    print(f"{what}: {oks[0].split('] ', 1)[-1]}")


def test_venv(tmp, src, job, elsewhere, major):
    import torch
    venv = os.path.join(tmp, "venv")
    run([sys.executable, "-m", "venv", "--system-site-packages", venv], env=clean_env(tmp))
    vpy, kt = os.path.join(venv, "bin", "python"), os.path.join(venv, "bin", "kaitian")
    run([vpy, "-m", "pip", "install", "--no-build-isolation", "--no-deps", "--no-index", src],
        env=clean_env(tmp), cwd=elsewhere)
    env = clean_env(tmp)
    job_ok(run([kt, "run", "-n", "2", job, venv, str(major)], env=env, cwd=elsewhere), 2, "venv")

    info = run([kt, "info"], env=env, cwd=elsewhere)
    pkg = run([vpy, "-c", "import os, torch_kaitian as t; print(os.path.dirname(t.__file__))"],
              env=env, cwd=elsewhere).strip().splitlines()[-1]
    want = [rf"^python: +{re.escape(vpy)} \([0-9.]+; \$PYTHON\)$",
            rf"^torch: +{re.escape(torch.__version__)} in ",
            rf"^package: +torch_kaitian in {re.escape(pkg)}$",
            rf"^library: +{re.escape(os.path.join(pkg, 'libkaitian.so'))} \("]
    for w in want:
        if not re.search(w, info, re.M):
            fail(f"venv: `kaitian info` has no line matching {w!r}:\n{info}")
    if not pkg.startswith(venv + os.sep):
        fail(f"venv: torch_kaitian imported from {pkg}, not from {venv}")
    print(f"venv: kaitian info names {vpy}, torch {torch.__version__}, {pkg}")

    active = clean_env(tmp, PATH=os.path.join(venv, "bin") + os.pathsep + os.environ.get("PATH", ""))
    out = run(["kaitian", "run", "-n", "2", "kaitian", "bench", "-c", "1", "-e", "64K", "-C",
               "allreduce,allgather"], env=active, cwd=elsewhere)
    if "# wrong values: 0 OK" not in out:
        fail(f"venv: kaitian run -n 2 kaitian bench -c 1 did not check clean:\n{out}")

    # The command is the launcher itself: its pid is the ranks' parent, its
    # exit status the failing rank's.
    p = subprocess.Popen([kt, "run", "-n", "1", "sh", "-c", 'echo "parent $PPID"; exit 3'], env=env,
                         cwd=elsewhere, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out, _ = p.communicate(timeout=120)
    m = re.search(r"parent (\d+)", out)
    if p.returncode != 3 or not m or int(m.group(1)) != p.pid:
        fail(f"venv: `kaitian run` through the entry point: exit status {p.returncode} (expected 3), "
             f"ranks' parent {m.group(1) if m else '?'} (expected the command's pid {p.pid}):\n{out}")
    print("venv: kaitian bench checks clean; the entry point is the launcher (same pid, exit status 3)")


def test_target(tmp, whl, job, elsewhere, major):
    target = os.path.join(tmp, "target")
    run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "--target", target, whl],
        env=clean_env(tmp), cwd=elsewhere)
    kt = os.path.join(target, "bin", "kaitian")
    out = run([kt, "run", "-n", "2", job, target, str(major)], env=clean_env(tmp, PYTHONPATH=target),
              cwd=elsewhere)
    job_ok(out, 2, f"--target ({sys.executable})")


def readme_example(src):
    """The README's C program and its shell lines up to `kaitian run`."""
    with open(os.path.join(src, "README.md")) as f:
        text = f.read()
    if "## Using it from C" not in text:
        fail("README.md has no section 'Using it from C'")
    sec = text.split("## Using it from C", 1)[1]
    c, sh = re.search(r"```c\n(.*?)```", sec, re.S), re.search(r"```sh\n(.*?)```", sec, re.S)
    if not c or not sh:
        fail("README.md's 'Using it from C' lacks its ```c or ```sh block")
    lines = []
    for line in sh.group(1).splitlines():
        lines.append(line)
        if line.startswith("kaitian run"):
            return c.group(1), lines
    fail("README.md's C example has no `kaitian run` line")


def test_make(tmp, src, elsewhere):
    home = os.path.join(tmp, "home")
    prefix = os.path.join(home, ".local")
    work = os.path.join(tmp, "demo")
    os.makedirs(home)
    os.makedirs(work)
    code, lines = readme_example(src)
    with open(os.path.join(work, "demo.c"), "w") as f:
        f.write(code)
    # `make` is the copy's Makefile, building in the directory the wheel's build
    # already configured (Release, no tests): the same install, quicker.
    script = ("set -e\n"
              f"make() {{ command make -C '{src}' BUILD=build-pip/cmake \"$@\"; }}\n"
              + "\n".join(lines) + "\n")
    env = clean_env(tmp, HOME=home)
    env.pop("PKG_CONFIG_PATH", None)
    out = run(["sh", "-c", script], env=env, cwd=work, timeout=900)
    ldd = run(["ldd", os.path.join(work, "demo")], env=env)
    m = re.search(r"libkaitian\.so\.0 => (\S+)", ldd)
    if not m or not os.path.realpath(m.group(1)).startswith(prefix + os.sep):
        fail(f"make: ./demo does not load the prefix's libkaitian by its run path:\n{ldd}")
    cmds = [re.sub(r"\s+#.*", "", line) for line in lines]
    print(f"make: the README's C example built and ran on 4 ranks: {'; '.join(cmds)}")

    lib = run([sys.executable, "-c", "import torch_kaitian as t; print(t.library_path)"], env=env,
              cwd=elsewhere).strip().splitlines()[-1]
    if not os.path.realpath(lib).startswith(prefix + os.sep):
        fail(f"make: import torch_kaitian loaded {lib} ({os.path.realpath(lib)}), not {prefix}'s:\n{out}")
    print(f"make: import torch_kaitian loads {lib} -> {os.path.realpath(lib)}")

    # A prefix this Python does not look in: one line says what to set, and it works.
    other = os.path.join(tmp, "other")
    out = run([sys.executable, os.path.join(src, "python", "install.py"), "--prefix", other],
              env=env, cwd=work)
    m = re.search(r"^note: .* export PYTHONPATH=(\S+):\$PYTHONPATH$", out, re.M)
    if not m or not m.group(1).startswith(other + os.sep):
        fail(f"install.py into {other} did not say which PYTHONPATH to set:\n{out}")
    # (found, not imported: this prefix has no library)
    got = run([sys.executable, "-c", "import importlib.util as u; print(u.find_spec('torch_kaitian').origin)"],
              env=dict(env, PYTHONPATH=m.group(1)), cwd=elsewhere).strip().splitlines()[-1]
    if not got.startswith(other + os.sep):
        fail(f"with the PYTHONPATH install.py named, torch_kaitian came from {got}")
    print(f"make: a prefix off the path: install.py says {m.group(0)!r}")

    run(["make", "-C", src, "BUILD=build-pip/cmake", "uninstall"], env=env, cwd=work)
    left = [os.path.join(d, f) for d, _, files in os.walk(prefix) for f in files]
    left += [os.path.join(d, x) for d, dirs, _ in os.walk(prefix) for x in dirs
             if os.path.islink(os.path.join(d, x))]
    if left:
        fail(f"make uninstall left {len(left)} files under {prefix}: {', '.join(sorted(left)[:10])}")
    print("make: make uninstall left no file under the prefix")


def main():
    import torch
    major = int(torch.__version__.split(".")[0])
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="kt_install.") as tmp:
        os.makedirs(os.path.join(tmp, "tmp"))
        src, elsewhere = os.path.join(tmp, "src"), os.path.join(tmp, "elsewhere")
        os.makedirs(elsewhere)
        fresh_copy(src)
        job = os.path.join(elsewhere, "zero_step.py")
        with open(job, "w") as f:
            f.write(JOB)
        run([sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "--no-index",
             "-w", os.path.join(tmp, "wheel"), src], env=clean_env(tmp), cwd=elsewhere, timeout=900)
        wheels = os.listdir(os.path.join(tmp, "wheel"))
        if len(wheels) != 1:
            fail(f"pip wheel made {wheels}, expected one wheel")
        whl = os.path.join(tmp, "wheel", wheels[0])
        check_wheel(whl, src)
        print(f"  ({time.monotonic() - t0:.0f} s)")
        if not IN_VENV:
            test_venv(tmp, src, job, elsewhere, major)
            print(f"  ({time.monotonic() - t0:.0f} s)")
        test_target(tmp, whl, job, elsewhere, major)
        print(f"  ({time.monotonic() - t0:.0f} s)")
        if not IN_VENV:
            test_make(tmp, src, elsewhere)
            print(f"  ({time.monotonic() - t0:.0f} s)")
    print(f"PASS install ({time.monotonic() - t0:.0f} s)")


if __name__ == "__main__":
    main()
