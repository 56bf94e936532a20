#!/usr/bin/env python3
"""check_layers.py - the C core's layering, read from the compiler: which
file includes which (cc -MM) and which object uses which other object's
symbols (nm), against the layer order of docs/layers.md. Any edge that runs
up the order fails the check, naming the two files and the symbols or header.

    check_layers.py --root SRC_ROOT --cc CC [--allow FILE] OBJECT...

Objects are the library's (CMake: $<TARGET_OBJECTS:kaitian_obj>); each is
mapped back to its source by its name (.../src/core/comm.c.o). --allow: a
file of edges still to be removed ("FROM -> TO" per line, # comments): those
are reported as known, not failed; an allowed edge that no longer exists
fails too, so the list only shrinks. Exit 0: no upward edge beyond the list.
"""
import argparse
import fnmatch
import os
import re
import subprocess
import sys

# The layer order, lowest first (docs/layers.md): a file may include headers
# and call functions of its own layer and the layers below it, never above.
# The first pattern that matches a path gives its layer.
LAYERS = [
    ("base", ["include/kaitian.h", "src/core/common.h", "src/core/error.c", "src/core/log.c",
              "src/core/util.c", "src/core/params.c", "src/core/params.def", "src/core/names.c",
              "src/core/op.h"]),
    # the process's registered buffers: a registry like the store, on the base only
    ("beside base", ["src/store/*", "src/reduce/*", "src/optim/*", "src/core/memreg.*"]),
    ("transport", ["src/transport/*"]),
    ("coll", ["src/coll/*"]),
    ("core", ["src/core/*"]),
    ("api", ["src/core/api.c"]),
]
# Exceptions to the first-match rule: the public API is the top.
TOP = {"src/core/api.c": "api"}


def layer_of(path):
    if path in TOP:
        name = TOP[path]
    else:
        name = next((n for n, pats in LAYERS for p in pats if fnmatch.fnmatch(path, p)), None)
    if name is None:
        return None, None
    return name, [n for n, _ in LAYERS].index(name)


def source_of(obj, root):
    m = re.search(r"((?:src|include)/.*\.c)\.o$", obj.replace(os.sep, "/"))
    if not m:
        sys.exit(f"check_layers: cannot tell the source of object {obj}")
    path = m.group(1)
    if not os.path.exists(os.path.join(root, path)):
        sys.exit(f"check_layers: object {obj}: no source {path} under {root}")
    return path


def includes(root, src, cc):
    """Project headers src includes (directly or not), relative to root."""
    cmd = [cc, "-MM", "-I", os.path.join(root, "include"), "-I", os.path.join(root, "src"),
           "-I", os.path.join(root, "src", "core"), "-D_GNU_SOURCE", os.path.join(root, src)]
    out = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if out.returncode != 0:
        sys.exit(f"check_layers: {' '.join(cmd)} failed:\n{out.stderr}")
    deps = out.stdout.replace("\\\n", " ").split(":", 1)[1].split()
    rel = []
    for d in deps[1:]:
        p = os.path.relpath(os.path.realpath(d), os.path.realpath(root))
        if not p.startswith(".."):
            rel.append(p)
    return rel


def symbols(obj):
    """(defined, undefined) global symbols of an object file."""
    out = subprocess.run(["nm", "-P", obj], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    if out.returncode != 0:
        sys.exit(f"check_layers: nm {obj} failed: {out.stderr}")
    defined, used = set(), set()
    for line in out.stdout.splitlines():
        f = line.split()
        if len(f) < 2:
            continue
        name, kind = f[0], f[1]
        if kind == "U":
            used.add(name)
        elif kind.isupper():
            defined.add(name)
    return defined, used


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", required=True)
    ap.add_argument("--cc", default="cc")
    ap.add_argument("--allow")
    ap.add_argument("objects", nargs="+")
    a = ap.parse_args()
    # CMake passes $<TARGET_OBJECTS:...> as one ;-separated argument.
    paths = [o for arg in a.objects for o in arg.split(";") if o]
    objs = {source_of(o, a.root): o for o in paths}
    for src in sorted(objs):
        if layer_of(src)[0] is None:
            sys.exit(f"check_layers: {src} is in no layer of the table (add it)")
    edges = {}  # (from, to) -> set of what (symbols or "#include")
    owner = {}
    uses = {}
    for src, obj in objs.items():
        d, u = symbols(obj)
        uses[src] = u
        for s in d:
            owner[s] = src
    for src in objs:
        for s in uses[src]:
            to = owner.get(s)
            if to is not None and to != src:
                edges.setdefault((src, to), set()).add(s + "()")
        for h in includes(a.root, src, a.cc):
            if layer_of(h)[0] is None:
                sys.exit(f"check_layers: header {h} (included by {src}) is in no layer")
            edges.setdefault((src, h), set()).add("#include")
    up = {}
    for (f, t), what in edges.items():
        lf, lt = layer_of(f), layer_of(t)
        if lt[1] > lf[1]:
            up[(f, t)] = (lf[0], lt[0], sorted(what))
    allowed = set()
    if a.allow:
        with open(a.allow) as fh:
            for line in fh:
                line = line.split("#", 1)[0].strip()
                if line:
                    f, t = [x.strip() for x in line.split("->")]
                    allowed.add((f, t))
    bad = [e for e in sorted(up) if e not in allowed]
    gone = sorted(allowed - set(up))
    n_edges = len(edges)
    for f, t in bad:
        lf, lt, what = up[(f, t)]
        print(f"UPWARD {f} ({lf}) -> {t} ({lt}): {', '.join(what)}")
    for f, t in gone:
        print(f"GONE   {f} -> {t}: no longer an edge; remove it from {a.allow}")
    known = [e for e in sorted(up) if e in allowed]
    for f, t in known:
        lf, lt, what = up[(f, t)]
        print(f"known  {f} ({lf}) -> {t} ({lt}): {', '.join(what)}")
    print(f"check_layers: {len(objs)} objects, {n_edges} edges; {len(bad)} upward beyond the "
          f"list, {len(known)} known (to remove), {len(gone)} listed but gone")
    return 1 if bad or gone else 0


if __name__ == "__main__":
    sys.exit(main())
