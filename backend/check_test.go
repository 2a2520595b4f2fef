package backend

import (
	"errors"
	"math"
	"strings"
	"testing"
)

// fakeTensor is a dtype and a shape: all the operand checks read.
type fakeTensor struct {
	dt    DType
	shape []int
}

func (f fakeTensor) DType() DType { return f.dt }
func (f fakeTensor) Shape() []int { return f.shape }

func ft(dt DType, shape ...int) Tensor { return fakeTensor{dt, shape} }

// ropeArgs are valid RoPEStoreKV operands: 3 tokens, 4 query heads over 2
// KV heads of dim 8, caches of 5 blocks of 16 tokens, Q/K norms.
func ropeArgs() RoPEArgs {
	return RoPEArgs{
		Q: ft(BF16, 3, 32), QKV: ft(BF16, 3, 64), Positions: ft(I32, 3), SlotMapping: ft(I32, 3),
		KCache: ft(BF16, 5, 2, 16, 8), VCache: ft(BF16, 5, 2, 16, 8), KV: PlainKV(BF16, 16), InvFreq: ft(F32, 4),
		QNorm: ft(F32, 8), KNorm: ft(BF16, 8), NormEps: 1e-6, NumHeads: 4, NumKVHeads: 2, HeadDim: 8,
	}
}

// attnArgs are valid Attention operands: 7 query rows of 2 sequences, the
// heads and caches of ropeArgs, tables of 3 blocks.
func attnArgs() AttentionArgs {
	return AttentionArgs{
		Out: ft(F32, 7, 32), Q: ft(F32, 7, 32), KCache: ft(BF16, 5, 2, 16, 8), VCache: ft(BF16, 5, 2, 16, 8), KV: PlainKV(BF16, 16),
		BlockTables: ft(I32, 2, 3), SeqLens: ft(I32, 2), QueryStart: ft(I32, 3),
		NumSeqs: 2, MaxSeqLen: 40, NumHeads: 4, NumKVHeads: 2, HeadDim: 8, Scale: 0.35,
	}
}

func withRoPE(f func(*RoPEArgs)) func() (any, error) {
	return func() (any, error) {
		a := ropeArgs()
		f(&a)
		return CheckRoPEStoreKV(a)
	}
}

func withAttn(f func(*AttentionArgs)) func() (any, error) {
	return func() (any, error) {
		a := attnArgs()
		f(&a)
		return CheckAttention(a)
	}
}

