#!/usr/bin/env python3
"""Checks gptfast_peer.py's model without timing anything.

On tiny random models (Llama-style with q/k/v biases, and Qwen3-style
with per-head q/k norms) it compares (1) greedy tokens from the static-cache
prefill + decode path with a naive forward that recomputes the whole
sequence with explicit causal attention and no cache, and (2) the Llama 3
RoPE frequencies with a scalar re-derivation. Runs on the CPU (torch >=
1.13, float32) or, with --device cuda, on the GPU; run it before timing:

  python3 bench/peers/selftest.py [--device cuda]
"""

import argparse
import math
import sys

import torch
import torch.nn.functional as F

import gptfast_peer as gp

if not hasattr(F, "scaled_dot_product_attention"):  # torch < 2.0
    def _sdpa(q, k, v, attn_mask=None, dropout_p=0.0):
        s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
        s = s.masked_fill(~attn_mask, float("-inf"))
        return torch.softmax(s, dim=-1) @ v
    F.scaled_dot_product_attention = _sdpa

SPEC = {
    "model_type": "llama", "vocab_size": 97, "hidden_size": 64, "intermediate_size": 96,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
    "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "max_position_embeddings": 128,
    "tie_word_embeddings": False, "attention_bias": True,
    "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 32},
}


def naive_last_logits(model, seq):
    """Logits of the last token of seq [B, T], written without the cache."""
    spec = model.spec
    B, T = seq.shape
    nh, nkv, hd = spec["num_attention_heads"], spec["num_key_value_heads"], spec["head_dim"]
    pos = torch.arange(T, dtype=torch.float32, device=seq.device)
    ang = pos[:, None] * gp.inv_freq(spec).to(seq.device)[None, :]  # [T, hd/2]
    cos, sin = ang.cos(), ang.sin()

    def rope(x):  # [B, H, T, hd], pairs (i, i + hd/2)
        a, b = x[..., : hd // 2], x[..., hd // 2:]
        return torch.cat((a * cos - b * sin, b * cos + a * sin), dim=-1)

    x = model.tok_embeddings(seq)
    causal = torch.tril(torch.ones(T, T, dtype=torch.bool, device=seq.device))
    for blk in model.layers:
        at = blk.attention
        h = blk.attention_norm(x)
        qkv = h @ at.wqkv.weight.T
        if at.wqkv.bias is not None:
            qkv = qkv + at.wqkv.bias
        q = qkv[..., : nh * hd].reshape(B, T, nh, hd)
        k = qkv[..., nh * hd: (nh + nkv) * hd].reshape(B, T, nkv, hd)
        if spec.get("qk_norm"):  # Qwen3: each head of q and k RMS-normalised, then scaled
            def head_norm(x, w):
                return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + spec["rms_norm_eps"]) * w
            q, k = head_norm(q, at.q_norm.weight), head_norm(k, at.k_norm.weight)
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        v = qkv[..., (nh + nkv) * hd:].reshape(B, T, nkv, hd).transpose(1, 2)
        q, k = rope(q), rope(k)
        heads = []
        for head in range(nh):
            kv = head // (nh // nkv)
            s = q[:, head] @ k[:, kv].transpose(-1, -2) / math.sqrt(hd)
            s = s.masked_fill(~causal, float("-inf"))
            heads.append(torch.softmax(s, dim=-1) @ v[:, kv])
        y = torch.stack(heads, dim=2).reshape(B, T, nh * hd)
        x = x + y @ at.wo.weight.T
        ff = blk.feed_forward
        gu = blk.ffn_norm(x) @ ff.w13.weight.T
        x = x + (F.silu(gu[..., : ff.inter]) * gu[..., ff.inter:]) @ ff.w2.weight.T
    return model.norm(x)[:, -1] @ model.output.weight.T


def check_inv_freq():
    s = SPEC["rope_scaling"]
    got = gp.inv_freq(SPEC).tolist()
    hd = SPEC["head_dim"]
    for i, g in enumerate(got):
        inv = 1 / SPEC["rope_theta"] ** (2 * i / hd)
        wl = 2 * math.pi / inv
        old = s["original_max_position_embeddings"]
        if wl < old / s["high_freq_factor"]:
            want = inv
        elif wl > old / s["low_freq_factor"]:
            want = inv / s["factor"]
        else:
            sm = (old / wl - s["low_freq_factor"]) / (s["high_freq_factor"] - s["low_freq_factor"])
            want = (1 - sm) * inv / s["factor"] + sm * inv
        if abs(g - want) > 1e-6 * want:
            return "inv_freq[%d] = %g, want %g" % (i, g, want)
    return None


def check_greedy(spec, dev):
    """Greedy tokens and last logits of the cached path against the naive
    forward, on a tiny random model of spec; returns the failures."""
    failures = []
    B, T, new = 2, 11, 6
    model = gp.build(spec, 0, dev, torch.float32)
    with torch.no_grad():
        for prm in model.parameters():  # larger weights: decisive argmaxes
            prm.mul_(20)
    model.setup_caches(B, T + new + 3)
    g = torch.Generator(device=dev).manual_seed(1)
    prompt = torch.randint(0, spec["vocab_size"], (B, T), generator=g, device=dev)
    with torch.no_grad():
        cur = gp.prefill(model, prompt, torch.arange(T, device=dev))
        fast = [cur]
        pos = torch.tensor([T], device=dev)
        for _ in range(new - 1):
            cur = gp.decode_one(model, cur, pos)
            pos += 1
            fast.append(cur)
        fast = torch.cat(fast, dim=1)
        seq = prompt
        slow = []
        for _ in range(new):
            logits = naive_last_logits(model, seq)
            nxt = logits.argmax(-1, keepdim=True)
            slow.append(nxt)
            seq = torch.cat((seq, nxt), dim=1)
        slow = torch.cat(slow, dim=1)
        model.setup_caches(B, seq.shape[1])
        cached = model(seq, torch.arange(seq.shape[1], device=dev))
        ref = naive_last_logits(model, seq)
    name = spec["model_type"]
    if not torch.equal(fast, slow):
        failures.append("%s: greedy tokens: cached path %s, naive %s" % (name, fast.tolist(), slow.tolist()))
    diff = (cached - ref).abs().max().item()
    if diff > 1e-3 * max(1.0, ref.abs().max().item()):
        failures.append("%s: last logits differ by %g" % (name, diff))
    return failures


# A Qwen3-style model: per-head q/k norms, no biases, plain RoPE.
SPEC_QK = dict(SPEC, model_type="qwen3", attention_bias=False, rope_scaling=None, qk_norm=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cpu")
    args = p.parse_args()
    failures = []
    err = check_inv_freq()
    if err:
        failures.append(err)
    for spec in (SPEC, SPEC_QK):
        failures += check_greedy(spec, args.device)
    if failures:
        print("selftest FAILED:\n  " + "\n  ".join(failures))
        sys.exit(1)
    print("selftest ok: greedy tokens of a Llama-style and a Qwen3-style model match the naive forward; llama3 frequencies match")


if __name__ == "__main__":
    main()
