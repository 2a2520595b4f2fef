package cuda

import (
	"slices"
	"strings"
	"testing"
)

// TestEnvSwitch checks the on/off knobs' parsing: unset keeps the default,
// on and off set it, anything else is an error naming the variable.
func TestEnvSwitch(t *testing.T) {
	const name = "TRIGON_CUDA_TEST_SWITCH"
	for _, tc := range []struct {
		v         string
		def, want bool
		bad       bool
	}{
		{"", true, true, false},
		{"", false, false, false},
		{"on", false, true, false},
		{"off", true, false, false},
		{"ON", true, true, true},
		{"1", false, false, true},
	} {
		t.Setenv(name, tc.v)
		got, err := envSwitch(name, tc.def)
		if got != tc.want || (err != nil) != tc.bad || (err != nil && !strings.Contains(err.Error(), name)) {
			t.Errorf("%q (default %v): %v, %v; want %v, error %v", tc.v, tc.def, got, err, tc.want, tc.bad)
		}
	}
}

// TestEnvChoice checks envChoice with three values: unset gives the
// default, each name its value, anything else the default and an error
// naming the variable and the values in order.
func TestEnvChoice(t *testing.T) {
	const name = "TRIGON_CUDA_TEST_CHOICE"
	choices := []choice[bulkModeT]{{"off", bulkOff}, {"on", bulkTuned}, {"always", bulkAlways}}
	for _, tc := range []struct {
		v    string
		want bulkModeT
		err  string
	}{
		{"", bulkTuned, ""},
		{"off", bulkOff, ""},
		{"on", bulkTuned, ""},
		{"always", bulkAlways, ""},
		{"Always", bulkTuned, `cuda: TRIGON_CUDA_TEST_CHOICE="Always": want off, on or always`},
		{"2", bulkTuned, `want off, on or always`},
	} {
		t.Setenv(name, tc.v)
		got, err := envChoice(name, bulkTuned, choices...)
		if got != tc.want || (err == nil) != (tc.err == "") || (err != nil && !strings.Contains(err.Error(), tc.err)) {
			t.Errorf("%q: %v, %v; want %v, error %q", tc.v, got, err, tc.want, tc.err)
		}
	}
	t.Setenv(name, "x")
	if _, err := envChoice(name, 0, choice[int]{"one", 1}); err == nil || !strings.HasSuffix(err.Error(), "want one") {
		t.Errorf("one choice: %v", err)
	}
}

// TestPDLEnv checks TRIGON_CUDA_PDL's three forms: on/off for every
// launch, a list of kernel names for only those, and errors that name the
// variable for anything else.
func TestPDLEnv(t *testing.T) {
	defer func(e bool, k map[string]bool) { pdlEnabled, pdlKernels = e, k }(pdlEnabled, pdlKernels)
	for _, tc := range []struct {
		v     string
		all   bool
		some  []string
		bad   bool
		wrong string // a name that must not be in the list
	}{
		{v: "", all: false, some: []string{"qkv_rope_bf16", "attn_decode_mma", "attn_decode_combine", "gemvb_bf16", "gemvb_add_bf16", "gemvb_silu_bf16", "gemvb_qkv_rope_bf16", "add_rmsnorm"}, wrong: "gemv_add_bf16"},
		{v: "on", all: true},
		{v: "off", all: false},
		{v: "attn_decode_combine", some: []string{"attn_decode_combine"}, wrong: "gemv_bf16"},
		{v: "attn_decode_combine,gemv_add_bf16", some: []string{"attn_decode_combine", "gemv_add_bf16"}, wrong: "qkv_rope_bf16"},
		{v: "gemv_bf16,", bad: true},
		{v: ",gemv_bf16", bad: true},
		{v: "gemv bf16", bad: true},
		{v: "9gemv", bad: true},
		{v: "ON", bad: true},
	} {
		t.Setenv(pdlEnv, tc.v)
		err := applyPDLEnv()
		if (err != nil) != tc.bad || (err != nil && !strings.Contains(err.Error(), pdlEnv)) {
			t.Fatalf("%q: error %v, want one: %v", tc.v, err, tc.bad)
		}
		if tc.bad {
			continue
		}
		if pdlEnabled != tc.all {
			t.Fatalf("%q: every launch with PDL %v, want %v", tc.v, pdlEnabled, tc.all)
		}
		if (pdlKernels != nil) != (tc.some != nil) || len(pdlKernels) != len(tc.some) {
			t.Fatalf("%q: kernels %v, want %v", tc.v, pdlKernels, tc.some)
		}
		for _, n := range tc.some {
			if !pdlKernels[n] {
				t.Fatalf("%q: %s not in %v", tc.v, n, pdlKernels)
			}
		}
		if tc.wrong != "" && pdlKernels[tc.wrong] {
			t.Fatalf("%q: %s in %v", tc.v, tc.wrong, pdlKernels)
		}
	}
}

