#!/usr/bin/env python3
"""A gpt-fast-style PyTorch peer of `trigon bench latency`.

The strongest simple PyTorch baseline: the whole Llama/Qwen2 model in this
file with fused QKV and fused gate/up projections, a static KV cache held
as module buffers, and the decode step compiled with
torch.compile(mode="reduce-overhead", fullgraph=True), which replays it
from a CUDA graph. Decode attention reads each KV head once for its whole
query group (no repeat of K/V). Weights are random bf16; no checkpoint, no
network.

Times --iters iterations (after --warmup) of: prefill --batch random
prompts of --input-len tokens (eager, or compiled with --compile-prefill),
then --output-len - 1 greedy decode steps, syncing after each. Prints one
JSON line in trigon's field names:

  python3 bench/peers/gptfast_peer.py --arch llama-3-8b --batch 4 --input-len 2048 --output-len 128
"""

import argparse
import math
import time
import traceback

import torch
import torch.nn as nn
import torch.nn.functional as F

import common


def inv_freq(spec):
    """RoPE inverse frequencies [head_dim/2] with Llama 3 scaling applied."""
    hd = spec["head_dim"]
    inv = 1.0 / (spec["rope_theta"] ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
    s = spec.get("rope_scaling")
    if s and s.get("rope_type", s.get("type")) == "llama3":
        old = s["original_max_position_embeddings"]
        low_wl, high_wl = old / s["low_freq_factor"], old / s["high_freq_factor"]
        wl = 2 * math.pi / inv
        smooth = (old / wl - s["low_freq_factor"]) / (s["high_freq_factor"] - s["low_freq_factor"])
        scaled = torch.where(wl > low_wl, inv / s["factor"], inv)
        mid = (wl >= high_wl) & (wl <= low_wl)
        inv = torch.where(mid, (1 - smooth) * inv / s["factor"] + smooth * inv, scaled)
    elif s and s.get("rope_type", s.get("type")) == "linear":
        inv = inv / s["factor"]
    return inv.float()


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * self.weight


class KVCache(nn.Module):
    """Static per-layer cache: k, v [batch, n_kv_heads, max_seq, head_dim]."""

    def __init__(self, batch, max_seq, n_kv, head_dim, dtype):
        super().__init__()
        self.register_buffer("k", torch.zeros(batch, n_kv, max_seq, head_dim, dtype=dtype), persistent=False)
        self.register_buffer("v", torch.zeros(batch, n_kv, max_seq, head_dim, dtype=dtype), persistent=False)

    def update(self, pos, k, v):
        # pos [T]; k, v [batch, n_kv, T, head_dim]
        self.k[:, :, pos] = k
        self.v[:, :, pos] = v
        return self.k, self.v


def rotate(x, cos, sin):
    # x [B, H, T, hd]; cos, sin [T, hd] (rotate-half layout, as HF Llama)
    x32 = x.float()
    half = x32.shape[-1] // 2
    rot = torch.cat((-x32[..., half:], x32[..., :half]), dim=-1)
    return (x32 * cos + rot * sin).to(x.dtype)


class Attention(nn.Module):
    def __init__(self, spec):
        super().__init__()
        self.nh, self.nkv, self.hd = spec["num_attention_heads"], spec["num_key_value_heads"], spec["head_dim"]
        dim = spec["hidden_size"]
        self.wqkv = nn.Linear(dim, (self.nh + 2 * self.nkv) * self.hd, bias=spec["attention_bias"])
        self.wo = nn.Linear(self.nh * self.hd, dim, bias=False)
        self.qk_norm = bool(spec.get("qk_norm"))
        if self.qk_norm:  # Qwen3: an RMS norm over each head of q and k, before RoPE
            self.q_norm = RMSNorm(self.hd, spec["rms_norm_eps"])
            self.k_norm = RMSNorm(self.hd, spec["rms_norm_eps"])
        self.cache = None

    def forward(self, x, cos, sin, mask, pos):
        B, T, _ = x.shape
        q, k, v = self.wqkv(x).split([self.nh * self.hd, self.nkv * self.hd, self.nkv * self.hd], dim=-1)
        q = q.view(B, T, self.nh, self.hd)
        k = k.view(B, T, self.nkv, self.hd)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        v = v.view(B, T, self.nkv, self.hd).transpose(1, 2)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        k, v = self.cache.update(pos, k, v)  # [B, nkv, S, hd]: the whole cache, masked below
        g = self.nh // self.nkv
        if T == 1:
            # Decode: each KV head serves its query group in one matmul.
            qg = q.view(B, self.nkv, g, self.hd)
            s = torch.matmul(qg, k.transpose(-1, -2)).float() / math.sqrt(self.hd)  # [B, nkv, g, S]
            s = s.masked_fill(~mask.view(1, 1, 1, -1), float("-inf"))
            y = torch.matmul(torch.softmax(s, dim=-1).to(v.dtype), v)  # [B, nkv, g, hd]
            y = y.view(B, self.nh, 1, self.hd)
        else:
            k = k.repeat_interleave(g, dim=1)
            v = v.repeat_interleave(g, dim=1)
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=0.0)
        return self.wo(y.transpose(1, 2).reshape(B, T, self.nh * self.hd))


