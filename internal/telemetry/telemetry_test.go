package telemetry

import (
	"context"
	"testing"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

// TestDurationBuckets records a 7 ms duration on each duration histogram and
// checks that it lands in a bucket whose upper bound is below 10 ms: with the
// SDK's default boundaries (meant for milliseconds) it fell into (0, 5], a
// bucket that holds everything from a microsecond to five seconds.
func TestDurationBuckets(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = mp.Shutdown(ctx) })

	a, err := NewAppend(nil, mp)
	if err != nil {
		t.Fatal(err)
	}
	s, err := NewSubscription(nil, mp)
	if err != nil {
		t.Fatal(err)
	}
	const d = 0.007
	a.Duration.Record(ctx, d)
	s.Batch.Record(ctx, d)
	s.Handler.Record(ctx, d)

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(ctx, &rm); err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			h, ok := m.Data.(metricdata.Histogram[float64])
			if !ok {
				continue
			}
			seen[m.Name] = true
			if len(h.DataPoints) != 1 {
				t.Fatalf("%s: %d data points, want 1", m.Name, len(h.DataPoints))
			}
			dp := h.DataPoints[0]
			bound := -1.0
			for i, c := range dp.BucketCounts {
				if c == 0 {
					continue
				}
				if i >= len(dp.Bounds) {
					t.Fatalf("%s: 7ms landed in the overflow bucket (bounds %v)", m.Name, dp.Bounds)
				}
				bound = dp.Bounds[i]
			}
			if bound < d || bound >= 0.01 {
				t.Errorf("%s: 7ms landed in the bucket with upper bound %v (bounds %v), want one in [0.007, 0.01)", m.Name, bound, dp.Bounds)
			}
		}
	}
	for _, name := range []string{"annals.append.duration", "annals.batch.duration", "annals.handler.duration"} {
		if !seen[name] {
			t.Errorf("%s: not collected", name)
		}
	}
}
