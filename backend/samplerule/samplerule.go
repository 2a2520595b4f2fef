// Package samplerule is the host implementation of backend.SampleRow's
// sampling rule, the one place it is written: the CPU backend's Sample op
// and package sample's host-side pick both call Pick, and the CUDA kernel
// is tested against it.
package samplerule

import (
	"cmp"
	"fmt"
	"math"
	"slices"

	"github.com/trigon-llm/trigon/backend"
)

// The rule, precisely:
//   - Temperature <= 0: argmax, lowest id on ties.
//   - Otherwise each token's unnormalised probability is
//     w = exp(-d) with d = (maxLogit - logit) / Temperature, in f64.
//     Tokens are ordered by logit descending, ties by lower id. Tokens with
//     d >= 745 (w below 1e-323, about to underflow) and -Inf logits are
//     never kept.
//   - TopK > 0 keeps the first TopK tokens.
//   - 0 < TopP < 1 then keeps the smallest prefix whose mass is at least
//     TopP times the mass kept so far (TopP <= 0 or >= 1: off).
//   - MinP > 0 then keeps the tokens with w >= MinP (w of the top token is
//     1, so this is p >= MinP * pMax); at least one token is always kept.
//   - Walking the kept tokens in order, the first whose running mass
//     exceeds U times the kept mass is chosen.
//
// Sorting the whole vocabulary for every token would dominate the cost.
// Instead one pass puts every token into one of up to maxBuckets buckets
// by d = (maxLogit - logit)/Temperature (buckets are ranges of d, so every
// token of a bucket ranks below every token of the buckets before it) and
// sums each bucket's count and mass. The filters and the final pick walk
// whole buckets by their sums and sort only the few buckets a boundary
// falls in. Sums of whole buckets are taken in id order rather than rank
// order; the difference is rounding, below anything a U can resolve.

// dLimit bounds the distances of candidate tokens: exp(-d) > 0 in f64 for
// every d < dLimit.
const dLimit = 745

// maxBuckets bounds the bucket count: enough that a boundary bucket of a
// 150k vocabulary holds tens of tokens, small enough to clear per call.
const maxBuckets = 4096

// Scratch holds the buffers of Pick and Filter so that sampling a
// token does not allocate after the first call. The zero value is ready;
// a scratch must not be used by two goroutines at once.
type Scratch struct {
	count  []int32   // [buckets] tokens per bucket
	mass   []float64 // [buckets] sum of w per bucket, in id order
	start  []int32   // [buckets+1] first rank of each bucket
	sorted []bool    // [buckets] bucket's ranks are in order
	perm   []int32   // [candidates] token ids by rank (within unsorted buckets: by id)
	out    []Candidate
}

// Candidate is a token kept by a row's filters and its renormalised
// probability.
type Candidate struct {
	ID   int32
	Prob float64
}

// ranking is one row's tokens bucketed by rank.
type ranking struct {
	logits  []float32
	max     float64
	invT    float64
	width   float64 // of a bucket, in d
	buckets int
	n       int // candidate tokens (d < dLimit): ranks [0, n)
	minP    int // tokens with w >= MinP
	s       *Scratch
}

// d returns the scaled distance of a logit below the maximum; w = exp(-d).
func (r *ranking) d(l float32) float64 { return (r.max - float64(l)) * r.invT }

// bucketOf returns the bucket of a token with distance d.
func (r *ranking) bucketOf(d float64) int {
	return int(min(float64(r.buckets-1), d/r.width))
}

