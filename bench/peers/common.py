"""Shared pieces of the peer benchmarks: architectures, statistics, output.

The architectures mirror bench/arch.go (trigon's presets); "default" and
config.json paths are read the same way, so every engine times the same
shapes. Statistics use the same percentile rule as trigon (linear
interpolation between order statistics), and results are printed as one
JSON object per line with trigon's field names, which compare.py reads.
"""

import json
import math
import os
import sys

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))

# Hugging Face config.json values of the published models (see arch.go).
ARCHS = {
    "llama-3-8b": {
        "model_type": "llama", "vocab_size": 128256, "hidden_size": 4096, "intermediate_size": 14336,
        "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
        "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "max_position_embeddings": 131072,
        "tie_word_embeddings": False, "attention_bias": False,
        "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 8192},
    },
    "qwen2.5-7b": {
        "model_type": "qwen2", "vocab_size": 152064, "hidden_size": 3584, "intermediate_size": 18944,
        "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4, "head_dim": 128,
        "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "max_position_embeddings": 131072,
        "tie_word_embeddings": False, "attention_bias": True, "rope_scaling": None,
    },
    "qwen3-8b": {
        "model_type": "qwen3", "vocab_size": 151936, "hidden_size": 4096, "intermediate_size": 12288,
        "num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
        "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "max_position_embeddings": 40960,
        "tie_word_embeddings": False, "attention_bias": False, "rope_scaling": None, "qk_norm": True,
    },
    "llama-3.2-1b": {
        "model_type": "llama", "vocab_size": 128256, "hidden_size": 2048, "intermediate_size": 8192,
        "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64,
        "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "max_position_embeddings": 131072,
        "tie_word_embeddings": True, "attention_bias": False,
        "rope_scaling": {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 8192},
    },
}
ALIASES = {"llama-3.1-8b": "llama-3-8b", "meta-llama-3-8b": "llama-3-8b", "meta-llama-3.1-8b": "llama-3-8b"}


def _from_config_json(cfg):
    """Normalises a transformers 4.x or 5.x config.json to the ARCHS form."""
    rope = cfg.get("rope_parameters") or {}
    scaling = cfg.get("rope_scaling") or None
    if rope and rope.get("rope_type", "default") not in ("default", None):
        scaling = {k: v for k, v in rope.items() if k != "rope_theta"}
    theta = rope.get("rope_theta", cfg.get("rope_theta", 10000.0))
    heads = cfg["num_attention_heads"]
    model_type = cfg.get("model_type", "llama")
    return {
        "model_type": model_type,
        "vocab_size": cfg["vocab_size"],
        "hidden_size": cfg["hidden_size"],
        "intermediate_size": cfg["intermediate_size"],
        "num_hidden_layers": cfg["num_hidden_layers"],
        "num_attention_heads": heads,
        "num_key_value_heads": cfg.get("num_key_value_heads", heads),
        "head_dim": cfg.get("head_dim") or cfg["hidden_size"] // heads,
        "rms_norm_eps": cfg.get("rms_norm_eps", 1e-6),
        "rope_theta": float(theta),
        "max_position_embeddings": cfg.get("max_position_embeddings", 4096),
        "tie_word_embeddings": bool(cfg.get("tie_word_embeddings", False)),
        # Qwen2 always has q/k/v biases; Llama says so in attention_bias.
        "attention_bias": model_type == "qwen2" or bool(cfg.get("attention_bias", False)),
        "rope_scaling": scaling,
        # Qwen3 normalises each head of q and k before RoPE.
        "qk_norm": model_type == "qwen3",
    }


def load_arch(name):
    """Returns (label, spec) for a preset, "default" or a config.json path."""
    key = ALIASES.get(name.lower(), name.lower())
    if key in ARCHS:
        return key, dict(ARCHS[key])
    path = name
    if key == "default":
        path = os.path.join(REPO, "models", "default", "hf", "config.json")
    if os.path.isdir(path):
        path = os.path.join(path, "config.json")
    if not os.path.isfile(path):
        raise SystemExit("unknown --arch %r: want one of %s, default, or a config.json path"
                         % (name, ", ".join(sorted(ARCHS))))
    with open(path) as f:
        spec = _from_config_json(json.load(f))
    if spec["model_type"] not in ("llama", "qwen2", "mistral"):
        raise SystemExit("--arch %s: model_type %s is not supported here" % (name, spec["model_type"]))
    return ("default" if key == "default" else name), spec


