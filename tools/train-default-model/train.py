#!/usr/bin/env python3
"""Train trigon's default model: a ~8M-parameter Llama on Go's own sources.

One script does the whole job on one GPU, inside a fixed wall-clock budget
(the shared H200 is lent by the minute):

  1. read the corpus archive made by prepare.sh (train / held-out split by file);
  2. train a byte-level BPE tokenizer (HF `tokenizers`, 8192 tokens, a
     Llama-3-style pre-tokenizer regex minus the English contractions, which
     only split Go rune literals);
  3. tokenize every file, documents separated by <|endoftext|>;
  4. train a Llama (plain PyTorch below: RMSNorm, RoPE, GQA, SwiGLU, tied
     embeddings) with bf16 autocast and AdamW under a cosine schedule whose
     length is planned from the measured step rate, so training ends on time;
  5. export through transformers' LlamaForCausalLM: the trained weights are
     loaded into it, its logits are checked against ours, and it is saved in
     bf16 safetensors with tokenizer and generation configs;
  6. reload the exported directory in float32 and compute the reference
     perplexity of models/default/heldout.go.txt (protocol in PPL_PROTOCOL)
     and sample completions.

The model is written here rather than trained as LlamaForCausalLM so that the
training loop runs (and is smoke-tested) on a CPU-only machine with an old
torch and no transformers; step 5 proves that it is the same function as
transformers' Llama before anything is shipped.

A draft model for speculative decoding (docs/speculative.md) is trained by
the same script with --draft: a smaller shape (DRAFT_MODEL, or --hidden,
--layers, --heads, --kv-heads, --intermediate), the default model's own
tokenizer (--tokenizer, whose tokenizer.json is shipped byte for byte, so the
draft's ids are the target's), and by default distilled from the default
model (--teacher): the loss is the cross-entropy against the teacher's
next-token distribution, because a draft is useful exactly where its guess is
the target's, not the corpus's. Step 2 is then skipped; the held-out top-1
agreement with the teacher (the greedy acceptance rate of one drafted token)
is evaluated beside the held-out loss.

Usage:
  train.py --archive .gpu/train-default-model/gosrc.tar.xz \
           --heldout-text models/default/heldout.go.txt --out /tmp/run [--smoke]
  train.py ... --draft [--tokenizer models/default/hf] [--teacher models/default/hf | --no-teacher]
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import hashlib
import io
import json
import math
import os
import platform
import shutil
import struct
import sys
import tarfile
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

T0 = time.monotonic()

EOT = "<|endoftext|>"

# Pre-tokenizer split (applied before byte-level mapping). Llama 3's pattern
# without the contraction alternatives: letters with at most one leading
# non-letter (" err", ".Println", "\tif"), digit runs of at most 3, punctuation
# runs with trailing newlines ("{\n"), newline runs, and whitespace.
PRETOKENIZE_PATTERN = (
    r"[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

PPL_PROTOCOL = (
    "Read the file as UTF-8 text. Encode it with hf/tokenizer.json (no BOS, no EOS, no "
    "special tokens added; the tokenizer has no post-processor). Cut the ids into "
    "consecutive non-overlapping windows of `window` tokens, the last one shorter; "
    "run each window through the model on its own, positions 0..len-1, no cache "
    "carried between windows. In each window, the logits at position i predict "
    "token i+1, so a window of n tokens gives n-1 predictions and the first token "
    "of every window is never predicted. nll = sum over all windows of "
    "-log softmax(logits_i)[token_{i+1}] divided by the number of predictions "
    "(tokens - number of windows); ppl = exp(nll). Reference computed with the "
    "exported bf16 weights loaded by transformers' LlamaForCausalLM, cast to "
    "float32, eager attention, TF32 off, on one GPU."
)

SAMPLE_PROMPTS = [
    "func reverse(s string) string {",
    "package main\n\nimport (\n",
    "// Sum returns",
    "func (s *Stack[T]) Pop() (T, bool) {",
    "// Copyright 2025 The Go Authors. All rights reserved.\n"
    "// Use of this source code is governed by a BSD-style\n"
    "// license that can be found in the LICENSE file.\n\npackage strings\n\n",
]

# Generation defaults shipped in generation_config.json and used for the
# sampled completions. A model this small loops under greedy decoding; mild
# temperature with nucleus sampling keeps completions plausible and varied.
GEN_TEMPERATURE = 0.7
GEN_TOP_P = 0.95
GEN_MAX_NEW_TOKENS = 256


def log(msg: str) -> None:
    print(f"[{time.monotonic() - T0:7.1f}s] {msg}", flush=True)


# ---------------------------------------------------------------- config


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    vocab_size: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    context: int
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def validate(self) -> None:
        if self.hidden % self.heads:
            raise ValueError(f"hidden {self.hidden} not divisible by heads {self.heads}")
        if self.heads % self.kv_heads:
            raise ValueError(f"heads {self.heads} not divisible by kv_heads {self.kv_heads}")
        if self.head_dim % 2:
            raise ValueError(f"head_dim {self.head_dim} must be even for RoPE")


# ~11.7M parameters (the issue asks 10-20M): head dim 32 (10 heads of 32 make
# hidden 320) and every matrix input dimension (320, 864) a multiple of 32,
# the Q8_0 block size, so the GGUF conversion quantizes every weight. The first
# shipped model (2026-11-29) was hidden 256, 8 heads, 4 KV heads,
# intermediate 704: 8.0M parameters.
FULL_MODEL = dict(hidden=320, layers=8, heads=10, kv_heads=5, intermediate=864, context=1024)
SMOKE_MODEL = dict(hidden=64, layers=2, heads=4, kv_heads=2, intermediate=192, context=128)
# The draft of the default model for speculative decoding: at batch 1 a step
# of a model this small is bound by its kernel count, which grows with the
# layers, so the draft keeps two layers and the target's vocabulary and
# context (its embedding, tied to the LM head, is then most of its
# parameters). Head dim 32 and matrix input dimensions (256, 704) that are
# multiples of 32 keep every weight Q8_0-quantizable.
DRAFT_MODEL = dict(hidden=256, layers=2, heads=8, kv_heads=4, intermediate=704, context=1024)
DEFAULT_TOKENIZER = "models/default/hf"


# ---------------------------------------------------------------- model


class RMSNorm(nn.Module):
    """RMSNorm computed in float32, cast back before the weight, as HF Llama does."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))  # [dim]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(dtype)