// rank buckets every candidate token. minLogit is the smallest
// finite logit (it sets the bucket width so that the buckets span the
// row's actual range).
func (s *Scratch) rank(logits []float32, maxLogit, minLogit float32, row backend.SampleRow) ranking {
	r := ranking{logits: logits, max: float64(maxLogit), invT: 1 / float64(row.Temperature), s: s}
	r.buckets = max(1, min(maxBuckets, len(logits)/8))
	span := min(r.d(minLogit), dLimit)
	r.width = span / float64(r.buckets)
	if !(r.width > 0) {
		r.width, r.buckets = 1, 1
	}
	s.count = resize(s.count, r.buckets)
	s.mass = resize(s.mass, r.buckets)
	s.start = resize(s.start, r.buckets+1)
	s.sorted = resize(s.sorted, r.buckets)
	minP := float64(row.MinP)
	for _, l := range logits {
		d := r.d(l)
		if !(d < dLimit) {
			continue
		}
		w := math.Exp(-d)
		b := r.bucketOf(d)
		s.count[b]++
		s.mass[b] += w
		if w >= minP {
			r.minP++
		}
	}
	for b, c := range s.count {
		s.start[b+1] = s.start[b] + c
	}
	r.n = int(s.start[r.buckets])
	s.perm = resize(s.perm, r.n)
	next := s.count // reused as each bucket's fill cursor
	for b := range next {
		next[b] = s.start[b]
	}
	for i, l := range logits {
		if d := r.d(l); d < dLimit {
			b := r.bucketOf(d)
			s.perm[next[b]] = int32(i)
			next[b]++
		}
	}
	return r
}

// resize returns buf with length n and zeroed contents.
func resize[T any](buf []T, n int) []T {
	if cap(buf) < n {
		return make([]T, n)
	}
	buf = buf[:n]
	clear(buf)
	return buf
}

// bucket returns the ranks [lo, hi) of bucket b, sorting it on first use.
func (r *ranking) bucket(b int) (lo, hi int) {
	lo, hi = int(r.s.start[b]), int(r.s.start[b+1])
	if !r.s.sorted[b] {
		slices.SortFunc(r.s.perm[lo:hi], func(x, y int32) int {
			if c := cmp.Compare(r.logits[y], r.logits[x]); c != 0 {
				return c
			}
			return cmp.Compare(x, y)
		})
		r.s.sorted[b] = true
	}
	return lo, hi
}

// at returns the token of a rank.
func (r *ranking) at(rank int) int32 {
	b, _ := slices.BinarySearch(r.s.start[:r.buckets+1], int32(rank)+1)
	r.bucket(b - 1)
	return r.s.perm[rank]
}

func (r *ranking) w(rank int) float64 { return math.Exp(-r.d(r.logits[r.s.perm[rank]])) }

// mass returns the mass of ranks [0, n).
func (r *ranking) mass(n int) float64 {
	var m float64
	for b := 0; b < r.buckets && int(r.s.start[b]) < n; b++ {
		if int(r.s.start[b+1]) <= n {
			m += r.s.mass[b]
			continue
		}
		lo, _ := r.bucket(b)
		for j := lo; j < n; j++ {
			m += r.w(j)
		}
	}
	return m
}

// cross returns the first rank j < n whose running mass reaches target
// (exceeds it when strict), or n-1 when rounding leaves it unreached.
func (r *ranking) cross(target float64, n int, strict bool) int {
	reached := func(cum float64) bool { return cum > target || (!strict && cum == target) }
	var cum float64
	for b := 0; b < r.buckets && int(r.s.start[b]) < n; b++ {
		if int(r.s.start[b+1]) <= n && !reached(cum+r.s.mass[b]) {
			cum += r.s.mass[b]
			continue
		}
		lo, hi := r.bucket(b)
		for j := lo; j < min(hi, n); j++ {
			if cum += r.w(j); reached(cum) {
				return j
			}
		}
	}
	return n - 1
}

// keep applies the row's filters: the kept tokens are ranks [0, n), of
// total mass m.
func (r *ranking) keep(row backend.SampleRow) (n int, m float64) {
	n = r.n
	if row.TopK > 0 {
		n = min(n, row.TopK)
	}
	m = r.mass(n)
	trimmed := false
	if row.TopP > 0 && row.TopP < 1 {
		n = r.cross(float64(row.TopP)*m, n, false) + 1
		trimmed = true
	}
	if row.MinP > 0 && r.minP < n {
		n = max(1, r.minP)
		trimmed = true
	}
	if trimmed {
		m = r.mass(n)
	}
	return n, m
}

