#!/usr/bin/env python3
"""Hugging Face transformers peer of `trigon bench latency`.

Builds the --arch model with random bf16 weights (no checkpoint, no
network) and times model.generate, greedy, on --batch random prompts of
--input-len tokens, generating --output-len tokens each (the first one from
the prefill, as trigon counts). Two modes:

  eager    dynamic KV cache, no compilation (what most users run)
  static   static KV cache with torch.compile mode="reduce-overhead" (CUDA
           graphs) on the decode step, HF's documented fast path

Each generated token is timestamped by a streamer after a CUDA sync, so
the prefill (TTFT of the batch) and every decode step are timed
separately. Prints one JSON line per mode, in trigon's field names:

  python3 bench/peers/hf_peer.py --arch llama-3-8b --batch 4 --input-len 2048 --output-len 128
"""

import argparse
import copy
import inspect
import time
import traceback

import torch
import transformers
from transformers import LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM

import common

CLASSES = {
    "llama": (LlamaConfig, LlamaForCausalLM),
    "mistral": (MistralConfig, MistralForCausalLM),
    "qwen2": (Qwen2Config, Qwen2ForCausalLM),
}
try:  # transformers 4.51 and newer
    from transformers import Qwen3Config, Qwen3ForCausalLM

    CLASSES["qwen3"] = (Qwen3Config, Qwen3ForCausalLM)
except ImportError:
    pass


def hf_config(spec, notes, with_scaling=True):
    """A transformers config of spec's shape, in the 4.x or 5.x RoPE form."""
    if spec["model_type"] not in CLASSES:
        raise SystemExit("hf_peer: transformers %s has no %s model" % (transformers.__version__, spec["model_type"]))
    cfg_cls, _ = CLASSES[spec["model_type"]]
    kw = dict(
        vocab_size=spec["vocab_size"], hidden_size=spec["hidden_size"], intermediate_size=spec["intermediate_size"],
        num_hidden_layers=spec["num_hidden_layers"], num_attention_heads=spec["num_attention_heads"],
        num_key_value_heads=spec["num_key_value_heads"], head_dim=spec["head_dim"],
        rms_norm_eps=spec["rms_norm_eps"], max_position_embeddings=spec["max_position_embeddings"],
        tie_word_embeddings=spec["tie_word_embeddings"], bos_token_id=None, eos_token_id=None, pad_token_id=None,
    )
    if spec["model_type"] == "llama":
        kw["attention_bias"] = spec["attention_bias"]
    scaling = spec["rope_scaling"] if with_scaling else None
    params = inspect.signature(cfg_cls.__init__).parameters
    if "rope_parameters" in params:  # transformers 5
        rope = {"rope_type": "default", "rope_theta": spec["rope_theta"]}
        if scaling:
            rope.update(scaling)
        kw["rope_parameters"] = rope
    else:
        kw["rope_theta"] = spec["rope_theta"]
        if scaling:
            kw["rope_scaling"] = dict(scaling)
    try:
        return cfg_cls(**kw)
    except Exception as e:  # a RoPE-scaling validation this version disagrees with
        if not scaling:
            raise
        notes.append("RoPE scaling dropped (%s: %s); it does not change the cost" % (type(e).__name__, e))
        return hf_config(spec, notes, with_scaling=False)


def build_model(spec, seed, notes):
    """The model on the GPU in bf16 with random weights (HF's own init)."""
    _, model_cls = CLASSES[spec["model_type"]]
    config = hf_config(spec, notes)
    torch.manual_seed(seed)
    prev = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device("cuda"):
            try:
                model = model_cls._from_config(config, attn_implementation="sdpa")
            except TypeError:
                model = model_cls(config)
    finally:
        torch.set_default_dtype(prev)
    model = model.to(device="cuda", dtype=torch.bfloat16).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


