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