def rope_tables(cfg: ModelConfig, device) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin, each [context, head_dim], in HF's half-split layout."""
    d = cfg.head_dim
    inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))  # [d/2]
    pos = torch.arange(cfg.context, dtype=torch.float32)  # [context]
    freqs = torch.outer(pos, inv_freq)  # [context, d/2]
    emb = torch.cat([freqs, freqs], dim=-1)  # [context, d]
    return emb.cos().to(device), emb.sin().to(device)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, H, T, D]; cos, sin [T, D]. Rotates pairs (i, i + D/2)."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos.to(x.dtype) + rotated * sin.to(x.dtype)


HAVE_SDPA = hasattr(F, "scaled_dot_product_attention")


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        d = cfg.head_dim
        self.q_proj = nn.Linear(cfg.hidden, cfg.heads * d, bias=False)  # [heads*d, hidden]
        self.k_proj = nn.Linear(cfg.hidden, cfg.kv_heads * d, bias=False)  # [kv*d, hidden]
        self.v_proj = nn.Linear(cfg.hidden, cfg.kv_heads * d, bias=False)  # [kv*d, hidden]
        self.o_proj = nn.Linear(cfg.heads * d, cfg.hidden, bias=False)  # [hidden, heads*d]

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        cfg = self.cfg
        b, t, _ = x.shape  # [B, T, hidden]
        d = cfg.head_dim
        q = self.q_proj(x).view(b, t, cfg.heads, d).transpose(1, 2)  # [B, H, T, D]
        k = self.k_proj(x).view(b, t, cfg.kv_heads, d).transpose(1, 2)  # [B, KV, T, D]
        v = self.v_proj(x).view(b, t, cfg.kv_heads, d).transpose(1, 2)  # [B, KV, T, D]
        q = apply_rope(q, cos, sin)
        k = apply_rope(k, cos, sin)
        if cfg.kv_heads != cfg.heads:
            # Query head h reads KV head h // group, as HF's repeat_kv.
            group = cfg.heads // cfg.kv_heads
            k = k.repeat_interleave(group, dim=1)  # [B, H, T, D]
            v = v.repeat_interleave(group, dim=1)  # [B, H, T, D]
        if HAVE_SDPA:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # [B, H, T, D]
        else:
            scores = (q @ k.transpose(-1, -2)) / math.sqrt(d)  # [B, H, T, T]
            mask = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
            scores = scores.masked_fill(mask, float("-inf"))
            y = torch.softmax(scores.float(), dim=-1).to(q.dtype) @ v
        y = y.transpose(1, 2).reshape(b, t, cfg.heads * d)  # [B, T, H*D]
        return self.o_proj(y)


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden, cfg.intermediate, bias=False)  # [inter, hidden]
        self.up_proj = nn.Linear(cfg.hidden, cfg.intermediate, bias=False)  # [inter, hidden]
        self.down_proj = nn.Linear(cfg.intermediate, cfg.hidden, bias=False)  # [hidden, inter]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden, cfg.norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden, cfg.norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class Llama(nn.Module):
    """Decoder-only Llama; parameter names follow HF's so export is a rename of prefixes."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        cfg.validate()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden)  # [vocab, hidden], tied to the LM head
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.norm = RMSNorm(cfg.hidden, cfg.norm_eps)
        cos, sin = rope_tables(cfg, "cpu")
        self.register_buffer("rope_cos", cos, persistent=False)  # [context, head_dim]
        self.register_buffer("rope_sin", sin, persistent=False)  # [context, head_dim]
        self._init_weights()

    def _init_weights(self) -> None:
        # GPT-2 style: N(0, 0.02), residual output projections scaled down by
        # sqrt(2 * layers) so the residual stream does not grow with depth.
        out_std = 0.02 / math.sqrt(2 * self.cfg.layers)
        for name, p in self.named_parameters():
            if p.dim() == 1:
                continue
            std = out_std if name.endswith(("o_proj.weight", "down_proj.weight")) else 0.02
            nn.init.normal_(p, mean=0.0, std=std)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """ids [B, T] int64 -> logits [B, T, vocab]."""
        t = ids.shape[1]
        if t > self.cfg.context:
            raise ValueError(f"sequence of {t} tokens exceeds context {self.cfg.context}")
        cos, sin = self.rope_cos[:t], self.rope_sin[:t]
        x = self.embed_tokens(ids)  # [B, T, hidden]
        for layer in self.layers:
            x = layer(x, cos, sin)
        x = self.norm(x)
        return F.linear(x, self.embed_tokens.weight)  # [B, T, vocab]

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())


def hf_state_dict(model: Llama) -> dict[str, torch.Tensor]:
    """Our parameters under LlamaForCausalLM's names (lm_head tied, so absent)."""
    return {f"model.{k}": v.detach() for k, v in model.state_dict().items()}


def read_safetensors(path: str) -> dict[str, torch.Tensor]:
    """The tensors of a .safetensors file, by the safetensors package where
    it is installed; else read here (8-byte little-endian header length, a
    JSON header of dtype, shape and byte offsets, then the data), which only
    the CPU smoke test of a machine without the package needs."""
    try:
        from safetensors.torch import load_file
    except ImportError:
        load_file = None
    if load_file is not None:
        return load_file(path)
    dtypes = {"BF16": (np.int16, torch.bfloat16), "F16": (np.float16, None), "F32": (np.float32, None)}
    out = {}
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        data = f.read()
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        if meta["dtype"] not in dtypes:
            raise RuntimeError(f"{path}: tensor {name}: dtype {meta['dtype']} not read here")
        np_dtype, view = dtypes[meta["dtype"]]
        a, b = meta["data_offsets"]
        t = torch.from_numpy(np.frombuffer(data[a:b], dtype=np_dtype).copy()).reshape(meta["shape"])
        out[name] = t.view(view) if view is not None else t
    return out


def load_teacher(hf_dir: str, device) -> Llama:
    """An exported Llama directory (config.json, model.safetensors with tied
    embeddings, as export_hf writes) as our Llama, in eval mode, frozen."""
    with open(os.path.join(hf_dir, "config.json")) as f:
        c = json.load(f)
    rope = c.get("rope_theta") or (c.get("rope_parameters") or {}).get("rope_theta", 10000.0)
    cfg = ModelConfig(vocab_size=c["vocab_size"], hidden=c["hidden_size"], layers=c["num_hidden_layers"],
                      heads=c["num_attention_heads"], kv_heads=c.get("num_key_value_heads", c["num_attention_heads"]),
                      intermediate=c["intermediate_size"], context=c["max_position_embeddings"],
                      rope_theta=float(rope), norm_eps=c.get("rms_norm_eps", 1e-5))
    if c.get("head_dim", cfg.head_dim) != cfg.head_dim:
        raise RuntimeError(f"teacher {hf_dir}: head_dim {c['head_dim']} is not hidden / heads")
    sd = read_safetensors(os.path.join(hf_dir, "model.safetensors"))
    sd = {k[len("model."):]: v.float() for k, v in sd.items() if k != "lm_head.weight"}
    m = Llama(cfg)
    m.load_state_dict(sd, strict=True)
    m = m.to(device).eval()
    for p in m.parameters():
        p.requires_grad_(False)
    return m


