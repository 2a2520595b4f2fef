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

// expQKVEarly (TRIGON_CUDA_EXP_QKV_EARLY=on, experiment): qkv_rope_bf16
// lets its dependents (decode attention) launch at its start.
var expQKVEarly = func() uint64 {
	if os.Getenv("TRIGON_CUDA_EXP_QKV_EARLY") == "on" {
		return 2
	}
	return 0
}()
