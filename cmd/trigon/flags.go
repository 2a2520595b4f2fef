package main

import "fmt"

// intFlag is a numeric flag's value with the least value it takes.
type intFlag struct {
	name  string // without the dashes
	value int64
	min   int64
	want  string // what the flag takes, for the error
}

// checkInts returns an error naming the first flag below its least
// value, before any model is read.
func checkInts(flags ...intFlag) error {
	for _, f := range flags {
		if f.value < f.min {
			return fmt.Errorf("--%s %d: want %s", f.name, f.value, f.want)
		}
	}
	return nil
}
