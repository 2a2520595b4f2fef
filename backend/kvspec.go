package backend

import (
	"fmt"
	"slices"
)

// KVSpec is the format of a paged KV cache: what every op that writes or
// reads the cache must agree on beyond the pools' shapes. The runner owns
// it (it allocates the pools from it) and hands it, with the pools, to
// the model, which passes it to RoPEStoreKV and Attention.
//
// The model's shape (KV heads, head dim) is not part of the format. In
// layout KVHeadMajor, per layer a K pool and a V pool of
//
//	[numBlocks][numKVHeads][BlockSize][headDim] DType
//
// so one head's slice of a block is contiguous (BlockSize*headDim
// elements). Token position p of a sequence lives at offset p%BlockSize
// of block table[p/BlockSize].
//
// # Quantized formats
//
// Scales names the format's side tensors (KVAux) and how values decode;
// every side tensor whose first dimension is numBlocks is indexed by the
// same block ids as the pools, so it moves with its block: a block copy
// (fork, copy-on-write) copies it, a prefix-cache hit reads the block in
// the quantized form and with the scales it was written with, and
// nothing about a block lives outside its id. All scales and zero points
// are F16 unless said otherwise; a value is quantized with its scale
// already rounded to F16, so decoding needs nothing but the stored bits.
// Rounding is to nearest, ties to even, everywhere.
//
// KVScalePerHead, DType F8E4M3 (--kv-cache-dtype fp8):
//
//	KScale, VScale [numKVHeads] F32, one scale per (layer, kv-head)
//	x ~ e4m3(q) * scale,  q = e4m3(x / scale) saturated to +-448
//
// The scales come from the checkpoint (k_scale, v_scale) or are 0 at
// allocation, meaning "not set": the first RoPEStoreKV that writes a
// token sets each head's scale from the tokens it writes, to
// max|x| / KVFP8DynamicTarget (that call's largest value lands at 112,
// leaving two binades for later, larger tokens); later values beyond
// 448*scale saturate to +-448*scale. The scales never change after that,
// so every block, cached or not, decodes with them.
//
// KVScaleGroups, DType I8 (--kv-cache-dtype int8), symmetric:
//
//	KScale, VScale [numBlocks][numKVHeads][BlockSize][headDim/GroupSize] F16
//	per token and group g of GroupSize channels:
//	  s = f16(max|x| / 127),  q = clamp(round(x/s), -127, 127),  x ~ q*s
//
// KVScaleKIVI, DType U4 (--kv-cache-dtype int4), asymmetric (KIVI): K is
// quantized per channel over the BlockSize tokens of a block, V per token
// over groups of GroupSize channels; for a group of values x:
//
//	s = f16((max x - min x) / 15),  z = f16(min x)
//	q = clamp(round((x - z) / s), 0, 15),  x ~ q*s + z   (s = 0: q = 0)
//
//	KScale [numBlocks][numKVHeads][2][headDim] F16: row 0 the channels'
//	       scales, row 1 their zero points
//	VScale [numBlocks][numKVHeads][BlockSize][headDim/GroupSize][2] F16:
//	       (scale, zero point) per group
//	KWindow, VWindow [numWindowBlocks][numKVHeads][BlockSize][headDim] BF16
//	WindowMap [numBlocks] I32: a block's window block, or -1
//
// K per channel needs a whole group of tokens, so the token group is
// the block: a block's K is quantized once, by the RoPEStoreKV that
// writes its last token, from its bf16 copy in the window pool. Every
// written token also goes, in bf16, to its block's window block, which
// the runner assigns before the block's first write (WindowMap); V is
// quantized per token at once. Reading position p of a sequence of
// length L in block b:
//
//	bf16 from KWindow/VWindow[WindowMap[b]]  when WindowMap[b] >= 0 and
//	                                         (b is not full or p >= L-Window)
//	int4 from K/V[b]                         otherwise
//
// A block is full when the sequence's length reaches its end. So the
// newest Window tokens of a sequence, and always its last, partial
// block, are read in bf16; as the window slides, tokens behind it are
// read from the int4 form that their block has had since it filled.
// Window 0 keeps only partial blocks in bf16. A block reused through the
// prefix cache after its window block went to another block is read in
// int4 within the window too; that costs accuracy, never correctness.
//
//	sequence of L = 75 tokens, BlockSize 16, Window 32:
//
//	position  0      16     32     48     64   75
//	          |  b3  |  b7  |  b1  |  b9  | b4 ..|
//	int4 form  full   full   full   full   (none yet)
//	window blk  -      -      w2     w5     w0      <- WindowMap
//	read as   int4   int4   int4 | bf16  bf16       <- p >= L-32 = 43
//
// The window pool holds numWindowBlocks blocks (WindowBlocks): enough
// for every block one step writes plus the windows and partial blocks of
// the most sequences that run at once.
type KVSpec struct {
	DType     DType
	BlockSize int
	Layout    KVLayout
	Scales    KVScales
	// GroupSize is the channels per scale: of K and V for
	// KVScaleGroups, of V for KVScaleKIVI (K's group is the block).
	GroupSize int
	// Window is KVScaleKIVI's newest tokens per sequence read in bf16.
	Window int
}