# ---------------------------------------------------------------- data


@dataclasses.dataclass
class Corpus:
    go_version: str
    train: list[tuple[str, str]]  # (path, text)
    heldout: list[tuple[str, str]]
    replaced_files: list[str]  # files that were not valid UTF-8


def load_corpus(archive: str) -> Corpus:
    splits: dict[str, str] = {}
    texts: dict[str, str] = {}
    go_version = ""
    replaced: list[str] = []
    try:
        tf = tarfile.open(archive, "r:*")
    except (OSError, tarfile.TarError) as e:
        raise RuntimeError(f"open corpus {archive}: {e}") from e
    with tf:
        for m in tf:
            if not m.isfile():
                continue
            data = tf.extractfile(m).read()
            if m.name == "GO_VERSION":
                go_version = data.decode().strip()
            elif m.name == "MANIFEST.tsv":
                for line in data.decode().splitlines()[1:]:
                    path, split, _ = line.split("\t")
                    splits[path] = split
            elif m.name.startswith("src/"):
                try:
                    text = data.decode("utf-8")
                except UnicodeDecodeError:
                    text = data.decode("utf-8", errors="replace")
                    replaced.append(m.name)
                texts[m.name[len("src/"):]] = text
    if not go_version or not splits:
        raise RuntimeError(f"{archive}: GO_VERSION or MANIFEST.tsv missing")
    missing = sorted(set(splits) - set(texts))
    if missing:
        raise RuntimeError(f"{archive}: {len(missing)} manifest files missing, first {missing[0]}")
    train = [(p, texts[p]) for p in sorted(splits) if splits[p] == "train"]
    heldout = [(p, texts[p]) for p in sorted(splits) if splits[p] == "heldout"]
    return Corpus(go_version, train, heldout, replaced)


def take_bytes(docs: list[tuple[str, str]], limit: int) -> list[tuple[str, str]]:
    out, total = [], 0
    for p, t in docs:
        if total >= limit:
            break
        out.append((p, t))
        total += len(t.encode())
    return out


# ---------------------------------------------------------------- tokenizer


class ByteTokenizer:
    """Fallback for CPU smoke tests where `tokenizers` is not installed: id 0 is
    EOT, ids 1..256 are bytes. Never used for a real run."""

    vocab_size = 257

    def encode_batch_ids(self, texts: list[str]) -> list[list[int]]:
        return [[b + 1 for b in t.encode()] for t in texts]

    def encode_ids(self, text: str) -> list[int]:
        return self.encode_batch_ids([text])[0]

    def decode(self, ids: list[int]) -> str:
        # Ids past the bytes come from a model of a larger vocabulary (a
        # teacher's, in a smoke run): shown as nothing.
        return bytes(i - 1 for i in ids if 0 < i <= 256).decode("utf-8", errors="replace")

    def eot_id(self) -> int:
        return 0


class HFTokenizer:
    def __init__(self, tok, source: str | None = None):
        self.tok = tok
        self.vocab_size = tok.get_vocab_size(with_added_tokens=True)
        self.source = source  # the tokenizer.json it was read from, shipped as is

    def save(self, path: str) -> None:
        if self.source:
            shutil.copyfile(self.source, path)
        else:
            self.tok.save(path)

    def encode_batch_ids(self, texts: list[str]) -> list[list[int]]:
        return [e.ids for e in self.tok.encode_batch(texts, add_special_tokens=False)]

    def encode_ids(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=False)

    def eot_id(self) -> int:
        i = self.tok.token_to_id(EOT)
        if i is None:
            raise RuntimeError(f"tokenizer lacks {EOT}")
        return i


def train_tokenizer(texts: list[str], vocab_size: int) -> HFTokenizer:
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=[EOT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    ht = HFTokenizer(tok)
    if ht.eot_id() != 0:
        raise RuntimeError(f"{EOT} got id {ht.eot_id()}, want 0")
    return ht


def load_tokenizer(hf_dir: str) -> HFTokenizer:
    """An existing model's tokenizer (HF directory with tokenizer.json)."""
    from tokenizers import Tokenizer

    path = os.path.join(hf_dir, "tokenizer.json")
    try:
        ht = HFTokenizer(Tokenizer.from_file(path), source=path)
    except Exception as e:
        raise RuntimeError(f"load tokenizer {path}: {e}") from e
    if ht.eot_id() != 0:
        raise RuntimeError(f"{path}: {EOT} has id {ht.eot_id()}, want 0")
    return ht


def build_stream(tok, docs: list[tuple[str, str]]) -> np.ndarray:
    """[EOT] doc [EOT] doc ... as one uint16 stream (every document is preceded by EOT)."""
    eot = tok.eot_id()
    parts = []
    for ids in tok.encode_batch_ids([t for _, t in docs]):
        parts.append(np.array([eot] + ids, dtype=np.uint16))
    if not parts:
        raise RuntimeError("no documents to tokenize")
    return np.concatenate(parts)


# ---------------------------------------------------------------- training


def lr_at(step: int, total: int, warmup: int, peak: float, floor: float) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    if total <= warmup:
        return floor
    frac = min(1.0, (step - warmup) / max(1, total - warmup))
    return floor + 0.5 * (peak - floor) * (1.0 + math.cos(math.pi * frac))


@torch.no_grad()
def heldout_loss(model: nn.Module, windows: torch.Tensor, batch: int, amp_dtype) -> float:
    """Mean next-token loss over windows [N, T+1]."""
    model.eval()
    total, count = 0.0, 0
    for i in range(0, windows.shape[0], batch):
        w = windows[i : i + batch]
        with autocast(w.device, amp_dtype):
            logits = model(w[:, :-1])
        loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), w[:, 1:].reshape(-1), reduction="sum")
        total += loss.item()
        count += w[:, 1:].numel()
    model.train()
    return total / count


