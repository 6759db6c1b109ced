package telemetry

import (
	"context"
	"log/slog"

	"github.com/cockroachdb/errors"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"
)

// Scope is the instrumentation scope name of annals.
const Scope = "github.com/annals-dev/annals"

// Metadata keys of the propagated trace context.
const (
	TraceparentKey = "traceparent"
	TracestateKey  = "tracestate"
)

// Attribute keys.
const (
	Subscriber = attribute.Key("annals.subscriber")
	Partition  = attribute.Key("annals.partition")
	Reason     = attribute.Key("annals.reason")
	Outcome    = attribute.Key("annals.outcome")
)

// durationBuckets are the bucket boundaries, in seconds, of the duration
// histograms (annals.append.duration, annals.batch.duration,
// annals.handler.duration). The SDK's default boundaries (0, 5, 10, 25, …,
// 10000) are meant for milliseconds: recorded in seconds, everything from a
// millisecond to five seconds would land in one bucket and a quantile over
// them would say nothing. These run from half a millisecond to ten seconds.
var durationBuckets = []float64{
	0.0005, 0.001, 0.0025, 0.005, 0.0075, 0.01, 0.025, 0.05, 0.075,
	0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10,
}

// Providers returns the given providers, or the global ones for nil.
func Providers(tp trace.TracerProvider, mp metric.MeterProvider) (trace.TracerProvider, metric.MeterProvider) {
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	return tp, mp
}

// Append holds the append-side instruments.
type Append struct {
	Tracer   trace.Tracer
	Duration metric.Float64Histogram
	Events   metric.Int64Counter
}

// NewAppend creates the append-side tracer and instruments.
func NewAppend(tp trace.TracerProvider, mp metric.MeterProvider) (*Append, error) {
	tp, mp = Providers(tp, mp)
	m := mp.Meter(Scope)
	a := &Append{Tracer: tp.Tracer(Scope)}
	var err error
	if a.Duration, err = m.Float64Histogram("annals.append.duration", metric.WithUnit("s"),
		metric.WithExplicitBucketBoundaries(durationBuckets...),
		metric.WithDescription("Duration of an append, from the call to its result.")); err != nil {
		return nil, errors.Wrap(err, "telemetry: annals.append.duration")
	}
	if a.Events, err = m.Int64Counter("annals.append.events", metric.WithUnit("{event}"),
		metric.WithDescription("Events appended.")); err != nil {
		return nil, errors.Wrap(err, "telemetry: annals.append.events")
	}
	return a, nil
}

// Off, given as the TracerProvider of NewSubscription, switches the
// subscription's telemetry off altogether: no spans, no metric records, not
// even no-op calls. It is not offered to users (telemetry stays on, with
// no-op providers unless the program sets real ones); the catch-up benchmark
// uses it to measure what that default costs.
var Off trace.TracerProvider = off{}

type off struct{ tracenoop.TracerProvider }

// Subscription holds the consumer-side instruments. The gauges are
// observed through a callback the runner registers with Observe.
type Subscription struct {
	// Enabled is false when the subscription was created with Off: callers
	// skip every span and record then.
	Enabled     bool
	Tracer      trace.Tracer
	Meter       metric.Meter
	Handler     metric.Float64Histogram
	Batch       metric.Float64Histogram
	Events      metric.Int64Counter
	Retries     metric.Int64Counter
	DeadLetters metric.Int64Counter
	Lag         metric.Int64ObservableGauge
	LagTime     metric.Float64ObservableGauge
	Leader      metric.Int64ObservableGauge
	Reconnects  metric.Int64ObservableCounter
}