// TestOperandChecks runs every op's check on valid operands (the sizes it
// derives) and on operands broken one at a time (an ErrShape error naming
// the op and the operand at fault).
func TestOperandChecks(t *testing.T) {
	nan, inf := float32(math.NaN()), float32(math.Inf(1))
	cases := []struct {
		op, name string
		check    func() (any, error)
		want     any    // the sizes, when the check passes
		operand  string // the operand the error names; "" when it passes
	}{
		{"embed", "valid", func() (any, error) { return CheckEmbed(ft(BF16, 3, 64), ft(Q8_0, 100, 64), ft(I32, 3)) },
			EmbedDims{N: 3, Rows: 100, Dim: 64}, ""},
		{"embed", "activation table", func() (any, error) { return CheckEmbed(ft(F32, 2, 8), ft(F32, 9, 8), ft(I32, 2)) },
			EmbedDims{N: 2, Rows: 9, Dim: 8}, ""},
		{"embed", "table of ids", func() (any, error) { return CheckEmbed(ft(F32, 3, 64), ft(I32, 100, 64), ft(I32, 3)) }, nil, "table"},
		{"embed", "flat table", func() (any, error) { return CheckEmbed(ft(F32, 3, 64), ft(F32, 6400), ft(I32, 3)) }, nil, "table"},
		{"embed", "float ids", func() (any, error) { return CheckEmbed(ft(F32, 3, 64), ft(F32, 100, 64), ft(F32, 3)) }, nil, "ids"},
		{"embed", "out too narrow", func() (any, error) { return CheckEmbed(ft(F32, 3, 32), ft(F32, 100, 64), ft(I32, 3)) }, nil, "out"},
		{"embed", "out rows", func() (any, error) { return CheckEmbed(ft(F32, 4, 64), ft(F32, 100, 64), ft(I32, 3)) }, nil, "out"},
		{"embed", "quantized out", func() (any, error) { return CheckEmbed(ft(Q8_0, 3, 64), ft(F32, 100, 64), ft(I32, 3)) }, nil, "out"},
		{"embed", "nil out", func() (any, error) { return CheckEmbed(nil, ft(F32, 100, 64), ft(I32, 3)) }, nil, "out"},

		{"addrmsnorm", "valid", func() (any, error) { return CheckAddRMSNorm(ft(BF16, 4, 16), ft(BF16, 4, 16), nil, ft(F32, 16), 1e-5) },
			NormDims{Rows: 4, Dim: 16}, ""},
		{"addrmsnorm", "valid with residual", func() (any, error) {
			return CheckAddRMSNorm(ft(F32, 4, 16), ft(BF16, 4, 16), ft(BF16, 4, 16), ft(BF16, 16), 0)
		}, NormDims{Rows: 4, Dim: 16}, ""},
		{"addrmsnorm", "x of ids", func() (any, error) { return CheckAddRMSNorm(ft(F32, 4, 16), ft(I32, 4, 16), nil, ft(F32, 16), 1e-5) }, nil, "x"},
		{"addrmsnorm", "x 1-D", func() (any, error) { return CheckAddRMSNorm(ft(F32, 4, 16), ft(F32, 64), nil, ft(F32, 16), 1e-5) }, nil, "x"},
		{"addrmsnorm", "out rows", func() (any, error) { return CheckAddRMSNorm(ft(F32, 3, 16), ft(F32, 4, 16), nil, ft(F32, 16), 1e-5) }, nil, "out"},
		{"addrmsnorm", "residual dtype", func() (any, error) {
			return CheckAddRMSNorm(ft(BF16, 4, 16), ft(BF16, 4, 16), ft(F32, 4, 16), ft(F32, 16), 1e-5)
		}, nil, "residual"},
		{"addrmsnorm", "residual shape", func() (any, error) {
			return CheckAddRMSNorm(ft(F32, 4, 16), ft(F32, 4, 16), ft(F32, 16, 4), ft(F32, 16), 1e-5)
		}, nil, "residual"},
		{"addrmsnorm", "weight width", func() (any, error) { return CheckAddRMSNorm(ft(F32, 4, 16), ft(F32, 4, 16), nil, ft(F32, 8), 1e-5) }, nil, "weight"},
		{"addrmsnorm", "quantized weight", func() (any, error) { return CheckAddRMSNorm(ft(F32, 4, 32), ft(F32, 4, 32), nil, ft(Q4_0, 32), 1e-5) }, nil, "weight"},
		{"addrmsnorm", "NaN eps", func() (any, error) { return CheckAddRMSNorm(ft(F32, 4, 16), ft(F32, 4, 16), nil, ft(F32, 16), nan) }, nil, "eps"},
		{"addrmsnorm", "negative eps", func() (any, error) { return CheckAddRMSNorm(ft(F32, 4, 16), ft(F32, 4, 16), nil, ft(F32, 16), -1e-6) }, nil, "eps"},
		{"addrmsnorm", "infinite eps", func() (any, error) { return CheckAddRMSNorm(ft(F32, 4, 16), ft(F32, 4, 16), nil, ft(F32, 16), inf) }, nil, "eps"},

		{"matmul", "valid", func() (any, error) {
			return CheckMatMul(ft(BF16, 5, 96), ft(BF16, 5, 64), ft(Q4_0, 96, 64), ft(F32, 96))
		},
			MatMulDims{N: 5, In: 64, Out: 96}, ""},
		{"matmul", "valid without bias", func() (any, error) { return CheckMatMul(ft(F32, 1, 96), ft(F32, 1, 64), ft(F16, 96, 64), nil) },
			MatMulDims{N: 1, In: 64, Out: 96}, ""},
		{"matmul", "weight of ids", func() (any, error) { return CheckMatMul(ft(F32, 5, 96), ft(F32, 5, 64), ft(I32, 96, 64), nil) }, nil, "w"},
		{"matmul", "weight 3-D", func() (any, error) { return CheckMatMul(ft(F32, 5, 96), ft(F32, 5, 64), ft(F32, 2, 48, 64), nil) }, nil, "w"},
		{"matmul", "x width", func() (any, error) { return CheckMatMul(ft(F32, 5, 96), ft(F32, 5, 32), ft(F32, 96, 64), nil) }, nil, "x"},
		{"matmul", "quantized x", func() (any, error) { return CheckMatMul(ft(F32, 5, 96), ft(Q8_0, 5, 64), ft(F32, 96, 64), nil) }, nil, "x"},
		{"matmul", "out width", func() (any, error) { return CheckMatMul(ft(F32, 5, 64), ft(F32, 5, 64), ft(F32, 96, 64), nil) }, nil, "out"},
		{"matmul", "out rows", func() (any, error) { return CheckMatMul(ft(F32, 4, 96), ft(F32, 5, 64), ft(F32, 96, 64), nil) }, nil, "out"},
		{"matmul", "bias width", func() (any, error) { return CheckMatMul(ft(F32, 5, 96), ft(F32, 5, 64), ft(F32, 96, 64), ft(F32, 64)) }, nil, "bias"},
		{"matmul", "quantized bias", func() (any, error) { return CheckMatMul(ft(F32, 5, 96), ft(F32, 5, 64), ft(F32, 96, 64), ft(Q8_0, 96)) }, nil, "bias"},

		{"ropestorekv", "valid", withRoPE(func(a *RoPEArgs) {}), RoPEDims{NumTokens: 3, NumBlocks: 5, BlockSize: 16}, ""},
		{"ropestorekv", "valid without norms", withRoPE(func(a *RoPEArgs) { a.QNorm, a.KNorm, a.NormEps = nil, nil, nan }),
			RoPEDims{NumTokens: 3, NumBlocks: 5, BlockSize: 16}, ""},
		{"ropestorekv", "heads not grouped", withRoPE(func(a *RoPEArgs) { a.NumKVHeads = 3 }), nil, "heads"},
		{"ropestorekv", "V dtype differs from K", withRoPE(func(a *RoPEArgs) { a.VCache = ft(F16, 5, 2, 16, 8) }), nil, "VCache"},
		{"ropestorekv", "window without a format", withRoPE(func(a *RoPEArgs) { a.KV.Window = 128 }), nil, "KV"},
		{"ropestorekv", "odd head dim", withRoPE(func(a *RoPEArgs) { a.HeadDim = 7 }), nil, "heads"},
		{"ropestorekv", "no heads", withRoPE(func(a *RoPEArgs) { a.NumHeads = 0 }), nil, "heads"},
		{"ropestorekv", "QKV width", withRoPE(func(a *RoPEArgs) { a.QKV = ft(BF16, 3, 48) }), nil, "QKV"},
		{"ropestorekv", "Q rows", withRoPE(func(a *RoPEArgs) { a.Q = ft(BF16, 2, 32) }), nil, "Q"},
		{"ropestorekv", "float positions", withRoPE(func(a *RoPEArgs) { a.Positions = ft(F32, 3) }), nil, "Positions"},
		{"ropestorekv", "short slot mapping", withRoPE(func(a *RoPEArgs) { a.SlotMapping = ft(I32, 2) }), nil, "SlotMapping"},
		{"ropestorekv", "cache KV heads", withRoPE(func(a *RoPEArgs) { a.KCache = ft(BF16, 5, 4, 16, 8) }), nil, "KCache"},
		{"ropestorekv", "quantized cache", withRoPE(func(a *RoPEArgs) { a.KCache = ft(Q8_0, 5, 2, 16, 8) }), nil, "KCache"},
		{"ropestorekv", "V shape", withRoPE(func(a *RoPEArgs) { a.VCache = ft(BF16, 5, 2, 8, 8) }), nil, "VCache"},
		{"ropestorekv", "inv freq length", withRoPE(func(a *RoPEArgs) { a.InvFreq = ft(F32, 8) }), nil, "InvFreq"},
		{"ropestorekv", "inv freq dtype", withRoPE(func(a *RoPEArgs) { a.InvFreq = ft(BF16, 4) }), nil, "InvFreq"},
		{"ropestorekv", "Q norm length", withRoPE(func(a *RoPEArgs) { a.QNorm = ft(F32, 4) }), nil, "QNorm"},
		{"ropestorekv", "K norm dtype", withRoPE(func(a *RoPEArgs) { a.KNorm = ft(I32, 8) }), nil, "KNorm"},
		{"ropestorekv", "NaN norm eps", withRoPE(func(a *RoPEArgs) { a.NormEps = nan }), nil, "NormEps"},

		{"attention", "valid", withAttn(func(a *AttentionArgs) {}), AttentionDims{NumTokens: 7, NumBlocks: 5, BlockSize: 16, MaxBlocksPerSeq: 3}, ""},
		{"attention", "no sequences", withAttn(func(a *AttentionArgs) { a.NumSeqs = 0 }), nil, "NumSeqs"},
		{"attention", "negative max seq len", withAttn(func(a *AttentionArgs) { a.MaxSeqLen = -1 }), nil, "MaxSeqLen"},
		{"attention", "negative window", withAttn(func(a *AttentionArgs) { a.SlidingWindow = -1 }), nil, "SlidingWindow"},
		{"attention", "infinite scale", withAttn(func(a *AttentionArgs) { a.Scale = inf }), nil, "Scale"},
		{"attention", "NaN scale", withAttn(func(a *AttentionArgs) { a.Scale = nan }), nil, "Scale"},
		{"attention", "heads not grouped", withAttn(func(a *AttentionArgs) { a.NumHeads = 5 }), nil, "heads"},
		{"attention", "Q width", withAttn(func(a *AttentionArgs) { a.Q = ft(F32, 7, 16) }), nil, "Q"},
		{"attention", "Out rows", withAttn(func(a *AttentionArgs) { a.Out = ft(F32, 6, 32) }), nil, "Out"},
		{"attention", "cache head dim", withAttn(func(a *AttentionArgs) { a.KCache = ft(BF16, 5, 2, 16, 16) }), nil, "KCache"},
		{"attention", "V of ids", withAttn(func(a *AttentionArgs) { a.VCache = ft(I32, 5, 2, 16, 8) }), nil, "VCache"},
		{"attention", "no KV spec", withAttn(func(a *AttentionArgs) { a.KV = KVSpec{} }), nil, "KV"},
		{"attention", "spec block size", withAttn(func(a *AttentionArgs) { a.KV.BlockSize = 32 }), nil, "KCache"},
		{"attention", "spec dtype", withAttn(func(a *AttentionArgs) { a.KV.DType = F16 }), nil, "KCache"},
		{"attention", "block table rows", withAttn(func(a *AttentionArgs) { a.BlockTables = ft(I32, 3, 3) }), nil, "BlockTables"},
		{"attention", "seq lens length", withAttn(func(a *AttentionArgs) { a.SeqLens = ft(I32, 3) }), nil, "SeqLens"},
		{"attention", "float query start", withAttn(func(a *AttentionArgs) { a.QueryStart = ft(F32, 3) }), nil, "QueryStart"},
		{"attention", "query start length", withAttn(func(a *AttentionArgs) { a.QueryStart = ft(I32, 2) }), nil, "QueryStart"},

		{"silumul", "valid", func() (any, error) { return CheckSiLUMul(ft(BF16, 4, 48), ft(F32, 4, 96)) }, SiLUMulDims{N: 4, Inter: 48}, ""},
		{"silumul", "gateUp width", func() (any, error) { return CheckSiLUMul(ft(F32, 4, 48), ft(F32, 4, 48)) }, nil, "gateUp"},
		{"silumul", "gateUp rows", func() (any, error) { return CheckSiLUMul(ft(F32, 4, 48), ft(F32, 5, 96)) }, nil, "gateUp"},
		{"silumul", "out 1-D", func() (any, error) { return CheckSiLUMul(ft(F32, 192), ft(F32, 4, 96)) }, nil, "out"},
		{"silumul", "out of ids", func() (any, error) { return CheckSiLUMul(ft(I32, 4, 48), ft(F32, 4, 96)) }, nil, "out"},

		{"sample", "valid", func() (any, error) {
			return CheckSample(SampleArgs{Logits: ft(F32, 2, 1000), Rows: make([]SampleRow, 2)})
		}, SampleDims{N: 2, Vocab: 1000}, ""},
		{"sample", "BF16 logits", func() (any, error) {
			return CheckSample(SampleArgs{Logits: ft(BF16, 2, 1000), Rows: make([]SampleRow, 2)})
		}, nil, "Logits"},
		{"sample", "rows for other logits", func() (any, error) {
			return CheckSample(SampleArgs{Logits: ft(F32, 2, 1000), Rows: make([]SampleRow, 3)})
		}, nil, "Logits"},
		{"product", "valid", func() (any, error) { return CheckProduct("product", ft(BF16, 3, 64), ft(Q4_0, 32, 64), 32) },
			MatMulDims{N: 3, In: 64, Out: 32}, ""},
		{"product", "any width", func() (any, error) { return CheckProduct("product", ft(F32, 2, 8), ft(BF16, 5, 8), -1) },
			MatMulDims{N: 2, In: 8, Out: 5}, ""},
		{"product", "weight rows", func() (any, error) { return CheckProduct("product", ft(BF16, 3, 64), ft(BF16, 31, 64), 32) }, nil, "w"},
		{"product", "x inner dim", func() (any, error) { return CheckProduct("product", ft(BF16, 3, 63), ft(BF16, 32, 64), 32) }, nil, "x"},
		{"product", "quantized x", func() (any, error) { return CheckProduct("product", ft(Q8_0, 3, 64), ft(BF16, 32, 64), 32) }, nil, "x"},
		{"activation", "valid", func() (any, error) { return nil, CheckActivation("activation", "t", ft(F16, 2, 8), -1, 8) }, nil, ""},
		{"activation", "ids", func() (any, error) { return nil, CheckActivation("activation", "t", ft(I32, 2, 8), -1, 8) }, nil, "t"},
		{"activation", "width", func() (any, error) { return nil, CheckActivation("activation", "t", ft(F32, 2, 4), -1, 8) }, nil, "t"},
		{"sample", "nil logits", func() (any, error) { return CheckSample(SampleArgs{Rows: make([]SampleRow, 1)}) }, nil, "Logits"},
	}
	for _, c := range cases {
		t.Run(c.op+"/"+c.name, func(t *testing.T) {
			got, err := c.check()
			if c.operand == "" {
				if err != nil {
					t.Fatalf("error %v, want none", err)
				}
				if got != c.want {
					t.Fatalf("sizes %+v, want %+v", got, c.want)
				}
				return
			}
			if err == nil {
				t.Fatalf("no error, want one about %s", c.operand)
			}
			if !errors.Is(err, ErrShape) {
				t.Errorf("error %v does not wrap ErrShape", err)
			}
			if prefix := c.op + ": " + c.operand + ": "; !strings.HasPrefix(err.Error(), prefix) {
				t.Errorf("error %q does not start with %q", err, prefix)
			}
		})
	}
}

