package cuda

import (
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
		{v: "", all: false, some: []string{"qkv_rope_bf16", "attn_decode_mma", "attn_decode_combine", "gemvb_bf16", "gemvb_add_bf16", "gemvb_silu_bf16", "add_rmsnorm"}, wrong: "gemv_add_bf16"},
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
		{v: "attn_decode_mma", bad: true},
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