// KVLayout is the order of a pool's dimensions.
type KVLayout uint8

const (
	// KVHeadMajor is [numBlocks][numKVHeads][blockSize][headDim].
	KVHeadMajor KVLayout = iota + 1
)

// KVScales says where a quantized cache keeps its scales and how its
// values decode (see KVSpec).
type KVScales uint8

const (
	// KVNoScales: the pools hold the values themselves.
	KVNoScales KVScales = iota + 1
	// KVScalePerHead: F8E4M3 values, a F32 scale per (layer, kv-head).
	KVScalePerHead
	// KVScaleGroups: I8 values, a F16 scale per token and channel group.
	KVScaleGroups
	// KVScaleKIVI: U4 values, K per channel over a block, V per token
	// over channel groups, scale and zero point, a bf16 window.
	KVScaleKIVI
)

// KVFP8DynamicTarget is where a dynamically scaled FP8 cache puts the
// largest value of the tokens that set its scale (see KVSpec): 448/4.
const KVFP8DynamicTarget = 112

// Defaults of the quantized formats: the int8 and int4 channel groups and
// the int4 window. docs/kv-cache.md gives the measurements behind them.
const (
	DefaultKVInt8Group = 32
	DefaultKVInt4Group = 32
	DefaultKVWindow    = 128
)

// KVNoWindow is the window option (WithWindowOption) of an int4 cache
// with no bf16 window: only each sequence's partial block is read in
// bf16 (KVSpec.Window 0). The option's 0 is the default window instead,
// so that options structs left zero keep DefaultKVWindow.
const KVNoWindow = -1

// WithWindowOption is s with the int4 window an options struct's KVWindow
// field asks for (engine.LoadOptions, eval.Options): 0 keeps s's window
// (DefaultKVWindow from ParseKVCacheDType), KVNoWindow sets none, n > 0
// sets n tokens. Other formats have no window and ignore the option (the
// --kv-cache-window flag is set, to its default, whatever the dtype);
// below KVNoWindow is an error.
func (s KVSpec) WithWindowOption(n int) (KVSpec, error) {
	if n < KVNoWindow {
		return s, fmt.Errorf("kv cache window %d: want a token count, 0 for the default or %d for none", n, KVNoWindow)
	}
	if s.Scales != KVScaleKIVI {
		return s, nil
	}
	switch {
	case n == KVNoWindow:
		s.Window = 0
	case n > 0:
		s.Window = n
	}
	return s, nil
}

// KVGroupSizes are the channel group sizes KVScaleGroups and KVScaleKIVI
// support.
var KVGroupSizes = []int{8, 16, 32, 128}

// kvDTypes are the pool dtypes of the unquantized formats.
var kvDTypes = []DType{F32, F16, BF16}