@torch.no_grad()
def teacher_agreement(model: nn.Module, teacher: nn.Module, windows: torch.Tensor, batch: int, amp_dtype) -> float:
    """Fraction of positions of windows [N, T+1] where the model's argmax is
    the teacher's: the rate at which the target accepts a first drafted token
    under greedy decoding (on this text, with both models seeing the same
    prefix)."""
    model.eval()
    same, count = 0, 0
    for i in range(0, windows.shape[0], batch):
        w = windows[i : i + batch, :-1]
        with autocast(w.device, amp_dtype):
            a = model(w).argmax(-1)
            b = teacher(w).argmax(-1)
        same += (a == b).sum().item()
        count += a.numel()
    model.train()
    return same / count


def autocast(device: torch.device, dtype):
    if dtype is None:
        return torch.autocast(device_type=device.type, enabled=False)
    return torch.autocast(device_type=device.type, dtype=dtype)


# ---------------------------------------------------------------- evaluation


@torch.no_grad()
def perplexity(logits_fn, ids: list[int], window: int, device) -> dict:
    """The PPL_PROTOCOL computation; logits_fn maps [1, n] int64 to [1, n, vocab]."""
    total = 0.0
    preds = 0
    per_window = []
    for start in range(0, len(ids), window):
        w = ids[start : start + window]
        if len(w) < 2:
            per_window.append(None)
            continue
        x = torch.tensor([w], dtype=torch.long, device=device)
        logits = logits_fn(x)[0].double()  # [n, vocab]
        nll = F.cross_entropy(logits[:-1], x[0, 1:], reduction="sum").item()
        total += nll
        preds += len(w) - 1
        per_window.append(nll / (len(w) - 1))
    if preds == 0:
        raise ValueError("perplexity: fewer than 2 tokens")
    mean = total / preds
    return {"nll": mean, "ppl": math.exp(mean), "predictions": preds, "window_nll": per_window}


@torch.no_grad()
def complete(logits_fn, tok, prompt: str, max_new: int, context: int, device,
             temperature: float = 0.0, top_p: float = 1.0, seed: int = 0) -> str:
    """Decode without a KV cache (the whole prefix each step): slow but obviously
    right. temperature 0 is greedy; otherwise softmax(logits / temperature),
    keep the smallest set of tokens whose probability reaches top_p (sorted
    descending, the token that crosses top_p kept), renormalise, draw with a
    torch.Generator seeded with `seed`. Stops at EOT."""
    ids = tok.encode_ids(prompt)
    eot = tok.eot_id()
    gen = torch.Generator(device="cpu")
    gen.manual_seed(seed)
    out: list[int] = []
    for _ in range(max_new):
        ctx = (ids + out)[-context:]
        logits = logits_fn(torch.tensor([ctx], dtype=torch.long, device=device))[0, -1].float().cpu()
        if temperature <= 0:
            nxt = int(torch.argmax(logits))
        else:
            probs = torch.softmax(logits / temperature, dim=-1)
            sp, si = torch.sort(probs, descending=True)
            keep = (torch.cumsum(sp, 0) - sp) < top_p
            sp = sp * keep
            nxt = int(si[torch.multinomial(sp / sp.sum(), 1, generator=gen)])
        if nxt == eot:
            break
        out.append(nxt)
    return tok.decode(out)


# ---------------------------------------------------------------- export


def export_hf(model: Llama, tok: HFTokenizer, outdir: str, check_ids: torch.Tensor) -> dict:
    """Save model + tokenizer as an HF Llama directory, verifying the round trip."""
    import transformers
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = model.cfg
    os.makedirs(outdir, exist_ok=True)
    eot = tok.eot_id()
    # Classic Llama config.json keys, the form every reader (and trigon's
    # model.Config) knows; transformers is made to parse exactly this.
    classic = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden,
        "intermediate_size": cfg.intermediate,
        "num_hidden_layers": cfg.layers,
        "num_attention_heads": cfg.heads,
        "num_key_value_heads": cfg.kv_heads,
        "head_dim": cfg.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": cfg.context,
        "rms_norm_eps": cfg.norm_eps,
        "rope_theta": cfg.rope_theta,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": True,
        "bos_token_id": eot,
        "eos_token_id": eot,
        "torch_dtype": "bfloat16",
    }
    with open(os.path.join(outdir, "config.json"), "w") as f:
        json.dump(classic, f, indent=2)
    try:
        hf_cfg = LlamaConfig.from_pretrained(outdir)
    except Exception as e:  # a transformers that no longer reads the classic form
        log(f"export: LlamaConfig.from_pretrained(classic) failed ({type(e).__name__}: {e}); building it")
        kw = {k: v for k, v in classic.items()
              if k not in ("architectures", "model_type", "rope_theta", "torch_dtype")}
        hf_cfg = LlamaConfig(**kw, rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_theta})
    hf = LlamaForCausalLM(hf_cfg)
    want_keys = set(hf.state_dict().keys())
    sd = hf_state_dict(model)
    if "lm_head.weight" in want_keys:
        sd["lm_head.weight"] = sd["model.embed_tokens.weight"]
    missing = sorted(want_keys - set(sd))
    unexpected = sorted(set(sd) - want_keys)
    if missing or unexpected:
        raise RuntimeError(f"export: missing {missing[:5]} unexpected {unexpected[:5]}")
    hf.load_state_dict({k: v.float().cpu() for k, v in sd.items()}, strict=True)
    if hf.lm_head.weight.data_ptr() != hf.model.embed_tokens.weight.data_ptr():
        hf.tie_weights()
    if hf.lm_head.weight.data_ptr() != hf.model.embed_tokens.weight.data_ptr():
        raise RuntimeError("export: lm_head is not tied to embed_tokens")

    # Same function? Both in float32 on the same device, no autocast.
    dev = check_ids.device
    hf = hf.to(dev).float().eval()
    ref = Llama(cfg).to(dev)
    ref.load_state_dict({k: v.float() for k, v in model.state_dict().items()})
    ref.eval()
    with torch.no_grad():
        ours = ref(check_ids)
        theirs = hf(input_ids=check_ids).logits
    diff = (ours - theirs).abs().max().item()
    scale = ours.abs().max().item()
    log(f"export: logits max |ours - transformers| = {diff:.3g} (max |logit| {scale:.3g})")
    if not diff <= 1e-3 * max(1.0, scale):
        raise RuntimeError(f"export: logits differ from transformers by {diff}")
    del ref

    hf = hf.to(torch.bfloat16).cpu()
    hf.save_pretrained(outdir)
    # Keep the classic keys beside whatever this transformers version writes
    # (5.x moves rope_theta into rope_parameters and writes dtype).
    with open(os.path.join(outdir, "config.json")) as f:
        written = json.load(f)
    with open(os.path.join(outdir, "config.transformers.json"), "w") as f:
        json.dump(written, f, indent=2, sort_keys=True)
    added = sorted(k for k in classic if k not in written)
    for k, v in classic.items():
        written.setdefault(k, v)
    written["architectures"] = ["LlamaForCausalLM"]
    with open(os.path.join(outdir, "config.json"), "w") as f:
        json.dump(written, f, indent=2, sort_keys=True)
        f.write("\n")
    log(f"export: config.json keys added beside transformers' own: {added}")

    tok.save(os.path.join(outdir, "tokenizer.json"))
    tok_cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": EOT,
        "eos_token": EOT,
        "unk_token": EOT,
        "add_bos_token": False,
        "add_eos_token": False,
        "model_max_length": cfg.context,
        "clean_up_tokenization_spaces": False,
        "added_tokens_decoder": {
            str(eot): {"content": EOT, "lstrip": False, "normalized": False, "rstrip": False,
                       "single_word": False, "special": True}
        },
    }
    with open(os.path.join(outdir, "tokenizer_config.json"), "w") as f:
        json.dump(tok_cfg, f, indent=2)
        f.write("\n")
    with open(os.path.join(outdir, "special_tokens_map.json"), "w") as f:
        json.dump({"bos_token": EOT, "eos_token": EOT, "unk_token": EOT}, f, indent=2)
        f.write("\n")
    gen_cfg = {
        "bos_token_id": eot,
        "eos_token_id": eot,
        "do_sample": True,
        "temperature": GEN_TEMPERATURE,
        "top_p": GEN_TOP_P,
        "top_k": 0,
        "max_new_tokens": GEN_MAX_NEW_TOKENS,
        "transformers_version": transformers.__version__,
    }
    with open(os.path.join(outdir, "generation_config.json"), "w") as f:
        json.dump(gen_cfg, f, indent=2)
        f.write("\n")

    # What landed on disk.
    from safetensors import safe_open

    files = sorted(f for f in os.listdir(outdir) if f != "config.transformers.json")
    st = [f for f in files if f.endswith(".safetensors")]
    if st != ["model.safetensors"]:
        raise RuntimeError(f"export: expected one model.safetensors, got {files}")
    tensors = {}
    with safe_open(os.path.join(outdir, "model.safetensors"), framework="pt") as f:
        for k in f.keys():
            t = f.get_tensor(k)
            tensors[k] = (list(t.shape), str(t.dtype))
    bad = {k: v for k, v in tensors.items() if v[1] != "torch.bfloat16"}
    if bad:
        raise RuntimeError(f"export: non-bf16 tensors {bad}")
    sizes = {f: os.path.getsize(os.path.join(outdir, f)) for f in files}
    log(f"export: {outdir}: {sizes}")
    return {"files": sizes, "tensors": len(tensors), "lm_head_saved": "lm_head.weight" in tensors,
            "logit_max_abs_diff_vs_transformers_fp32": diff}


