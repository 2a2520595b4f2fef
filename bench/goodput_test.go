package bench

import (
	"errors"
	"math"
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestParseGoodput(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want SLOs
		err  string
	}{
		{nil, nil, ""},
		{[]string{"ttft:500"}, SLOs{"ttft": 500}, ""},
		{[]string{"ttft:500", "tpot:50", "e2el:1000"}, SLOs{"ttft": 500, "tpot": 50, "e2el": 1000}, ""},
		{[]string{"ttft:1000,itl:85"}, SLOs{"ttft": 1000, "itl": 85}, ""},
		{[]string{"TTFT:0.5 itl:85"}, SLOs{"ttft": 0.5, "itl": 85}, ""},
		{[]string{"e2el:0"}, SLOs{"e2el": 0}, ""},
		{[]string{"ttft"}, nil, "KEY:MILLISECONDS"},
		{[]string{"ttft:fast"}, nil, "KEY:MILLISECONDS"},
		{[]string{"latency:5"}, nil, "one of ttft, tpot, e2el, itl"},
		{[]string{"ttft:-1"}, nil, "non-negative"},
		{[]string{"ttft:inf"}, nil, "non-negative"},
		{[]string{"ttft:1", "ttft:2"}, nil, "twice"},
	} {
		got, err := ParseGoodput(tc.args)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%q: error %v, want one mentioning %q", tc.args, err, tc.err)
			}
			continue
		}
		if err != nil || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%q = %v, %v; want %v", tc.args, got, err, tc.want)
		}
	}
	if s := (SLOs{"itl": 85, "ttft": 1000, "e2el": 9}).String(); s != "ttft<=1000ms itl<=85ms e2el<=9ms" {
		t.Errorf("String() = %q", s)
	}
}

func msDur(v float64) time.Duration { return time.Duration(v * float64(time.Millisecond)) }

// TestGoodputCounts: a request counts when it meets every objective given,
// by vLLM's definitions (TPOT 0 for a one-token reply) and trigon's itl
// (the request's own p99 inter-token latency).
func TestGoodputCounts(t *testing.T) {
	// 100 tokens: TTFT 200 ms, 98 gaps of 20 ms and one of 500 ms, so
	// E2E 200+98*20+500 = 2660 ms and TPOT (2660-200)/99 ms.
	steady := &serveRequest{prompt: []int32{1}, ttft: msDur(200), outTokens: 100}
	for range 98 {
		steady.itl = append(steady.itl, msDur(20))
	}
	steady.itl = append(steady.itl, msDur(500))
	steady.e2e = msDur(2660)
	// p99 of 99 gaps by interpolation: rank 0.99*98 = 97.02, between the
	// 98th (20 ms) and the 99th (500 ms) order statistic.
	stallP99 := 20 + 0.02*480
	one := &serveRequest{prompt: []int32{1}, ttft: msDur(900), e2e: msDur(900), outTokens: 1}
	failed := &serveRequest{prompt: []int32{1}, err: errors.New("status 500")}
	reqs := []*serveRequest{steady, one, failed}
	for _, tc := range []struct {
		slos SLOs
		good int
	}{
		{SLOs{"ttft": 1000}, 2},
		{SLOs{"ttft": 500}, 1},
		{SLOs{"ttft": 199}, 0},
		{SLOs{"tpot": 25}, 2}, // 24.85 ms; the one-token reply counts 0
		{SLOs{"tpot": 24}, 1},
		{SLOs{"e2el": 1000}, 1},
		{SLOs{"e2el": 2660}, 2},
		{SLOs{"itl": stallP99}, 2},
		{SLOs{"itl": stallP99 - 0.1}, 1},
		{SLOs{"ttft": 1000, "itl": 85}, 2},
		{SLOs{"ttft": 1000, "itl": 20}, 1},
		{SLOs{"ttft": 500, "e2el": 1000}, 0},
		// vLLM's tpot is the mean gap, trigon's itl the request's p99:
		// the stall fails the one and not the other.
		{SLOs{"ttft": 1000, "tpot": 25}, 2},
		{SLOs{"ttft": 1000, "tpot": 25, "itl": 25}, 1},
		{SLOs{"ttft": 800, "tpot": 25}, 1},
	} {
		res := &ServeResult{GoodputSLOMS: tc.slos, DurationS: 2}
		summarizeServe(res, reqs)
		if res.GoodRequests == nil || *res.GoodRequests != tc.good || math.Abs(*res.RequestGoodput-float64(tc.good)/2) > 1e-12 {
			t.Errorf("%v: good %v, goodput %v; want %d, %g/s", tc.slos, res.GoodRequests, res.RequestGoodput, tc.good, float64(tc.good)/2)
		}
		if res.Completed != 2 || res.Failed != 1 {
			t.Fatalf("completed %d, failed %d", res.Completed, res.Failed)
		}
	}
	res := &ServeResult{DurationS: 2}
	summarizeServe(res, reqs)
	if res.GoodRequests != nil || res.RequestGoodput != nil {
		t.Error("goodput reported without objectives")
	}
}
