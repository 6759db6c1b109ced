package benchmark

import (
	"fmt"
	"io"
	"math"
	"strings"

	"github.com/cockroachdb/errors"
)

// WriteLatencySVG draws the latency distributions of a latency report as
// cumulative curves (percentile over latency on a log scale), one colour per
// target rate, annals solid and raw PostgreSQL dashed.
func WriteLatencySVG(w io.Writer, rep *LatencyReport) error {
	if rep == nil || len(rep.Results) == 0 {
		return errors.New("benchmark: no latency results to plot")
	}
	const (
		width, height = 760, 440
		left, right   = 70, 190
		top, bottom   = 40, 60
	)
	plotW, plotH := float64(width-left-right), float64(height-top-bottom)
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, r := range rep.Results {
		for _, l := range []Latencies{r.Annals, r.Raw} {
			for _, q := range l.Quantiles {
				if q > 0 {
					lo, hi = math.Min(lo, q), math.Max(hi, q)
				}
			}
		}
	}
	if math.IsInf(lo, 1) {
		return errors.New("benchmark: the latency results hold no samples")
	}
	lo = math.Pow(10, math.Floor(math.Log10(lo)))
	hi = math.Pow(10, math.Ceil(math.Log10(hi)))
	x := func(v float64) float64 {
		v = math.Max(v, lo)
		return float64(left) + plotW*(math.Log10(v)-math.Log10(lo))/(math.Log10(hi)-math.Log10(lo))
	}
	y := func(pct float64) float64 { return float64(top) + plotH*(1-pct/100) }

	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="12">`+"\n", width, height)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="white"/>`+"\n", width, height)
	fmt.Fprintf(&b, `<text x="%d" y="22" font-size="14">End-to-end latency (append → handler start), cumulative</text>`+"\n", left)
	// Axes and grid.
	for d := lo; d <= hi*1.0001; d *= 10 {
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#ddd"/>`+"\n", x(d), top, x(d), height-bottom)
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">%g ms</text>`+"\n", x(d), height-bottom+18, d)
	}
	for _, p := range []float64{0, 25, 50, 75, 90, 99} {
		fmt.Fprintf(&b, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#eee"/>`+"\n", left, y(p), width-right, y(p))
		fmt.Fprintf(&b, `<text x="%d" y="%.1f" text-anchor="end">p%g</text>`+"\n", left-6, y(p)+4, p)
	}
	fmt.Fprintf(&b, `<rect x="%d" y="%d" width="%.0f" height="%.0f" fill="none" stroke="#444"/>`+"\n", left, top, plotW, plotH)
	fmt.Fprintf(&b, `<text x="%.0f" y="%d" text-anchor="middle">latency (log scale)</text>`+"\n", float64(left)+plotW/2, height-18)
	colours := []string{"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e"}
	legendY := top + 10
	for i, r := range rep.Results {
		c := colours[i%len(colours)]
		for _, s := range []struct {
			l    Latencies
			name string
			dash string
		}{{r.Annals, "annals", ""}, {r.Raw, "raw PostgreSQL", ` stroke-dasharray="6 4"`}} {
			if len(s.l.Quantiles) == 0 {
				continue
			}
			var pts []string
			for pct, q := range s.l.Quantiles {
				pts = append(pts, fmt.Sprintf("%.1f,%.1f", x(q), y(float64(pct))))
			}
			fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="2"%s points="%s"/>`+"\n", c, s.dash, strings.Join(pts, " "))
			fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="2"%s/>`+"\n", width-right+12, legendY, width-right+40, legendY, c, s.dash)
			fmt.Fprintf(&b, `<text x="%d" y="%d">%s %d/s</text>`+"\n", width-right+46, legendY+4, s.name, r.Rate)
			legendY += 20
		}
	}
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}
