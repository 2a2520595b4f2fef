package backend_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/trigon-llm/trigon/backend"
)

// TestCheckPoolsQuantized runs CheckPools over every quantized format
// with 10 blocks, 2 KV heads of 64: the tensors the format names, each
// in turn with the wrong dtype, the wrong shape, or missing, and side
// tensors the format does not have.
func TestCheckPoolsQuantized(t *testing.T) {
	const nb, kvh, hd = 10, 2, 64
	tn := func(dt backend.DType, shape ...int) backend.Tensor { return &fakeTensor{dt: dt, shape: shape} }
	fp8, int8, int4 := backend.FP8KV(16), backend.Int8KV(16, 32), backend.Int4KV(16, 32, 128)
	type pools struct {
		k, v backend.Tensor
		aux  backend.KVAux
	}
	// good is a correct set of tensors for spec; edit changes one of them.
	good := func(spec backend.KVSpec) pools {
		p := pools{k: tn(spec.DType, nb, kvh, 16, hd), v: tn(spec.DType, nb, kvh, 16, hd)}
		switch spec.Scales {
		case backend.KVScalePerHead:
			p.aux = backend.KVAux{KScale: tn(backend.F32, kvh), VScale: tn(backend.F32, kvh)}
		case backend.KVScaleGroups:
			p.aux = backend.KVAux{KScale: tn(backend.F16, nb, kvh, 16, hd/32), VScale: tn(backend.F16, nb, kvh, 16, hd/32)}
		case backend.KVScaleKIVI:
			p.aux = backend.KVAux{KScale: tn(backend.F16, nb, kvh, 2, hd), VScale: tn(backend.F16, nb, kvh, 16, 2*hd/32),
				KWindow: tn(backend.BF16, 5, kvh, 16, hd), VWindow: tn(backend.BF16, 5, kvh, 16, hd), WindowMap: tn(backend.I32, nb)}
		}
		return p
	}
	for _, c := range []struct {
		name string
		spec backend.KVSpec
		edit func(*pools)
		err  string // "": valid
	}{
		{"fp8 ok", fp8, func(*pools) {}, ""},
		{"fp8 pool dtype", fp8, func(p *pools) { p.k = tn(backend.BF16, nb, kvh, 16, hd) }, "KCache: dtype BF16"},
		{"fp8 v pool dtype", fp8, func(p *pools) { p.v = tn(backend.I8, nb, kvh, 16, hd) }, "VCache: dtype I8"},
		{"fp8 pool shape", fp8, func(p *pools) { p.k, p.v = tn(backend.F8E4M3, nb, kvh, 16, 32), tn(backend.F8E4M3, nb, kvh, 16, 32) }, "KCache: shape"},
		{"fp8 no k scale", fp8, func(p *pools) { p.aux.KScale = nil }, "KScale: nil"},
		{"fp8 no v scale", fp8, func(p *pools) { p.aux.VScale = nil }, "VScale: nil"},
		{"fp8 scale dtype", fp8, func(p *pools) { p.aux.KScale = tn(backend.F16, kvh) }, "KScale: F16"},
		{"fp8 scale per block", fp8, func(p *pools) { p.aux.VScale = tn(backend.F32, nb, kvh) }, "VScale: F32 [10 2]"},
		{"fp8 scale heads", fp8, func(p *pools) { p.aux.KScale = tn(backend.F32, 1) }, "KScale: F32 [1]"},
		{"fp8 window", fp8, func(p *pools) { p.aux.KWindow = tn(backend.BF16, 5, kvh, 16, hd) }, "KWindow: set"},
		{"fp8 window map", fp8, func(p *pools) { p.aux.WindowMap = tn(backend.I32, nb) }, "WindowMap: set"},

		{"int8 ok", int8, func(*pools) {}, ""},
		{"int8 pool dtype", int8, func(p *pools) { p.k, p.v = tn(backend.U4, nb, kvh, 16, hd), tn(backend.U4, nb, kvh, 16, hd) }, "KCache: dtype U4"},
		{"int8 pool blocks", int8, func(p *pools) { p.v = tn(backend.I8, nb+1, kvh, 16, hd) }, "VCache: shape"},
		{"int8 no k scale", int8, func(p *pools) { p.aux.KScale = nil }, "KScale: nil"},
		{"int8 no v scale", int8, func(p *pools) { p.aux.VScale = nil }, "VScale: nil"},
		{"int8 scale dtype", int8, func(p *pools) { p.aux.VScale = tn(backend.F32, nb, kvh, 16, hd/32) }, "VScale: F32"},
		{"int8 scale blocks", int8, func(p *pools) { p.aux.KScale = tn(backend.F16, nb-1, kvh, 16, hd/32) }, "KScale: F16 [9"},
		{"int8 scale groups", int8, func(p *pools) { p.aux.KScale = tn(backend.F16, nb, kvh, 16, hd/16) }, "KScale: F16 [10 2 16 4]"},
		{"int8 per-head scales", int8, func(p *pools) { p.aux.KScale = tn(backend.F32, kvh) }, "KScale"},
		{"int8 window map", int8, func(p *pools) { p.aux.WindowMap = tn(backend.I32, nb) }, "WindowMap: set"},

		{"int4 ok", int4, func(*pools) {}, ""},
		{"int4 pool dtype", int4, func(p *pools) { p.k = tn(backend.I8, nb, kvh, 16, hd) }, "KCache: dtype I8"},
		{"int4 pool heads", int4, func(p *pools) { p.k, p.v = tn(backend.U4, nb, 1, 16, hd), tn(backend.U4, nb, 1, 16, hd) }, "KCache: shape"},
		{"int4 no k scale", int4, func(p *pools) { p.aux.KScale = nil }, "KScale: nil"},
		{"int4 k scale per token", int4, func(p *pools) { p.aux.KScale = tn(backend.F16, nb, kvh, 16, 2*hd/32) }, "KScale: F16 [10 2 16 4]"},
		{"int4 v scale no zero points", int4, func(p *pools) { p.aux.VScale = tn(backend.F16, nb, kvh, 16, hd/32) }, "VScale: F16 [10 2 16 2]"},
		{"int4 no k window", int4, func(p *pools) { p.aux.KWindow = nil }, "KWindow: nil"},
		{"int4 no v window", int4, func(p *pools) { p.aux.VWindow = nil }, "VWindow: nil"},
		{"int4 window dtype", int4, func(p *pools) { p.aux.KWindow = tn(backend.F16, 5, kvh, 16, hd) }, "KWindow: F16"},
		{"int4 window shape", int4, func(p *pools) { p.aux.VWindow = tn(backend.BF16, 5, kvh, 32, hd) }, "VWindow: BF16 [5 2 32 64]"},
		{"int4 window counts differ", int4, func(p *pools) { p.aux.VWindow = tn(backend.BF16, 6, kvh, 16, hd) }, "VWindow: shape [6 2 16 64] differs"},
		{"int4 no window map", int4, func(p *pools) { p.aux.WindowMap = nil }, "WindowMap: nil"},
		{"int4 window map blocks", int4, func(p *pools) { p.aux.WindowMap = tn(backend.I32, nb-1) }, "WindowMap: I32 [9]"},
		{"int4 window map dtype", int4, func(p *pools) { p.aux.WindowMap = tn(backend.F32, nb) }, "WindowMap: F32"},

		{"plain with scales", backend.PlainKV(backend.BF16, 16), func(p *pools) { p.aux.KScale = tn(backend.F32, kvh) }, "KScale: set"},
		{"group not dividing head dim", backend.Int8KV(16, 128), func(*pools) {}, "not a multiple"},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := good(c.spec)
			c.edit(&p)
			n, err := c.spec.CheckPools("op", p.k, p.v, p.aux, kvh, hd)
			if c.err == "" {
				if err != nil || n != nb {
					t.Fatalf("CheckPools = %d, %v; want %d, nil", n, err, nb)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), c.err) || !errors.Is(err, backend.ErrShape) {
				t.Fatalf("CheckPools = %d, %v; want an ErrShape containing %q", n, err, c.err)
			}
		})
	}
}

