#!/usr/bin/env python3
"""Summarises a kernel timeline written by tools/gpu/probes/ktrace.c.

The graph with the most replays is taken for the decode step. Each replay
is cut where the graph's first node runs again; within a replay the
kernels are ordered by start, and each gets its duration and its gap: its
start minus the latest end of the kernels before it (negative where it
overlapped them, as programmatic dependent launch allows). Over the
replays after the first --skip, the summary prints the step's span, the
time no kernel ran, the kernels grouped by name (count a step, median
time a step, the gaps before them), and the positions with the largest
median gaps. Kernels outside graphs (prefill, eager steps) are grouped by
name.

Usage: ktrace_summary.py ktrace.csv [--skip N] [--top N]
"""
import argparse
import csv
import statistics
from collections import defaultdict


def short(name: str) -> str:
    name = name.split("(")[0]
    return name if len(name) <= 48 else name[:45] + "..."


def replays(rows):
    """Splits one graph's kernels (sorted by start) into replays."""
    out, cur, first = [], [], rows[0]["graph_node"]
    for r in rows:
        if r["graph_node"] == first and cur:
            out.append(cur)
            cur = []
        cur.append(r)
    if cur:
        out.append(cur)
    return out


def outside_between(rows, keep):
    """Prints what ran outside the graph between consecutive kept replays
    (sampling, copies, sets): per name the median count and time a step,
    then one typical interval's timeline, from the previous replay's end."""
    per, timelines = defaultdict(list), []
    for k in range(1, len(keep)):
        (i0, prev), (i1, cur) = keep[k - 1], keep[k]
        if i1 != i0 + 1:
            continue
        lo, hi = max(r["end"] for r in prev), cur[0]["start"]
        inside = [r for r in rows if r["graph"] in ("", "0") and lo - 50_000 <= r["start"] < hi]
        names = defaultdict(list)
        for r in inside:
            names[short(r["name"])].append((r["end"] - r["start"]) / 1e3)
        for n in set(per) | set(names):
            per[n].append((len(names.get(n, [])), sum(names.get(n, []))))
        timelines.append((hi - lo, lo, inside))
    if not timelines:
        return
    med = statistics.median
    print("outside the graph between replays (name, median count and us a step):")
    for n, v in sorted(per.items(), key=lambda kv: -med(t for _, t in kv[1])):
        v += [(0, 0.0)] * (len(timelines) - len(v))  # intervals before the name first showed
        if med(c for c, _ in v) == 0:
            continue  # seen only where an iteration ends (its prefill)
        print(f"  {n:<48} {med(c for c, _ in v):>4} {med(t for _, t in v):>8.2f}")
    timelines.sort(key=lambda t: t[0])
    gap, lo, inside = timelines[len(timelines) // 2]
    print(f"a median interval ({gap / 1e3:.1f} us), times from the replay's end (start, duration us, stream):")
    for r in inside:
        print(f"  {(r['start'] - lo) / 1e3:>8.2f} {(r['end'] - r['start']) / 1e3:>7.2f} {r['stream']:>4} {short(r['name'])}")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--skip", type=int, default=2, help="replays left out at the start (capture, warm-up)")
    ap.add_argument("--top", type=int, default=12)
    a = ap.parse_args()
    rows = []
    with open(a.csv, newline="") as f:
        for r in csv.DictReader(f):
            try:
                r["start"], r["end"] = int(r["start_ns"]), int(r["end_ns"])
            except (KeyError, ValueError):
                continue  # a line cut short by the program's exit
            if r["end"] <= r["start"]:
                continue
            rows.append(r)
    if not rows:
        print("ktrace_summary: no kernel records")
        return 1
    rows.sort(key=lambda r: r["start"])
    graphs, eager = defaultdict(list), defaultdict(list)
    for r in rows:
        if r["graph"] not in ("", "0"):
            graphs[r["graph"]].append(r)
        else:
            eager[short(r["name"])].append((r["end"] - r["start"]) / 1e3)
    print(f"{len(rows)} kernels, {sum(len(v) for v in graphs.values())} of them in {len(graphs)} graphs")

    if graphs:
        gid, grows = max(graphs.items(), key=lambda kv: len(kv[1]))
        reps = replays(grows)
        sizes = statistics.multimode(len(r) for r in reps)
        keep = [(i, r) for i, r in enumerate(reps) if i >= a.skip and len(r) == sizes[0]]
        print(f"graph {gid}: {len(reps)} replays of {sizes[0]} kernels; {len(keep)} summarised")
        if keep:
            spans, idles, between = [], [], []
            per_pos = defaultdict(lambda: {"dur": [], "gap": [], "s2s": []})
            for k, (i, rep) in enumerate(keep):
                if k > 0 and keep[k - 1][0] == i - 1:  # the replay before it, kept too
                    between.append((rep[0]["start"] - max(r["end"] for r in keep[k - 1][1])) / 1e3)
                t0 = rep[0]["start"]
                last_end, busy_end, idle = t0, t0, 0
                for i, r in enumerate(rep):
                    gap = r["start"] - last_end
                    if r["start"] > busy_end:
                        idle += r["start"] - busy_end
                    busy_end = max(busy_end, r["end"])
                    last_end = max(last_end, r["end"])
                    per_pos[i]["dur"].append((r["end"] - r["start"]) / 1e3)
                    if i + 1 < len(rep):  # the step's critical path: start to the next kernel's start
                        per_pos[i]["s2s"].append((rep[i + 1]["start"] - r["start"]) / 1e3)
                    per_pos[i]["gap"].append(gap / 1e3)
                    per_pos[i]["name"] = short(r["name"])
                    per_pos[i]["grid"] = f'{r["grid_x"]}x{r["grid_y"]}x{r["grid_z"]}'
                spans.append((busy_end - t0) / 1e3)
                idles.append(idle / 1e3)
            med = statistics.median
            print(f"step span median {med(spans):.1f} us (min {min(spans):.1f}, max {max(spans):.1f}); "
                  f"no kernel running {med(idles):.1f} us of it")
            if between:
                print(f"between consecutive replays: median {med(between):.1f} us (max {max(between):.1f})")
                outside_between(rows, keep)
            by_name = defaultdict(lambda: [0, 0.0, 0.0, 0.0, 0.0])  # count, time, gaps > 0, overlap, start to next start
            for p in per_pos.values():
                b = by_name[p["name"]]
                b[0] += 1
                b[1] += med(p["dur"])
                g = med(p["gap"])
                if g > 0:
                    b[2] += g
                else:
                    b[3] -= g
                b[4] += med(p["s2s"]) if p["s2s"] else 0.0
            # "to next start": from a kernel's start to the next kernel's,
            # its share of the step's critical path (the last kernel's is 0).
            print(f'{"kernel":<48} {"a step":>6} {"us a step":>10} {"us each":>8} {"gaps us":>8} {"overlap us":>10} {"to next start us each":>22}')
            for name, (n, t, g, o, s2s) in sorted(by_name.items(), key=lambda kv: -kv[1][1]):
                print(f"{name:<48} {n:>6} {t:>10.1f} {t / n:>8.2f} {g:>8.1f} {o:>10.1f} {s2s / n:>22.2f}")
            worst = sorted(per_pos.items(), key=lambda kv: -med(kv[1]["gap"]))[: a.top]
            print("largest median gaps before a kernel (position, kernel, grid, gap us, its time us):")
            for i, p in worst:
                prev = per_pos[i - 1]["name"] if i > 0 else "-"
                print(f"  {i:>4} {p['name']} after {prev} ({p['grid']}): {med(p['gap']):.2f}, {med(p['dur']):.2f}")

    if eager:
        print("kernels outside graphs (total ms, count):")
        for name, d in sorted(eager.items(), key=lambda kv: -sum(kv[1]))[: a.top]:
            print(f"  {name:<48} {sum(d) / 1e3:>9.2f} {len(d):>6}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
