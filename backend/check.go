package backend

import (
	"math"
	"slices"
)

// Operand checks: what the Backend contract requires of each op's operands
// (dtypes from the sets the op's doc comment allows, shapes that agree,
// scalar arguments in range), written once for every backend. Each Check*
// function returns the sizes the operands agree on, or an error wrapping
// ErrShape that names the op and the operand.
//
// A backend first resolves its own handles (nil, foreign or freed tensors
// are its business: a typed nil pointer in a Tensor cannot be told from a
// tensor here), passes optional operands that are absent as nil, calls the
// Check* function, and then adds its own constraints: the dtype subset it
// computes in (CheckDType), alignment, overlap of memory it owns, index
// ranges it can read on the host. Errors are not prefixed with the
// backend's name; backends wrap them ("cpu: %w").

// Dtype sets of the contract.
var (
	floatDTypes  = []DType{F32, F16, BF16}
	weightDTypes = []DType{F32, F16, BF16, Q8_0, Q4_0, Q4_K, Q5_K, Q6_K, AWQ4G32, AWQ4G64, AWQ4G128, F8E4M3Row}
	// embedDTypes: the weight-quantized dtypes of wquant.go are for
	// projections only (loaders leave embeddings as stored).
	embedDTypes = []DType{F32, F16, BF16, Q8_0, Q4_0, Q4_K, Q5_K, Q6_K}
	i32DTypes   = []DType{I32}
	f32DTypes   = []DType{F32}
)

// CheckDType returns an ErrShape error naming op and operand unless t has
// one of dts.
func CheckDType(op, operand string, t Tensor, dts ...DType) error {
	if t == nil {
		return ShapeError(op, operand, "nil tensor")
	}
	if slices.Contains(dts, t.DType()) {
		return nil
	}
	return ShapeError(op, operand, "dtype %v, want one of %v", t.DType(), slices.Clone(dts))
}

// CheckShape returns an ErrShape error naming op and operand unless t's
// shape is want; -1 in want matches any size.
func CheckShape(op, operand string, t Tensor, want ...int) error {
	if t == nil {
		return ShapeError(op, operand, "nil tensor")
	}
	s := t.Shape()
	ok := len(s) == len(want)
	for i := 0; ok && i < len(want); i++ {
		ok = want[i] < 0 || want[i] == s[i]
	}
	if !ok {
		// Clones keep want (often a literal of the caller's) off the heap
		// on the path that passes.
		return ShapeError(op, operand, "shape %v, want %v", slices.Clone(s), slices.Clone(want))
	}
	return nil
}

// checkOperand is CheckDType, then CheckShape.
func checkOperand(op, name string, t Tensor, dts []DType, shape ...int) error {
	if err := CheckDType(op, name, t, dts...); err != nil {
		return err
	}
	return CheckShape(op, name, t, shape...)
}

// EmbedDims are the sizes of Embed's operands.
type EmbedDims struct {
	N    int // ids, rows of out
	Rows int // rows of the table
	Dim  int // row width
}

// CheckEmbed checks Embed's operands:
//
//	out   [n, dim] F32, F16 or BF16
//	table [rows, dim] F32, F16, BF16, Q8_0 or Q4_0
//	ids   [n] I32
func CheckEmbed(out, table, ids Tensor) (EmbedDims, error) {
	const op = "embed"
	if err := checkOperand(op, "table", table, embedDTypes, -1, -1); err != nil {
		return EmbedDims{}, err
	}
	if err := checkOperand(op, "ids", ids, i32DTypes, -1); err != nil {
		return EmbedDims{}, err
	}
	d := EmbedDims{N: ids.Shape()[0], Rows: table.Shape()[0], Dim: table.Shape()[1]}
	return d, checkOperand(op, "out", out, floatDTypes, d.N, d.Dim)
}

// NormDims are the sizes of AddRMSNorm's operands.
type NormDims struct {
	Rows, Dim int
}

