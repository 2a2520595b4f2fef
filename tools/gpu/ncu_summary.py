#!/usr/bin/env python3
"""Summarises `ncu --csv --page raw --metrics gpu__time_duration.sum` output
of `trigon bench latency --profile-steps N`: the run's kernels in launch
order, cut into steps at each sampling kernel (every step ends with one).
Prints, per step, the kernel count and the summed kernel time, then for the
prefill steps and the decode steps the kernels grouped by name (and grid),
heaviest first. Summed kernel time against the step's wall time is the
share the GPU spent idle between kernels (launch gaps, host work).

Usage: ncu_summary.py ncu.csv
"""
import csv
import sys
from collections import defaultdict


def num(s: str) -> float:
    """ncu's numbers carry thousands separators ("19,680")."""
    return float(s.replace(",", ""))


def short(name: str) -> str:
    name = name.split("(")[0]
    return name if len(name) <= 60 else name[:57] + "..."


def main() -> int:
    # ncu prints lines of its own before the CSV; the table starts at "ID".
    lines = [l for l in open(sys.argv[1], newline="")]
    start = next((i for i, l in enumerate(lines) if l.startswith('"ID"')), None)
    if start is None:
        print("ncu_summary: no CSV table (was anything profiled?)")
        return 1
    all_rows = list(csv.DictReader(lines[start:]))
    rows = [r for r in all_rows if r.get("ID", "").strip().isdigit()]
    if not rows:
        print("ncu_summary: no kernel rows (was anything profiled?)")
        return 1
    tcol = next(k for k in rows[0] if k.startswith("gpu__time_duration"))
    units = next((r for r in all_rows if not r.get("ID", "").strip()), {})
    # Printed in microseconds.
    unit = {"nsecond": 1e-3, "usecond": 1.0, "msecond": 1e3, "second": 1e6}.get(units.get(tcol, "nsecond"), 1e-3)
    steps, cur = [], []
    for r in rows:
        cur.append(r)
        if "sample" in r["Kernel Name"]:
            steps.append(cur)
            cur = []
    if cur:
        steps.append(cur)
    print(f"{len(rows)} kernels in {len(steps)} steps")
    for i, s in enumerate(steps):
        tot = sum(num(r[tcol]) for r in s) * unit
        print(f"  step {i}: {len(s)} kernels, {tot:.1f} us of kernel time")
    # The last two steps are the decode steps (--profile-steps 2).
    ndec = min(2, len(steps) - 1) if len(steps) > 1 else 0
    groups = [("prefill", steps[: len(steps) - ndec]), ("decode", steps[len(steps) - ndec:])]
    for label, ss in groups:
        if not ss:
            continue
        agg = defaultdict(lambda: [0, 0.0])
        total = 0.0
        for s in ss:
            for r in s:
                key = (short(r["Kernel Name"]), r.get("Grid Size", ""), r.get("Block Size", ""))
                t = num(r[tcol]) * unit
                agg[key][0] += 1
                agg[key][1] += t
                total += t
        n = len(ss)
        print(f"{label}: {n} steps, {total / n:.1f} us of kernel time per step")
        print(f"  {'us/step':>9} {'share':>6} {'calls/step':>10} {'us/call':>8}  kernel [grid] [block]")
        for (name, grid, block), (c, t) in sorted(agg.items(), key=lambda kv: -kv[1][1])[:25]:
            print(f"  {t / n:9.1f} {t / total:6.1%} {c / n:10.1f} {t / c:8.2f}  {name} {grid} {block}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
