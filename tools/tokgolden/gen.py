"""Writes tokenizer goldens from HF tokenizers and transformers.

For every tokenizer in tokenizer/testdata/manifest.json (a tokenizer.json,
optionally patched, plus a tokenizer_config.json) it records:

  encode: for each corpus line (and some random strings), the ids that
          tokenizers.Tokenizer.encode gives with and without special tokens;
  decode: Tokenizer.decode of those ids and of random id sequences, with and
          without skip_special_tokens;
  chat:   transformers' apply_chat_template(..., tokenize=False) for each
          conversation in chats.json, with and without add_generation_prompt
          (or the exception's message when the template raises).

Each tokenizer's goldens go to OUT/NAME.golden.json.gz. Nothing here needs a
GPU or a network; it runs wherever tokenizers and transformers are installed.

Usage: python3 tools/tokgolden/gen.py --testdata tokenizer/testdata --out OUT
"""

import argparse
import gzip
import json
import os
import random
import sys
import tempfile
import time
import traceback

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def load_json_maybe_gz(path):
    if path.endswith(".gz"):
        with gzip.open(path, "rb") as f:
            return json.loads(f.read().decode("utf-8"))
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def build_tokenizer_json(testdata, entry):
    """Applies a manifest entry's patches to its base tokenizer.json. The Go
    tests apply the same patches (top-level keys, then model keys)."""
    tj = load_json_maybe_gz(os.path.join(testdata, entry["base"]))
    for k, v in entry.get("patch", {}).items():
        tj[k] = v
    for k, v in entry.get("model_patch", {}).items():
        tj["model"][k] = v
    return tj


# Code point ranges for random strings: assigned characters in long-stable
# blocks, so that Unicode-version differences between regex engines do not
# show up as false failures.
RANGES = [
    (0x20, 0x7E, 40), (0x09, 0x0D, 6), (0xA0, 0xFF, 6), (0x100, 0x17F, 4),
    (0x300, 0x36F, 3), (0x391, 0x3C9, 3), (0x410, 0x44F, 4), (0x5D0, 0x5EA, 2),
    (0x620, 0x64A, 2), (0x660, 0x669, 2), (0x905, 0x939, 2), (0x966, 0x96F, 2),
    (0xE01, 0xE30, 2), (0x2000, 0x200A, 2), (0x2010, 0x2027, 2), (0x3000, 0x3000, 1),
    (0x3041, 0x3096, 3), (0x30A1, 0x30FA, 3), (0x4E00, 0x9FA5, 8), (0xAC00, 0xD7A3, 3),
    (0xFF01, 0xFF5E, 2), (0x1F300, 0x1F64F, 4), (0x1F900, 0x1F9FF, 2), (0x200D, 0x200D, 2),
    (0xFE0F, 0xFE0F, 1), (0x2160, 0x2188, 1), (0xB2, 0xB3, 1), (0xBC, 0xBE, 1),
]


def random_strings(seed, n):
    rng = random.Random(seed)
    total = sum(w for _, _, w in RANGES)
    out = []
    for _ in range(n):
        k = rng.randint(1, 40)
        chars = []
        for _ in range(k):
            r = rng.uniform(0, total)
            for lo, hi, w in RANGES:
                if r < w:
                    chars.append(chr(rng.randint(lo, hi)))
                    break
                r -= w
            else:
                chars.append("x")
        out.append("".join(chars))
    return out


def random_id_seqs(seed, vocab_size, n):
    rng = random.Random(seed)
    seqs = []
    for i in range(n):
        k = rng.randint(1, 12)
        if i % 2 == 0:
            hi = min(vocab_size, 300)  # single bytes / byte tokens: partial UTF-8
        else:
            hi = vocab_size
        seqs.append([rng.randrange(hi) for _ in range(k)])
    return seqs


