package cpu

import "github.com/trigon-llm/trigon/backend"

// The conversions below moved to package backend; these forwarders remain
// only until backend/cuda's tests call package backend directly.

// F32ToBF16 is backend.F32ToBF16.
//
// Deprecated: use backend.F32ToBF16.
func F32ToBF16(f float32) uint16 { return backend.F32ToBF16(f) }

// BF16ToF32 is backend.BF16ToF32.
//
// Deprecated: use backend.BF16ToF32.
func BF16ToF32(h uint16) float32 { return backend.BF16ToF32(h) }

// F16ToF32 is backend.F16ToF32.
//
// Deprecated: use backend.F16ToF32.
func F16ToF32(h uint16) float32 { return backend.F16ToF32(h) }

// F32ToF16 is backend.F32ToF16.
//
// Deprecated: use backend.F32ToF16.
func F32ToF16(f float32) uint16 { return backend.F32ToF16(f) }

// QuantizeQ8_0 is backend.QuantizeQ8_0.
//
// Deprecated: use backend.QuantizeQ8_0.
func QuantizeQ8_0(src []float32) ([]byte, error) { return backend.QuantizeQ8_0(src) }

// QuantizeQ4_0 is backend.QuantizeQ4_0.
//
// Deprecated: use backend.QuantizeQ4_0.
func QuantizeQ4_0(src []float32) ([]byte, error) { return backend.QuantizeQ4_0(src) }
