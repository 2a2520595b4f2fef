package safetensors

import (
	"path/filepath"
	"testing"
)

func TestWriteRoundTrip(t *testing.T) {
	path := filepath.Join(t.TempDir(), "m.safetensors")
	in := []TensorInfo{
		{Name: "a", DType: "F8_E4M3", Shape: []int{2, 3}, Data: []byte{1, 2, 3, 4, 5, 6}},
		{Name: "b", DType: "I32", Shape: []int{1}, Data: []byte{7, 0, 0, 0}},
		{Name: "s", DType: "F32", Data: []byte{0, 0, 128, 63}},
	}
	if err := Write(path, in, map[string]string{"format": "pt"}); err != nil {
		t.Fatal(err)
	}
	f, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, want := range in {
		got, ok := f.Tensor(want.Name)
		if !ok || got.DType != want.DType || len(got.Shape) != len(want.Shape) || string(got.Data) != string(want.Data) {
			t.Errorf("%s: got %+v, want %+v", want.Name, got, want)
		}
	}
	if f.Metadata()["format"] != "pt" {
		t.Errorf("metadata %v", f.Metadata())
	}
	for _, bad := range [][]TensorInfo{
		{{Name: "x", DType: "F32", Shape: []int{2}, Data: make([]byte, 4)}},
		{{Name: "x", DType: "Q4", Shape: []int{1}, Data: make([]byte, 1)}},
		{{Name: "x", DType: "U8", Shape: []int{1}, Data: []byte{1}}, {Name: "x", DType: "U8", Shape: []int{1}, Data: []byte{1}}},
	} {
		if err := Write(path, bad, nil); err == nil {
			t.Errorf("%+v: no error", bad)
		}
	}
}
