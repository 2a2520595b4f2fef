package telemetry

import (
	"testing"
	"time"
)

// TestSpecDecodeMetrics: the spec_decode counters add up the drafts, and
// the per-position counter counts each accepted position once per draft;
// invalid observations are ignored.
func TestSpecDecodeMetrics(t *testing.T) {
	m := NewMetrics()
	m.ObserveSpecDraft(4, 2)
	m.ObserveSpecDraft(4, 4)
	m.ObserveSpecDraft(3, 0)
	m.ObserveSpecDraft(0, 0)  // no draft: ignored
	m.ObserveSpecDraft(2, 3)  // more accepted than proposed: ignored
	m.ObserveSpecDraft(2, -1) // ignored
	m.ObserveSpecDraftTime(3 * time.Millisecond)
	m.ObserveSpecDraftTime(40 * time.Millisecond)
	fams := scrape(t, m)
	for name, want := range map[string]float64{
		"trigon_spec_decode_num_drafts_total":          3,
		"trigon_spec_decode_num_draft_tokens_total":    11,
		"trigon_spec_decode_num_accepted_tokens_total": 6,
	} {
		if got := scalar(t, fams, name, nil); got != want {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
	for pos, want := range []float64{2, 2, 1, 1} {
		got := scalar(t, fams, "trigon_spec_decode_num_accepted_tokens_per_pos_total", map[string]string{SpecPositionLabel: string(rune('0' + pos))})
		if got != want {
			t.Errorf("accepted at position %d = %v, want %v", pos, got, want)
		}
	}
	checkHistogram(t, fams, "trigon_spec_decode_draft_seconds", StepBuckets, []float64{0.003, 0.04})
	var nilM *Metrics
	nilM.ObserveSpecDraft(1, 1)
	nilM.ObserveSpecDraftTime(time.Second)
}
