package cuda

import (
	"os"
	"strings"
)

// expSkip is for timing experiments only (TRIGON_CUDA_EXP_SKIP, a comma
// list of combine, attn, norm): decode-batch kernels left out of the step,
// so its outputs are wrong. It bounds what removing a kernel could save.
var expSkip = func() map[string]bool {
	m := map[string]bool{}
	for _, s := range strings.Split(os.Getenv("TRIGON_CUDA_EXP_SKIP"), ",") {
		if s != "" {
			m[s] = true
		}
	}
	return m
}()

// expEarlyLaunch (TRIGON_CUDA_EXP_EARLY_LAUNCH, experiment: a comma list
// of qkv_rope_bf16, gemvb_bf16, gemvb_add_bf16, gemvb_silu_bf16): those
// kernels let their dependents launch at their start.
var expEarlyLaunch = func() map[string]bool {
	m := map[string]bool{}
	for _, s := range strings.Split(os.Getenv("TRIGON_CUDA_EXP_EARLY_LAUNCH"), ",") {
		if s != "" {
			m[s] = true
		}
	}
	return m
}()

// expEarly is the kernels' flag bit 1 for expEarlyLaunch.
func expEarly(kernel string) uint64 {
	if expEarlyLaunch[kernel] {
		return 2
	}
	return 0
}
