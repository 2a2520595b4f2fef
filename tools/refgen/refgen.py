#!/usr/bin/env python3
"""refgen makes trigon's reference fixtures: tiny random-weight models in
Hugging Face format and the outputs transformers computes for them.

trigon's CPU backend is checked against these files, and every GPU kernel is
checked against the CPU backend, so this script is the root of the project's
numerical trust. It therefore:

  * builds each model with transformers' own classes and saves it with
    save_pretrained (safetensors), so the files are exactly what users feed us;
  * reloads each saved directory and runs the reference in float64 on the CPU
    (bf16 checkpoints are upcast exactly), so the oracle's own rounding error
    is far below the tolerances the Go tests use;
  * takes greedy continuations from a full recompute at every step (no KV
    cache), keeps only prompts whose greedy path has a clear top-1 margin, and
    cross-checks them against model.generate;
  * checks that the features each model is meant to exercise (llama3/linear
    RoPE scaling, sliding window) really change the output.

Run it where torch and transformers are installed (see README.md).
"""

import argparse
import copy
import gzip
import json
import math
import os
import random
import shutil
import sys

import torch
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

SEED = 20261129
VOCAB = 512
SPECIAL_TOKENS = ["<|begin_of_text|>", "<|end_of_text|>", "<|im_start|>", "<|im_end|>"]
BOS, EOS, IM_START, IM_END = 0, 1, 2, 3
NUM_GREEDY = 32
# A greedy step whose top-1/top-2 logit gap is below this is too close to call
# for an f32 implementation; prompts whose path has one are replaced.
MIN_MARGIN = 2e-3
# Prompt lengths: a single token, partial and whole 16-token KV blocks, and
# prompts long enough that prompt + continuation crosses Mistral's window.
PROMPT_LENGTHS = [1, 7, 16, 17, 45, 70]
ALL_LOGITS_PROMPT = 3  # index of the prompt whose every position is stored
DECODE_LOGITS_PROMPT = 2  # index of the prompt whose 32 decode-step logits are stored

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# Each model exercises a different part of the Llama family. head_dim None
# means hidden/heads. Intermediate sizes are deliberately not powers of two;
# qwen3's 160 is a multiple of 32 so Q8_0 GGUF tests quantize its down_proj.
MODEL_SPECS = [
    dict(
        name="llama3",
        config_class="LlamaConfig",
        model_class="LlamaForCausalLM",
        hidden=64, intermediate=172, layers=2, heads=4, kv_heads=2, head_dim=None,
        rope_theta=500000.0,
        # original_max_position_embeddings 64 puts the 16-dim head's
        # frequencies in all three llama3 regimes (kept, smoothed, divided).
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
        max_positions=1024, tie=False, eps=1e-5, extra={},
        bos=BOS, eos=EOS, gen_eos=[EOS, IM_END],
        dtypes=["float32", "bfloat16"],
    ),
    dict(
        name="llama-tied",
        config_class="LlamaConfig",
        model_class="LlamaForCausalLM",
        # 8 query heads share 1 KV head; head_dim 16 makes q_proj 128 rows for
        # a hidden size of 64, so nothing may assume heads*head_dim == hidden.
        hidden=64, intermediate=172, layers=2, heads=8, kv_heads=1, head_dim=16,
        rope_theta=10000.0,
        rope_scaling={"rope_type": "linear", "factor": 2.0},
        max_positions=512, tie=True, eps=1e-6, extra={},
        bos=BOS, eos=EOS, gen_eos=EOS,
        dtypes=["float32"],
    ),
    dict(
        name="mistral",
        config_class="MistralConfig",
        model_class="MistralForCausalLM",
        hidden=64, intermediate=172, layers=3, heads=4, kv_heads=2, head_dim=None,
        rope_theta=10000.0, rope_scaling=None,
        max_positions=512, tie=False, eps=1e-5,
        # Window 40: the 45- and 70-token prompts and every continuation past
        # position 40 attend to a window, in prefill and in decode.
        extra={"sliding_window": 40},
        bos=BOS, eos=EOS, gen_eos=EOS,
        dtypes=["float32"],
    ),
    dict(
        name="qwen2",
        config_class="Qwen2Config",
        model_class="Qwen2ForCausalLM",
        hidden=64, intermediate=172, layers=2, heads=4, kv_heads=2, head_dim=None,
        rope_theta=1000000.0, rope_scaling=None,
        max_positions=512, tie=False, eps=1e-6,
        extra={"use_sliding_window": False},
        bos=BOS, eos=IM_END, gen_eos=[IM_END, EOS],
        dtypes=["float32"],
    ),
    dict(
        name="qwen3",
        config_class="Qwen3Config",
        model_class="Qwen3ForCausalLM",
        hidden=64, intermediate=160, layers=2, heads=4, kv_heads=2, head_dim=32,
        rope_theta=1000000.0, rope_scaling=None,
        max_positions=512, tie=True, eps=1e-6,
        extra={"use_sliding_window": False, "attention_bias": False},
        bos=BOS, eos=IM_END, gen_eos=[IM_END, EOS],
        dtypes=["float32", "bfloat16"],
    ),
]