// CheckAddRMSNorm checks AddRMSNorm's operands; residual may be nil.
//
//	out, x   [rows, dim] F32, F16 or BF16
//	residual [rows, dim] x's dtype, or nil
//	weight   [dim] F32, F16 or BF16
//	eps      finite, >= 0
func CheckAddRMSNorm(out, x, residual, weight Tensor, eps float32) (NormDims, error) {
	const op = "addrmsnorm"
	if err := checkOperand(op, "x", x, floatDTypes, -1, -1); err != nil {
		return NormDims{}, err
	}
	d := NormDims{Rows: x.Shape()[0], Dim: x.Shape()[1]}
	if err := checkOperand(op, "out", out, floatDTypes, d.Rows, d.Dim); err != nil {
		return NormDims{}, err
	}
	if residual != nil {
		if err := checkOperand(op, "residual", residual, []DType{x.DType()}, d.Rows, d.Dim); err != nil {
			return NormDims{}, err
		}
	}
	if err := checkOperand(op, "weight", weight, floatDTypes, d.Dim); err != nil {
		return NormDims{}, err
	}
	if !finiteNonNegative(eps) {
		return NormDims{}, ShapeError(op, "eps", "%v is not a finite non-negative number", eps)
	}
	return d, nil
}

// MatMulDims are the sizes of MatMul's operands.
type MatMulDims struct {
	N   int // rows of x and out
	In  int // inFeatures
	Out int // outFeatures
}

// CheckMatMul checks MatMul's operands; bias may be nil.
//
//	out  [n, outFeatures] F32, F16 or BF16
//	x    [n, inFeatures] F32, F16 or BF16
//	w    [outFeatures, inFeatures] F32, F16, BF16, Q8_0, Q4_0, Q4_K, Q5_K, Q6_K, AWQ4_G* or F8_E4M3_ROW
//	bias [outFeatures] F32, F16 or BF16, or nil
func CheckMatMul(out, x, w, bias Tensor) (MatMulDims, error) {
	const op = "matmul"
	d, err := CheckProduct(op, x, w, -1)
	if err != nil {
		return MatMulDims{}, err
	}
	if err := checkOperand(op, "out", out, floatDTypes, d.N, d.Out); err != nil {
		return MatMulDims{}, err
	}
	if bias != nil {
		if err := checkOperand(op, "bias", bias, floatDTypes, d.Out); err != nil {
			return MatMulDims{}, err
		}
	}
	return d, nil
}

// CheckProduct checks, under op, the x and w of a product x . w^T of
// outFeatures columns (-1: any) as CheckMatMul checks them. It is for
// fused ops whose product never lands in a MatMul output of its own; the
// caller checks where the product goes.
//
//	x [n, inFeatures] F32, F16 or BF16
//	w [outFeatures, inFeatures] F32, F16, BF16, Q8_0, Q4_0, Q4_K, Q5_K, Q6_K, AWQ4_G* or F8_E4M3_ROW
func CheckProduct(op string, x, w Tensor, outFeatures int) (MatMulDims, error) {
	if err := checkOperand(op, "w", w, weightDTypes, outFeatures, -1); err != nil {
		return MatMulDims{}, err
	}
	d := MatMulDims{Out: w.Shape()[0], In: w.Shape()[1]}
	if err := checkOperand(op, "x", x, floatDTypes, -1, d.In); err != nil {
		return MatMulDims{}, err
	}
	d.N = x.Shape()[0]
	return d, nil
}

// CheckActivation returns an ErrShape error naming op and operand unless
// t is an activation of the contract's float dtypes (F32, F16 or BF16)
// whose shape is want (as CheckShape).
func CheckActivation(op, operand string, t Tensor, want ...int) error {
	return checkOperand(op, operand, t, floatDTypes, want...)
}

// checkHeads checks the head counts of RoPEStoreKV and Attention.
func checkHeads(op string, h, kvh, d int, evenDim bool) error {
	if h <= 0 || kvh <= 0 || d <= 0 || h%kvh != 0 || (evenDim && d%2 != 0) {
		want := "positive counts with NumHeads a multiple of NumKVHeads"
		if evenDim {
			want += " and an even HeadDim"
		}
		return ShapeError(op, "heads", "NumHeads %d, NumKVHeads %d, HeadDim %d: want %s", h, kvh, d, want)
	}
	return nil
}