func TestWithWindowOption(t *testing.T) {
	for _, c := range []struct {
		name   string
		spec   backend.KVSpec
		opt    int
		window int
		err    bool
	}{
		{"int4 default", backend.Int4KV(16, 32, backend.DefaultKVWindow), 0, backend.DefaultKVWindow, false},
		{"int4 none", backend.Int4KV(16, 32, backend.DefaultKVWindow), backend.KVNoWindow, 0, false},
		{"int4 tokens", backend.Int4KV(16, 32, backend.DefaultKVWindow), 48, 48, false},
		{"int4 below none", backend.Int4KV(16, 32, backend.DefaultKVWindow), -2, 0, true},
		{"int8 ignores it", backend.Int8KV(16, 32), 48, 0, false},
		{"fp8 ignores none", backend.FP8KV(16), backend.KVNoWindow, 0, false},
		{"bf16 below none", backend.PlainKV(backend.BF16, 16), -5, 0, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := c.spec.WithWindowOption(c.opt)
			if (err != nil) != c.err {
				t.Fatalf("WithWindowOption(%d): error %v, want error %v", c.opt, err, c.err)
			}
			if err != nil {
				return
			}
			if got.Window != c.window {
				t.Errorf("WithWindowOption(%d): window %d, want %d", c.opt, got.Window, c.window)
			}
			if err := got.Validate(); err != nil {
				t.Errorf("WithWindowOption(%d) = %v: %v", c.opt, got, err)
			}
		})
	}
}
