//go:build !(amd64 || arm64) || purego

package cpu

// kernelSets lists the kernel sets of this architecture: only the pure-Go
// one (vector kernels are written for amd64 and arm64).
func kernelSets() []kernels { return []kernels{{name: "go"}} }
