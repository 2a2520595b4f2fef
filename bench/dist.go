package bench

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
)

// MaxLength bounds every length a distribution may produce (tokens): far
// above any context, low enough that a typo cannot ask for terabytes.
const MaxLength = 1 << 20

// LengthDist is a distribution of prompt or output lengths in tokens.
// ParseLengthDist reads its text form:
//
//	512, fixed:512      always 512
//	uniform:128-1024    uniform over 128..1024, both ends included
//	normal:512,128      mean 512, standard deviation 128, rounded to the
//	                    nearest integer and clamped to 1..MaxLength
type LengthDist struct {
	kind string  // "fixed", "uniform" or "normal"
	a, b float64 // fixed: a; uniform: a..b; normal: mean a, stddev b
}

// FixedLength is the distribution that always gives n.
func FixedLength(n int) LengthDist { return LengthDist{kind: "fixed", a: float64(n)} }

// ParseLengthDist parses the forms listed on LengthDist.
func ParseLengthDist(s string) (LengthDist, error) {
	kind, arg, found := strings.Cut(strings.TrimSpace(s), ":")
	if !found {
		kind, arg = "fixed", kind
	}
	bad := func(why string) (LengthDist, error) {
		return LengthDist{}, fmt.Errorf("length distribution %q: %s (want N, fixed:N, uniform:LO-HI or normal:MEAN,STDDEV)", s, why)
	}
	length := func(v string) (int, error) {
		n, err := strconv.Atoi(strings.TrimSpace(v))
		if err != nil {
			return 0, fmt.Errorf("%q is not an integer", v)
		}
		if n < 1 || n > MaxLength {
			return 0, fmt.Errorf("%d is outside 1..%d", n, MaxLength)
		}
		return n, nil
	}
	switch strings.ToLower(kind) {
	case "fixed":
		n, err := length(arg)
		if err != nil {
			return bad(err.Error())
		}
		return FixedLength(n), nil
	case "uniform":
		l, h, ok := strings.Cut(arg, "-")
		if !ok {
			return bad("uniform needs LO-HI")
		}
		lo, err := length(l)
		if err != nil {
			return bad(err.Error())
		}
		hi, err := length(h)
		if err != nil {
			return bad(err.Error())
		}
		if lo > hi {
			return bad(fmt.Sprintf("low end %d is above high end %d", lo, hi))
		}
		return LengthDist{kind: "uniform", a: float64(lo), b: float64(hi)}, nil
	case "normal":
		m, sd, ok := strings.Cut(arg, ",")
		if !ok {
			return bad("normal needs MEAN,STDDEV")
		}
		mean, err := strconv.ParseFloat(strings.TrimSpace(m), 64)
		if err != nil || !(mean >= 1 && mean <= MaxLength) {
			return bad(fmt.Sprintf("mean %q must be a number in 1..%d", m, MaxLength))
		}
		std, err := strconv.ParseFloat(strings.TrimSpace(sd), 64)
		if err != nil || !(std >= 0 && std <= MaxLength) {
			return bad(fmt.Sprintf("standard deviation %q must be a number in 0..%d", sd, MaxLength))
		}
		return LengthDist{kind: "normal", a: mean, b: std}, nil
	}
	return bad(fmt.Sprintf("unknown kind %q", kind))
}

// Sample draws one length.
func (d LengthDist) Sample(r *rand.Rand) int {
	switch d.kind {
	case "uniform":
		lo, hi := int(d.a), int(d.b)
		return lo + r.IntN(hi-lo+1)
	case "normal":
		v := math.Round(d.a + d.b*r.NormFloat64())
		return int(min(max(v, 1), MaxLength))
	}
	return int(d.a)
}

// Max is the largest length d can give.
func (d LengthDist) Max() int {
	switch d.kind {
	case "uniform":
		return int(d.b)
	case "normal":
		return MaxLength
	}
	return int(d.a)
}

// Mean is d's expected length (before clamping, for normal).
func (d LengthDist) Mean() float64 {
	if d.kind == "uniform" {
		return (d.a + d.b) / 2
	}
	return d.a
}

// String is the form ParseLengthDist reads.
func (d LengthDist) String() string {
	switch d.kind {
	case "uniform":
		return fmt.Sprintf("uniform:%d-%d", int(d.a), int(d.b))
	case "normal":
		return "normal:" + strconv.FormatFloat(d.a, 'g', -1, 64) + "," + strconv.FormatFloat(d.b, 'g', -1, 64)
	case "fixed":
		return fmt.Sprintf("fixed:%d", int(d.a))
	}
	return "unset"
}

// MarshalText makes LengthDist print as its text form in JSON.
func (d LengthDist) MarshalText() ([]byte, error) { return []byte(d.String()), nil }
