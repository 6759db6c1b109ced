package projection_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/projection"
)

// immediateClock fires every retry delay at once.
type immediateClock struct{}

func (immediateClock) Now() time.Time { return time.Now() }
func (immediateClock) After(time.Duration) <-chan time.Time {
	ch := make(chan time.Time, 1)
	ch <- time.Now()
	return ch
}

type telemetryBundle struct {
	*bundle
	spans  *tracetest.SpanRecorder
	tp     *sdktrace.TracerProvider
	reader *sdkmetric.ManualReader
	mp     *sdkmetric.MeterProvider
	store  *eventstore.Store
}

func setupTelemetry(t *testing.T) *telemetryBundle {
	t.Helper()
	b := setup(t)
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	store, err := eventstore.New(b.db.Pool, &eventstore.Config{Registry: b.reg, TracerProvider: tp, MeterProvider: mp})
	if err != nil {
		t.Fatal(err)
	}
	return &telemetryBundle{bundle: b, spans: spans, tp: tp, reader: reader, mp: mp, store: store}
}

func (tb *telemetryBundle) ended(name string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range tb.spans.Ended() {
		if s.Name() == name {
			out = append(out, s)
		}
	}
	return out
}

func attr(s sdktrace.ReadOnlySpan, key string) (string, bool) {
	for _, a := range s.Attributes() {
		if string(a.Key) == key {
			return a.Value.Emit(), true
		}
	}
	return "", false
}

// collect returns the metrics by name.
func (tb *telemetryBundle) collect(t *testing.T) map[string]metricdata.Metrics {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := tb.reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	out := map[string]metricdata.Metrics{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			out[m.Name] = m
		}
	}
	return out
}

func TestTracingAcrossTheEventStore(t *testing.T) {
	t.Parallel()
	for _, child := range []bool{false, true} {
		name := "Link"
		if child {
			name = "ChildOf"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			tb := setupTelemetry(t)
			ctx := context.Background()
			ctx, request := tb.tp.Tracer("test").Start(ctx, "request")
			_, err := tb.store.Append(ctx, "acct-1", eventstore.NoStream, eventstore.NewEvent(Deposited{Amount: 5}), eventstore.NewEvent(Withdrawn{Amount: 2}))
			request.End()
			if err != nil {
				t.Fatal(err)
			}
			appends := tb.ended("annals.append")
			if len(appends) != 1 {
				t.Fatalf("%d append spans", len(appends))
			}
			ap := appends[0]
			if ap.Parent().SpanID() != request.SpanContext().SpanID() || ap.SpanKind() != trace.SpanKindProducer {
				t.Fatalf("append span parent %v kind %v", ap.Parent(), ap.SpanKind())
			}
			for key, want := range map[string]string{
				"annals.stream_id": "acct-1", "annals.event_count": "2", "annals.expected_version": "no stream",
				"annals.global_sequence.first": "1", "annals.global_sequence.last": "2",
			} {
				if got, _ := attr(ap, key); got != want {
					t.Errorf("append span %s = %q, want %q", key, got, want)
				}
			}
			// The trace context travels in the events' metadata.
			for e, err := range tb.store.ReadStream(ctx, "acct-1", 1) {
				if err != nil {
					t.Fatal(err)
				}
				if sc := e.Metadata.SpanContext(); sc.SpanID() != ap.SpanContext().SpanID() || sc.TraceID() != ap.SpanContext().TraceID() {
					t.Fatalf("event %d carries %v, want the append span %v", e.GlobalSequence, sc, ap.SpanContext())
				}
			}
			r, err := projection.NewRunner(tb.db.Pool, &projection.Config{TracerProvider: tb.tp, MeterProvider: tb.mp, HandlerSpans: true, HandlerSpanParent: child})
			if err != nil {
				t.Fatal(err)
			}
			if err := r.Register(balances(tb.reg), nil); err != nil {
				t.Fatal(err)
			}
			if err := r.RunUntilCaughtUp(ctx); err != nil {
				t.Fatal(err)
			}
			handles := append(tb.ended("annals.handle account.deposited"), tb.ended("annals.handle account.withdrawn")...)
			if len(handles) != 2 {
				t.Fatalf("%d handler spans, want 2", len(handles))
			}
			for _, h := range handles {
				if sub, _ := attr(h, "annals.subscriber"); sub != "balances" || h.SpanKind() != trace.SpanKindConsumer {
					t.Fatalf("handler span subscriber %q kind %v", sub, h.SpanKind())
				}
				if a, _ := attr(h, "annals.attempt"); a != "1" {
					t.Fatalf("handler span attempt %q", a)
				}
				if _, ok := attr(h, "annals.global_sequence"); !ok {
					t.Fatal("handler span without annals.global_sequence")
				}
				if child {
					if h.Parent().SpanID() != ap.SpanContext().SpanID() || h.SpanContext().TraceID() != ap.SpanContext().TraceID() {
						t.Fatalf("handler span parent %v, want the append span", h.Parent())
					}
				} else {
					if len(h.Links()) != 1 || h.Links()[0].SpanContext.SpanID() != ap.SpanContext().SpanID() {
						t.Fatalf("handler span links %v, want the append span", h.Links())
					}
				}
			}
		})
	}
}