// Validate reports a spec no backend can take: a dtype that is not a
// KV dtype, non-positive sizes, an unknown layout, a dtype and scales
// that do not go together, a group size or window the format does not
// take.
func (s KVSpec) Validate() error {
	if !slices.Contains(kvDTypes, s.DType) && s.DType != F8E4M3 && s.DType != I8 && s.DType != U4 {
		return fmt.Errorf("kv spec: dtype %v, want one of %v, or F8_E4M3, I8, U4 with their scales", s.DType, kvDTypes)
	}
	if s.BlockSize <= 0 {
		return fmt.Errorf("kv spec: block size %d is not positive", s.BlockSize)
	}
	if s.Layout != KVHeadMajor {
		return fmt.Errorf("kv spec: layout %d, want head-major (%d)", s.Layout, KVHeadMajor)
	}
	want := map[KVScales]DType{KVScalePerHead: F8E4M3, KVScaleGroups: I8, KVScaleKIVI: U4}
	switch s.Scales {
	case KVNoScales:
		if !slices.Contains(kvDTypes, s.DType) {
			return fmt.Errorf("kv spec: dtype %v, want one of %v", s.DType, kvDTypes)
		}
	case KVScalePerHead, KVScaleGroups, KVScaleKIVI:
		if s.DType != want[s.Scales] {
			return fmt.Errorf("kv spec: scales %d take dtype %v, not %v", s.Scales, want[s.Scales], s.DType)
		}
	default:
		return fmt.Errorf("kv spec: unknown scales %d", s.Scales)
	}
	grouped := s.Scales == KVScaleGroups || s.Scales == KVScaleKIVI
	if grouped && !slices.Contains(KVGroupSizes, s.GroupSize) {
		return fmt.Errorf("kv spec: group size %d, want one of %v", s.GroupSize, KVGroupSizes)
	}
	if !grouped && s.GroupSize != 0 {
		return fmt.Errorf("kv spec: %v has no channel groups (group size %d)", s.DType, s.GroupSize)
	}
	if s.Window < 0 || (s.Scales != KVScaleKIVI && s.Window != 0) {
		return fmt.Errorf("kv spec: a full-precision window of %d tokens: only int4 (KIVI) has one", s.Window)
	}
	return nil
}

// CheckModel reports a model shape the spec cannot hold: a head dim that
// is not a whole number of channel groups (or, for U4, of bytes).
func (s KVSpec) CheckModel(numKVHeads, headDim int) error {
	if numKVHeads <= 0 || headDim <= 0 {
		return fmt.Errorf("kv spec: %d heads of %d", numKVHeads, headDim)
	}
	if s.GroupSize > 0 && headDim%s.GroupSize != 0 {
		return fmt.Errorf("kv spec: head dim %d is not a multiple of the %v cache's group size %d", headDim, s.DType, s.GroupSize)
	}
	if s.DType == U4 && headDim%2 != 0 {
		return fmt.Errorf("kv spec: head dim %d is odd; int4 packs two channels a byte", headDim)
	}
	return nil
}

// PlainKV is the spec of an unquantized head-major cache.
func PlainKV(dt DType, blockSize int) KVSpec {
	return KVSpec{DType: dt, BlockSize: blockSize, Layout: KVHeadMajor, Scales: KVNoScales}
}

// FP8KV is the spec of an e4m3 cache with a scale per (layer, kv-head).
func FP8KV(blockSize int) KVSpec {
	return KVSpec{DType: F8E4M3, BlockSize: blockSize, Layout: KVHeadMajor, Scales: KVScalePerHead}
}

// Int8KV is the spec of a symmetric int8 cache with a scale per group of
// group channels.
func Int8KV(blockSize, group int) KVSpec {
	return KVSpec{DType: I8, BlockSize: blockSize, Layout: KVHeadMajor, Scales: KVScaleGroups, GroupSize: group}
}

// Int4KV is the spec of a KIVI int4 cache: V in groups of group channels,
// the newest window tokens of each sequence read in bf16.
func Int4KV(blockSize, group, window int) KVSpec {
	return KVSpec{DType: U4, BlockSize: blockSize, Layout: KVHeadMajor, Scales: KVScaleKIVI, GroupSize: group, Window: window}
}

// KVCacheDTypes are the names ParseKVCacheDType takes (vLLM's
// --kv-cache-dtype spelling; fp8 is e4m3).
var KVCacheDTypes = []string{"auto", "bf16", "fp8", "int8", "int4"}

// ParseKVCacheDType is the spec a --kv-cache-dtype name stands for, with
// the default group sizes and window: auto (or "") is an unquantized
// cache in act, the backend's activation dtype.
func ParseKVCacheDType(name string, act DType, blockSize int) (KVSpec, error) {
	switch name {
	case "", "auto":
		return PlainKV(act, blockSize), nil
	case "bf16", "bfloat16":
		return PlainKV(BF16, blockSize), nil
	case "fp8", "fp8_e4m3":
		return FP8KV(blockSize), nil
	case "int8":
		return Int8KV(blockSize, DefaultKVInt8Group), nil
	case "int4":
		return Int4KV(blockSize, DefaultKVInt4Group, DefaultKVWindow), nil
	}
	return KVSpec{}, fmt.Errorf("kv cache dtype %q: want one of %v", name, KVCacheDTypes)
}

