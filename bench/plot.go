package bench

import (
	"errors"
	"fmt"
	"image/color"
	"io"
	"math"
	"strconv"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// Plot size and line colours (colour-blind-safe Okabe-Ito hues).
const plotWidth, plotHeight = 12 * vg.Inch, 8 * vg.Inch

var (
	plotBlue   = color.RGBA{R: 0, G: 114, B: 178, A: 255}
	plotOrange = color.RGBA{R: 230, G: 159, B: 0, A: 255}
	plotGreen  = color.RGBA{R: 0, G: 158, B: 115, A: 255}
	plotRed    = color.RGBA{R: 213, G: 94, B: 0, A: 255}
)

// WritePlot draws the sweep's throughput-latency curve as a PNG: output
// tokens/s, request throughput and goodput, TTFT and ITL (p50 and p99,
// with the goodput objectives as dashed lines) against the request rate.
func (s *SweepResult) WritePlot(w io.Writer) error {
	if len(s.Points) < 2 {
		return errors.New("plot: a curve needs at least two request rates")
	}
	rates := make([]float64, len(s.Points))
	for i, r := range s.Points {
		rates[i] = float64(r.RequestRate)
		if math.IsInf(rates[i], 0) || !(rates[i] > 0) {
			return fmt.Errorf("plot: request rate %v cannot be plotted", r.RequestRate)
		}
	}
	first := s.Points[0]
	series := func(f func(*ServeResult) (float64, bool)) plotter.XYs {
		var xy plotter.XYs
		for i, r := range s.Points {
			if v, ok := f(r); ok && !math.IsNaN(v) {
				xy = append(xy, plotter.XY{X: rates[i], Y: v})
			}
		}
		return xy
	}
	title := fmt.Sprintf("input %s, output %s, %d prompts a rate", first.InputLen, first.OutputLen, first.NumPrompts)

	tput := newRatePlot("Output throughput", "output tokens/s", rates)
	tokS := series(func(r *ServeResult) (float64, bool) { return r.OutputTokensPerS, true })
	if err := addLine(tput, "output tok/s", plotBlue, false, tokS); err != nil {
		return err
	}
	headroom(tput, tokS)
	reqs := newRatePlot("Requests completed per second", "requests/s", rates)
	reqS := series(func(r *ServeResult) (float64, bool) { return r.RequestsPerS, true })
	if err := addLine(reqs, "request throughput", plotBlue, false, reqS); err != nil {
		return err
	}
	if first.GoodputSLOMS != nil {
		reqs.Title.Text = "Throughput and goodput (" + first.GoodputSLOMS.String() + ")"
		good := series(func(r *ServeResult) (float64, bool) {
			if r.RequestGoodput == nil {
				return 0, false
			}
			return *r.RequestGoodput, true
		})
		if err := addLine(reqs, "goodput", plotGreen, false, good); err != nil {
			return err
		}
	}
	// Through every rate: on a log rate axis y = x is not a straight line.
	offered := series(func(r *ServeResult) (float64, bool) { return float64(r.RequestRate), true })
	if err := addLine(reqs, "offered rate", color.Gray{Y: 150}, true, offered); err != nil {
		return err
	}
	headroom(reqs, append(reqS, offered...))
	latency := func(name, slo string, get func(*ServeResult) Summary) (*plot.Plot, error) {
		p := newRatePlot(name, "ms", rates)
		p50 := series(func(r *ServeResult) (float64, bool) { s := get(r); return s.P50, s.Count > 0 })
		p99 := series(func(r *ServeResult) (float64, bool) { s := get(r); return s.P99, s.Count > 0 })
		if err := addLine(p, "p50", plotBlue, false, p50); err != nil {
			return nil, err
		}
		if err := addLine(p, "p99", plotRed, false, p99); err != nil {
			return nil, err
		}
		all := append(p50, p99...)
		if bound, ok := first.GoodputSLOMS[slo]; ok {
			line := plotter.XYs{{X: rates[0], Y: bound}, {X: rates[len(rates)-1], Y: bound}}
			if err := addLine(p, slo+" objective", plotOrange, true, line); err != nil {
				return nil, err
			}
			all = append(all, line...)
		}
		if !logScale(p, all) {
			headroom(p, all)
		}
		return p, nil
	}
	ttft, err := latency("Time to first token", SLOTTFT, func(r *ServeResult) Summary { return r.TTFTMS })
	if err != nil {
		return err
	}
	itl, err := latency("Inter-token latency", SLOITL, func(r *ServeResult) Summary { return r.ITLMS })
	if err != nil {
		return err
	}

	img := vgimg.New(plotWidth, plotHeight)
	dc := draw.New(img)
	top := draw.Crop(dc, 0, 0, 0, -vg.Points(24))
	head := plot.New()
	head.HideAxes()
	head.Title.Text = "trigon bench serve: " + title
	head.Title.TextStyle.Font.Size = vg.Points(14)
	head.Draw(draw.Crop(dc, 0, 0, plotHeight-vg.Points(28), 0))
	grid := [][]*plot.Plot{{tput, reqs}, {ttft, itl}}
	tiles := draw.Tiles{Rows: 2, Cols: 2, PadTop: vg.Points(8), PadBottom: vg.Points(8), PadLeft: vg.Points(8), PadRight: vg.Points(12), PadX: vg.Points(24), PadY: vg.Points(24)}
	canvases := plot.Align(grid, tiles, top)
	for j := range grid {
		for i := range grid[j] {
			grid[j][i].Draw(canvases[j][i])
		}
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(w); err != nil {
		return fmt.Errorf("plot: write PNG: %w", err)
	}
	return nil
}

// newRatePlot is a panel with the request rates on its x axis, ticked at
// each rate.
func newRatePlot(title, ylabel string, rates []float64) *plot.Plot {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = "request rate (requests/s)"
	p.Y.Label.Text = ylabel
	p.Y.Min = 0
	p.Y.Tick.Marker = niceTicks{}
	ticks := make([]plot.Tick, len(rates))
	for i, r := range rates {
		ticks[i] = plot.Tick{Value: r, Label: strconv.FormatFloat(r, 'g', 4, 64)}
	}
	p.X.Tick.Marker = plot.ConstantTicks(ticks)
	if rates[len(rates)-1] >= 4*rates[0] {
		p.X.Scale = plot.LogScale{}
	}
	p.Add(plotter.NewGrid())
	p.Legend.Top = true
	p.Legend.Left = true
	return p
}

// addLine adds a line with point markers (dashed, without markers, for
// reference lines) to p.
func addLine(p *plot.Plot, name string, c color.Color, dashed bool, xy plotter.XYs) error {
	if len(xy) == 0 {
		return nil
	}
	l, err := plotter.NewLine(xy)
	if err != nil {
		return fmt.Errorf("plot %s: %w", name, err)
	}
	l.Color = c
	l.Width = vg.Points(1.5)
	p.Add(l)
	p.Legend.Add(name, l)
	if dashed {
		l.Dashes = []vg.Length{vg.Points(5), vg.Points(4)}
		return nil
	}
	sc, err := plotter.NewScatter(xy)
	if err != nil {
		return fmt.Errorf("plot %s: %w", name, err)
	}
	sc.Color = c
	sc.Shape = draw.CircleGlyph{}
	sc.Radius = vg.Points(3)
	p.Add(sc)
	return nil
}

// logScale puts p's y axis on a log scale when its values are positive
// and span more than 20x: latency under overload grows by orders of
// magnitude, and on a linear axis the rates the server keeps up with would
// lie flat at zero.
func logScale(p *plot.Plot, xy plotter.XYs) bool {
	lo, hi := math.Inf(1), 0.0
	for _, v := range xy {
		lo, hi = min(lo, v.Y), max(hi, v.Y)
	}
	if !(lo > 0) || hi < 20*lo {
		return false
	}
	p.Y.Min, p.Y.Max = lo/2, hi*6 // the top decade or so for the legend
	p.Y.Scale = plot.LogScale{}
	p.Y.Tick.Marker = plot.LogTicks{Prec: -1}
	return true
}

// headroom raises a linear y axis a third above the data, so the legend
// in the top left corner does not cover the first points.
func headroom(p *plot.Plot, xy plotter.XYs) {
	hi := 0.0
	for _, v := range xy {
		hi = max(hi, v.Y)
	}
	if hi > 0 {
		p.Y.Max = hi * 1.35
	}
}

// niceTicks labels a linear axis at 1, 2 or 5 times a power of ten, four
// to ten of them, printed with the decimals the step needs.
type niceTicks struct{}

// Ticks implements plot.Ticker.
func (niceTicks) Ticks(lo, hi float64) []plot.Tick {
	if !(hi > lo) {
		return plot.DefaultTicks{}.Ticks(lo, hi)
	}
	step := math.Pow(10, math.Floor(math.Log10((hi-lo)/4)))
	for _, m := range []float64{1, 2, 5, 10} {
		if (hi-lo)/(step*m) <= 10 {
			step *= m
			break
		}
	}
	prec := max(0, int(-math.Floor(math.Log10(step)))) // decimals the step needs
	first := math.Ceil(lo / step)
	var ticks []plot.Tick
	for i := 0.0; ; i++ {
		v := (first + i) * step
		if v > hi+step*1e-9 {
			break
		}
		ticks = append(ticks, plot.Tick{Value: v, Label: strconv.FormatFloat(v, 'f', prec, 64)})
		if m := v + step/2; m <= hi { // an unlabelled tick between
			ticks = append(ticks, plot.Tick{Value: m})
		}
	}
	return ticks
}
