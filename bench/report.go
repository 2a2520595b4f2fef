package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"strings"
)

// WriteJSON writes v as one indented JSON object and a newline.
func WriteJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return fmt.Errorf("write JSON: %w", err)
	}
	return nil
}

// WriteText prints the result for people.
func (r *LatencyResult) WriteText(w io.Writer) error {
	var b strings.Builder
	p := func(label, format string, args ...any) {
		fmt.Fprintf(&b, "%-28s %s\n", label, fmt.Sprintf(format, args...))
	}
	dev := r.Backend
	if r.Device != "" {
		dev += " (" + r.Device + ")"
	}
	fmt.Fprintf(&b, "trigon bench latency\n")
	p("  model", "%s, %s weights (%s), %s params, %s", r.Arch, r.WeightDType, r.Weights, count(float64(r.Params)), bytesStr(float64(r.WeightBytes)))
	p("  backend", "%s, KV cache %s (%s pool)", dev, r.KVDType, bytesStr(float64(r.KVPoolBytes)))
	p("  run", "batch %d, input %d, output %d, prefill chunk %d, warmup %d, iters %d, cuda graphs %s",
		r.Batch, r.InputLen, r.OutputLen, r.PrefillChunk, r.Warmup, r.Iters, r.CUDAGraphs)
	b.WriteString("\n")
	p("prefill (TTFT of the batch)", "p50 %s  mean %s  (%s tok/s)", ms(r.PrefillMS.P50), ms(r.PrefillMS.Mean), count(r.PrefillTokensPerS))
	if r.ITLMS.Count > 0 {
		p("decode step (ITL)", "p50 %s  p90 %s  p99 %s  mean %s  (%d steps)", ms(r.ITLMS.P50), ms(r.ITLMS.P90), ms(r.ITLMS.P99), ms(r.ITLMS.Mean), r.ITLMS.Count)
	} else {
		p("decode step (ITL)", "n/a")
	}
	if d := r.DeviceStepMS; d != nil && d.Count > 0 {
		p("decode step, device-timed", "p50 %s  p90 %s  p99 %s  mean %s  (%d intervals between steps' ends)", ms(d.P50), ms(d.P90), ms(d.P99), ms(d.Mean), d.Count)
	}
	if r.QueuedStepMS != nil {
		p("decode step, queued", "%s (the device's time: steps queued back to back, nothing read back)", ms(*r.QueuedStepMS))
	}
	if r.VerifyStepMS != nil && r.VerifyDecodeStepMS != nil {
		p(fmt.Sprintf("verify step (k=%d)", r.VerifyTokens), "p50 %s  mean %s, %s x a decode step timed alike (p50 %s  mean %s); %s form",
			ms(r.VerifyStepMS.P50), ms(r.VerifyStepMS.Mean), opt(r.VerifyRatio, func(v float64) string { return fmt.Sprintf("%.3f", v) }),
			ms(r.VerifyDecodeStepMS.P50), ms(r.VerifyDecodeStepMS.Mean), r.VerifyForm)
		for _, f := range r.VerifyForms {
			p("verify form", "bucket %d x %d rows, width %d: native %.3f ms, flat %.3f ms a replay: flat %v", f.Bucket, f.Query, f.Width, f.NativeMS, f.FlatMS, f.Flat)
		}
	}
	p("decode throughput", "%s", opt(r.DecodeTokensPerS, func(v float64) string { return count(v) + " tok/s" }))
	p("end to end", "p50 %s  mean %s  (%s output tok/s)", ms(r.E2EMS.P50), ms(r.E2EMS.Mean), count(r.OutputTokensPerS))
	if r.DecodeBytesPerStep != nil {
		p("bytes read per decode step", "%s (weights %s + KV %s at the mean context)",
			bytesStr(*r.DecodeBytesPerStep), bytesStr(float64(r.DecodeWeightBytes)), bytesStr(*r.DecodeKVBytes))
	} else {
		p("bytes read per decode step", "n/a (weights %s)", bytesStr(float64(r.DecodeWeightBytes)))
	}
	ceiling := "n/a"
	if r.CopyCeiling != nil {
		ceiling = fmt.Sprintf("%s/s (%s)", bytesStr(*r.CopyCeiling), r.CeilingSource)
	}
	share := ""
	if r.CeilingShare != nil {
		share = fmt.Sprintf(", %.1f%% of the ceiling", 100**r.CeilingShare)
	}
	p("achieved bandwidth", "%s%s", opt(r.AchievedBytesPerS, func(v float64) string { return bytesStr(v) + "/s" }), share)
	p("copy ceiling", "%s", ceiling)
	if r.DecodeFloorMS != nil {
		p("decode floor", "%s per step (bytes / ceiling)", ms(*r.DecodeFloorMS))
		if r.DecodeFloorAllWeightsMS != nil {
			p("decode floor, all weights", "%s per step (every weight byte counted, the whole embedding table too)", ms(*r.DecodeFloorAllWeightsMS))
		}
	} else {
		p("decode floor", "n/a")
	}
	if r.PrefillGEMMFloorMS != nil {
		p("prefill GEMM floor", "%s at %sFLOP/s measured (projections only)", ms(*r.PrefillGEMMFloorMS), count(*r.MatMulFLOPsPerS))
	} else {
		p("prefill GEMM floor", "n/a")
	}
	if r.DecodeGEMMFloorMS != nil {
		p("decode GEMM floor", "%s per step at the same rate (projections only)", ms(*r.DecodeGEMMFloorMS))
	}
	if r.PrefillGEMMFloorSustainedMS != nil {
		p("sustained GEMM floor", "%s at %sFLOP/s held under the power limit", ms(*r.PrefillGEMMFloorSustainedMS), count(*r.MatMulFLOPsPerSSustained))
	}
	for _, n := range r.Notes {
		fmt.Fprintf(&b, "note: %s\n", n)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// ms formats milliseconds with about four significant digits.
func ms(v float64) string {
	switch {
	case math.IsNaN(v):
		return "n/a"
	case v >= 100:
		return fmt.Sprintf("%.1f ms", v)
	case v >= 1:
		return fmt.Sprintf("%.3f ms", v)
	}
	return fmt.Sprintf("%.1f us", v*1e3)
}

// count formats a count or rate with an SI prefix (k, M, G, T).
func count(v float64) string {
	for _, u := range []struct {
		s string
		f float64
	}{{"T", 1e12}, {"G", 1e9}, {"M", 1e6}, {"k", 1e3}} {
		if math.Abs(v) >= u.f {
			return fmt.Sprintf("%.2f %s", v/u.f, u.s)
		}
	}
	return fmt.Sprintf("%.1f", v)
}

// bytesStr formats a byte count in decimal units (GB = 1e9, as bandwidths
// are quoted).
func bytesStr(v float64) string {
	s := count(v)
	if strings.HasSuffix(s, " k") {
		s = strings.TrimSuffix(s, " k") + " K"
	}
	if !strings.ContainsAny(s, "KMGT") {
		return s + " B"
	}
	return s + "B"
}

// opt formats an optional value, "n/a" when nil.
func opt(v *float64, format func(float64) string) string {
	if v == nil {
		return "n/a"
	}
	return format(*v)
}
