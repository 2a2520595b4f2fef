package cuda

import (
	"fmt"
	"os"
)

// envSwitch reads an on/off setting of the environment: def when unset,
// and an error naming the variable for anything but "on" or "off". New
// reads every such knob once, so a bad value stops the backend at start.
func envSwitch(name string, def bool) (bool, error) {
	switch v := os.Getenv(name); v {
	case "":
		return def, nil
	case "on":
		return true, nil
	case "off":
		return false, nil
	default:
		return def, fmt.Errorf("cuda: %s=%q: want on or off", name, v)
	}
}