def param_count(spec):
    """Every weight element, as trigon counts them."""
    h, inter, layers = spec["hidden_size"], spec["intermediate_size"], spec["num_hidden_layers"]
    q = spec["num_attention_heads"] * spec["head_dim"]
    kv = spec["num_key_value_heads"] * spec["head_dim"]
    per_layer = 2 * h + h * q + 2 * h * kv + q * h + 3 * h * inter
    if spec["attention_bias"]:
        per_layer += q + 2 * kv
    embed = spec["vocab_size"] * h * (1 if spec["tie_word_embeddings"] else 2)
    return embed + h + layers * per_layer


def percentile(sorted_xs, p):
    """Linear interpolation between order statistics (numpy's default)."""
    n = len(sorted_xs)
    if n == 0:
        return float("nan")
    rank = p / 100.0 * (n - 1)
    lo = int(math.floor(rank))
    if lo >= n - 1:
        return sorted_xs[-1]
    return sorted_xs[lo] + (rank - lo) * (sorted_xs[lo + 1] - sorted_xs[lo])


def summary(xs):
    """trigon's Summary: count, mean, min, p50, p90, p99, max."""
    s = sorted(xs)
    if not s:
        return {"count": 0, "mean": 0, "min": 0, "p50": 0, "p90": 0, "p99": 0, "max": 0}
    return {"count": len(s), "mean": sum(s) / len(s), "min": s[0], "p50": percentile(s, 50),
            "p90": percentile(s, 90), "p99": percentile(s, 99), "max": s[-1]}


def result(engine, arch, args, warmup, prefill_s, itl_s, e2e_s, extra=None):
    """Builds one result object in trigon's latency-report shape."""
    ms = lambda xs: summary([x * 1e3 for x in xs])
    pre, itl, e2e = ms(prefill_s), ms(itl_s), ms(e2e_s)
    out = {
        "benchmark": "latency", "engine": engine, "arch": arch, "batch": args.batch,
        "input_len": args.input_len, "output_len": args.output_len, "warmup": warmup, "iters": args.iters,
        "prefill_ms": pre, "itl_ms": itl, "e2e_ms": e2e,
        "prefill_tokens_per_s": args.batch * args.input_len / (pre["mean"] / 1e3) if pre["mean"] > 0 else None,
        "decode_tokens_per_s": args.batch / (itl["mean"] / 1e3) if itl["count"] and itl["mean"] > 0 else None,
        "output_tokens_per_s": args.batch * args.output_len / (e2e["mean"] / 1e3) if e2e["mean"] > 0 else None,
        "notes": [],
    }
    if extra:
        out.update(extra)
    return out


def emit(obj):
    """Prints one JSON line and flushes (runs may be cut short)."""
    sys.stdout.write(json.dumps(obj, sort_keys=True) + "\n")
    sys.stdout.flush()


def add_common_args(p):
    p.add_argument("--arch", default="llama-3-8b", help="preset, default, or a config.json path")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--input-len", type=int, default=512)
    p.add_argument("--output-len", type=int, default=128,
                   help="generated tokens per sequence, the one from the prefill included")
    p.add_argument("--warmup", type=int, default=None, help="untimed iterations (default: 1 eager, 3 compiled)")
    p.add_argument("--iters", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)


def check_args(args, spec):
    if args.batch < 1 or args.input_len < 1 or args.output_len < 1 or args.iters < 1:
        raise SystemExit("--batch, --input-len, --output-len and --iters must be >= 1")
    if args.warmup is not None and args.warmup < 0:
        raise SystemExit("--warmup must be >= 0")
    if args.input_len + args.output_len > spec["max_position_embeddings"]:
        raise SystemExit("input + output tokens exceed the model's context of %d" % spec["max_position_embeddings"])