// TestCheckDTypeAndShape checks the two primitives backends use for their
// own constraints.
func TestCheckDTypeAndShape(t *testing.T) {
	x := ft(BF16, 4, 16)
	for _, c := range []struct {
		name string
		err  error
		ok   bool
	}{
		{"dtype in set", CheckDType("op", "x", x, F32, BF16), true},
		{"dtype outside set", CheckDType("op", "x", x, F32), false},
		{"nil for dtype", CheckDType("op", "x", nil, F32), false},
		{"exact shape", CheckShape("op", "x", x, 4, 16), true},
		{"wildcards", CheckShape("op", "x", x, -1, -1), true},
		{"one wildcard", CheckShape("op", "x", x, -1, 8), false},
		{"rank", CheckShape("op", "x", x, 4, 16, 1), false},
		{"nil for shape", CheckShape("op", "x", nil, 4), false},
	} {
		t.Run(c.name, func(t *testing.T) {
			if c.ok {
				if c.err != nil {
					t.Fatalf("error %v, want none", c.err)
				}
				return
			}
			if !errors.Is(c.err, ErrShape) || !strings.HasPrefix(c.err.Error(), "op: x: ") {
				t.Fatalf("error %v, want an ErrShape error about op: x", c.err)
			}
		})
	}
}
