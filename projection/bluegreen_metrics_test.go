package projection_test

import (
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/projection"
)

// TestBlueGreenMetrics: the leadership and lag of a generation's subscriber
// are reported under its own name (bgstats#g1).
func TestBlueGreenMetrics(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	log := &bgLog{db: db}
	if err := log.add(t.Context(), 5, 10); err != nil {
		t.Fatal(err)
	}
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = mp.Shutdown(t.Context()) })
	r, err := projection.NewRunner(db.Pool, &projection.Config{MeterProvider: mp, PollInterval: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Register(statsProjection(1), &projection.Options{BlueGreen: &projection.BlueGreen{Version: 1, CheckInterval: 100 * time.Millisecond}}); err != nil {
		t.Fatal(err)
	}
	bgRunInBackground(t, r)
	annalstest.WaitFor(t, 30*time.Second, func() bool {
		var rm metricdata.ResourceMetrics
		if err := reader.Collect(t.Context(), &rm); err != nil {
			t.Fatal(err)
		}
		leader, lagged := false, false
		for _, sm := range rm.ScopeMetrics {
			for _, m := range sm.Metrics {
				g, ok := m.Data.(metricdata.Gauge[int64])
				if !ok {
					continue
				}
				for _, dp := range g.DataPoints {
					if v, _ := dp.Attributes.Value(attribute.Key("annals.subscriber")); v.AsString() != "bgstats#g1" {
						continue
					}
					switch m.Name {
					case "annals.subscription.leader":
						leader = dp.Value == 1
					case "annals.subscription.lag":
						lagged = dp.Value == 0
					}
				}
			}
		}
		return leader && lagged
	})
}