WORDS = (
    "the a one two three small large red green blue quick slow lazy fox dog cat bird tree river "
    "mountain city road house engine token model batch cache block kernel tensor layer head "
    "attention value key query memory device server request stream sample greedy logits number "
    "runs jumps sits writes reads computes sends waits stops starts over under into from with "
    "and but or because while when after before every some many few"
).split()

FIXED_TEXT = [
    "The quick brown fox jumps over the lazy dog.",
    "Hello, world! 1234567890 +-*/=%",
    "Inference engines batch many requests into one step.",
    "Caf\u00e9 na\u00efve r\u00e9sum\u00e9 \u00fcber stra\u00dfe.",
    "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8\u3068\u7d75\u6587\u5b57 \U0001F600\U0001F680",
    "def forward(x):\n    return x * 2  # double it\n",
    "    indented\ttabs\tand  double  spaces\n\nnew paragraph",
]


def log(*args):
    print(*args, flush=True)


def corpus(rng):
    """Text for the tokenizer: fixed lines plus seeded random sentences."""
    lines = list(FIXED_TEXT) * 20
    for _ in range(3000):
        n = rng.randint(4, 14)
        s = " ".join(rng.choice(WORDS) for _ in range(n))
        s = s[0].upper() + s[1:] + rng.choice([".", "!", "?", ",", ";", ":"])
        if rng.random() < 0.2:
            s += " " + str(rng.randint(0, 99999))
        lines.append(s)
    return lines


def train_tokenizer(rng):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(rng), trainer)
    for i, s in enumerate(SPECIAL_TOKENS):
        got = tok.token_to_id(s)
        if got != i:
            raise SystemExit(f"special token {s} has id {got}, want {i}")
    log(f"tokenizer: vocab {tok.get_vocab_size()}")
    return tok


def tokenizer_config():
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": SPECIAL_TOKENS[BOS],
        "eos_token": SPECIAL_TOKENS[EOS],
        "pad_token": SPECIAL_TOKENS[EOS],
        "add_bos_token": False,
        "model_max_length": 512,
        "chat_template": CHAT_TEMPLATE,
    }


def tokenizer_reference(tok):
    texts = FIXED_TEXT + [
        "",
        " ",
        "a",
        "<|im_start|>user\nhi<|im_end|>\n",
        "tokens tokens tokens",
        "\u00e9\u00e8\u00ea \u4e2d\u6587 \U0001F9EA",
    ]
    cases = []
    for t in texts:
        enc = tok.encode(t)
        dec = tok.decode(enc.ids, skip_special_tokens=False)
        cases.append({"text": t, "ids": enc.ids, "tokens": enc.tokens, "decoded": dec})
    return {"tokenizers_version": __import__("tokenizers").__version__, "cases": cases}


def transformers_major():
    return int(transformers.__version__.split(".")[0])