// checkKV checks a layer's K and V pools and their side tensors against
// the format spec says for kvh heads of d.
func checkKV(op string, spec KVSpec, k, v Tensor, aux KVAux, kvh, d int) error {
	_, err := spec.CheckPools(op, k, v, aux, kvh, d)
	return err
}

// RoPEDims are the sizes of RoPEStoreKV's operands.
type RoPEDims struct {
	NumTokens int
	NumBlocks int // blocks of each cache
	BlockSize int // tokens per block
}

// CheckRoPEStoreKV checks RoPEStoreKV's operands (QNorm and KNorm may be
// nil) and its scalar arguments; the values of Positions and SlotMapping
// are the backend's to check.
//
//	Q           [numTokens, numHeads*headDim] F32, F16 or BF16
//	QKV         [numTokens, (numHeads+2*numKVHeads)*headDim] F32, F16 or BF16
//	Positions   [numTokens] I32; SlotMapping [numTokens] I32
//	KCache      [numBlocks, numKVHeads, blockSize, headDim] as KV says
//	VCache      KCache's shape and dtype
//	InvFreq     [headDim/2] F32
//	QNorm/KNorm [headDim] F32, F16 or BF16, or nil; NormEps finite, >= 0 with either
func CheckRoPEStoreKV(a RoPEArgs) (RoPEDims, error) {
	const op = "ropestorekv"
	h, kvh, d := a.NumHeads, a.NumKVHeads, a.HeadDim
	if err := checkHeads(op, h, kvh, d, true); err != nil {
		return RoPEDims{}, err
	}
	if err := checkOperand(op, "QKV", a.QKV, floatDTypes, -1, (h+2*kvh)*d); err != nil {
		return RoPEDims{}, err
	}
	n := a.QKV.Shape()[0]
	if err := checkOperand(op, "Q", a.Q, floatDTypes, n, h*d); err != nil {
		return RoPEDims{}, err
	}
	if err := checkOperand(op, "Positions", a.Positions, i32DTypes, n); err != nil {
		return RoPEDims{}, err
	}
	if err := checkOperand(op, "SlotMapping", a.SlotMapping, i32DTypes, n); err != nil {
		return RoPEDims{}, err
	}
	if err := checkKV(op, a.KV, a.KCache, a.VCache, a.KVAux, kvh, d); err != nil {
		return RoPEDims{}, err
	}
	if err := checkOperand(op, "InvFreq", a.InvFreq, f32DTypes, d/2); err != nil {
		return RoPEDims{}, err
	}
	for _, nt := range []struct {
		name string
		t    Tensor
	}{{"QNorm", a.QNorm}, {"KNorm", a.KNorm}} {
		if nt.t == nil {
			continue
		}
		if err := checkOperand(op, nt.name, nt.t, floatDTypes, d); err != nil {
			return RoPEDims{}, err
		}
	}
	if (a.QNorm != nil || a.KNorm != nil) && !finiteNonNegative(a.NormEps) {
		return RoPEDims{}, ShapeError(op, "NormEps", "%v is not a finite non-negative number", a.NormEps)
	}
	ks := a.KCache.Shape()
	return RoPEDims{NumTokens: n, NumBlocks: ks[0], BlockSize: a.KV.BlockSize}, nil
}

// AttentionDims are the sizes of Attention's operands.
type AttentionDims struct {
	NumTokens       int
	NumBlocks       int // blocks of each cache
	BlockSize       int // tokens per block
	MaxBlocksPerSeq int // width of BlockTables
}