def load_exported(outdir: str, device) -> tuple[nn.Module, str]:
    """The shipped directory as transformers reads it, in float32. If the
    merged config.json (classic keys added) does not load, fall back to the
    one transformers wrote and say so."""
    from transformers import AutoModelForCausalLM

    def load():
        try:
            return AutoModelForCausalLM.from_pretrained(outdir, attn_implementation="eager")
        except TypeError:
            return AutoModelForCausalLM.from_pretrained(outdir)

    note = "merged config.json loads"
    try:
        m = load()
    except Exception as e:
        note = f"CHECK FAILED: merged config.json: {type(e).__name__}: {e}; shipped transformers' own"
        log(note)
        os.replace(os.path.join(outdir, "config.transformers.json"), os.path.join(outdir, "config.json"))
        m = load()
    side = os.path.join(outdir, "config.transformers.json")
    if os.path.exists(side):
        os.remove(side)
    return m.to(device=device, dtype=torch.float32).eval(), note


def check_auto_tokenizer(outdir: str, tok: HFTokenizer, text: str) -> str:
    """transformers' AutoTokenizer must agree with raw tokenizer.json."""
    try:
        from transformers import AutoTokenizer

        at = AutoTokenizer.from_pretrained(outdir)
        a = at(text, add_special_tokens=True)["input_ids"]
        b = tok.encode_ids(text)
        if a != b:
            return f"CHECK FAILED: AutoTokenizer ids differ (len {len(a)} vs {len(b)})"
        if at.eos_token_id != tok.eot_id():
            return f"CHECK FAILED: AutoTokenizer eos {at.eos_token_id}"
        return f"ok ({type(at).__name__})"
    except Exception as e:  # report, do not lose the run over a loader quirk
        return f"CHECK FAILED: AutoTokenizer: {type(e).__name__}: {e}"


