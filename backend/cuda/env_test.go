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