// TestParseBulkQKV checks TRIGON_CUDA_GEMV_BULK_QKV's values: off, on,
// and a variant's tag, which must read back as written.
func TestParseBulkQKV(t *testing.T) {
	for _, tc := range []struct {
		v    string
		on   bool
		want bulkConfig
		bad  bool
	}{
		{v: "", on: bulkQKVDefault}, {v: "off"}, {v: "on", on: true},
		{v: "w8_c512_s2_b3", on: true, want: bulkConfig{8, 512, 2, 3}},
		{v: "w4_c1024_s3", on: true, want: bulkConfig{4, 1024, 3, 0}},
		{v: "w8_c100_s2", bad: true}, {v: "yes", bad: true}, {v: "w8_c512_s2_b3x", bad: true},
		{v: "w8_c512_s2_b", bad: true}, {v: "w8_c512_s0", bad: true}, {v: "w0_c512_s2", bad: true},
	} {
		on, c, err := parseBulkQKV(tc.v)
		if tc.bad {
			if err == nil {
				t.Errorf("%q: accepted as %v, %v", tc.v, on, c)
			}
			continue
		}
		if err != nil || on != tc.on || c != tc.want {
			t.Errorf("%q: %v, %+v, %v; want %v, %+v", tc.v, on, c, err, tc.on, tc.want)
		}
	}
}

// TestParseQKVGEMV checks TRIGON_CUDA_QKV_GEMV's values: unset (the
// pinned default), tuner (none pinned) and warps x spans, which must read
// back as written.
func TestParseQKVGEMV(t *testing.T) {
	for _, tc := range []struct {
		v    string
		want gemvConfig
		bad  bool
	}{
		{v: "", want: qkvGEMVDefault}, {v: "tuner"}, {v: "8x2", want: gemvConfig{8, 2}},
		{v: "16x1", want: gemvConfig{16, 1}}, {v: "32x16", want: gemvConfig{32, 16}},
		{v: "0x2", bad: true}, {v: "8x0", bad: true}, {v: "33x1", bad: true}, {v: "8x17", bad: true},
		{v: "8x2x", bad: true}, {v: "08x2", bad: true}, {v: "8", bad: true}, {v: "on", bad: true}, {v: "-8x2", bad: true},
	} {
		c, err := parseQKVGEMV(tc.v)
		if tc.bad {
			if err == nil {
				t.Errorf("%q: accepted as %+v", tc.v, c)
			}
			continue
		}
		if err != nil || c != tc.want {
			t.Errorf("%q: %+v, %v; want %+v", tc.v, c, err, tc.want)
		}
	}
	if qkvGEMVDefault.nw == 0 || !slices.Contains(gemvConfigs, qkvGEMVDefault) {
		t.Errorf("default %+v is not one of the variants compiled at start-up and tested (gemvConfigs)", qkvGEMVDefault)
	}
}