def make_config(spec):
    cls = getattr(transformers, spec["config_class"])
    kw = dict(
        vocab_size=VOCAB,
        hidden_size=spec["hidden"],
        intermediate_size=spec["intermediate"],
        num_hidden_layers=spec["layers"],
        num_attention_heads=spec["heads"],
        num_key_value_heads=spec["kv_heads"],
        max_position_embeddings=spec["max_positions"],
        rms_norm_eps=spec["eps"],
        tie_word_embeddings=spec["tie"],
        bos_token_id=spec["bos"],
        eos_token_id=spec["eos"],
        hidden_act="silu",
    )
    if spec["head_dim"] is not None:
        kw["head_dim"] = spec["head_dim"]
    kw.update(spec["extra"])
    scaling = dict(spec["rope_scaling"] or {})
    if transformers_major() >= 5:
        params = {"rope_type": scaling.pop("rope_type", "default"), "rope_theta": spec["rope_theta"]}
        params.update(scaling)
        kw["rope_parameters"] = params
    else:
        kw["rope_theta"] = spec["rope_theta"]
        if scaling:
            kw["rope_scaling"] = scaling
    return cls(**kw)


def expected_inv_freq(spec):
    """RoPE inverse frequencies written out from the published formulas, to
    catch a config whose scaling transformers silently ignored."""
    hd = spec["head_dim"] or spec["hidden"] // spec["heads"]
    base = spec["rope_theta"]
    inv = [1.0 / base ** (2 * i / hd) for i in range(hd // 2)]
    sc = spec["rope_scaling"]
    if not sc:
        return inv
    if sc["rope_type"] == "linear":
        return [f / sc["factor"] for f in inv]
    assert sc["rope_type"] == "llama3"
    factor, lo, hi, old = sc["factor"], sc["low_freq_factor"], sc["high_freq_factor"], sc["original_max_position_embeddings"]
    out = []
    for f in inv:
        wl = 2 * math.pi / f
        if wl < old / hi:
            out.append(f)
        elif wl > old / lo:
            out.append(f / factor)
        else:
            s = (old / wl - lo) / (hi - lo)
            out.append((1 - s) * f / factor + s * f)
    return out


def find_rotary(model):
    for _, m in model.named_modules():
        if hasattr(m, "inv_freq") and isinstance(getattr(m, "inv_freq"), torch.Tensor):
            return m
    raise SystemExit("no rotary embedding module with inv_freq found")


@torch.no_grad()
def init_weights(model, gen, tie):
    """Weights large enough that logits are not flat, so greedy continuations
    depend on every part of the forward pass."""
    for name, p in model.named_parameters():
        if name.endswith("norm.weight"):
            p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
        elif name.endswith(".bias"):
            p.copy_(0.1 * torch.randn(p.shape, generator=gen))
        elif "embed_tokens" in name:
            p.copy_((0.5 if tie else 1.0) * torch.randn(p.shape, generator=gen))
        elif "lm_head" in name:
            p.copy_(0.3 * torch.randn(p.shape, generator=gen))
        else:
            p.copy_(0.15 * torch.randn(p.shape, generator=gen))


def load(path, dtype):
    cls = transformers.AutoModelForCausalLM
    try:
        m = cls.from_pretrained(path, dtype=dtype)
    except TypeError:
        m = cls.from_pretrained(path, torch_dtype=dtype)
    m = m.to(dtype)
    m.eval()
    return m


@torch.no_grad()
def logits_of(model, ids):
    """[len(ids), vocab] float64 logits of one sequence, no cache."""
    out = model(input_ids=torch.tensor([ids], dtype=torch.long), use_cache=False)
    return out.logits[0].to(torch.float64)


@torch.no_grad()
def greedy(model, prompt, n):
    """Greedy continuation by full recompute: tokens, per-step margins and logits."""
    seq = list(prompt)
    toks, margins, step_logits = [], [], []
    for _ in range(n):
        lg = logits_of(model, seq)[-1]
        top = torch.topk(lg, 2)
        toks.append(int(top.indices[0]))
        margins.append(float(top.values[0] - top.values[1]))
        step_logits.append(lg)
        seq.append(toks[-1])
    return toks, margins, step_logits


@torch.no_grad()
def generate_check(model, prompt, n):
    """model.generate's greedy continuation (KV cache path), for a cross-check."""
    saved = model.generation_config
    try:
        model.generation_config = transformers.GenerationConfig(
            do_sample=False, bos_token_id=BOS, pad_token_id=EOS, eos_token_id=None)
        out = model.generate(torch.tensor([prompt], dtype=torch.long),
                             attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                             max_new_tokens=n, do_sample=False)
        return [int(t) for t in out[0, len(prompt):].tolist()]
    except Exception as e:  # informational only
        log(f"    generate failed: {type(e).__name__}: {e}")
        return None
    finally:
        model.generation_config = saved


def f32list(t):
    return [float("%.9g" % v) for v in t.to(torch.float32).tolist()]


def rel_err(a, ref):
    return float((a.to(torch.float64) - ref).abs().max() / ref.abs().max())


def candidate_prompts(tok, rng, length):
    """Yields prompts of a given length: tokenized text first, then random ids."""
    text = " ".join(FIXED_TEXT + [" ".join(rng.choice(WORDS) for _ in range(200))])
    ids = [BOS] + tok.encode(text).ids
    for start in range(0, 40, 3):
        p = [BOS] + ids[1 + start: start + length]
        if len(p) == length:
            yield p, tok.decode(p[1:], skip_special_tokens=False)
    while True:  # random ids, not necessarily starting with BOS
        yield [rng.randrange(4, VOCAB) for _ in range(length)], None


def pick_prompts(model, tok, rng):
    prompts = []
    for length in PROMPT_LENGTHS:
        for tries, (p, text) in enumerate(candidate_prompts(tok, rng, length)):
            toks, margins, step_logits = greedy(model, p, NUM_GREEDY)
            if min(margins) >= MIN_MARGIN:
                prompts.append(dict(ids=p, text=text, greedy=toks, margins=margins, step_logits=step_logits))
                break
            if tries > 50:
                raise SystemExit(f"no prompt of length {length} with a clear greedy path")
    return prompts


def write_generation_config(path, spec):
    gc = {
        "bos_token_id": spec["bos"],
        "eos_token_id": spec["gen_eos"],
        "do_sample": True,
        "temperature": 0.7,
        "top_p": 0.9,
        "top_k": 40,
        "repetition_penalty": 1.05,
        "max_length": spec["max_positions"],
        "transformers_version": transformers.__version__,
    }
    with open(os.path.join(path, "generation_config.json"), "w") as f:
        json.dump(gc, f, indent=2)


def check_feature(spec, ref, prompts):
    """Fail unless the model's special feature changes the logits."""
    if spec["name"] != "mistral":
        return
    cfg = copy.deepcopy(ref.config)
    cfg.sliding_window = None
    plain = transformers.AutoModelForCausalLM.from_config(cfg).to(torch.float64)
    plain.load_state_dict(ref.state_dict())
    plain.eval()
    p = prompts[-1]["ids"]
    d = rel_err(logits_of(plain, p)[-1], logits_of(ref, p)[-1])
    log(f"    sliding window changes last logits by {d:.3g} (relative)")
    if d < 1e-3:
        raise SystemExit("sliding window has no effect on the fixture")


def build(spec, tok, out_dir, rng):
    log(f"== {spec['name']}")
    cfg = make_config(spec)
    model_cls = getattr(transformers, spec["model_class"])
    gen = torch.Generator().manual_seed(rng.randrange(1 << 30))
    model = model_cls(cfg).to(torch.float32)
    init_weights(model, gen, spec["tie"])
    if spec["tie"]:
        model.tie_weights()

    # Check RoPE frequencies against the formulas before anything is saved.
    inv = find_rotary(model).inv_freq.to(torch.float64)
    want = torch.tensor(expected_inv_freq(spec), dtype=torch.float64)
    d = float(((inv - want).abs() / want).max())
    log(f"    inv_freq vs formula: max rel diff {d:.3g}")
    if d > 1e-6:
        raise SystemExit(f"{spec['name']}: transformers' inv_freq {inv.tolist()} differs from {want.tolist()}")

    results = []
    for dtype_name in spec["dtypes"]:
        name = spec["name"] if dtype_name == "float32" else f"{spec['name']}-bf16"
        path = os.path.join(out_dir, "models", name)
        shutil.rmtree(path, ignore_errors=True)
        os.makedirs(path)
        m = copy.deepcopy(model).to(getattr(torch, dtype_name))
        m.save_pretrained(path)  # safetensors is the default format
        if not os.path.exists(os.path.join(path, "model.safetensors")):
            raise SystemExit(f"{path}: save_pretrained wrote no model.safetensors")
        write_generation_config(path, spec)
        tok.save(os.path.join(path, "tokenizer.json"))
        with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
            json.dump(tokenizer_config(), f, indent=2)
        log(f"    saved {path}: {sorted(os.listdir(path))}")

        ref = load(path, torch.float64)
        native = load(path, getattr(torch, dtype_name))
        prompts = pick_prompts(ref, tok, rng)
        check_feature(spec, ref, prompts)

        rot = find_rotary(ref)
        entries, native_err, gen_agree = [], 0.0, True
        for i, p in enumerate(prompts):
            all_lg = logits_of(ref, p["ids"])
            native_err = max(native_err, rel_err(logits_of(native, p["ids"])[-1], all_lg[-1]))
            g = generate_check(ref, p["ids"], NUM_GREEDY)
            # generate may stop early at an EOS id it took from the model config.
            agree = g is not None and len(g) > 0 and g == p["greedy"][:len(g)]
            gen_agree = gen_agree and agree
            if not agree:
                log(f"    prompt {i}: generate {g} != full-recompute greedy {p['greedy']}")
            e = {
                "ids": p["ids"],
                "last_logits": f32list(all_lg[-1]),
                "greedy": p["greedy"],
                "min_margin": min(p["margins"]),
                "generate_agrees": agree,
            }
            if p["text"] is not None:
                e["decoded_text"] = p["text"]  # informative: re-encoding may split differently
            if i == ALL_LOGITS_PROMPT:
                e["all_logits"] = [f32list(r) for r in all_lg]
            if i == DECODE_LOGITS_PROMPT:
                e["decode_logits"] = [f32list(r) for r in p["step_logits"]]
            entries.append(e)
        reference = {
            "model": name,
            "architecture": spec["model_class"],
            "weights_dtype": dtype_name,
            "reference_dtype": "float64",
            "torch_version": torch.__version__,
            "transformers_version": transformers.__version__,
            "inv_freq": [float(v) for v in rot.inv_freq.to(torch.float32).tolist()],
            "attention_scaling": float(getattr(rot, "attention_scaling", 1.0)),
            "native_dtype_max_rel_err": native_err,
            "generate_agrees": gen_agree,
            "prompts": entries,
        }
        with gzip.open(os.path.join(path, "reference.json.gz"), "wt") as f:
            json.dump(reference, f, separators=(",", ":"))
        log(f"    prompts {[len(p['ids']) for p in prompts]}, min margins "
            f"{[round(min(p['margins']), 4) for p in prompts]}, native {dtype_name} max rel err {native_err:.3g}, "
            f"generate agrees {gen_agree}")
        results.append(name)
    return results


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="output directory (becomes testdata/)")
    ap.add_argument("--threads", type=int, default=8)
    args = ap.parse_args()

    torch.manual_seed(SEED)
    torch.set_num_threads(args.threads)
    rng = random.Random(SEED)
    log(f"torch {torch.__version__}, transformers {transformers.__version__}, python {sys.version.split()[0]}")

    os.makedirs(args.out, exist_ok=True)
    tok = train_tokenizer(rng)
    tdir = os.path.join(args.out, "tokenizer")
    os.makedirs(tdir, exist_ok=True)
    tok.save(os.path.join(tdir, "tokenizer.json"))
    with open(os.path.join(tdir, "tokenizer_config.json"), "w") as f:
        json.dump(tokenizer_config(), f, indent=2)
    with open(os.path.join(tdir, "reference.json"), "w") as f:
        json.dump(tokenizer_reference(tok), f, indent=1, ensure_ascii=False)

    built = []
    for spec in MODEL_SPECS:
        built += build(spec, tok, args.out, rng)
    with open(os.path.join(args.out, "models", "index.json"), "w") as f:
        json.dump({"models": built, "transformers_version": transformers.__version__,
                   "torch_version": torch.__version__, "seed": SEED}, f, indent=2)
    for name in built:
        with open(os.path.join(args.out, "models", name, "config.json")) as f:
            log(f"{name}/config.json: " + json.dumps(json.load(f), separators=(",", ":")))
    log("done:", built)


if __name__ == "__main__":
    main()
