package cuda

import (
	"fmt"
	"os"
	"strings"
)

// envSwitch reads an on/off setting of the environment: def when unset,
// and an error naming the variable for anything but "on" or "off". New
// reads every such knob once, so a bad value stops the backend at start.
func envSwitch(name string, def bool) (bool, error) {
	return envChoice(name, def, choice[bool]{"on", true}, choice[bool]{"off", false})
}

// choice is one value an environment setting accepts and what it means.
type choice[T any] struct {
	name string
	v    T
}

// envChoice reads a setting with a fixed set of values: def when unset,
// the meaning of the value given, or def and an error naming the variable
// and the accepted values (in the order given).
func envChoice[T any](name string, def T, choices ...choice[T]) (T, error) {
	v := os.Getenv(name)
	if v == "" {
		return def, nil
	}
	names := make([]string, len(choices))
	for i, c := range choices {
		if c.name == v {
			return c.v, nil
		}
		names[i] = c.name
	}
	want := names[len(names)-1]
	if len(names) > 1 {
		want = strings.Join(names[:len(names)-1], ", ") + " or " + want
	}
	return def, fmt.Errorf("cuda: %s=%q: want %s", name, v, want)
}
