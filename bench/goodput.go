package bench

import (
	"fmt"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
)

// SLO names, as vLLM's benchmark spells them (ttft, tpot, e2el), and itl.
const (
	SLOTTFT = "ttft" // time to first token
	SLOTPOT = "tpot" // time per output token after the first: (E2E - TTFT) / (tokens - 1), 0 for one token
	SLOE2EL = "e2el" // end-to-end latency
	SLOITL  = "itl"  // trigon's addition: the request's p99 inter-token latency, 0 without two tokens
)

// SLOs are goodput's service level objectives: a bound in milliseconds by
// metric name (SLOTTFT, SLOTPOT, SLOE2EL, SLOITL). A completed request is
// good when it meets every bound given (its metric <= the bound), as in
// vLLM's benchmark (after DistServe); goodput is good requests per second
// of the run.
type SLOs map[string]float64

// ParseGoodput reads "KEY:MS" pairs, vLLM's --goodput syntax; each
// argument may hold several, separated by commas or spaces.
func ParseGoodput(args []string) (SLOs, error) {
	slos := SLOs{}
	for _, arg := range args {
		for _, pair := range strings.FieldsFunc(arg, func(r rune) bool { return r == ',' || r == ' ' || r == '\t' }) {
			key, val, ok := strings.Cut(pair, ":")
			key = strings.ToLower(strings.TrimSpace(key))
			ms, err := strconv.ParseFloat(strings.TrimSpace(val), 64)
			switch {
			case !ok || err != nil:
				return nil, fmt.Errorf("goodput %q: want KEY:MILLISECONDS, e.g. ttft:500", pair)
			case key != SLOTTFT && key != SLOTPOT && key != SLOE2EL && key != SLOITL:
				return nil, fmt.Errorf("goodput %q: the objective must be one of ttft, tpot, e2el, itl", pair)
			case !(ms >= 0) || math.IsInf(ms, 0):
				return nil, fmt.Errorf("goodput %q: the bound must be a non-negative number of milliseconds", pair)
			}
			if _, dup := slos[key]; dup {
				return nil, fmt.Errorf("goodput: %s given twice", key)
			}
			slos[key] = ms
		}
	}
	if len(slos) == 0 {
		return nil, nil
	}
	return slos, nil
}

// String lists the objectives in a fixed order, e.g. "ttft<=500ms itl<=85ms".
func (s SLOs) String() string {
	keys := make([]string, 0, len(s))
	for k := range s {
		keys = append(keys, k)
	}
	order := map[string]int{SLOTTFT: 0, SLOTPOT: 1, SLOITL: 2, SLOE2EL: 3}
	sort.Slice(keys, func(i, j int) bool { return order[keys[i]] < order[keys[j]] })
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k + "<=" + strconv.FormatFloat(s[k], 'g', -1, 64) + "ms"
	}
	return strings.Join(parts, " ")
}

// meets reports whether a completed request meets every objective.
func (s SLOs) meets(rq *serveRequest) bool {
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	for key, bound := range s {
		var v float64
		switch key {
		case SLOTTFT:
			v = ms(rq.ttft)
		case SLOTPOT:
			if rq.outTokens > 1 {
				v = ms(rq.e2e-rq.ttft) / float64(rq.outTokens-1)
			}
		case SLOE2EL:
			v = ms(rq.e2e)
		case SLOITL:
			if len(rq.itl) > 0 {
				itl := make([]float64, len(rq.itl))
				for i, d := range rq.itl {
					itl[i] = ms(d)
				}
				slices.Sort(itl)
				v = Percentile(itl, 99)
			}
		}
		if v > bound {
			return false
		}
	}
	return true
}