// TestParseBulkPick checks TRIGON_CUDA_BULK_PICK's values: entries of a
// weight's rows x k and a bulk variant's tag, and that bulkPick returns
// an entry's variant for its weight and its own pick for others.
func TestParseBulkPick(t *testing.T) {
	for _, tc := range []struct {
		v    string
		want map[[2]int]bulkConfig
		bad  bool
	}{
		{v: ""},
		{v: "4096x4096=w8_c1024_s3", want: map[[2]int]bulkConfig{{4096, 4096}: {8, 1024, 3, 0}}},
		{v: "4096x4096=w8_c1024_s3,28672x4096=w8_c512_s4_b3",
			want: map[[2]int]bulkConfig{{4096, 4096}: {8, 1024, 3, 0}, {28672, 4096}: {8, 512, 4, 3}}},
		{v: "4096x4096", bad: true}, {v: "4096=w8_c1024_s3", bad: true}, {v: "4096x4096=on", bad: true},
		{v: "4096x4096=off", bad: true}, {v: "4096x4096=w8_c100_s2", bad: true}, {v: "0x4096=w8_c1024_s3", bad: true},
		{v: "4096x4096=w8_c1024_s3,", bad: true}, {v: "04096x4096=w8_c1024_s3", bad: true},
	} {
		got, err := parseBulkPick(tc.v)
		if tc.bad {
			if err == nil {
				t.Errorf("%q: accepted as %v", tc.v, got)
			}
			continue
		}
		if err != nil || len(got) != len(tc.want) {
			t.Errorf("%q: %v, %v; want %v", tc.v, got, err, tc.want)
			continue
		}
		for k, c := range tc.want {
			if got[k] != c {
				t.Errorf("%q: %v: %+v, want %+v", tc.v, k, got[k], c)
			}
		}
	}
	plain := bulkPick(4096, 14336, 132)
	old := bulkPickOverride
	t.Cleanup(func() { bulkPickOverride = old })
	bulkPickOverride = map[[2]int]bulkConfig{{4096, 4096}: {8, 512, 4, 0}}
	if c := bulkPick(4096, 4096, 132); c != (bulkConfig{8, 512, 4, 0}) {
		t.Errorf("bulkPick(4096, 4096) with an override: %+v", c)
	}
	if c := bulkPick(4096, 14336, 132); c != plain {
		t.Errorf("bulkPick(4096, 14336), not overridden: %+v, want %+v", c, plain)
	}
}

// TestParseLaunchEarly checks TRIGON_CUDA_EARLY_LAUNCH's values: unset
// (the default set), on (every kernel that takes the flag), off, a list,
// and errors naming the variable for a malformed list or a kernel without
// the flag.
func TestParseLaunchEarly(t *testing.T) {
	for _, tc := range []struct {
		v    string
		want []string
		bad  bool
	}{
		{v: "", want: []string{"qkv_rope_bf16", "gemvb_silu_bf16"}},
		{v: "off", want: []string{}},
		{v: "on", want: launchEarlyKernels},
		{v: "gemvb_add_bf16", want: []string{"gemvb_add_bf16"}},
		{v: "qkv_rope_bf16,gemvb_bf16", want: []string{"qkv_rope_bf16", "gemvb_bf16"}},
		{v: "attn_decode_mma", want: []string{"attn_decode_mma"}},
		{v: "attn_decode_combine", bad: true},
		{v: "qkv_rope_bf16,", bad: true},
		{v: "ON", bad: true},
	} {
		got, err := parseLaunchEarly(tc.v)
		if tc.bad {
			if err == nil || !strings.Contains(err.Error(), launchEarlyEnv) {
				t.Errorf("%q: %v, %v; want an error naming %s", tc.v, got, err, launchEarlyEnv)
			}
			continue
		}
		if err != nil || len(got) != len(tc.want) {
			t.Errorf("%q: %v, %v; want %v", tc.v, got, err, tc.want)
			continue
		}
		for _, n := range tc.want {
			if !got[n] {
				t.Errorf("%q: %s missing from %v", tc.v, n, got)
			}
		}
	}
}
