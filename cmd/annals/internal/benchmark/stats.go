package benchmark

import (
	"math"
	"slices"
	"time"
)

// Latencies summarizes a set of durations, in milliseconds.
type Latencies struct {
	Samples int     `json:"samples"`
	P50     float64 `json:"p50_ms"`
	P99     float64 `json:"p99_ms"`
	Max     float64 `json:"max_ms"`
	// Quantiles are the 0th to 100th percentiles, in ms: the distribution
	// the SVG plot draws.
	Quantiles []float64 `json:"quantiles_ms"`
}

// summarize returns the nearest-rank percentiles of ds (which it sorts).
func summarize(ds []time.Duration) Latencies {
	if len(ds) == 0 {
		return Latencies{}
	}
	slices.Sort(ds)
	q := make([]float64, 101)
	for i := range q {
		q[i] = ms(percentile(ds, float64(i)/100))
	}
	return Latencies{
		Samples:   len(ds),
		P50:       ms(percentile(ds, 0.50)),
		P99:       ms(percentile(ds, 0.99)),
		Max:       ms(ds[len(ds)-1]),
		Quantiles: q,
	}
}

// percentile returns the nearest-rank p-th percentile of sorted ds.
func percentile(sorted []time.Duration, p float64) time.Duration {
	i := int(math.Ceil(p*float64(len(sorted)))) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// ratio returns a/b, or 0 when b is 0.
func ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}
