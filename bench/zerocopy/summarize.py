#!/usr/bin/env python3
"""Median-of-reps markdown tables from the raw per-run lines that run.sh
collects (one `setup=... SEND ... | RECV ... | ...` line per run).

Usage: summarize.py RAW_FILE
"""
import re, sys, statistics as st
from collections import defaultdict

if len(sys.argv) != 2:
    sys.exit("usage: summarize.py RAW_FILE")
path = sys.argv[1]
GiB = 2**30
runs = defaultdict(list)
for line in open(path):
    if line.startswith("#") or "SEND" not in line:
        continue
    kv = dict(re.findall(r"(\w+)=([^\s|]+)", line.split("| RECV")[0]))
    rv = dict(re.findall(r"(\w+)=([^\s|]+)", line.split("| RECV")[1]))
    g = int(kv["bytes"]) / GiB
    r = dict(
        snd=(float(kv["user"]) + float(kv["sys"])) / g,
        rcv=(float(rv["user"]) + float(rv["sys"])) / g,
        gbs=int(rv["bytes"]) / float(rv["wall"]) / 1e9,
        sirq=float(rv["softirq_s"]) / g,
        busy=float(rv["machine_busy_s"]) / g,
        copied=(int(kv["zc_copied"]) / int(kv["zc_ids"])) if int(kv["zc_ids"]) else None,
        notifs=int(kv["zc_notifs"]), ids=int(kv["zc_ids"]),
    )
    runs[(kv.get("setup") or re.search(r"setup=(\w+)", line).group(1), int(kv["chunk"]), kv["mode"])].append(r)

order = {"plain": 0, "zc": 1, "splice": 2}
names = {"plain": "plain send", "zc": "MSG_ZEROCOPY", "splice": "vmsplice+splice"}
titles = {"lo": "(a) loopback 127.0.0.1", "veth": "(b) veth between two netns, unshaped",
          "tbf": "(c) veth, tbf 2gbit both ends"}
for setup in ["lo", "veth", "tbf"]:
    keys = sorted([k for k in runs if k[0] == setup], key=lambda k: (k[1], order[k[2]]))
    if not keys:
        continue
    print(f"\n### {titles[setup]}\n")
    print("| chunk | mode | n | sender CPU s/GiB | receiver CPU s/GiB | snd+rcv s/GiB | wall GB/s | softirq s/GiB (machine, noisy) | zc COPIED fraction (ids; notifs/ids) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for k in keys:
        rs = runs[k]
        med = lambda f: st.median(x[f] for x in rs)
        snd = [x["snd"] for x in rs]
        cp = rs[0]["copied"]
        cps = "-" if cp is None else f"{st.median(x['copied'] for x in rs):.3f}; {st.median(x['notifs']/x['ids'] for x in rs):.2f}"
        print(f"| {k[1]//1024} KiB | {names[k[2]]} | {len(rs)} | {med('snd'):.3f} ({min(snd):.3f}-{max(snd):.3f}) "
              f"| {med('rcv'):.3f} | {st.median(x['snd']+x['rcv'] for x in rs):.3f} | {med('gbs'):.2f} | {med('sirq'):.3f} | {cps} |")
