package scheduler

import (
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/eventstore"
)

// TestIdlePassesRecordNoAppends: a dispatcher pass that finds no timer due
// records no append: no "annals.transact" span and no annals.append.duration
// point. Every pass (at least one per PollInterval in every process) opened
// a Transact for its claim, so an idle service exported an empty producer
// span, a trace of its own, and an "ok" append to the latency histogram
// every 10 s per process. A pass that fires timers records their append.
func TestIdlePassesRecordNoAppends(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := annalstest.NewDB(t, nil)
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	store, err := eventstore.New(db.Pool, &eventstore.Config{Schema: db.Schema, TracerProvider: tp, MeterProvider: mp})
	if err != nil {
		t.Fatal(err)
	}
	clock := newFakeClock(t0)
	s, err := New(store, &Config{Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Schedule(ctx, nil, t0.Add(time.Minute), "later", ev("reminder", map[string]int{"n": 1})); err != nil {
		t.Fatal(err)
	}
	appends := func() (transacts, points int, events int64) {
		t.Helper()
		for _, sp := range spans.Ended() {
			if sp.Name() == "annals.transact" {
				transacts++
			}
		}
		var rm metricdata.ResourceMetrics
		if err := reader.Collect(ctx, &rm); err != nil {
			t.Fatal(err)
		}
		for _, sm := range rm.ScopeMetrics {
			for _, m := range sm.Metrics {
				switch d := m.Data.(type) {
				case metricdata.Histogram[float64]:
					if m.Name == "annals.append.duration" {
						for _, p := range d.DataPoints {
							points += int(p.Count)
						}
					}
				case metricdata.Sum[int64]:
					if m.Name == "annals.append.events" {
						for _, p := range d.DataPoints {
							events += p.Value
						}
					}
				}
			}
		}
		return transacts, points, events
	}
	for range 3 {
		if n, err := s.FireDue(ctx); err != nil || n != 0 {
			t.Fatalf("FireDue with nothing due: %d, %v", n, err)
		}
	}
	if tr, pts, _ := appends(); tr != 0 || pts != 0 {
		t.Errorf("3 passes with nothing due recorded %d annals.transact spans and %d annals.append.duration points, want none", tr, pts)
	}
	clock.Advance(time.Minute)
	if n, err := s.FireDue(ctx); err != nil || n != 1 {
		t.Fatalf("FireDue with a timer due: %d, %v", n, err)
	}
	tr, pts, events := appends()
	if tr != 1 || pts != 1 || events != 1 {
		t.Errorf("a pass firing one timer recorded %d annals.transact spans, %d annals.append.duration points, %d events; want 1, 1, 1", tr, pts, events)
	}
	for _, sp := range spans.Ended() {
		if sp.Name() != "annals.transact" {
			continue
		}
		for _, a := range sp.Attributes() {
			if a.Key == attribute.Key("annals.event_count") && a.Value.AsInt64() != 1 {
				t.Errorf("the firing's span has annals.event_count %d, want 1", a.Value.AsInt64())
			}
		}
		if !sp.StartTime().Before(sp.EndTime()) {
			t.Errorf("the firing's span starts at %v and ends at %v", sp.StartTime(), sp.EndTime())
		}
	}
}
