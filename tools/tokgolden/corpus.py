"""Writes the tokenizer golden corpus (one JSON string per line) to stdout.

The corpus is deterministic: hand-written lines that each aim at one
tokenizer edge case, followed by lines assembled from the same fragments with
a seeded RNG so that the edge cases also meet each other.

Usage: python3 tools/tokgolden/corpus.py > tokenizer/testdata/corpus.jsonl
"""

import json
import random
import sys
import unicodedata

HAND = [
    # English prose and punctuation.
    "Hello world!",
    "The quick brown fox jumps over the lazy dog.",
    "It was the best of times, it was the worst of times; it was the age of wisdom.",
    "In 1969, Apollo 11 landed on the Moon (July 20th) and returned on July 24th.",
    "Mr. Smith's dog isn't here -- it's at the vet's office, isn't it?",
    "A sentence with \"double quotes\", 'single quotes' and `backticks`.",
    "Ellipsis... and em-dash \u2014 and en-dash \u2013 and \u201csmart quotes\u201d.",
    "e.g. i.e. etc. vs. U.S.A. Ph.D.",
    "ALL CAPS SHOUTING: DON'T YOU DARE! WE'LL SEE. THEY'RE HERE. I'VE GOT IT. I'M OK. YOU'D KNOW.",
    # Contractions, mixed case (Llama-3/Qwen regexes are case-insensitive there).
    "I'm, you're, he's, she'd, we've, they'll, it's, can't, won't",
    "I'M YOU'RE HE'S SHE'D WE'VE THEY'LL IT'S CAN'T",
    "I'm I'M i'M I'Ll i'lL y'all o'clock rock'n'roll",
    "'s 't 're 've 'm 'll 'd 'S 'T 'RE 'VE 'M 'LL 'D",
    "don\u2019t (curly apostrophe) vs don't",
    # Contractions followed by more letters: only here do the contraction
    # alternatives and the letter-run alternatives disagree.
    "'Sam said 'tis 'Twas 'REally 'velvet 'Llama 'mama 'dad 'STOP 'Tree",
    "x'sam y'TEA z'veal w'LLAMA v'DUDE u'mmm t'rex",
    "\u017f '\u017ftop '\u017f He'\u017f (long s) and 'K 'k",
    "'''s '' ' s 'S's's",
    "abc'defg'hij 12'34 'x'y'z",
    # Numbers.
    "1234567890",
    "3.14159265358979 2.71828 -42 +7 1e-10 0x1F 0b1010 1_000_000",
    "Call 555-123-4567 or +1 (800) 555-0199 before 12:30pm on 2024-03-15.",
    "\u0661\u0662\u0663 \u0968\u0969 \u2167 \u00bd \u00b2 \u2460 \uff11\uff12\uff13",
    "100000000000000000000000000000000000000000000",
    "v1.2.3-rc.4+build.5",
    # Whitespace runs.
    "two  spaces",
    "three   spaces and four    spaces",
    "trailing spaces   ",
    "   leading spaces",
    "\ttab\tseparated\tvalues\t",
    "line one\nline two\n\nline four",
    "windows\r\nline\r\nendings\r\n",
    "mixed \t \n \r\n whitespace \u00a0 nbsp \u2003 emspace \u3000 ideographic",
    "a \u3000b x\u00a0\u00a0y tab\t\tword \u2028x \u0085y \x0bz \x0cw",
    "  ,  .  !  1  a  \u4e2d  \U0001f600  ",
    "12 123 1234 12345 123456 1234567 \u0661\u0662\u0663\u0664 \u2160\u2161\u2162\u2163",
    "\n\n\n",
    "          ",
    " ",
    "\t",
    "a\n b\n  c\n   d",
    "end with newline\n",
    "  \n  \n  ",
    "word \n\n word",
    # Code.
    "func main() {\n\tfmt.Println(\"hello, world\")\n}",
    "for i := 0; i < len(xs); i++ {\n\t\tsum += xs[i] * 2\n\t}",
    "if err != nil {\n\treturn fmt.Errorf(\"load %s: %w\", path, err)\n}",
    "type TokenID = int32 // an alias",
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    "class Foo(Bar):\n    def __init__(self, x: int = 3) -> None:\n        self._x = x  # comment\n",
    "print(f\"{x!r:>10} {y:.3f}\")",
    "import numpy as np; a = np.zeros((3, 4), dtype=np.float32)",
    "SELECT id, name FROM users WHERE age >= 21 ORDER BY name DESC LIMIT 10;",
    "<div class=\"row\"><span id='x'>&amp; &lt;tag&gt;</span></div>",
    "{\"key\": [1, 2, 3], \"nested\": {\"a\": null, \"b\": true}}",
    "#!/bin/bash\nset -euo pipefail\necho \"$HOME\" | grep -c '/root' >/dev/null 2>&1",
    "x+=1;y-=2;z*=3;w/=4;a%=5;b**=6;c//=7;d<<=8;e>>=9;f&=g|=h^=~i",
    "    indented with four spaces",
    "\t\tindented with tabs",
    "// TODO(someone): fix this\n/* block\n * comment */",
    "https://example.com/path/to/page?query=1&other=two#fragment",
    "user@example.com, first.last+tag@sub.domain.org",
    "C:\\Program Files\\App\\bin\\app.exe",
    "regex: ^[a-zA-Z0-9_]+\\s*=\\s*(\\d+)$",
    # CJK and other scripts.
    "\u4f60\u597d\uff0c\u4e16\u754c\uff01\u4eca\u5929\u5929\u6c14\u5f88\u597d\u3002",
    "\u6211\u7684\u540d\u5b57\u662f\u5c0f\u660e\uff0c\u6211\u6765\u81ea\u5317\u4eac\u3002",
    "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8\u3067\u3059\u3002\u3072\u3089\u304c\u306a\u3068\u30ab\u30bf\u30ab\u30ca\u3068\u6f22\u5b57\u3002",
    "\ud55c\uad6d\uc5b4 \ubb38\uc7a5\uc785\ub2c8\ub2e4. \uc548\ub155\ud558\uc138\uc694!",
    "\u0417\u0434\u0440\u0430\u0432\u0441\u0442\u0432\u0443\u0439, \u043c\u0438\u0440! \u041a\u0430\u043a \u0434\u0435\u043b\u0430?",
    "\u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645",
    "\u05e9\u05dc\u05d5\u05dd \u05e2\u05d5\u05dc\u05dd",
    "\u0928\u092e\u0938\u094d\u0924\u0947 \u0926\u0941\u0928\u093f\u092f\u093e",
    "\u0e2a\u0e27\u0e31\u0e2a\u0e14\u0e35\u0e0a\u0e32\u0e27\u0e42\u0e25\u0e01",
    "\u0393\u03b5\u03b9\u03ac \u03c3\u03bf\u03c5 \u039a\u03cc\u03c3\u03bc\u03b5",
    "\u1780\u17d2\u1798\u17c2\u179a \u1797\u17b6\u179f\u17b6",
    "\u10d2\u10d0\u10db\u10d0\u10e0\u10ef\u10dd\u10d1\u10d0",
    "\u0531\u0575\u0562\u0578\u0582\u0562\u0565\u0576",
    # Mixed scripts.
    "English\u4e2d\u6587\u6df7\u5408mixed\u30c6\u30ad\u30b9\u30c8text123\u6570\u5b57",
    "Go\u8bed\u8a00\u5f88\u597d\u7528 and Python\u4e5f\u4e0d\u9519",
    "caf\u00e9 na\u00efve r\u00e9sum\u00e9 \u00fcber Stra\u00dfe \u00e5ngstr\u00f6m",
    # Accents, NFC vs NFD.
    "cafe\u0301 nai\u0308ve re\u0301sume\u0301 (decomposed)",
    "\u00c5ngstr\u00f6m vs A\u030angstro\u0308m vs \u212bngstr\u00f6m",
    "\u1e9b\u0323 \ufb01 \ufb02 \u2126 \u212a \u00bd",
    "Z\u0351\u036b\u0343\u036a\u0302\u036b\u033d\u034f\u0334\u0319\u0324\u031e\u0349\u035a\u032f\u031e\u0320\u034dA\u036b\u0357\u0334\u0362\u0335\u031c\u0330\u0354L\u0368\u0367\u0369\u0358\u0320G\u0311\u0357\u030e\u0305\u035b\u0341\u0334\u033b\u0348\u034d\u0354\u0339O\u0342\u030c\u030c\u0358\u0328\u0335\u0339\u033b\u031d\u0333",
    "\u0e01\u0e33 \u0915\u094d\u0937 \u1100\u1161\u11a8",
    # Emoji, including ZWJ sequences, flags, skin tones and variation selectors.
    "I love \U0001f355 and \U0001f363!",
    "\U0001f468\u200d\U0001f469\u200d\U0001f467\u200d\U0001f466 family",
    "\U0001f469\U0001f3fd\u200d\U0001f4bb coder \U0001f9d1\U0001f3ff\u200d\U0001f52c scientist",
    "\U0001f1fa\U0001f1f8 \U0001f1ef\U0001f1f5 \U0001f1e9\U0001f1ea flags",
    "\u2764\ufe0f \u2764 \u263a\ufe0f \u2639 \u270c\U0001f3fb",
    "\U0001f3f3\ufe0f\u200d\U0001f308 \U0001f3f4\u200d\u2620\ufe0f",
    "\U0001f600\U0001f603\U0001f604\U0001f601\U0001f606\U0001f605\U0001f923\U0001f602",
    "emoji\U0001f525inside\U0001f680words",
    "1\ufe0f\u20e3 2\ufe0f\u20e3 #\ufe0f\u20e3",
    # Special-token strings embedded in text.
    "<|endoftext|>",
    "Hello<|endoftext|>world",
    "Hello <|endoftext|> world",
    "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
    "text <|im_start|> text <|im_end|>text",
    "<|im_start|><|im_end|><|endoftext|>",
    "<s>Hello</s>",
    "<s> Hello </s> <unk>",
    "a</s>b<s>c",
    "<think>\nreasoning here\n</think>\n\nanswer",
    "<tool_call>{\"name\": \"f\"}</tool_call>",
    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>",
    "<|begin_of_text|>",
    "almost special: <|im_start| and <|endoftext and im_end|> and <s and /s>",
    "<|IM_START|> is not the same as <|im_start|>",
    "<<|endoftext|>>",
    "<mask> lstrip and rstrip   <mask>   around",
    "x<mask>y",
    "[SEP]word [SEP] word[SEP]",
    "\u2581already has metaspace \u2581\u2581 chars",
    "<0x0A> looks like a byte token",
    # Odd characters.
    "\u0000 nul \u0001 soh \u007f del",
    "zero\u200bwidth\u200cnon\u200djoiner\ufeffbom",
    "\u00ad soft hyphen, \u2028 line sep, \u2029 para sep, \u0085 nel",
    "\U00010348 gothic \U0001d11e clef \U0001f9ea vial",
    "\ue000 private use \U000f0000 plane 15",
    "\ufffd replacement char",
    "\u200f\u0627\u200e rtl marks",
    # Repetition.
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "abababababababababababababababababababababababababababababab",
    "!!!!!!!!!!!!!!!!!!!??????????????...............",
    "============================================================",
    "lol lol lol lol lol lol lol lol lol lol lol lol lol lol lol",
    "\u54c8\u54c8\u54c8\u54c8\u54c8\u54c8\u54c8\u54c8\u54c8\u54c8\u54c8\u54c8",
    # Empty line.
    "",
]