// Name is the spec's --kv-cache-dtype name: bf16, fp8, int8, int4, or the
// plain dtype (f32, f16).
func (s KVSpec) Name() string {
	switch s.Scales {
	case KVScalePerHead:
		return "fp8"
	case KVScaleGroups:
		return "int8"
	case KVScaleKIVI:
		return "int4"
	}
	switch s.DType {
	case BF16:
		return "bf16"
	case F16:
		return "f16"
	case F32:
		return "f32"
	}
	return s.DType.String()
}

// PoolShape is the shape of one K or V pool of numBlocks blocks for a
// model with numKVHeads heads of headDim.
func (s KVSpec) PoolShape(numBlocks, numKVHeads, headDim int) []int {
	return []int{numBlocks, numKVHeads, s.BlockSize, headDim}
}

// ScaleShapes are the shapes and dtype of the K and V scale tensors of
// one layer (KVAux.KScale, VScale); nil for an unquantized spec.
func (s KVSpec) ScaleShapes(numBlocks, numKVHeads, headDim int) (k, v []int, dt DType) {
	switch s.Scales {
	case KVScalePerHead:
		return []int{numKVHeads}, []int{numKVHeads}, F32
	case KVScaleGroups:
		sh := []int{numBlocks, numKVHeads, s.BlockSize, headDim / s.GroupSize}
		return sh, slices.Clone(sh), F16
	case KVScaleKIVI:
		return []int{numBlocks, numKVHeads, 2, headDim}, []int{numBlocks, numKVHeads, s.BlockSize, 2 * headDim / s.GroupSize}, F16
	}
	return nil, nil, 0
}

// WindowBlocks is the window pool's size for KVScaleKIVI (0 for other
// formats), for steps of at most maxTokens tokens over at most maxSeqs
// running sequences: the blocks one step writes (maxTokens/BlockSize and
// one more per sequence) plus, per sequence, its window's blocks, its
// partial block and one to spare.
func (s KVSpec) WindowBlocks(maxSeqs, maxTokens int) int {
	if s.Scales != KVScaleKIVI {
		return 0
	}
	bs := s.BlockSize
	return (maxTokens+bs-1)/bs + maxSeqs*((s.Window+bs-1)/bs+3)
}

// BlockBytes is the size of one block of one pool (K or V) of one layer,
// without scales.
func (s KVSpec) BlockBytes(numKVHeads, headDim int) int {
	n, err := s.DType.Bytes(s.PoolShape(1, numKVHeads, headDim))
	if err != nil {
		return 0
	}
	return n
}

// LayerBlockBytes is what one block costs in one layer: its K and V
// values and their scales and zero points.
func (s KVSpec) LayerBlockBytes(numKVHeads, headDim int) int {
	n := 2 * s.BlockBytes(numKVHeads, headDim)
	k, v, dt := s.ScaleShapes(1, numKVHeads, headDim)
	if s.Scales == KVScaleGroups || s.Scales == KVScaleKIVI {
		kb, _ := dt.Bytes(k)
		vb, _ := dt.Bytes(v)
		n += kb + vb
	}
	return n
}

// CacheBlockBytes is what one block costs over all numLayers layers,
// everything indexed by block id included (KIVI's window map entry).
func (s KVSpec) CacheBlockBytes(numLayers, numKVHeads, headDim int) int64 {
	n := int64(numLayers) * int64(s.LayerBlockBytes(numKVHeads, headDim))
	if s.Scales == KVScaleKIVI {
		n += 4
	}
	return n
}

// FixedBytes is what the cache costs whatever its block count, over all
// numLayers layers: FP8's per-head scales, KIVI's window pools of
// windowBlocks blocks.
func (s KVSpec) FixedBytes(numLayers, numKVHeads, headDim, windowBlocks int) int64 {
	switch s.Scales {
	case KVScalePerHead:
		return int64(numLayers) * 2 * 4 * int64(numKVHeads)
	case KVScaleKIVI:
		n, _ := BF16.Bytes([]int{windowBlocks, numKVHeads, s.BlockSize, headDim})
		return int64(numLayers) * 2 * int64(n)
	}
	return 0
}

func (s KVSpec) String() string {
	switch s.Scales {
	case KVScalePerHead:
		return fmt.Sprintf("fp8 e4m3 head-major, %d-token blocks, a scale per kv-head", s.BlockSize)
	case KVScaleGroups:
		return fmt.Sprintf("int8 head-major, %d-token blocks, a scale per %d channels", s.BlockSize, s.GroupSize)
	case KVScaleKIVI:
		return fmt.Sprintf("int4 KIVI head-major, %d-token blocks, V groups of %d channels, a %d-token bf16 window", s.BlockSize, s.GroupSize, s.Window)
	}
	return fmt.Sprintf("%v head-major, %d-token blocks", s.DType, s.BlockSize)
}

