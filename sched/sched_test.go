package sched_test

import (
	"errors"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/trigon-llm/trigon/kvcache"
	"github.com/trigon-llm/trigon/sched"
)

func newPool(t *testing.T, blocks, bs int) *kvcache.Pool {
	t.Helper()
	p, err := kvcache.NewPool(kvcache.Options{NumBlocks: blocks, BlockSize: bs, EnablePrefixCache: true})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestNewConfig(t *testing.T) {
	pool := newPool(t, 9, 4)
	for _, tc := range []struct {
		name    string
		cfg     sched.Config
		pool    *kvcache.Pool
		wantErr string
	}{
		{"ok", sched.Config{MaxNumSeqs: 4, MaxNumBatchedTokens: 16}, pool, ""},
		{"chunk above budget is clamped", sched.Config{MaxNumSeqs: 4, MaxNumBatchedTokens: 16, ChunkSize: 99}, pool, ""},
		{"nil pool", sched.Config{MaxNumSeqs: 4, MaxNumBatchedTokens: 16}, nil, "nil pool"},
		{"no seqs", sched.Config{MaxNumSeqs: 0, MaxNumBatchedTokens: 16}, pool, "MaxNumSeqs"},
		{"budget below seqs", sched.Config{MaxNumSeqs: 4, MaxNumBatchedTokens: 3}, pool, "MaxNumBatchedTokens"},
		{"negative chunk", sched.Config{MaxNumSeqs: 4, MaxNumBatchedTokens: 16, ChunkSize: -1}, pool, "ChunkSize"},
		{"unknown policy", sched.Config{MaxNumSeqs: 4, MaxNumBatchedTokens: 16, Policy: 7}, pool, "policy"},
		{"mixed caps", sched.Config{MaxNumSeqs: 4, MaxNumBatchedTokens: 16, MixedCap: []int{0, 1, 5, 9}}, pool, ""},
		{"mixed cap 0 beside decodes", sched.Config{MaxNumSeqs: 4, MaxNumBatchedTokens: 16, MixedCap: []int{0, 3, 0}}, pool, "MixedCap[2]"},
		{"negative mixed cap", sched.Config{MaxNumSeqs: 4, MaxNumBatchedTokens: 16, MixedCap: []int{0, -1}}, pool, "MixedCap[1]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := sched.New(tc.cfg, tc.pool)
			if tc.wantErr == "" {
				if err != nil || s == nil {
					t.Fatalf("New: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("err = %v, want one containing %q", err, tc.wantErr)
			}
		})
	}
}

// TestChunkClamp: a chunk size above the budget behaves as the budget.
func TestChunkClamp(t *testing.T) {
	s, err := sched.New(sched.Config{MaxNumSeqs: 2, MaxNumBatchedTokens: 8, ChunkSize: 99}, newPool(t, 9, 4))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Add(sched.Request{ID: 1, Prompt: make([]int32, 20), MaxTokens: 1}); err != nil {
		t.Fatal(err)
	}
	if p := s.Schedule(); len(p.Seqs) != 1 || len(p.Seqs[0].Tokens) != 8 {
		t.Fatalf("plan %+v", p)
	}
}

func TestAddRejects(t *testing.T) {
	for _, tc := range []struct {
		name  string
		req   sched.Request
		is    error
		valid bool
	}{
		{"fits exactly", sched.Request{ID: 1, Prompt: make([]int32, 30), MaxTokens: 3}, nil, true},
		{"one token too many", sched.Request{ID: 1, Prompt: make([]int32, 30), MaxTokens: 4}, sched.ErrTooLarge, false},
		{"overflowing max tokens", sched.Request{ID: 1, Prompt: make([]int32, 3), MaxTokens: math.MaxInt}, nil, false},
		{"too many samples", sched.Request{ID: 1, Prompt: make([]int32, 3), MaxTokens: 1, Forks: []sched.SeqID{2, 3, 4, 5}}, sched.ErrTooLarge, false},
		{"fork id equals request id", sched.Request{ID: 1, Prompt: make([]int32, 3), MaxTokens: 1, Forks: []sched.SeqID{1}}, nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := sched.New(sched.Config{MaxNumSeqs: 4, MaxNumBatchedTokens: 16}, newPool(t, 9, 4))
			if err != nil {
				t.Fatal(err)
			}
			err = s.Add(tc.req)
			if tc.valid != (err == nil) {
				t.Fatalf("Add: %v", err)
			}
			if tc.is != nil && !errors.Is(err, tc.is) {
				t.Fatalf("err = %v, want %v", err, tc.is)
			}
			want := 0
			if tc.valid {
				want = 1
			}
			if s.NumWaiting() != want {
				t.Fatalf("%d waiting, want %d", s.NumWaiting(), want)
			}
		})
	}
}

// TestAppendSlots compares the runner's slot mapping with one built the
// other way round: by walking every block of the table in order.
func TestAppendSlots(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for _, bs := range []int{1, 4, 16} {
		for range 50 {
			nb := 1 + rng.IntN(8)
			blocks := make([]kvcache.BlockID, nb)
			for i := range blocks {
				blocks[i] = kvcache.BlockID(1 + rng.IntN(1000))
			}
			var slotOf []int32 // position -> slot, by enumeration
			for _, b := range blocks {
				for off := range bs {
					slotOf = append(slotOf, int32(int(b)*bs+off))
				}
			}
			start := rng.IntN(nb * bs)
			n := 1 + rng.IntN(nb*bs-start)
			e := sched.ScheduledSeq{Tokens: make([]int32, n), Start: start, Blocks: blocks}
			got := e.AppendSlots([]int32{-7}, bs)
			if got[0] != -7 || len(got) != n+1 {
				t.Fatalf("AppendSlots did not append: %v", got)
			}
			for i, slot := range got[1:] {
				if slot != slotOf[start+i] {
					t.Fatalf("block size %d, blocks %v: slot of position %d = %d, want %d", bs, blocks, start+i, slot, slotOf[start+i])
				}
			}
		}
	}
}

func TestStrings(t *testing.T) {
	for _, tc := range []struct{ got, want string }{
		{sched.FCFS.String(), "fcfs"},
		{sched.Priority.String(), "priority"},
		{sched.Policy(9).String(), "Policy(9)"},
		{sched.FinishStop.String(), "stop"},
		{sched.FinishLength.String(), "length"},
		{sched.FinishError.String(), "error"},
		{sched.FinishReason(0).String(), "FinishReason(0)"},
	} {
		if tc.got != tc.want {
			t.Errorf("%q, want %q", tc.got, tc.want)
		}
	}
}