// CheckAttention checks Attention's operands and scalar arguments; the
// values of BlockTables, SeqLens and QueryStart are the backend's to check.
//
//	Out, Q      [numTokens, numHeads*headDim] F32, F16 or BF16
//	KCache      [numBlocks, numKVHeads, blockSize, headDim] as KV says
//	VCache      KCache's shape and dtype
//	BlockTables [numSeqs, maxBlocksPerSeq] I32
//	SeqLens     [numSeqs] I32; QueryStart [numSeqs+1] I32
//	NumSeqs > 0, MaxSeqLen >= 0, SlidingWindow >= 0, Scale finite
func CheckAttention(a AttentionArgs) (AttentionDims, error) {
	const op = "attention"
	h, kvh, d, ns := a.NumHeads, a.NumKVHeads, a.HeadDim, a.NumSeqs
	if err := checkHeads(op, h, kvh, d, false); err != nil {
		return AttentionDims{}, err
	}
	switch {
	case ns <= 0:
		return AttentionDims{}, ShapeError(op, "NumSeqs", "%d is not positive", ns)
	case a.MaxSeqLen < 0:
		return AttentionDims{}, ShapeError(op, "MaxSeqLen", "%d is negative", a.MaxSeqLen)
	case a.SlidingWindow < 0:
		return AttentionDims{}, ShapeError(op, "SlidingWindow", "%d is negative", a.SlidingWindow)
	case a.StepKeys < 0:
		return AttentionDims{}, ShapeError(op, "StepKeys", "%d is negative", a.StepKeys)
	case math.IsNaN(float64(a.Scale)) || math.IsInf(float64(a.Scale), 0):
		return AttentionDims{}, ShapeError(op, "Scale", "%v is not finite", a.Scale)
	}
	if err := checkOperand(op, "Q", a.Q, floatDTypes, -1, h*d); err != nil {
		return AttentionDims{}, err
	}
	n := a.Q.Shape()[0]
	if err := checkOperand(op, "Out", a.Out, floatDTypes, n, h*d); err != nil {
		return AttentionDims{}, err
	}
	if err := checkKV(op, a.KV, a.KCache, a.VCache, a.KVAux, kvh, d); err != nil {
		return AttentionDims{}, err
	}
	if err := checkOperand(op, "BlockTables", a.BlockTables, i32DTypes, ns, -1); err != nil {
		return AttentionDims{}, err
	}
	if err := checkOperand(op, "SeqLens", a.SeqLens, i32DTypes, ns); err != nil {
		return AttentionDims{}, err
	}
	if err := checkOperand(op, "QueryStart", a.QueryStart, i32DTypes, ns+1); err != nil {
		return AttentionDims{}, err
	}
	ks := a.KCache.Shape()
	return AttentionDims{NumTokens: n, NumBlocks: ks[0], BlockSize: a.KV.BlockSize, MaxBlocksPerSeq: a.BlockTables.Shape()[1]}, nil
}

// SiLUMulDims are the sizes of SiLUMul's operands.
type SiLUMulDims struct {
	N, Inter int
}

// CheckSiLUMul checks SiLUMul's operands:
//
//	out    [n, inter] F32, F16 or BF16
//	gateUp [n, 2*inter] F32, F16 or BF16
func CheckSiLUMul(out, gateUp Tensor) (SiLUMulDims, error) {
	const op = "silumul"
	if err := checkOperand(op, "out", out, floatDTypes, -1, -1); err != nil {
		return SiLUMulDims{}, err
	}
	d := SiLUMulDims{N: out.Shape()[0], Inter: out.Shape()[1]}
	return d, checkOperand(op, "gateUp", gateUp, floatDTypes, d.N, 2*d.Inter)
}

// SampleDims are the sizes of Sample's logits.
type SampleDims struct {
	N, Vocab int
}

// CheckSample checks Sample's logits against its rows (the rows' rules
// are checked where they are applied, row by row):
//
//	Logits [len(Rows), vocab] F32
func CheckSample(a SampleArgs) (SampleDims, error) {
	if err := checkOperand("sample", "Logits", a.Logits, f32DTypes, len(a.Rows), -1); err != nil {
		return SampleDims{}, err
	}
	s := a.Logits.Shape()
	return SampleDims{N: s[0], Vocab: s[1]}, nil
}

func finiteNonNegative(v float32) bool {
	return v >= 0 && !math.IsInf(float64(v), 0)
}
