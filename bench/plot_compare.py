#!/usr/bin/python3
"""plot_compare.py - draw a bench/compare report: busbw against size for
KaiTian, Open MPI and torch gloo, one panel per rank count, and under each the
time ratios kaitian/mpi and kaitian/gloo.

    /usr/bin/python3 bench/plot_compare.py bench/results/compare-DATE.txt [-o OUT.png]

Reads only the report (the "# table: allreduce ... ranks=N" sections that
bench/compare writes), so a saved report can be drawn again at any time.
Needs matplotlib (Debian: python3-matplotlib). The default output is the
report's name with .png.
"""
import argparse
import math
import re
import sys

LIBS = (  # table column of the time, label, style
    (2, "KaiTian (kaitian bench, C API)", dict(color="tab:red", marker="o")),
    (3, "Open MPI (MPI_Allreduce)", dict(color="tab:blue", marker="s")),
    (4, "torch gloo (all_reduce)", dict(color="tab:green", marker="^")),
)
TABLE = re.compile(r"^# table: allreduce float32 .*ranks=(\d+)")


def number(text):
    """A table cell as a float, or None for '-'."""
    try:
        v = float(text)
    except ValueError:
        return None
    return v if math.isfinite(v) else None


def parse(path):
    """Returns (header lines, {ranks: [row cells...]}) from a compare report."""
    header, tables, current = [], {}, None
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.rstrip("\n")
            m = TABLE.match(line)
            if m:
                current = tables.setdefault(int(m.group(1)), [])
                continue
            if line.startswith("# table:") or not line.strip():
                current = None
                continue
            if line.startswith("#"):
                if not tables:
                    header.append(line[1:].strip())
                continue
            cells = line.split()
            if current is not None and len(cells) >= 10 and cells[0].isdigit():
                current.append(cells)
    return header, tables


def size_label(b):
    b = int(b)
    for unit, name in ((1 << 30, "G"), (1 << 20, "M"), (1 << 10, "K")):
        if b >= unit and b % unit == 0:
            return "%d%s" % (b // unit, name)
    return str(b)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("report", help="a bench/results/compare-*.txt file")
    ap.add_argument("-o", "--output", help="PNG to write (default: the report with .png)")
    args = ap.parse_args()
    out = args.output or re.sub(r"\.txt$", "", args.report) + ".png"

    try:
        header, tables = parse(args.report)
    except OSError as e:
        sys.stderr.write("plot_compare.py: cannot read %s: %s\n" % (args.report, e))
        return 1
    if not tables:
        sys.stderr.write("plot_compare.py: %s has no '# table: allreduce float32 ... ranks=N' "
                         "section with data rows; is it a bench/compare report?\n" % args.report)
        return 1

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    ranks = sorted(tables)
    fig, axes = plt.subplots(2, len(ranks), figsize=(6.2 * len(ranks), 7.5), squeeze=False,
                             sharex="col", gridspec_kw=dict(height_ratios=[2.2, 1]))
    for col, n in enumerate(ranks):
        rows = tables[n]
        sizes = [int(r[0]) for r in rows]
        top, bottom = axes[0][col], axes[1][col]
        factor = 2.0 * (n - 1) / n  # allreduce's bus factor, as in kaitian bench
        for tcol, name, style in LIBS:
            # busbw from the time, not the table's rounded column
            pts = [(s, number(r[tcol])) for s, r in zip(sizes, rows)]
            pts = [(s, s / t / 1e3 * factor) for s, t in pts if t is not None and t > 0]
            if pts:
                top.plot(*zip(*pts), label=name, linewidth=1.5, markersize=4, **style)
        top.set_title("allreduce float32, %d ranks" % n)
        top.set_ylabel("busbw (GB/s, log scale)")
        top.set_yscale("log")
        top.grid(True, which="both", alpha=0.3)
        top.legend(loc="lower right", fontsize=8)

        for tcol, name, style in ((3, "kaitian / Open MPI", dict(color="tab:blue", marker="s")),
                                  (4, "kaitian / gloo", dict(color="tab:green", marker="^"))):
            # ratios from the times, not the table's rounded column
            pts = [(s, number(r[2]), number(r[tcol])) for s, r in zip(sizes, rows)]
            pts = [(s, k / o) for s, k, o in pts if k and o]
            if pts:
                bottom.plot(*zip(*pts), label=name, linewidth=1.2, markersize=3, **style)
        bottom.axhline(1.0, color="black", linewidth=0.8)
        if n == 2:
            bottom.axhline(0.2, color="tab:green", linestyle="--", linewidth=0.8,
                           label="target vs gloo (0.2)")
        else:
            bottom.axhline(1.2, color="tab:blue", linestyle="--", linewidth=0.8,
                           label="target vs Open MPI (1.2)")
        bottom.set_yscale("log")
        bottom.set_ylabel("time ratio (<1: kaitian faster)")
        bottom.grid(True, which="both", alpha=0.3)
        bottom.legend(loc="best", fontsize=7)
        bottom.set_xscale("log", base=2)
        bottom.set_xlabel("size per rank (bytes, log scale)")
        ticks = [s for i, s in enumerate(sizes) if i % 2 == 0 or len(sizes) <= 12]
        bottom.xaxis.set_major_locator(FixedLocator(ticks))
        bottom.xaxis.set_minor_locator(NullLocator())
        bottom.xaxis.set_major_formatter(FuncFormatter(lambda v, _: size_label(v)))
        for label in bottom.get_xticklabels():
            label.set_rotation(60)
            label.set_fontsize(7)

    title = header[0] if header else args.report
    cpu = next((h for h in header if h.startswith("cpu:")), "")
    load = next((h for h in header if h.startswith("load average")), "")
    fig.suptitle("%s\n%s\n%s" % (title, cpu, load), fontsize=8)
    fig.tight_layout(rect=(0, 0, 1, 0.93))
    try:
        fig.savefig(out, dpi=110)
    except OSError as e:
        sys.stderr.write("plot_compare.py: cannot write %s: %s\n" % (out, e))
        return 1
    print("plot_compare.py: wrote %s" % out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
