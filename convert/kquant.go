package convert

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/trigon-llm/trigon/backend"
	"github.com/trigon-llm/trigon/model"
)

// ParseTarget maps a user-facing target name to Options' Type and KMix:
// any name ParseType knows, and q4_k_m or q5_k_m for llama.cpp's mixes.
func ParseTarget(s string) (backend.DType, bool, error) {
	switch strings.ToLower(s) {
	case "q4_k_m":
		return backend.Q4_K, true, nil
	case "q5_k_m":
		return backend.Q5_K, true, nil
	}
	dt, err := ParseType(s)
	if err != nil {
		return 0, false, fmt.Errorf("unknown type %q: want f32, f16, bf16, q8_0, q4_0, q4_k, q5_k, q6_k, q4_k_m or q5_k_m", s)
	}
	return dt, false, nil
}

// tensorType is the type Write stores matrix name (an HF tensor name) in,
// before the block-size fallback. Without KMix it is opts.Type. With KMix
// it is llama.cpp's choice for its Q4_K_M / Q5_K_M files: Q6_K for the LM
// head (the embedding when the head is tied to it, as llama.cpp gives the
// tensor that serves as output), and for the V projection and the MLP
// down projection of the layers kmixMoreBits picks; opts.Type elsewhere.
func tensorType(cfg model.Config, name string, opts Options) (backend.DType, error) {
	if !opts.KMix {
		return opts.Type, nil
	}
	if opts.Type != backend.Q4_K && opts.Type != backend.Q5_K {
		return 0, fmt.Errorf("convert: the _M mix is for Q4_K and Q5_K targets, not %v", opts.Type)
	}
	g, err := model.GGUFTensorName(name)
	if err != nil {
		return 0, err
	}
	if g == "output.weight" || (g == "token_embd.weight" && cfg.TieEmbeddings) {
		return backend.Q6_K, nil
	}
	if layer, suffix, ok := ggufLayer(g); ok && (suffix == "attn_v.weight" || suffix == "ffn_down.weight") && kmixMoreBits(layer, cfg.NumLayers) {
		return backend.Q6_K, nil
	}
	return opts.Type, nil
}

// kmixMoreBits is llama.cpp's use_more_bits: the first and last eighth of
// the layers, and every third layer between them.
func kmixMoreBits(layer, layers int) bool {
	return layer < layers/8 || layer >= 7*layers/8 || (layer-layers/8)%3 == 2
}

// ggufLayer splits "blk.N.suffix".
func ggufLayer(g string) (int, string, bool) {
	rest, ok := strings.CutPrefix(g, "blk.")
	if !ok {
		return 0, "", false
	}
	num, suffix, ok := strings.Cut(rest, ".")
	if !ok {
		return 0, "", false
	}
	n, err := strconv.Atoi(num)
	return n, suffix, err == nil
}

// fallbackType is the type of a matrix whose rows of inner values are
// not whole blocks of target. llama.cpp falls back from the K-quants to
// Q5_0, Q5_1 and Q8_0, which trigon does not have except Q8_0; every
// K-quant falls back to Q8_0 (at least the fallback llama.cpp's bits),
// or F16 where the rows are not whole 32-value blocks either. Other
// quantized targets fall back to F16.
func fallbackType(target backend.DType, inner int) backend.DType {
	if target.BlockSize() == backend.QK_K && inner%backend.Q8_0.BlockSize() == 0 {
		return backend.Q8_0
	}
	return backend.F16
}