// checkRow rejects rules that have no meaning.
func checkRow(r backend.SampleRow) error {
	t := float64(r.Temperature)
	if math.IsNaN(t) || math.IsInf(t, 0) {
		return fmt.Errorf("sample: temperature %v is not finite", r.Temperature)
	}
	if t <= 0 {
		return nil
	}
	switch {
	case r.TopK < 0:
		return fmt.Errorf("sample: top-k %d is negative", r.TopK)
	case math.IsNaN(float64(r.TopP)):
		return fmt.Errorf("sample: top-p is NaN")
	case !(r.MinP >= 0):
		return fmt.Errorf("sample: min-p %v is not a non-negative number", r.MinP)
	case !(r.U >= 0 && r.U < 1):
		return fmt.Errorf("sample: U %v is outside [0, 1)", r.U)
	}
	return nil
}

// scan returns the largest logit with its lowest index and the smallest
// finite logit, rejecting rows that hold NaN, +Inf or nothing finite.
func scan(logits []float32) (hi float32, arg int32, lo float32, err error) {
	if len(logits) == 0 {
		return 0, 0, 0, fmt.Errorf("sample: empty logits row")
	}
	hi, lo, arg = float32(math.Inf(-1)), float32(math.Inf(1)), -1
	for i, l := range logits {
		if l != l || l > math.MaxFloat32 {
			return 0, 0, 0, fmt.Errorf("sample: logit %d is %v", i, l)
		}
		if l > hi {
			hi, arg = l, int32(i)
		}
		if l < lo && l >= -math.MaxFloat32 {
			lo = l
		}
	}
	if arg < 0 {
		return 0, 0, 0, fmt.Errorf("sample: every logit is -Inf")
	}
	return hi, arg, lo, nil
}

// Pick chooses one token from a row of logits by the rule of
// backend.SampleRow (spelled out at the top of this file). s may be nil
// (then buffers are allocated).
func Pick(logits []float32, row backend.SampleRow, s *Scratch) (int32, error) {
	if err := checkRow(row); err != nil {
		return -1, err
	}
	hi, arg, lo, err := scan(logits)
	if err != nil {
		return -1, err
	}
	if row.Temperature <= 0 {
		return arg, nil
	}
	if s == nil {
		s = new(Scratch)
	}
	r := s.rank(logits, hi, lo, row)
	n, m := r.keep(row)
	return r.at(r.cross(float64(row.U)*m, n, true)), nil
}

// Filter returns the tokens row keeps from logits, in the rule's order,
// with probabilities renormalised over the kept set. Greedy rows keep their
// argmax with probability 1. The result aliases s (allocated when nil) and
// is valid until s is used again.
func Filter(logits []float32, row backend.SampleRow, s *Scratch) ([]Candidate, error) {
	if err := checkRow(row); err != nil {
		return nil, err
	}
	hi, arg, lo, err := scan(logits)
	if err != nil {
		return nil, err
	}
	if s == nil {
		s = new(Scratch)
	}
	if row.Temperature <= 0 {
		s.out = append(s.out[:0], Candidate{ID: arg, Prob: 1})
		return s.out, nil
	}
	r := s.rank(logits, hi, lo, row)
	n, m := r.keep(row)
	s.out = s.out[:0]
	for b := 0; b < r.buckets && int(s.start[b]) < n; b++ {
		lo, hi := r.bucket(b)
		for j := lo; j < min(hi, n); j++ {
			s.out = append(s.out, Candidate{ID: s.perm[j], Prob: r.w(j) / m})
		}
	}
	return s.out, nil
}
