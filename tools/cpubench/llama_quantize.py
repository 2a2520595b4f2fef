"""Quantize a GGUF file with llama.cpp's own quantizer, for checking that
trigon reads the files llama.cpp writes (docs/quantization.md).

    python3 llama_quantize.py LIBDIR IN.gguf OUT.gguf FTYPE [THREADS]

LIBDIR holds llama.cpp's shared libraries (the npm package node-llama-cpp
ships them under @node-llama-cpp/linux-x64/bins/linux-x64); FTYPE is a
llama_ftype number (15: Q4_K_M, 17: Q5_K_M, 18: Q6_K). It calls
llama_model_quantize through ctypes, changing only the first two fields of
llama_model_quantize_default_params() (nthread, ftype), whose offsets
(0 and 4) llama.h has kept; the rest of the struct is passed back as the
library filled it, so its size need only be bounded here.
"""
import ctypes
import os
import sys


class Params(ctypes.Structure):
    # Larger than llama_model_quantize_params (returned in memory either way).
    _fields_ = [("raw", ctypes.c_ubyte * 512)]


def main():
    if len(sys.argv) not in (5, 6):
        sys.exit(__doc__)
    libdir, src, dst, ftype = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    threads = int(sys.argv[5]) if len(sys.argv) == 6 else 1
    for name in ("libggml-base.so", "libggml.v0.4.0.so"):
        ctypes.CDLL(os.path.join(libdir, name), mode=ctypes.RTLD_GLOBAL)
    ll = ctypes.CDLL(os.path.join(libdir, "libllama.v0.4.0.so"))
    ll.llama_model_quantize_default_params.restype = Params
    ll.llama_model_quantize.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.POINTER(Params)]
    ll.llama_model_quantize.restype = ctypes.c_uint32
    ll.llama_backend_init()
    p = ll.llama_model_quantize_default_params()
    ctypes.c_int32.from_buffer(p, 0).value = threads
    ctypes.c_int32.from_buffer(p, 4).value = ftype
    rc = ll.llama_model_quantize(src.encode(), dst.encode(), ctypes.byref(p))
    if rc != 0:
        sys.exit(f"llama_model_quantize returned {rc}")


if __name__ == "__main__":
    main()
