#!/usr/bin/env python3
"""Prints trigon's latency results beside the peers' as a ratio table.

Reads any number of files, each holding JSON objects: trigon's
`bench latency --json` output (one indented object) or the peers' JSON
lines (hf_peer.py, gptfast_peer.py). Results are grouped by (arch, batch,
input_len, output_len); in each group every peer is compared with every
trigon result (e.g. with and without CUDA graphs). Ratios are peer time /
trigon time, so above 1 means trigon is faster.

  python3 bench/peers/compare.py trigon.json trigon-graphs.json hf.jsonl gptfast.jsonl
  python3 bench/peers/compare.py --markdown results/*.json > table.md
"""

import argparse
import json
import sys


def read_objects(path):
    """Every JSON object in a file: one document or JSON lines."""
    with open(path) as f:
        text = f.read()
    try:
        doc = json.loads(text)
        return doc if isinstance(doc, list) else [doc]
    except ValueError:
        pass
    objs = []
    for n, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line.startswith("{"):
            continue  # log lines mixed into a captured stdout
        try:
            objs.append(json.loads(line))
        except ValueError as e:
            sys.stderr.write("%s:%d: skipped, not JSON: %s\n" % (path, n, e))
    return objs


def label(r):
    name = r.get("engine", "?")
    if name == "trigon":
        name += " (graphs %s)" % r.get("cuda_graphs", "?")
    return name


def get(r, key, stat=None):
    v = r.get(key)
    if stat is not None:
        v = v.get(stat) if isinstance(v, dict) else None
        if isinstance(r.get(key), dict) and r[key].get("count", 1) == 0:
            return None
    return v if isinstance(v, (int, float)) else None


def fmt(v, digits=2):
    return "n/a" if v is None else "%.*f" % (digits, v)


def ratio(peer, ours):
    if peer is None or ours is None or ours == 0:
        return None
    return peer / ours


COLUMNS = ["engine", "prefill ms", "ITL p50 ms", "ITL p99 ms", "decode tok/s", "prefill x", "ITL p50 x", "ITL p99 x"]


def rows_for(group):
    trigons = [r for r in group if r.get("engine") == "trigon"]
    peers = [r for r in group if r.get("engine") != "trigon"]
    rows = []
    for r in trigons + peers:
        if "error" in r:
            rows.append([label(r), "error: " + r["error"][:80]] + [""] * (len(COLUMNS) - 2))
            continue
        rows.append([label(r), fmt(get(r, "prefill_ms", "p50")), fmt(get(r, "itl_ms", "p50"), 3),
                     fmt(get(r, "itl_ms", "p99"), 3), fmt(get(r, "decode_tokens_per_s"), 1), "", "", ""])
        if r.get("engine") == "trigon":
            continue
        for t in trigons:
            if "error" in t:
                continue
            rows.append(["  vs " + label(t), "", "", "", "",
                         fmt(ratio(get(r, "prefill_ms", "p50"), get(t, "prefill_ms", "p50"))),
                         fmt(ratio(get(r, "itl_ms", "p50"), get(t, "itl_ms", "p50"))),
                         fmt(ratio(get(r, "itl_ms", "p99"), get(t, "itl_ms", "p99")))])
    return rows


def print_table(rows, markdown, out):
    if markdown:
        out.write("| " + " | ".join(COLUMNS) + " |\n")
        out.write("|" + "|".join("---" for _ in COLUMNS) + "|\n")
        for r in rows:
            out.write("| " + " | ".join(r) + " |\n")
        return
    widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(COLUMNS)]
    line = lambda cells: "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))
    out.write(line(COLUMNS) + "\n")
    for r in rows:
        out.write(line(r) + "\n")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("files", nargs="+", help="JSON or JSON-lines result files")
    p.add_argument("--markdown", action="store_true", help="print Markdown tables")
    args = p.parse_args()
    groups = {}
    for path in args.files:
        for r in read_objects(path):
            if not isinstance(r, dict) or r.get("benchmark", "latency") != "latency":
                continue
            key = (str(r.get("arch")), r.get("batch"), r.get("input_len"), r.get("output_len"))
            groups.setdefault(key, []).append(r)
    if not groups:
        raise SystemExit("no latency results in %s" % ", ".join(args.files))
    for (arch, batch, inp, outp), group in sorted(groups.items(), key=lambda kv: str(kv[0])):
        head = "arch %s, batch %s, input %s, output %s" % (arch, batch, inp, outp)
        sys.stdout.write(("\n**%s**\n\n" if args.markdown else "\n%s\n") % head)
        if not any(r.get("engine") == "trigon" for r in group):
            sys.stdout.write("(no trigon result for this shape: ratios omitted)\n")
        print_table(rows_for(group), args.markdown, sys.stdout)
    sys.stdout.write("\nratios: peer time / trigon time (above 1: trigon faster)\n")


if __name__ == "__main__":
    main()