func TestMetrics(t *testing.T) {
	t.Parallel()
	tb := setupTelemetry(t)
	ctx := context.Background()
	for i := range 20 {
		var ev eventstore.EventData
		if i == 7 {
			ev = eventstore.NewEvent(Withdrawn{Amount: -1}) // the poison event
		} else {
			ev = eventstore.NewEvent(Deposited{Amount: i})
		}
		if _, err := tb.store.Append(ctx, "acct-"+string(rune('a'+i%3)), eventstore.Any, ev); err != nil {
			t.Fatal(err)
		}
	}
	p := projection.New("balances", tb.reg)
	projection.On(p, func(ctx context.Context, tx pgx.Tx, e eventstore.Envelope[Deposited]) error { return nil })
	projection.On(p, func(ctx context.Context, tx pgx.Tx, e eventstore.Envelope[Withdrawn]) error {
		if e.Data.Amount < 0 {
			return errors.New("negative withdrawal")
		}
		return nil
	})
	r, err := projection.NewRunner(tb.db.Pool, &projection.Config{
		TracerProvider: tb.tp, MeterProvider: tb.mp, Clock: immediateClock{}, HandlerSpans: true,
		Retry: &projection.RetryPolicy{MaxRetries: 2}, PollInterval: 100 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Register(p, &projection.Options{OnDeadLetter: projection.SkipEvent}); err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); _ = r.Run(runCtx) }()
	t.Cleanup(func() { cancel(); wg.Wait() })

	// After catching up, the partition's lag is 0 and this process leads it.
	var ms map[string]metricdata.Metrics
	annalstest.WaitFor(t, 10*time.Second, func() bool {
		ms = tb.collect(t)
		lag, ok := ms["annals.subscription.lag"]
		return ok && gaugeInt(lag) == 0 && gaugeInt(ms["annals.subscription.leader"]) == 1 && gaugeFloat(ms["annals.subscription.lag_time"]) == 0
	})
	if n := counter(ms["annals.append.events"]); n != 20 {
		t.Errorf("annals.append.events = %d, want 20", n)
	}
	if n := histCount(ms["annals.append.duration"]); n != 20 {
		t.Errorf("annals.append.duration count = %d, want 20", n)
	}
	if n := counter(ms["annals.subscription.retries"]); n != 2 {
		t.Errorf("annals.subscription.retries = %d, want 2", n)
	}
	if n := counter(ms["annals.subscription.dead_letters"]); n != 1 {
		t.Errorf("annals.subscription.dead_letters = %d, want 1", n)
	}
	// Calls, not effects: the first attempt runs events 1-8 and rolls back;
	// events 1-7 run again in the transaction that commits them alone; the
	// poison event is tried twice more, dead-lettered, and events 9-20 follow:
	// 8 + 7 + 2 + 12 = 29.
	if n := histCount(ms["annals.handler.duration"]); n != 29 {
		t.Errorf("annals.handler.duration count = %d, want 29", n)
	}
	if _, ok := ms["annals.listener.reconnects"]; !ok {
		t.Error("annals.listener.reconnects not reported")
	}
}