// KVAux are a quantized cache's tensors besides its K and V pools, per
// layer (WindowMap is shared by all layers); which are set, and their
// shapes, the spec says (see KVSpec). All nil for an unquantized cache.
type KVAux struct {
	KScale, VScale   Tensor // scales (and zero points) of K and V
	KWindow, VWindow Tensor // KVScaleKIVI: bf16 copies of the window's blocks
	WindowMap        Tensor // KVScaleKIVI: [numBlocks] I32, a block's window block or -1
}

// CheckPools reports (ShapeError, under op) pools k and v that do not
// have the spec's dtype and layout for numKVHeads heads of headDim, side
// tensors aux that are not the ones the spec names, or a spec that is not
// valid. It returns the pools' block count.
func (s KVSpec) CheckPools(op string, k, v Tensor, aux KVAux, numKVHeads, headDim int) (numBlocks int, err error) {
	if err := s.Validate(); err != nil {
		return 0, ShapeError(op, "KV", "%v", err)
	}
	if err := s.CheckModel(numKVHeads, headDim); err != nil {
		return 0, ShapeError(op, "KV", "%v", err)
	}
	for _, p := range []struct {
		name string
		t    Tensor
	}{{"KCache", k}, {"VCache", v}} {
		if p.t == nil {
			return 0, ShapeError(op, p.name, "nil tensor")
		}
		if p.t.DType() != s.DType {
			return 0, ShapeError(op, p.name, "dtype %v, the KV spec says %v", p.t.DType(), s.DType)
		}
		sh := p.t.Shape()
		if want := s.PoolShape(0, numKVHeads, headDim); len(sh) != 4 || sh[0] <= 0 || !slices.Equal(sh[1:], want[1:]) {
			return 0, ShapeError(op, p.name, "shape %v, want [numBlocks %d %d %d] (%v)", sh, want[1], want[2], want[3], s)
		}
	}
	if !slices.Equal(k.Shape(), v.Shape()) {
		return 0, ShapeError(op, "VCache", "shape %v differs from KCache's %v", v.Shape(), k.Shape())
	}
	nb := k.Shape()[0]
	ks, vs, sdt := s.ScaleShapes(nb, numKVHeads, headDim)
	type side struct {
		name  string
		t     Tensor
		shape []int // nil: must be nil; -1 first: any count
		dt    DType
	}
	sides := []side{{"KScale", aux.KScale, ks, sdt}, {"VScale", aux.VScale, vs, sdt}, {"KWindow", aux.KWindow, nil, BF16}, {"VWindow", aux.VWindow, nil, BF16}, {"WindowMap", aux.WindowMap, nil, I32}}
	if s.Scales == KVScaleKIVI {
		sides[2].shape = []int{-1, numKVHeads, s.BlockSize, headDim}
		sides[3].shape = sides[2].shape
		sides[4].shape = []int{nb}
	}
	for _, sd := range sides {
		if sd.shape == nil {
			if sd.t != nil {
				return 0, ShapeError(op, sd.name, "set, but the %v cache has none", s.DType)
			}
			continue
		}
		if sd.t == nil {
			return 0, ShapeError(op, sd.name, "nil tensor (the %v cache needs it)", s.DType)
		}
		sh := sd.t.Shape()
		ok := sd.t.DType() == sd.dt && len(sh) == len(sd.shape)
		for i := 0; ok && i < len(sh); i++ {
			ok = sh[i] == sd.shape[i] || (sd.shape[i] == -1 && sh[i] > 0)
		}
		if !ok {
			return 0, ShapeError(op, sd.name, "%v %v, want %v %v (%v)", sd.t.DType(), sh, sd.dt, sd.shape, s)
		}
	}
	if s.Scales == KVScaleKIVI && !slices.Equal(aux.KWindow.Shape(), aux.VWindow.Shape()) {
		return 0, ShapeError(op, "VWindow", "shape %v differs from KWindow's %v", aux.VWindow.Shape(), aux.KWindow.Shape())
	}
	return nb, nil
}

// KVSpecChecker is an optional Backend interface, for backends whose
// kernels take only some KV formats (the CUDA backend): the runner asks
// it before it allocates a cache, so a format the backend cannot run is
// refused at load, not on every step.
type KVSpecChecker interface {
	CheckKVSpec(spec KVSpec) error
}