def chat_tokenizer(tmpdir, tj_path):
    import transformers

    try:
        return transformers.AutoTokenizer.from_pretrained(tmpdir), "AutoTokenizer"
    except Exception as e:  # fall back to the plain fast tokenizer
        print("  AutoTokenizer failed: %r; using PreTrainedTokenizerFast" % (e,), flush=True)
    with open(os.path.join(tmpdir, "tokenizer_config.json"), encoding="utf-8") as f:
        cfg = json.load(f)
    kwargs = {}
    for k in ("bos_token", "eos_token", "unk_token", "pad_token", "chat_template"):
        v = cfg.get(k)
        if isinstance(v, dict) and "content" in v:
            v = v["content"]
        if v is not None:
            kwargs[k] = v
    return transformers.PreTrainedTokenizerFast(tokenizer_file=tj_path, **kwargs), "PreTrainedTokenizerFast"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--testdata", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    import tokenizers
    import transformers

    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.testdata, "manifest.json"), encoding="utf-8") as f:
        manifest = json.load(f)
    with open(os.path.join(args.testdata, "chats.json"), encoding="utf-8") as f:
        chats = json.load(f)
    corpus = []
    with open(os.path.join(args.testdata, "corpus.jsonl"), encoding="utf-8") as f:
        for line in f:
            line = line.rstrip("\n")
            if line:
                corpus.append(json.loads(line))
    texts = corpus + random_strings(7, 150)
    versions = {"tokenizers": tokenizers.__version__, "transformers": transformers.__version__}
    print("versions", versions, "corpus", len(corpus), "texts", len(texts), flush=True)

    failures = 0
    for idx, entry in enumerate(manifest):
        name = entry["name"]
        t0 = time.time()
        tj = build_tokenizer_json(args.testdata, entry)
        tmpdir = tempfile.mkdtemp(prefix="tok-" + name + "-")
        tj_path = os.path.join(tmpdir, "tokenizer.json")
        with open(tj_path, "w", encoding="utf-8") as f:
            json.dump(tj, f, ensure_ascii=False)
        cfg = load_json_maybe_gz(os.path.join(args.testdata, entry["config"]))
        with open(os.path.join(tmpdir, "tokenizer_config.json"), "w", encoding="utf-8") as f:
            json.dump(cfg, f, ensure_ascii=False)

        golden = {"name": name, "versions": versions, "encode": [], "decode": [], "chat": [], "errors": []}
        try:
            tok = tokenizers.Tokenizer.from_file(tj_path)
        except Exception:
            failures += 1
            golden["errors"].append("load: " + traceback.format_exc())
            print("  LOAD FAILED", name, traceback.format_exc(), flush=True)
            tok = None

        if tok is not None:
            for text in texts:
                try:
                    ids = tok.encode(text, add_special_tokens=False).ids
                    ids_special = tok.encode(text, add_special_tokens=True).ids
                except Exception:
                    golden["errors"].append("encode %r: %s" % (text, traceback.format_exc()))
                    continue
                golden["encode"].append({"text": text, "ids": ids, "ids_special": ids_special})
                golden["decode"].append({
                    "ids": ids_special,
                    "text": tok.decode(ids_special, skip_special_tokens=False),
                    "text_skip": tok.decode(ids_special, skip_special_tokens=True),
                })
            vocab_size = tok.get_vocab_size(with_added_tokens=True)
            for ids in random_id_seqs(1000 + idx, vocab_size, 300):
                try:
                    golden["decode"].append({
                        "ids": ids,
                        "text": tok.decode(ids, skip_special_tokens=False),
                        "text_skip": tok.decode(ids, skip_special_tokens=True),
                    })
                except Exception:
                    golden["errors"].append("decode %r: %s" % (ids, traceback.format_exc()))
            big = " ".join(corpus[:60]) * 40
            t1 = time.time()
            n = len(tok.encode(big, add_special_tokens=False).ids)
            golden["hf_encode_seconds"] = {"bytes": len(big.encode("utf-8")), "tokens": n, "seconds": time.time() - t1}

        try:
            hf, how = chat_tokenizer(tmpdir, tj_path)
            golden["chat_loader"] = how
            has = bool(getattr(hf, "chat_template", None))
            golden["has_chat_template"] = has
            if has:
                # Extra template variables, as callers pass enable_thinking.
                runs = [(ci, agp, None) for ci in range(len(chats)) for agp in (False, True)]
                runs += [(ci, True, {"enable_thinking": False}) for ci in (0, 3)]
                for ci, agp, extra in runs:
                    rec = {"conversation": ci, "add_generation_prompt": agp}
                    if extra:
                        rec["vars"] = extra
                    try:
                        rec["text"] = hf.apply_chat_template(
                            chats[ci], tokenize=False, add_generation_prompt=agp, **(extra or {}))
                    except Exception as e:
                        rec["error"] = "%s: %s" % (type(e).__name__, e)
                    golden["chat"].append(rec)
        except Exception:
            failures += 1
            golden["errors"].append("chat: " + traceback.format_exc())
            print("  CHAT FAILED", name, traceback.format_exc(), flush=True)

        out_path = os.path.join(args.out, name + ".golden.json.gz")
        data = json.dumps(golden, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
        with open(out_path, "wb") as f:
            with gzip.GzipFile(fileobj=f, mode="wb", compresslevel=9, mtime=0) as gz:
                gz.write(data)
        print("%-20s encode=%d decode=%d chat=%d errors=%d %.1fs %s" % (
            name, len(golden["encode"]), len(golden["decode"]), len(golden["chat"]),
            len(golden["errors"]), time.time() - t0, golden.get("hf_encode_seconds")), flush=True)
        for e in golden["errors"][:3]:
            print("   ", e[:2000], flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
