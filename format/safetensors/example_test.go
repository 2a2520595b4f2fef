package safetensors_test

import (
	"encoding/binary"
	"fmt"
	"log"
	"math"

	"github.com/trigon-llm/trigon/format/safetensors"
)

func ExampleParse() {
	// A file holding one F32 tensor of shape [2] = {1.5, -2}.
	header := `{"__metadata__":{"format":"pt"},"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}`
	file := binary.LittleEndian.AppendUint64(nil, uint64(len(header)))
	file = append(file, header...)
	file = binary.LittleEndian.AppendUint32(file, math.Float32bits(1.5))
	file = binary.LittleEndian.AppendUint32(file, math.Float32bits(-2))

	f, err := safetensors.Parse(file)
	if err != nil {
		log.Fatal(err)
	}
	w, _ := f.Tensor("w")
	second := math.Float32frombits(binary.LittleEndian.Uint32(w.Data[4:]))
	fmt.Println(w.DType, w.Shape, second, f.Metadata()["format"])
	// Output: F32 [2] -2 pt
}
