package cuda

import (
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
)

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
// every trigon kernel calls grid_dep_sync() (common.cuh) before it touches
// memory, so it never reads what its predecessor has not finished
// writing. The one exception is the GEMV's first weight loads, made before
// the wait only for a weight no kernel ever wrote (allocation.pristine).
// Kernels that others launch (cuBLASLt) are unaffected: the
// attribute is on our launches only, and a kernel that never triggers its
// dependents releases them when it completes.

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

// earlyWeights lets the products read a pristine weight (allocation.
// pristine) before they wait under PDL: the register GEMV's first weight
// loads, the bulk GEMV's producer stream. Off, every product waits first.
// TRIGON_CUDA_EARLY_WEIGHTS=on|off, read by New; for comparisons.
var earlyWeights = true

// earlyWeightsEnv names earlyWeights' setting.
const earlyWeightsEnv = "TRIGON_CUDA_EARLY_WEIGHTS"

// earlyRead reports whether a product may read weight w before it waits:
// w is pristine, read now in queue order (a later op may still make it
// otherwise), and earlyWeights is on.
func earlyRead(w *tensor) bool {
	return earlyWeights && w.owner != nil && w.owner.pristine.Load()
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
	// pdlEnv selects the launches with PDL, where the device and driver
	// can: "on" every one, "off" none, a comma-separated list of kernel
	// names only those; unset, pdlDefault's.
	pdlEnv = "TRIGON_CUDA_PDL"
)

// pdlEnabled (pdlEnv "on", read by New) launches every kernel with PDL.
// Off by default: on the H200 (docs/benchmarks.md, 2026-11-30) the
// batch-4 Llama-3-8B decode step took 5.38 ms with PDL on every launch
// against 5.21 ms without, in the same call, and 4.86 against 4.78 in a
// later build (seventh session); the GEMV adding into the residual
// (gemv_add_bf16) lost most.
var pdlEnabled = false

// pdlKernels names the only kernels launched with PDL when pdlEnabled is
// off: by default pdlDefault, from pdlEnv a list of names, nil with
// pdlEnv "off" or "on".
var pdlKernels = pdlDefault

// pdlDefault are the kernels whose launch PDL measured faster on the
// H200 (seventh session): the QKV projection behind its norm, decode
// attention behind the QKV projection (its prologue reads the step's
// metadata and the older cache rows before it waits), and the split
// combine behind attention; (eighth session) the bulk-copy GEMVs, whose
// producer streams the weight before it waits; and (tenth session) the
// norms, which then launch during the bulk GEMV's tail before them:
// -0.027 ms a batch-4 step, where with the register GEMV before them
// (seventh session) PDL on the norms had been slower.
var pdlDefault = map[string]bool{
	"qkv_rope_bf16": true, "attn_decode_mma": true, "attn_decode_combine": true,
	"gemvb_bf16": true, "gemvb_add_bf16": true, "gemvb_silu_bf16": true,
	"add_rmsnorm": true,
}

// launchEarly names the kernels that let their dependents launch at their
// start rather than after their weight stream (their flag's bit 1, see
// launchEarlyFlag). Where the kernel leaves room on an SM, the next
// kernel's blocks are then resident before it ends and do what they may
// before their wait: decode attention after the QKV product issues its
// first K/V tiles, the down product after gate/up streams its weight.
// Measured on the H200 (batch 4, seventeenth session, docs/benchmarks.md):
// the QKV product -44 us a step, with gate/up too -77 us; the O and down
// products (whose dependent is a norm, which lets the next product launch
// at once) +240 us, so they are not in the default.
// TRIGON_CUDA_EARLY_LAUNCH (read by New): on (every kernel of
// launchEarlyKernels), off, or a list of names.
var launchEarly = launchEarlyDefault

// launchEarlyDefault is launchEarly without the environment.
var launchEarlyDefault = map[string]bool{"qkv_rope_bf16": true, "gemvb_silu_bf16": true}

// launchEarlyKernels are the kernels that take the flag.
var launchEarlyKernels = []string{"qkv_rope_bf16", "gemvb_bf16", "gemvb_add_bf16", "gemvb_silu_bf16"}