class FeedForward(nn.Module):
    def __init__(self, spec):
        super().__init__()
        self.inter = spec["intermediate_size"]
        self.w13 = nn.Linear(spec["hidden_size"], 2 * self.inter, bias=False)  # gate, then up
        self.w2 = nn.Linear(self.inter, spec["hidden_size"], bias=False)

    def forward(self, x):
        gate, up = self.w13(x).split([self.inter, self.inter], dim=-1)
        return self.w2(F.silu(gate) * up)


class Block(nn.Module):
    def __init__(self, spec):
        super().__init__()
        self.attention_norm = RMSNorm(spec["hidden_size"], spec["rms_norm_eps"])
        self.attention = Attention(spec)
        self.ffn_norm = RMSNorm(spec["hidden_size"], spec["rms_norm_eps"])
        self.feed_forward = FeedForward(spec)

    def forward(self, x, cos, sin, mask, pos):
        h = x + self.attention(self.attention_norm(x), cos, sin, mask, pos)
        return h + self.feed_forward(self.ffn_norm(h))


class Transformer(nn.Module):
    def __init__(self, spec):
        super().__init__()
        self.spec = spec
        self.tok_embeddings = nn.Embedding(spec["vocab_size"], spec["hidden_size"])
        self.layers = nn.ModuleList(Block(spec) for _ in range(spec["num_hidden_layers"]))
        self.norm = RMSNorm(spec["hidden_size"], spec["rms_norm_eps"])
        self.output = nn.Linear(spec["hidden_size"], spec["vocab_size"], bias=False)
        if spec["tie_word_embeddings"]:
            self.output.weight = self.tok_embeddings.weight

    def setup_caches(self, batch, max_seq):
        dtype, dev = self.output.weight.dtype, self.output.weight.device
        for b in self.layers:
            b.attention.cache = KVCache(batch, max_seq, self.spec["num_key_value_heads"], self.spec["head_dim"], dtype).to(dev)
        freqs = torch.outer(torch.arange(max_seq, dtype=torch.float32), inv_freq(self.spec)).to(dev)
        emb = torch.cat((freqs, freqs), dim=-1)  # [max_seq, head_dim]
        self.register_buffer("cos", emb.cos(), persistent=False)
        self.register_buffer("sin", emb.sin(), persistent=False)
        self.register_buffer("causal", torch.tril(torch.ones(max_seq, max_seq, dtype=torch.bool, device=dev)), persistent=False)

    def forward(self, idx, pos):
        # idx [B, T] token ids at positions pos [T]; returns the last position's logits [B, vocab]
        x = self.tok_embeddings(idx)
        cos, sin = self.cos[pos], self.sin[pos]
        mask = self.causal[pos].view(1, 1, pos.shape[0], -1)  # [1, 1, T, S]
        for b in self.layers:
            x = b(x, cos, sin, mask, pos)
        return self.output(self.norm(x[:, -1]))


