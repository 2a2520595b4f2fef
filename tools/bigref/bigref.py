"""Llama-3-8B-shaped reference for the CUDA backend (GPU machine only).

Writes a Llama-3-8B-shaped model with random bf16 weights as an HF directory
(safetensors) and the transformers reference trigon is compared with:
4 random prompts of 2048 tokens; last-token logits at batch 4 and batch 1;
64-token greedy continuations at batch 4 and batch 1. transformers runs in
bf16 on the GPU (sdpa attention), as a user of it would.

    python3 bigref.py OUTDIR      # OUTDIR/model/ and OUTDIR/reference.json.gz
"""
import gzip
import json
import os
import sys
import time

import torch
import transformers
from transformers import LlamaConfig, LlamaForCausalLM

PROMPTS, PROMPT_LEN, NEW_TOKENS, SEED, SHORT = 4, 2048, 64, 20261129, 24


def main():
    out = sys.argv[1]
    mdir = os.path.join(out, "model")
    os.makedirs(mdir, exist_ok=True)
    torch.manual_seed(SEED)
    cfg = LlamaConfig(
        vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=8, head_dim=128, max_position_embeddings=131072,
        rms_norm_eps=1e-5, tie_word_embeddings=False, bos_token_id=128000, eos_token_id=128001,
        initializer_range=0.02, hidden_act="silu",
        # transformers 5 takes rope_parameters (4.x took rope_theta + rope_scaling).
        rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                         "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 8192},
    )
    t0 = time.time()
    # Initialise in float32 (so RoPE buffers are computed in float32), cast
    # the parameters to bf16, save, then reload with from_pretrained: the
    # reference is the model exactly as a transformers user would run it.
    with torch.device("cuda"):
        model = LlamaForCausalLM(cfg)
    for p in model.parameters():
        p.data = p.data.to(torch.bfloat16)
    print(f"init {time.time() - t0:.1f}s", flush=True)
    t0 = time.time()
    model.save_pretrained(mdir, safe_serialization=True)
    del model
    torch.cuda.empty_cache()
    model = LlamaForCausalLM.from_pretrained(mdir, dtype=torch.bfloat16, device_map="cuda").eval()
    print(f"saved and reloaded {time.time() - t0:.1f}s", flush=True)

    g = torch.Generator().manual_seed(SEED)
    prompts = torch.randint(0, 128000, (PROMPTS, PROMPT_LEN), generator=g)
    ids = prompts.cuda()
    ref = {"prompts": prompts.tolist(), "new_tokens": NEW_TOKENS,
           "transformers": transformers.__version__, "torch": torch.__version__}
    with torch.no_grad():
        t0 = time.time()
        ref["last_logits_b4"] = model(ids).logits[:, -1].float().cpu().tolist()
        ref["last_logits_b1"] = model(ids[:1]).logits[:, -1].float().cpu().tolist()
        # A short prompt the CPU backend can also run, to tell a kernel
        # problem from a model-definition one.
        ref["short_len"] = SHORT
        ref["short_last_logits"] = model(ids[:1, :SHORT]).logits[0, -1].float().cpu().tolist()
        torch.cuda.synchronize()
        print(f"prefill logits {time.time() - t0:.1f}s", flush=True)
        model.generation_config = transformers.GenerationConfig(
            do_sample=False, bos_token_id=128000, pad_token_id=0, eos_token_id=None)
        kw = dict(max_new_tokens=NEW_TOKENS, do_sample=False)
        t0 = time.time()
        ref["greedy_b4"] = model.generate(ids, attention_mask=torch.ones_like(ids), **kw)[:, PROMPT_LEN:].cpu().tolist()
        ref["greedy_b1"] = model.generate(ids[:1], attention_mask=torch.ones_like(ids[:1]), **kw)[:, PROMPT_LEN:].cpu().tolist()[0]
        print(f"generate {time.time() - t0:.1f}s", flush=True)
    with gzip.open(os.path.join(out, "reference.json.gz"), "wt") as f:
        json.dump(ref, f)
    print("ok", flush=True)


if __name__ == "__main__":
    main()
