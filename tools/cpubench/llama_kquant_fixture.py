"""Write backend/testdata/kquant-llamacpp.json: K-quant blocks made by
llama.cpp's reference quantizers and the values llama.cpp's dequantizers
decode them to, for backend's TestKQuantLlamaCpp (the layouts checked
against llama.cpp itself, in CI, without llama.cpp).

    python3 llama_kquant_fixture.py LIBDIR OUT.json

LIBDIR holds llama.cpp's shared libraries (the npm package node-llama-cpp
ships them under @node-llama-cpp/linux-x64/bins/linux-x64). The input is
deterministic (a linear congruential generator, no dependencies): four
super-blocks per type of normal-ish values at several scales, with a zero
sub-block, an outlier and an all-positive block.
"""
import ctypes
import json
import math
import os
import sys

TYPES = {"Q4_K": 144, "Q5_K": 176, "Q6_K": 210}
N = 4 * 256


def inputs():
    state = 12345
    def uniform():
        nonlocal state
        state = (state * 6364136223846793005 + 1442695040888963407) % 2**64
        return ((state >> 11) + 0.5) / 2**53
    x = []
    for blk in range(4):
        scale = [1.0, 0.01, 30.0, 1.0][blk]
        for i in range(256):
            # Box-Muller from two uniforms.
            v = math.sqrt(-2 * math.log(uniform())) * math.cos(2 * math.pi * uniform()) * scale
            if blk == 3:
                v = abs(v) + 0.5  # all positive: a zero min
            x.append(v)
    for i in range(64, 96):
        x[i] = 0.0  # a zero sub-block
    x[300] = 25.0  # an outlier
    return x


def main():
    libdir, out = sys.argv[1], sys.argv[2]
    base = ctypes.CDLL(os.path.join(libdir, "libggml-base.so"))
    x = inputs()
    xs = (ctypes.c_float * N)(*x)
    result = {"input": [float(ctypes.c_float(v).value) for v in x]}
    for name, size in TYPES.items():
        suffix = name[1] + "_K"
        q = (ctypes.c_ubyte * (N // 256 * size))()
        getattr(base, "quantize_row_q%s_ref" % suffix)(xs, q, ctypes.c_int64(N))
        y = (ctypes.c_float * N)()
        getattr(base, "dequantize_row_q%s" % suffix)(q, y, ctypes.c_int64(N))
        result[name] = {"blocks": bytes(q).hex(), "values": [float(v) for v in y]}
    with open(out, "w") as f:
        json.dump(result, f, separators=(",", ":"))
        f.write("\n")


if __name__ == "__main__":
    main()