def build(spec, seed, device="cuda", dtype=torch.bfloat16):
    """The model with random weights (N(0, 0.02), norms 1) on device."""
    torch.manual_seed(seed)
    if device == "cpu":
        model = Transformer(spec).to(dtype)
    else:
        prev = torch.get_default_dtype()
        torch.set_default_dtype(dtype)
        try:
            with torch.device(device):
                model = Transformer(spec)
        finally:
            torch.set_default_dtype(prev)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                continue  # ones
            nn.init.normal_(p, std=0.02)
    model.requires_grad_(False)
    return model.eval()


def sync(device):
    if device != "cpu":
        torch.cuda.synchronize()


def prefill(model, idx, pos):
    return torch.argmax(model(idx, pos), dim=-1, keepdim=True)  # [B, 1]


def decode_one(model, cur, pos):
    return torch.argmax(model(cur, pos), dim=-1, keepdim=True)  # [B, 1]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    common.add_common_args(p)
    p.add_argument("--compile-prefill", action="store_true", help="compile the prefill too (dynamic shapes)")
    p.add_argument("--no-compile", action="store_true", help="run the decode step eagerly (for debugging)")
    p.add_argument("--tune", action="store_true", help="inductor coordinate-descent tuning, as gpt-fast (slower compile)")
    p.add_argument("--device", default="cuda", help=argparse.SUPPRESS)  # cpu: smoke tests only
    args = p.parse_args()
    label, spec = common.load_arch(args.arch)
    common.check_args(args, spec)
    dev = args.device
    if dev != "cpu" and not torch.cuda.is_available():
        raise SystemExit("gptfast_peer.py needs a CUDA GPU")
    warmup = args.warmup if args.warmup is not None else (1 if args.no_compile else 3)
    engine = "gptfast-eager" if args.no_compile else "gptfast-compile"
    notes = []
    try:
        import torch._inductor.config as ic
        ic.triton.unique_kernel_names = True
        ic.fx_graph_cache = True
        if args.tune:
            ic.coordinate_descent_tuning = True
            notes.append("coordinate descent tuning on")
    except Exception as e:
        notes.append("inductor config not set: %s" % e)
    try:
        model = build(spec, args.seed, dev, torch.bfloat16 if dev != "cpu" else torch.float32)
        max_seq = (args.input_len + args.output_len + 7) // 8 * 8
        model.setup_caches(args.batch, max_seq)
        dec = decode_one if args.no_compile else torch.compile(decode_one, mode="reduce-overhead", fullgraph=True)
        pre = torch.compile(prefill, fullgraph=True, dynamic=True) if args.compile_prefill else prefill
        if args.compile_prefill:
            notes.append("prefill compiled (dynamic=True)")
        gen = torch.Generator(device=dev).manual_seed(args.seed)
        idx = torch.randint(0, spec["vocab_size"], (args.batch, args.input_len), device=dev, generator=gen)
        prompt_pos = torch.arange(args.input_len, device=dev)
        prefill_s, itl_s, e2e_s = [], [], []
        with torch.no_grad():
            for it in range(warmup + args.iters):
                sync(dev)
                t0 = time.perf_counter()
                cur = pre(model, idx, prompt_pos)
                sync(dev)
                t1 = time.perf_counter()
                pos = torch.tensor([args.input_len], device=dev)
                steps, last = [], t1
                for _ in range(args.output_len - 1):
                    # The graph's output buffer is reused by the next replay: copy it.
                    cur = dec(model, cur, pos).clone()
                    pos += 1
                    sync(dev)
                    now = time.perf_counter()
                    steps.append(now - last)
                    last = now
                if it < warmup:
                    continue
                prefill_s.append(t1 - t0)
                itl_s.extend(steps)
                e2e_s.append(last - t0)
        res = common.result(engine, label, args, warmup, prefill_s, itl_s, e2e_s, {
            "params": sum(p.numel() for p in model.parameters()),
            "device": torch.cuda.get_device_name() if dev != "cpu" else "cpu",
            "torch": torch.__version__,
            "notes": notes,
        })
    except Exception as e:
        res = {"benchmark": "latency", "engine": engine, "arch": label, "batch": args.batch,
               "input_len": args.input_len, "output_len": args.output_len,
               "error": "%s: %s" % (type(e).__name__, e), "traceback": traceback.format_exc(limit=5)}
    common.emit(res)


if __name__ == "__main__":
    main()