# ---------------------------------------------------------------- main


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--archive", required=True, help="gosrc.tar.xz from prepare.sh")
    ap.add_argument("--heldout-text", required=True, help="models/default/heldout.go.txt")
    ap.add_argument("--out", required=True, help="output directory")
    ap.add_argument("--smoke", action="store_true", help="tiny data, model and step count: a pipeline check")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--tokenizer-bytes", type=int, default=64 << 20, help="train files used for the tokenizer")
    ap.add_argument("--batch", type=int, default=64, help="sequences per step")
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--min-lr", type=float, default=2e-4)
    ap.add_argument("--warmup", type=int, default=150)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--budget", type=float, default=400, help="seconds for the whole script")
    ap.add_argument("--reserve", type=float, default=60, help="seconds kept for export and evaluation")
    ap.add_argument("--max-train-seconds", type=float, default=None, help="default 360, --draft 120")
    ap.add_argument("--max-steps", type=int, default=None,
                    help="stop after this many steps; 0 or unset: by time (--smoke: 30 unless set)")
    ap.add_argument("--eval-every", type=int, default=250)
    ap.add_argument("--log-every", type=int, default=25)
    ap.add_argument("--eval-windows", type=int, default=128)
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--draft", action="store_true",
                    help=f"train a draft of the default model: shape {DRAFT_MODEL}, --tokenizer and --teacher "
                         f"default to {DEFAULT_TOKENIZER}, --max-train-seconds to 120")
    ap.add_argument("--tokenizer", default=None, metavar="HF_DIR",
                    help="use this model directory's tokenizer.json instead of training one (shipped unchanged)")
    ap.add_argument("--teacher", default=None, metavar="HF_DIR",
                    help="distil from this exported Llama (same tokenizer): the loss is the cross-entropy "
                         "against its next-token distribution, mixed with the data's by --distill-weight")
    ap.add_argument("--no-teacher", action="store_true", help="with --draft: train on the data alone")
    ap.add_argument("--distill-weight", type=float, default=1.0,
                    help="weight of the teacher's loss; the data's gets 1 minus it")
    for name in ("hidden", "layers", "heads", "kv-heads", "intermediate", "context"):
        ap.add_argument(f"--{name}", type=int, default=None, help="model shape (default: the full or --draft shape)")
    args = ap.parse_args()

    if args.draft:
        if args.tokenizer is None:
            args.tokenizer = DEFAULT_TOKENIZER
        if args.teacher is None and not args.no_teacher:
            args.teacher = DEFAULT_TOKENIZER
        if args.max_train_seconds is None:
            args.max_train_seconds = 120
    if args.no_teacher:
        args.teacher = None
    if args.max_train_seconds is None:
        args.max_train_seconds = 360
    if args.teacher and args.tokenizer is None:
        args.tokenizer = args.teacher  # the teacher's ids are the only ones its logits judge
    if not 0.0 <= args.distill_weight <= 1.0:
        ap.error(f"--distill-weight {args.distill_weight} outside [0, 1]")
    shape = dict(DRAFT_MODEL if args.draft else FULL_MODEL)
    for key in ("hidden", "layers", "heads", "kv_heads", "intermediate", "context"):
        if getattr(args, key) is not None:
            shape[key] = getattr(args, key)
    try:
        ModelConfig(vocab_size=args.vocab, **shape).validate()
    except ValueError as e:
        ap.error(f"model shape {shape}: {e}")

    if args.smoke:
        args.vocab = min(args.vocab, 512)
        args.batch = min(args.batch, 8)
        args.warmup = 5
        args.eval_every = 10
        args.log_every = 5
        args.eval_windows = 8
        if args.max_steps is None:
            args.max_steps = 30
    args.max_steps = args.max_steps or 0

    os.makedirs(args.out, exist_ok=True)
    torch.manual_seed(args.seed)
    np.random.seed(args.seed)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    amp_dtype = torch.bfloat16 if device.type == "cuda" else None
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    log(f"torch {torch.__version__} python {platform.python_version()} device {device}"
        + (f" ({torch.cuda.get_device_name()})" if device.type == "cuda" else ""))

    # 1. corpus
    corpus = load_corpus(args.archive)
    train_docs, held_docs = corpus.train, corpus.heldout
    if args.smoke:
        train_docs = take_bytes(train_docs, 1 << 20)
        held_docs = take_bytes(held_docs, 64 << 10)
    with open(args.heldout_text, "rb") as f:
        heldout_text = f.read().decode("utf-8")
    train_bytes = sum(len(t.encode()) for _, t in train_docs)
    held_bytes = sum(len(t.encode()) for _, t in held_docs)
    log(f"corpus {corpus.go_version}: train {len(train_docs)} files {train_bytes} B, "
        f"held out {len(held_docs)} files {held_bytes} B, non-UTF-8 files {corpus.replaced_files}")

    # 2. tokenizer
    try:
        import tokenizers  # noqa: F401

        have_tokenizers = True
    except ImportError:
        have_tokenizers = False
    if have_tokenizers and args.tokenizer:
        tok = load_tokenizer(args.tokenizer)
        log(f"tokenizer: {tok.source} (not trained)")
    elif have_tokenizers:
        tok_docs = take_bytes(train_docs, args.tokenizer_bytes)
        tok = train_tokenizer([t for _, t in tok_docs], args.vocab)
    elif args.smoke:
        log("tokenizers not installed: smoke run with a byte tokenizer, no export")
        tok = ByteTokenizer()
    else:
        raise RuntimeError("the `tokenizers` package is required")
    log(f"tokenizer: vocab {tok.vocab_size}")

    # 3. tokenize
    train_stream = build_stream(tok, train_docs)
    held_stream = build_stream(tok, held_docs)
    log(f"tokens: train {len(train_stream)} ({train_bytes / len(train_stream):.2f} B/token), "
        f"held out {len(held_stream)}")

    # 4. model and training
    teacher = None
    if args.teacher:
        teacher = load_teacher(args.teacher, device)
        log(f"teacher {args.teacher}: {teacher.cfg} params {teacher.num_params()}")
    vocab = tok.vocab_size
    if teacher is not None and isinstance(tok, ByteTokenizer):
        vocab = teacher.cfg.vocab_size  # smoke without tokenizers: byte ids are valid teacher ids
    if teacher is not None and vocab != teacher.cfg.vocab_size:
        raise RuntimeError(f"tokenizer vocab {vocab} is not the teacher's {teacher.cfg.vocab_size}")
    if args.smoke:
        shape = SMOKE_MODEL
    cfg = ModelConfig(vocab_size=vocab, **shape)
    if teacher is not None and cfg.context > teacher.cfg.context:
        raise RuntimeError(f"context {cfg.context} exceeds the teacher's {teacher.cfg.context}")
    model = Llama(cfg).to(device)
    nparams = model.num_params()
    log(f"model: {cfg} params {nparams}")
    T = cfg.context
    if len(train_stream) < T + 2:
        raise RuntimeError(f"train stream of {len(train_stream)} tokens shorter than one window")

    train_t = torch.from_numpy(train_stream.astype(np.int64)).to(device)  # [N]
    n_win = min(args.eval_windows, (len(held_stream) - 1) // T)
    if n_win < 1:
        raise RuntimeError(f"held-out stream of {len(held_stream)} tokens shorter than one window")
    held_t = torch.from_numpy(held_stream.astype(np.int64)).to(device)
    held_windows = torch.stack([held_t[i * T : i * T + T + 1] for i in range(n_win)])  # [n_win, T+1]
    offsets = torch.arange(T + 1, device=device)  # [T+1]
    gen = torch.Generator(device=device)
    gen.manual_seed(args.seed)

    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": args.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    try:
        opt = torch.optim.AdamW(groups, lr=args.lr, betas=(0.9, 0.95), eps=1e-8, fused=device.type == "cuda")
    except TypeError:
        opt = torch.optim.AdamW(groups, lr=args.lr, betas=(0.9, 0.95), eps=1e-8)

    step_model, step_teacher = model, teacher
    compiled = False
    if device.type == "cuda" and not args.no_compile and hasattr(torch, "compile"):
        step_model = torch.compile(model)
        step_teacher = torch.compile(teacher) if teacher is not None else None
        compiled = True
    w_kd = args.distill_weight if teacher is not None else 0.0

    def train_step(lr: float) -> torch.Tensor:
        for g in opt.param_groups:
            g["lr"] = lr
        starts = torch.randint(0, len(train_t) - T - 1, (args.batch,), device=device, generator=gen)
        batch = train_t[starts[:, None] + offsets]  # [B, T+1]
        with autocast(device, amp_dtype):
            logits = step_model(batch[:, :-1])  # [B, T, vocab]
        logp = F.log_softmax(logits.float().reshape(-1, cfg.vocab_size), dim=-1)  # [B*T, vocab]
        loss = torch.zeros((), device=device)
        if w_kd < 1.0:
            loss = loss + (1.0 - w_kd) * F.nll_loss(logp, batch[:, 1:].reshape(-1))
        if w_kd > 0.0:
            with torch.no_grad(), autocast(device, amp_dtype):
                t_logits = step_teacher(batch[:, :-1])  # [B, T, vocab]
            t_prob = F.softmax(t_logits.float().reshape(-1, cfg.vocab_size), dim=-1)  # [B*T, vocab]
            loss = loss + w_kd * -(t_prob * logp).sum(-1).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return loss.detach()

    log_path = os.path.join(args.out, "train-log.csv")
    log_f = open(log_path, "w", newline="")
    writer = csv.writer(log_f)
    writer.writerow(["step", "tokens", "elapsed_s", "lr", "train_loss", "heldout_loss"])

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize()

    tokens_per_step = args.batch * T
    train_start = time.monotonic()
    train_end = min(train_start + args.max_train_seconds, T0 + args.budget - args.reserve)
    if train_end - train_start < 30 and not args.smoke:
        raise RuntimeError(f"only {train_end - train_start:.0f}s left for training")
    # total_steps is planned from the measured rate after a calibration phase
    # and re-planned at every held-out evaluation; until calibrated, use a
    # guess long enough that warmup runs unchanged.
    total_steps = args.max_steps if args.max_steps else 10**9
    calib_step, calib_time = None, None
    step = 0
    loss_sum = torch.zeros((), device=device)
    loss_n = 0
    last_held = float("nan")
    # The best held-out state is kept on the device: with ~10M tokens of data
    # and a time budget, the model sees the corpus many times over and could
    # start to memorise; export then takes the better of final and best.
    best_held, best_step, best_state = float("inf"), 0, None
    last_eval_step = -1
    first_step_s = None
    while True:
        now = time.monotonic()
        if step >= total_steps or (not args.max_steps and now >= train_end):
            break
        lr = lr_at(step, total_steps, args.warmup, args.lr, args.min_lr)
        if step == 0:
            try:
                loss = train_step(lr)
                sync()
            except Exception as e:  # a compiler failure must not cost the run
                if not compiled:
                    raise
                log(f"torch.compile failed ({type(e).__name__}: {e}); training eager")
                step_model, step_teacher, compiled = model, teacher, False
                loss = train_step(lr)
                sync()
            first_step_s = time.monotonic() - now
            log(f"first step (compile={compiled}) took {first_step_s:.1f}s, loss {loss.item():.3f}")
        else:
            loss = train_step(lr)
        loss_sum += loss
        loss_n += 1
        step += 1
        if not args.max_steps and step == 10:
            sync()
            calib_step, calib_time = step, time.monotonic()
        if not args.max_steps and step == 40:
            sync()
            rate = (step - calib_step) / (time.monotonic() - calib_time)
            total_steps = step + int(rate * (train_end - time.monotonic()))
            log(f"calibrated: {rate:.2f} steps/s ({rate * tokens_per_step / 1e6:.2f}M tok/s), planning {total_steps} steps")
        do_eval = step % args.eval_every == 0 or step == total_steps
        if step % args.log_every == 0 or do_eval:
            train_loss = (loss_sum / loss_n).item()
            loss_sum.zero_()
            loss_n = 0
            held = ""
            if do_eval:
                last_held = heldout_loss(model, held_windows, args.batch, amp_dtype)
                held = f"{last_held:.4f}"
                if last_held < best_held:
                    best_held, best_step = last_held, step
                    best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
                if not args.max_steps and calib_time is not None and step > 40:
                    rate = (step - calib_step) / (time.monotonic() - calib_time)
                    total_steps = max(step + 1, step + int(rate * (train_end - time.monotonic())))
            elapsed = time.monotonic() - train_start
            writer.writerow([step, step * tokens_per_step, f"{elapsed:.1f}", f"{lr:.6g}", f"{train_loss:.4f}", held])
            last_eval_step = step if do_eval else last_eval_step
            log_f.flush()
            if do_eval or step % (args.log_every * 8) == 0:
                log(f"step {step}/{total_steps} lr {lr:.2e} train {train_loss:.4f} held-out {held or '-'}")
    sync()
    train_seconds = time.monotonic() - train_start
    if last_eval_step != step:  # stopped by the clock between evaluations
        train_loss = (loss_sum / loss_n).item() if loss_n else float("nan")
        last_held = heldout_loss(model, held_windows, args.batch, amp_dtype)
        writer.writerow([step, step * tokens_per_step, f"{train_seconds:.1f}", f"{lr:.6g}",
                         f"{train_loss:.4f}", f"{last_held:.4f}"])
    log_f.close()
    log(f"trained {step} steps, {step * tokens_per_step} tokens in {train_seconds:.1f}s; held-out loss {last_held:.4f}"
        + (" (training loss: against the teacher)" if w_kd > 0 else ""))
    exported_step = step
    if best_state is not None and best_held < last_held - 0.005:
        model.load_state_dict(best_state)
        exported_step = best_step
        log(f"held-out loss was lower at step {best_step} ({best_held:.4f} < {last_held:.4f}): exporting that state")
        last_held = best_held
    del best_state

    model.eval()
    # Rescue copy: if export fails below, these two files are enough to export again.
    torch.save({"config": dataclasses.asdict(cfg),
                "state_dict": {k: v.to(torch.bfloat16).cpu() for k, v in model.state_dict().items()}},
               os.path.join(args.out, "ckpt.pt"))
    if isinstance(tok, HFTokenizer):
        tok.save(os.path.join(args.out, "tokenizer.json"))
    summary = {
        "go_version": corpus.go_version,
        "train_files": len(train_docs),
        "train_bytes": train_bytes,
        "heldout_files": len(held_docs),
        "heldout_bytes": held_bytes,
        "non_utf8_files": corpus.replaced_files,
        "train_tokens": int(len(train_stream)),
        "heldout_tokens": int(len(held_stream)),
        "bytes_per_token": train_bytes / len(train_stream),
        "vocab_size": tok.vocab_size,
        "model": dataclasses.asdict(cfg),
        "params": nparams,
        "seed": args.seed,
        "batch_sequences": args.batch,
        "tokens_per_step": tokens_per_step,
        "steps": step,
        "tokens_seen": step * tokens_per_step,
        "epochs": step * tokens_per_step / len(train_stream),
        "train_seconds": train_seconds,
        "first_step_seconds": first_step_s,
        "compiled": compiled,
        "optimizer": {"name": "AdamW", "lr": args.lr, "min_lr": args.min_lr, "warmup": args.warmup,
                      "betas": [0.9, 0.95], "weight_decay": args.weight_decay, "grad_clip": 1.0,
                      "schedule": "linear warmup, cosine to min_lr over the planned steps"},
        "exported_step": exported_step,
        "exported_heldout_loss_bf16": last_held,
        "device": torch.cuda.get_device_name() if device.type == "cuda" else platform.processor(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "pretokenize_pattern": PRETOKENIZE_PATTERN,
        "tokenizer_from": args.tokenizer,
        "teacher": args.teacher,
        "distill_weight": w_kd,
    }
    if teacher is not None:
        agree = teacher_agreement(model, teacher, held_windows, args.batch, amp_dtype)
        summary["heldout_top1_agreement_with_teacher_bf16"] = agree
        log(f"held-out top-1 agreement with the teacher (bf16): {agree:.4f}")
        del teacher, step_teacher

    def our_logits(x):
        with autocast(device, amp_dtype):
            return model(x).float()

    def write_summary():
        with open(os.path.join(args.out, "summary.json"), "w") as f:
            json.dump(summary, f, indent=2)
            f.write("\n")

    heldout_ids = tok.encode_ids(heldout_text)
    ppl_train_copy = perplexity(our_logits, heldout_ids, T, device)
    summary["heldout_text_ppl_training_copy_bf16"] = ppl_train_copy["ppl"]
    write_summary()
    log(f"held-out text perplexity, training copy in bf16: {ppl_train_copy['ppl']:.4f}")

    if not isinstance(tok, HFTokenizer):
        # CPU smoke without tokenizers/transformers: exercise decoding on our model.
        text = complete(our_logits, tok, SAMPLE_PROMPTS[0], 8, T, device, GEN_TEMPERATURE, GEN_TOP_P, args.seed)
        log(f"smoke: sample {text!r}")
        return 0

    # 5. export and verify
    import tokenizers as tk
    import transformers

    summary["transformers"] = transformers.__version__
    summary["tokenizers"] = tk.__version__
    hf_dir = os.path.join(args.out, "hf")
    check = torch.tensor([heldout_ids[: min(256, T)], heldout_ids[100 : 100 + min(256, T)]],
                         dtype=torch.long, device=device)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    summary["export"] = export_hf(model, tok, hf_dir, check)

    # 6. reference numbers from the exported files only.
    from tokenizers import Tokenizer

    shipped_tok = HFTokenizer(Tokenizer.from_file(os.path.join(hf_dir, "tokenizer.json")))
    ids = shipped_tok.encode_ids(heldout_text)
    if ids != heldout_ids:
        raise RuntimeError("reloaded tokenizer.json encodes the held-out text differently")
    summary["auto_tokenizer"] = check_auto_tokenizer(hf_dir, shipped_tok, heldout_text)
    log(f"AutoTokenizer: {summary['auto_tokenizer']}")
    hf, summary["config_load"] = load_exported(hf_dir, device)

    def hf_logits(x):
        return hf(input_ids=x).logits.float()

    ppl = perplexity(hf_logits, ids, T, device)
    log(f"perplexity of {args.heldout_text}: {ppl['ppl']:.4f} (nll {ppl['nll']:.5f}, {len(ids)} tokens)")
    ppl_doc = {
        "file": "models/default/heldout.go.txt",
        "file_sha256": sha256_file(args.heldout_text),
        "tokens": len(ids),
        "window": T,
        "windows": len(ppl["window_nll"]),
        "predictions": ppl["predictions"],
        "nll": ppl["nll"],
        "ppl": ppl["ppl"],
        "window_nll": ppl["window_nll"],
        "first_ids": ids[:64],
        "protocol": PPL_PROTOCOL,
        "computed_with": f"transformers {transformers.__version__}, torch {torch.__version__}, "
                         f"{summary['device']}",
    }
    with open(os.path.join(args.out, "perplexity.json"), "w") as f:
        json.dump(ppl_doc, f, indent=2)
        f.write("\n")
    with open(os.path.join(args.out, "heldout.ids.txt"), "w") as f:
        f.write(" ".join(map(str, ids)) + "\n")
    summary["heldout_text_ppl"] = ppl["ppl"]
    summary["heldout_text_tokens"] = len(ids)

    n_greedy = 24 if args.smoke else 128
    n_sampled = 24 if args.smoke else 160
    lines = [
        "# Completions by the exported model (hf/, loaded by transformers, float32), no BOS.",
        f"# greedy: argmax, {n_greedy} new tokens at most; sampled: temperature {GEN_TEMPERATURE}, "
        f"top_p {GEN_TOP_P}, seed {args.seed} + prompt index (torch.Generator on CPU), {n_sampled} new tokens at most.",
        "# Generation stops at <|endoftext|>. Produced by tools/train-default-model/train.py.",
        "",
    ]
    for i, prompt in enumerate(SAMPLE_PROMPTS):
        greedy = complete(hf_logits, shipped_tok, prompt, n_greedy, T, device)
        sampled = complete(hf_logits, shipped_tok, prompt, n_sampled, T, device,
                           GEN_TEMPERATURE, GEN_TOP_P, args.seed + i)
        lines += [f"=== prompt {i + 1} (greedy) ===", prompt + greedy, "",
                  f"=== prompt {i + 1} (sampled) ===", prompt + sampled, ""]
    with open(os.path.join(args.out, "samples.txt"), "w") as f:
        f.write("\n".join(lines))
    log("samples written")

    summary["total_seconds"] = time.monotonic() - T0
    write_summary()
    log(f"done in {summary['total_seconds']:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
