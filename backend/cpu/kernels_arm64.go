//go:build arm64 && !purego

package cpu

import "golang.org/x/sys/cpu"

// The assembly kernels of kernels_arm64.s. SDOT needs the dot-product
// extension (ASIMDDP); the others are base NEON (ASIMD), whose f16
// conversions (fcvtl, fcvt) need no half-precision arithmetic extension.

func dotQ8SDOT(xq *int8, xs *float32, w *byte, nb int) float32
func dotQ4SDOT(xq *int8, xs *float32, w *byte, nb int) float32
func dotQ8NEON(xq *int8, xs *float32, w *byte, nb int) float32
func dotQ4NEON(xq *int8, xs *float32, w *byte, nb int) float32
func dotQ8RowsSDOT(xq *int8, xs *float32, w *byte, nb int, rows int, out *float32)
func dotQ4RowsSDOT(xq *int8, xs *float32, w *byte, nb int, rows int, out *float32)
func dotQ8RowsNEON(xq *int8, xs *float32, w *byte, nb int, rows int, out *float32)
func dotQ4RowsNEON(xq *int8, xs *float32, w *byte, nb int, rows int, out *float32)

// kernelSets lists the vector kernel sets this CPU can run, best first,
// and the pure-Go set last: "neon-dotprod" where the CPU has the
// dot-product extension, and "neon" (which every arm64 CPU Go runs on
// has) after it, so the tests cover both on such a CPU.
func kernelSets() []kernels {
	var sets []kernels
	if !cpu.ARM64.HasASIMD {
		return []kernels{{name: "go"}}
	}
	neon := kernels{
		name:  "neon",
		dotQ8: dotQ8NEON, dotQ4: dotQ4NEON, dotQ8Rows: dotQ8RowsNEON, dotQ4Rows: dotQ4RowsNEON,
	}
	if cpu.ARM64.HasASIMDDP {
		dp := neon
		dp.name = "neon-dotprod"
		dp.dotQ8, dp.dotQ4, dp.dotQ8Rows, dp.dotQ4Rows = dotQ8SDOT, dotQ4SDOT, dotQ8RowsSDOT, dotQ4RowsSDOT
		sets = append(sets, dp)
	}
	return append(sets, neon, kernels{name: "go"})
}