// NewSubscription creates the consumer-side tracer and instruments.
func NewSubscription(tp trace.TracerProvider, mp metric.MeterProvider) (*Subscription, error) {
	_, isOff := tp.(off)
	if isOff {
		mp = metricnoop.NewMeterProvider()
	}
	tp, mp = Providers(tp, mp)
	m := mp.Meter(Scope)
	s := &Subscription{Enabled: !isOff, Tracer: tp.Tracer(Scope), Meter: m}
	var err error
	wrap := func(name string) error { return errors.Wrapf(err, "telemetry: %s", name) }
	if s.Handler, err = m.Float64Histogram("annals.handler.duration", metric.WithUnit("s"),
		metric.WithExplicitBucketBoundaries(durationBuckets...),
		metric.WithDescription("Duration of one handler call.")); err != nil {
		return nil, wrap("annals.handler.duration")
	}
	if s.Batch, err = m.Float64Histogram("annals.batch.duration", metric.WithUnit("s"),
		metric.WithExplicitBucketBoundaries(durationBuckets...),
		metric.WithDescription("Duration of processing one batch: its handler calls and, for projections, its transaction.")); err != nil {
		return nil, wrap("annals.batch.duration")
	}
	if s.Events, err = m.Int64Counter("annals.subscription.events", metric.WithUnit("{event}"),
		metric.WithDescription("Events handled (or dead-lettered) by a subscriber, counted per batch.")); err != nil {
		return nil, wrap("annals.subscription.events")
	}
	if s.Retries, err = m.Int64Counter("annals.subscription.retries", metric.WithUnit("{retry}"),
		metric.WithDescription("Failed handler attempts that will be retried.")); err != nil {
		return nil, wrap("annals.subscription.retries")
	}
	if s.DeadLetters, err = m.Int64Counter("annals.subscription.dead_letters", metric.WithUnit("{event}"),
		metric.WithDescription("Events written to the dead-letter table (annals.reason failed or parked).")); err != nil {
		return nil, wrap("annals.subscription.dead_letters")
	}
	if s.Lag, err = m.Int64ObservableGauge("annals.subscription.lag", metric.WithUnit("{event}"),
		metric.WithDescription("Head of the log minus the checkpoint of a partition this process leads (an upper bound: positions can have holes).")); err != nil {
		return nil, wrap("annals.subscription.lag")
	}
	if s.LagTime, err = m.Float64ObservableGauge("annals.subscription.lag_time", metric.WithUnit("s"),
		metric.WithDescription("Age of the oldest event a partition this process leads has not processed (0 when caught up).")); err != nil {
		return nil, wrap("annals.subscription.lag_time")
	}
	if s.Leader, err = m.Int64ObservableGauge("annals.subscription.leader", metric.WithUnit("1"),
		metric.WithDescription("1 while this process leads the subscriber partition.")); err != nil {
		return nil, wrap("annals.subscription.leader")
	}
	if s.Reconnects, err = m.Int64ObservableCounter("annals.listener.reconnects", metric.WithUnit("{reconnect}"),
		metric.WithDescription("Times the LISTEN connection had to be re-established.")); err != nil {
		return nil, wrap("annals.listener.reconnects")
	}
	return s, nil
}

var propagator = propagation.TraceContext{}

// Inject writes ctx's span context into meta (traceparent, tracestate) when
// there is a valid one. It returns whether it wrote anything.
func Inject(ctx context.Context, meta map[string]any) bool {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return false
	}
	carrier := propagation.MapCarrier{}
	propagator.Inject(ctx, carrier)
	for k, v := range carrier {
		meta[k] = v
	}
	return len(carrier) > 0
}

// Extract returns the span context carried in event metadata, if any.
func Extract(meta map[string]any) trace.SpanContext {
	tp, _ := meta[TraceparentKey].(string)
	if tp == "" {
		return trace.SpanContext{}
	}
	carrier := propagation.MapCarrier{TraceparentKey: tp}
	if ts, ok := meta[TracestateKey].(string); ok {
		carrier[TracestateKey] = ts
	}
	return trace.SpanContextFromContext(propagator.Extract(context.Background(), carrier))
}

// Err is the log attribute of an error: "error" with the error's message on
// one line. slog.Any would print it with %+v, which for a cockroachdb error
// is its whole chain with a stack trace per wrap, some forty lines in an
// operator's log for every retry.
func Err(err error) slog.Attr {
	if err == nil {
		return slog.String("error", "<nil>")
	}
	return slog.String("error", err.Error())
}
