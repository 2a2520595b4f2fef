package cuda

import (
	"os"
	"testing"
)

func TestDevPtxas(t *testing.T) {
	if os.Getenv("DEV_PTXAS") == "" {
		t.Skip()
	}
	nv, _ := loadNVRTC()
	for _, s := range []modSpec{
		{file: "attention", p: [6]int{128, 16, 8}},
		{file: "attention", p: [6]int{64, 16, 4}},
		{file: "sample"},
		{file: "quant", p: [6]int{4, 3}},
		{file: "quant", p: [6]int{5, 1}},
		{file: "rope", p: [6]int{128, 16, 3, 3, 3}},
	} {
		src, hs, _ := source(s.file)
		opts := append([]string{"--gpu-architecture=sm_90", "-std=c++17", "-Xptxas=-v"}, s.defines()...)
		_, log, err := nv.compile(s.file+".cu", src, hs, opts, true)
		t.Logf("%v err=%v\n%s", s, err, log)
	}
}