// Telemetry is per batch by default: an annals.batch span and the batch
// metrics, no span or duration record per handler call. HandlerSpans adds
// those.
func TestHandlerSpansOffByDefault(t *testing.T) {
	t.Parallel()
	for _, perEvent := range []bool{false, true} {
		t.Run(map[bool]string{false: "Default", true: "HandlerSpans"}[perEvent], func(t *testing.T) {
			t.Parallel()
			tb := setupTelemetry(t)
			ctx := context.Background()
			const n = 7
			for i := range n {
				if _, err := tb.store.Append(ctx, "acct-"+string(rune('a'+i%2)), eventstore.Any, eventstore.NewEvent(Deposited{Amount: i})); err != nil {
					t.Fatal(err)
				}
			}
			r, err := projection.NewRunner(tb.db.Pool, &projection.Config{TracerProvider: tb.tp, MeterProvider: tb.mp, HandlerSpans: perEvent})
			if err != nil {
				t.Fatal(err)
			}
			if err := r.Register(balances(tb.reg), &projection.Options{BatchSize: 3}); err != nil {
				t.Fatal(err)
			}
			if err := r.RunUntilCaughtUp(ctx); err != nil {
				t.Fatal(err)
			}
			handles := tb.ended("annals.handle account.deposited")
			ms := tb.collect(t)
			handlerCalls := histCount(ms["annals.handler.duration"])
			if perEvent {
				if len(handles) != n || handlerCalls != n {
					t.Fatalf("with HandlerSpans: %d handler spans and %d annals.handler.duration records, want %d", len(handles), handlerCalls, n)
				}
			} else if len(handles) != 0 || handlerCalls > 0 {
				t.Fatalf("by default: %d handler spans and %d annals.handler.duration records, want none", len(handles), handlerCalls)
			}
			// Either way, a span and a duration record per batch (7 events, 3
			// at a time: 3 batches), and the events counted.
			batches := tb.ended("annals.batch")
			if len(batches) != 3 {
				t.Fatalf("%d annals.batch spans, want 3", len(batches))
			}
			total := 0
			for _, b := range batches {
				if sub, _ := attr(b, "annals.subscriber"); sub != "balances" || b.SpanKind() != trace.SpanKindConsumer {
					t.Fatalf("batch span subscriber %q kind %v", sub, b.SpanKind())
				}
				c, _ := attr(b, "annals.event_count")
				total += map[string]int{"1": 1, "3": 3}[c]
			}
			if total != n {
				t.Fatalf("batch spans cover %d events, want %d", total, n)
			}
			if got := histCount(ms["annals.batch.duration"]); got != 3 {
				t.Fatalf("annals.batch.duration count = %d, want 3", got)
			}
			if got := counter(ms["annals.subscription.events"]); got != n {
				t.Fatalf("annals.subscription.events = %d, want %d", got, n)
			}
		})
	}
}

func gaugeInt(m metricdata.Metrics) int64 {
	g, ok := m.Data.(metricdata.Gauge[int64])
	if !ok || len(g.DataPoints) == 0 {
		return -1
	}
	return g.DataPoints[0].Value
}

func gaugeFloat(m metricdata.Metrics) float64 {
	g, ok := m.Data.(metricdata.Gauge[float64])
	if !ok || len(g.DataPoints) == 0 {
		return -1
	}
	return g.DataPoints[0].Value
}

func counter(m metricdata.Metrics) int64 {
	s, ok := m.Data.(metricdata.Sum[int64])
	if !ok {
		return -1
	}
	var n int64
	for _, p := range s.DataPoints {
		n += p.Value
	}
	return n
}

func histCount(m metricdata.Metrics) int64 {
	h, ok := m.Data.(metricdata.Histogram[float64])
	if !ok {
		return -1
	}
	var n int64
	for _, p := range h.DataPoints {
		n += int64(p.Count)
	}
	return n
}
