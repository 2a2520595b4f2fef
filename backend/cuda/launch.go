package cuda

// Programmatic dependent launch (PDL, Hopper and newer): a kernel launched
// with the programmatic-stream-serialization attribute may start while the
// kernel before it in the stream is still running; it waits at
// griddepcontrol.wait until that kernel has finished and its writes are
// visible. A decode step is ~300 short kernels replayed from a graph, and
// without PDL every boundary costs the launch of the next grid after the
// last block of the previous one drains. With it the next grid's blocks
// are already resident, waiting, when the previous grid ends.
//
// Correctness rests on one rule, checked by TestKernelsWaitForPredecessor:
// every trigon kernel waits (grid_dep_sync, grid_dep_wait or
// grid_dep_launch_wait, common.cuh) before it reads memory its
// predecessor may write, so it never reads what that kernel has not
// finished writing. What a kernel reads before its wait is written by no
// kernel of the step: a product's first weight loads, made early only for
// a weight no kernel ever wrote (allocation.pristine), decode attention's
// metadata and older cache rows, the norm's prefetch. Kernels that others
// launch (cuBLASLt) are unaffected: the attribute is on our launches only,
// and a kernel that never triggers its dependents releases them when it
// completes.

// launchConfig mirrors CUlaunchConfig (cuda.h, CUDA 12): 56 bytes
// (TestLaunchConfigLayout checks the sizes).
type launchConfig struct {
	grid     [3]uint32
	block    [3]uint32
	smem     uint32
	_        uint32
	stream   uintptr
	attrs    uintptr
	numAttrs uint32
	_        uint32
}

// earlyRead reports whether a product may read weight w before it waits
// under PDL: w is pristine, read now in queue order (a later op may still
// make it otherwise).
func earlyRead(w *tensor) bool {
	return w.owner != nil && w.owner.pristine.Load()
}

// launchAttr mirrors CUlaunchAttribute: an id, padding to 8 bytes, and a
// 64-byte union value.
type launchAttr struct {
	id    uint32
	_     uint32
	value [64]byte
}

const (
	// launchConfigBytes is the pinned space for the PDL launchConfig and
	// the attribute it points at (at offset 64).
	launchConfigBytes = 64 + 72
	// cuLaunchAttributeProgrammaticStreamSerialization is
	// CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION.
	cuLaunchAttributeProgrammaticStreamSerialization = 6
)

// pdlKernels are the kernels launched with PDL where the device and driver
// can: those whose successor does useful work before its wait (or whose
// own prologue does), so that letting it in early pays. The QKV product
// behind its norm; decode attention behind the QKV product (its prologue
// reads the step's metadata and the older cache rows before it waits) and
// the split combine behind attention; the bulk GEMVs, whose producer
// streams the weight before it waits; the norms, which then launch during
// the tail of the bulk GEMV before them; the weight-quantized decode
// products, which load their first chunks of weights before they wait;
// the int4 cache's K seal (kivi_seal_k) behind rope_store_kv, a short
// kernel whose launch then overlaps the store's. Not the register GEMV or
// rope_store_kv by name: their other launch sites gain nothing from it
// (FusedQKVRoPE's Q/K-norm pair uses launchPDL for its own), and not
// cuBLASLt's kernels, which are not ours to launch.
var pdlKernels = map[string]bool{
	"qkv_rope_bf16": true, "attn_decode_mma": true, "attn_decode_combine": true,
	"gemvb_bf16": true, "gemvb_add_bf16": true, "gemvb_silu_bf16": true,
	"add_rmsnorm": true, "awq_dec": true, "f8_dec": true, "kivi_seal_k": true,
}

// initLaunchConfig lays the launch config and its one attribute out at
// host (pinned memory that lives as long as the backend) and decides
// whether launches may use PDL: compute capability 9.0 or newer and a
// driver with cuLaunchKernelEx. CUDA thread only.
func (b *Backend) initLaunchConfig(host uintptr) {
	b.launchCfg = (*launchConfig)(cptr(host))
	attr := (*launchAttr)(cptr(host + 64))
	*attr = launchAttr{id: cuLaunchAttributeProgrammaticStreamSerialization}
	attr.value[0] = 1 // programmaticStreamSerializationAllowed = 1 (an int)
	*b.launchCfg = launchConfig{attrs: host + 64, numAttrs: 1}
	b.pdl = b.cc >= 90 && b.d.cuLaunchKernelEx != 0
}
