package model

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/trigon-llm/trigon/backend"
)

// Writers of the checkpoint layouts quantized.go reads, round to nearest:
// for tools/quantckpt, which makes test checkpoints, and for the loader's
// tests. They are the layouts' inverses, so a checkpoint they write loads
// to exactly the backend encoding of the same rounding.

// PackAutoAWQ quantizes w ([out, in] row-major f32) into AutoAWQ GEMM
// tensors with group g (backend.QuantizeAWQ4 per output row): qweight I32
// [in, out/8], qzeros I32 [in/g, out/8], scales F16 [in/g, out], as
// little-endian bytes.
func PackAutoAWQ(w []float32, out, in, g int) (qweight, qzeros, scales []byte, err error) {
	if out%8 != 0 || g <= 0 || in%g != 0 || len(w) != out*in {
		return nil, nil, nil, fmt.Errorf("pack autoawq: %d values as [%d %d] with groups of %d: want out a multiple of 8 and whole groups", len(w), out, in, g)
	}
	groups := in / g
	qw := make([]uint32, in*out/8)
	qz := make([]uint32, groups*out/8)
	scales = make([]byte, 2*groups*out)
	for o := range out {
		q, s, z, err := backend.QuantizeAWQ4(w[o*in:(o+1)*in], g)
		if err != nil {
			return nil, nil, nil, fmt.Errorf("pack autoawq row %d: %w", o, err)
		}
		c, shift := o/8, 4*awqNibble[o%8]
		for k := range in {
			qw[k*(out/8)+c] |= uint32(q[k]) << shift
		}
		for b := range groups {
			qz[b*(out/8)+c] |= uint32(z[b]) << shift
			binary.LittleEndian.PutUint16(scales[2*(b*out+o):], s[b])
		}
	}
	return u32Bytes(qw), u32Bytes(qz), scales, nil
}

// PackFP8 quantizes w ([out, in] row-major f32) to e4m3 with a scale per
// output feature (perTensor false) or one for the tensor: the weight's
// F8_E4M3 bytes and the scales as F32 (out values, or one).
func PackFP8(w []float32, out, in int, perTensor bool) (weight []byte, scales []float32, err error) {
	if len(w) != out*in {
		return nil, nil, fmt.Errorf("pack fp8: %d values as [%d %d]", len(w), out, in)
	}
	if perTensor {
		scales = []float32{backend.E4M3Scale(w)}
	} else {
		scales = make([]float32, out)
		for o := range out {
			scales[o] = backend.E4M3Scale(w[o*in : (o+1)*in])
		}
	}
	weight = make([]byte, out*in)
	for o := range out {
		inv := 1 / scales[min(o, len(scales)-1)]
		for k, v := range w[o*in : (o+1)*in] {
			weight[o*in+k] = backend.F32ToE4M3(v * inv)
		}
	}
	return weight, scales, nil
}

func u32Bytes(v []uint32) []byte {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], x)
	}
	return b
}

// F32Bytes returns v's little-endian bytes.
func F32Bytes(v []float32) []byte {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
	}
	return b
}
