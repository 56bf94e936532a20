#!/usr/bin/env python3
"""test_imports.py - the Python package's modules import in one direction: no
module of python/torch_kaitian imports (at its top or inside a function) a
module that imports it back, directly or through others. Reads the sources
with ast (nothing is imported), prints every cycle found, exit 1 if any; also
reports the largest modules. Usage: test_imports.py PACKAGE_DIR"""
import ast
import os
import sys


def module_name(root, path):
    rel = os.path.relpath(path, root)[:-3].replace(os.sep, ".")
    return rel[:-len(".__init__")] if rel.endswith("__init__") else rel


def imports(root, path, name):
    """Modules of the package that `name` imports (relative and absolute)."""
    tree = ast.parse(open(path).read(), path)
    pkg = name if path.endswith("__init__.py") else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg.split(".") if pkg else []
                base = base[:len(base) - (node.level - 1)] if node.level > 1 else base
                mod = ".".join(base + ([node.module] if node.module else []))
            elif node.module and node.module.startswith("torch_kaitian"):
                mod = node.module[len("torch_kaitian"):].lstrip(".")
            else:
                continue
            out.add(mod)
            for a in node.names:  # from . import X: X may be a module
                out.add(f"{mod}.{a.name}" if mod else a.name)
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("torch_kaitian."):
                    out.add(a.name[len("torch_kaitian."):])
    return out


def main():
    root = sys.argv[1]
    mods = {}
    for d, _, files in os.walk(root):
        for f in files:
            if f.endswith(".py"):
                p = os.path.join(d, f)
                mods[module_name(root, p)] = p
    graph = {m: sorted(i for i in imports(root, p, m) if i in mods and i != m and i != "")
             for m, p in mods.items()}
    # A package's __init__ importing its submodules is how a package is made;
    # a submodule importing its own package's __init__ is the cycle to catch.
    cycles, state, stack = [], {}, []

    def visit(m):
        state[m] = 1
        stack.append(m)
        for n in graph[m]:
            if "." in m and m.startswith(n + ".") is False and n == "":
                continue
            if state.get(n) == 1:
                cycles.append(stack[stack.index(n):] + [n])
            elif n not in state:
                visit(n)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)
    for c in cycles:
        print("CYCLE " + " -> ".join(c))
    big = sorted(((sum(1 for _ in open(p)), m) for m, p in mods.items()), reverse=True)[:3]
    print(f"{len(mods)} modules, {sum(len(v) for v in graph.values())} imports inside the package, "
          f"{len(cycles)} cycle(s); largest: " + ", ".join(f"{m} {n} lines" for n, m in big))
    return 1 if cycles else 0


if __name__ == "__main__":
    sys.exit(main())