class StepTimer:
    """A generate() streamer that timestamps every new token after a sync.

    generate calls put() once with the prompt ([batch, input_len]), then
    once per generated token ([batch]), and end() when done.
    """

    def __init__(self):
        self.seen_prompt = False
        self.times = []

    def put(self, value):
        if not self.seen_prompt and value.dim() == 2:
            self.seen_prompt = True
            return
        torch.cuda.synchronize()
        self.times.append(time.perf_counter())

    def end(self):
        pass


def generation_config(model, args, mode, notes):
    gc = copy.deepcopy(model.generation_config)
    gc.max_new_tokens = args.output_len
    gc.min_new_tokens = None
    gc.do_sample = False
    gc.num_beams = 1
    gc.temperature = None
    gc.top_p = None
    gc.top_k = None
    gc.eos_token_id = None  # random weights: never stop early
    gc.pad_token_id = 0
    gc.use_cache = True
    if mode == "eager":
        gc.disable_compile = True
        return gc
    gc.cache_implementation = "static"
    try:
        from transformers import CompileConfig
    except ImportError:
        CompileConfig = None
    if CompileConfig is not None:
        # generate compiles the decode step itself when the cache is static.
        gc.compile_config = CompileConfig(fullgraph=True, dynamic=False, mode="reduce-overhead")
        gc.disable_compile = False
        notes.append("decode compiled by generate (compile_config, mode=reduce-overhead)")
    else:
        model.forward = torch.compile(model.forward, mode="reduce-overhead", fullgraph=True)
        notes.append("model.forward compiled by hand (this transformers has no CompileConfig)")
    return gc


def run_mode(model, spec, label, args, mode):
    notes = []
    warmup = args.warmup if args.warmup is not None else (1 if mode == "eager" else 3)
    gc = generation_config(model, args, mode, notes)
    gen = torch.Generator(device="cuda").manual_seed(args.seed)
    ids = torch.randint(0, spec["vocab_size"], (args.batch, args.input_len), device="cuda", generator=gen)
    mask = torch.ones_like(ids)
    prefill, itl, e2e = [], [], []
    for it in range(warmup + args.iters):
        timer = StepTimer()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.no_grad():
            out = model.generate(input_ids=ids, attention_mask=mask, generation_config=gc, streamer=timer)
        torch.cuda.synchronize()
        t1 = time.perf_counter()
        new = out.shape[1] - args.input_len
        if new != args.output_len or len(timer.times) != args.output_len:
            raise RuntimeError("generated %d tokens with %d timestamps, want %d" % (new, len(timer.times), args.output_len))
        if it < warmup:
            continue
        prefill.append(timer.times[0] - t0)
        itl.extend(b - a for a, b in zip(timer.times, timer.times[1:]))
        e2e.append(t1 - t0)
    engine = "hf-eager" if mode == "eager" else "hf-static-compile"
    return common.result(engine, label, args, warmup, prefill, itl, e2e, {
        "params": common.param_count(spec),
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "notes": notes,
    })


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    common.add_common_args(p)
    p.add_argument("--modes", default="eager,static", help="comma-separated: eager, static")
    args = p.parse_args()
    label, spec = common.load_arch(args.arch)
    common.check_args(args, spec)
    if not torch.cuda.is_available():
        raise SystemExit("hf_peer.py needs a CUDA GPU")
    build_notes = []
    model = build_model(spec, args.seed, build_notes)
    for mode in [m.strip() for m in args.modes.split(",") if m.strip()]:
        if mode not in ("eager", "static"):
            raise SystemExit("unknown mode %r (eager, static)" % mode)
        try:
            res = run_mode(model, spec, label, args, mode)
            res["notes"] = build_notes + res["notes"]
        except Exception as e:  # report and go on to the next mode
            res = {"benchmark": "latency", "engine": "hf-" + mode, "arch": label, "batch": args.batch,
                   "input_len": args.input_len, "output_len": args.output_len,
                   "error": "%s: %s" % (type(e).__name__, e), "traceback": traceback.format_exc(limit=5)}
        common.emit(res)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