// launchEarlyEnv names launchEarly's setting.
const launchEarlyEnv = "TRIGON_CUDA_EARLY_LAUNCH"

// launchEarlyFlag is kernel's flag bit 1 (2) where launchEarly names it.
func launchEarlyFlag(kernel string) uint64 {
	if launchEarly[kernel] {
		return 2
	}
	return 0
}

// parseLaunchEarly reads launchEarlyEnv's value.
func parseLaunchEarly(v string) (map[string]bool, error) {
	switch v {
	case "":
		return maps.Clone(launchEarlyDefault), nil
	case "off":
		return map[string]bool{}, nil
	case "on":
		m := map[string]bool{}
		for _, n := range launchEarlyKernels {
			m[n] = true
		}
		return m, nil
	}
	names, err := parseKernelList(v)
	if err == nil {
		for n := range names {
			if !slices.Contains(launchEarlyKernels, n) {
				err = fmt.Errorf("%s does not take the flag (%s do)", n, strings.Join(launchEarlyKernels, ", "))
				break
			}
		}
	}
	if err != nil {
		return nil, fmt.Errorf("cuda: %s=%q: want on, off or kernel names separated by commas: %w", launchEarlyEnv, v, err)
	}
	return names, nil
}

// applyPDLEnv reads pdlEnv, earlyWeightsEnv and launchEarlyEnv.
func applyPDLEnv() (err error) {
	if earlyWeights, err = envSwitch(earlyWeightsEnv, true); err != nil {
		return err
	}
	if launchEarly, err = parseLaunchEarly(os.Getenv(launchEarlyEnv)); err != nil {
		return err
	}
	v := os.Getenv(pdlEnv)
	if v == "" {
		pdlEnabled, pdlKernels = false, pdlDefault
		return nil
	}
	if v == "on" || v == "off" {
		pdlKernels = nil
		pdlEnabled, err = envSwitch(pdlEnv, false)
		return err
	}
	names, err := parseKernelList(v)
	if err != nil {
		return fmt.Errorf("cuda: %s=%q: want on, off or kernel names separated by commas: %w", pdlEnv, v, err)
	}
	pdlEnabled = false
	pdlKernels = names
	return nil
}

// parseKernelList reads "name,name,...": at least one name, each of
// lower-case letters, digits and underscores (trigon's kernel names).
func parseKernelList(v string) (map[string]bool, error) {
	out := map[string]bool{}
	for _, n := range strings.Split(v, ",") {
		if n == "" {
			return nil, fmt.Errorf("empty name")
		}
		for i, c := range n {
			if !(c == '_' || c >= 'a' && c <= 'z' || i > 0 && c >= '0' && c <= '9') {
				return nil, fmt.Errorf("%q is not a kernel name", n)
			}
		}
		out[n] = true
	}
	return out, nil
}

// initLaunchConfig lays the launch config and its one attribute out at
// host (pinned memory that lives as long as the backend) and decides
// whether launches use PDL: compute capability 9.0 or newer, a driver with
// cuLaunchKernelEx, and not turned off. CUDA thread only.
func (b *Backend) initLaunchConfig(host uintptr) {
	b.launchCfg = (*launchConfig)(cptr(host))
	attr := (*launchAttr)(cptr(host + 64))
	*attr = launchAttr{id: cuLaunchAttributeProgrammaticStreamSerialization}
	attr.value[0] = 1 // programmaticStreamSerializationAllowed = 1 (an int)
	*b.launchCfg = launchConfig{attrs: host + 64, numAttrs: 1}
	b.pdl = pdlEnabled && b.cc >= 90 && b.d.cuLaunchKernelEx != 0
	b.pdlSome = pdlKernels != nil && b.cc >= 90 && b.d.cuLaunchKernelEx != 0
	b.pdlSite = (pdlEnabled || pdlKernels != nil) && b.cc >= 90 && b.d.cuLaunchKernelEx != 0
}

// PDL reports whether kernel launches use programmatic dependent launch.
func (b *Backend) PDL() bool {
	var on bool
	_ = b.call(func() error { on = b.pdl; return nil })
	return on
}
