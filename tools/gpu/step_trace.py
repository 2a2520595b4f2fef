#!/usr/bin/env python3
"""Summarise a `trigon bench latency --step-trace --json` result: ITL
against the device-timed interval between decode steps, and where the
slowest steps fall (step index, and the context's position in its
16-token cache block, where a new block starts)."""
import json
import sys


def pct(v, p):
    v = sorted(v)
    k = (len(v) - 1) * p / 100
    i = int(k)
    j = min(i + 1, len(v) - 1)
    return v[i] + (v[j] - v[i]) * (k - i)


def main(path):
    d = json.load(open(path))
    rows = d if isinstance(d, list) else [d]
    for r in rows:
        itl = r.get("itl_trace_ms") or []
        dev = r.get("device_step_trace_ms") or []
        flat_i = [x for it in itl for x in it]
        flat_d = [x for it in dev for x in it]
        print("graphs %s: ITL p50 %.3f p90 %.3f p99 %.3f max %.3f ms (%d)" % (
            r["cuda_graphs"], pct(flat_i, 50), pct(flat_i, 90), pct(flat_i, 99), max(flat_i), len(flat_i)))
        if flat_d:
            print("  device step p50 %.3f p90 %.3f p99 %.3f max %.3f min %.3f ms (%d); floor %.3f" % (
                pct(flat_d, 50), pct(flat_d, 90), pct(flat_d, 99), max(flat_d), min(flat_d), len(flat_d),
                r.get("decode_floor_ms") or float("nan")))
        inp = r["input_len"]
        # ITL of decode step k (1-based) is itl[i][k-1]; its context is inp + k.
        slow = sorted(((x, i, k + 1) for i, it in enumerate(itl) for k, x in enumerate(it)), reverse=True)[:8]
        print("  slowest ITLs (ms, iteration, step, context mod 16):",
              ", ".join("%.3f@%d/%d/%d" % (x, i, k, (inp + k) % 16) for x, i, k in slow))
        if dev:
            # Interval j of an iteration ends with decode step j+2.
            slow = sorted(((x, i, j + 2) for i, it in enumerate(dev) for j, x in enumerate(it)), reverse=True)[:8]
            print("  slowest device steps (ms, iteration, step, context mod 16):",
                  ", ".join("%.3f@%d/%d/%d" % (x, i, k, (inp + k) % 16) for x, i, k in slow))
            if "-v" in sys.argv:
                for i, it in enumerate(dev):
                    print("  iteration %d device steps, every 8th: %s" % (i, " ".join("%.3f" % x for x in it[::8])))
            # Steady state: the intervals after the first 16 of each iteration.
            steady = [x for it in dev for x in it[16:]]
            if steady:
                print("  device step after the first 16 steps: p50 %.3f p99 %.3f ms" % (pct(steady, 50), pct(steady, 99)))


if __name__ == "__main__":
    for p in sys.argv[1:]:
        if p != "-v":
            main(p)