FRAGMENTS = [
    "the", " The", "quick", " fox", "'s", "'LL", "n't", " 2024", "123456", "3.5",
    " ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", " \n", "\u00a0",
    "\u4f60\u597d", "\u4e16\u754c", "\u65e5\u672c\u8a9e", "\ud55c\uad6d\uc5b4",
    "\U0001f600", "\U0001f468\u200d\U0001f469\u200d\U0001f467", "\u2764\ufe0f",
    "caf\u00e9", "cafe\u0301", "\u00fc", "u\u0308", "\u00df",
    "func", "()", "{", "}", "[]", "=>", "!=", "==", ":=", "//", "#", "$", "@",
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<s>", "</s>", "<think>", "<mask>",
    "\u2581", "<0x41>", "Hello", "WORLD", "\u041f\u0440\u0438\u0432\u0435\u0442",
    "\u0645\u0631\u062d\u0628\u0627", "x", "y", "_", "-", ".", ",", "...", "\u2014",
]


def generated(rng, n):
    out = []
    for _ in range(n):
        k = rng.randint(2, 14)
        out.append("".join(rng.choice(FRAGMENTS) for _ in range(k)))
    return out


def paragraph_lines():
    """Longer prose lines, so that per-word caches and long inputs get exercised."""
    base = (
        "Tokenizers split text into pieces that a language model has seen during "
        "training. Byte-level BPE never meets an unknown character, because every "
        "byte has a token of its own; SentencePiece BPE falls back to byte tokens "
        "such as <0xE4> when a character is missing from its vocabulary. "
    )
    return [base * 3, (base + "\n") * 2 + "  \t trailing", base.upper()]


def main():
    rng = random.Random(20240611)
    lines = list(HAND)
    lines += paragraph_lines()
    # NFD forms of some lines, so that the NFC normalizer has work to do.
    lines += [unicodedata.normalize("NFD", s) for s in HAND if s != unicodedata.normalize("NFD", s)][:20]
    lines += generated(rng, 260)
    seen = set()
    out = sys.stdout
    for s in lines:
        if s in seen:
            continue
        seen.add(s)
        out.write(json.dumps(s, ensure_ascii=True) + "\n")


if __name__ == "__main__":
    main()
