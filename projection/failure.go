package projection

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"time"

	"github.com/cockroachdb/errors"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/annals-dev/annals/catchup"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/failure"
	"github.com/annals-dev/annals/internal/errmark"
	"github.com/annals-dev/annals/internal/recovered"
	"github.com/annals-dev/annals/internal/telemetry"
)

// RetryPolicy says how often and how fast a failing event is retried before
// it is dead-lettered. The delay before retry n (n = 1, 2, …) is
// InitialDelay × Multiplier^(n-1), capped at MaxDelay, ±Jitter.
type RetryPolicy struct {
	// MaxRetries is the number of retries after the first attempt, so an
	// event is tried MaxRetries+1 times. Defaults to 3; -1 means no retries.
	MaxRetries int
	// InitialDelay is the delay before the first retry. Defaults to 1s.
	InitialDelay time.Duration
	// Multiplier grows the delay per retry. Defaults to 2.
	Multiplier float64
	// MaxDelay caps the delay. Defaults to 60s.
	MaxDelay time.Duration
	// Jitter is the fraction of the delay added or removed at random, at
	// most 1. Defaults to 0.2; -1 means none.
	Jitter float64
}

// ErrInvalidRetryPolicy is the error of a RetryPolicy that Validate
// refuses (NewRunner for Config.Retry, Register for Options.Retry); the
// message says which field is wrong.
var ErrInvalidRetryPolicy = errors.New("projection: invalid retry policy")

// Validate returns an error matching ErrInvalidRetryPolicy when p cannot be
// used: MaxRetries below -1, a negative InitialDelay or MaxDelay, a
// Multiplier that is not a finite number, or a Jitter that is not a finite
// number or is above 1 (a delay could then be negative: an instant retry).
// Zero values are fine: they mean the defaults.
func (p RetryPolicy) Validate() error {
	finite := func(x float64) bool { return !math.IsNaN(x) && !math.IsInf(x, 0) }
	switch {
	case p.MaxRetries < -1:
		return errors.Wrapf(ErrInvalidRetryPolicy, "MaxRetries %d is below -1", p.MaxRetries)
	case p.InitialDelay < 0:
		return errors.Wrapf(ErrInvalidRetryPolicy, "InitialDelay %s is negative", p.InitialDelay)
	case p.MaxDelay < 0:
		return errors.Wrapf(ErrInvalidRetryPolicy, "MaxDelay %s is negative", p.MaxDelay)
	case !finite(p.Multiplier):
		return errors.Wrapf(ErrInvalidRetryPolicy, "Multiplier %v is not a finite number", p.Multiplier)
	case !finite(p.Jitter) || p.Jitter > 1:
		return errors.Wrapf(ErrInvalidRetryPolicy, "Jitter %v is not a finite number at most 1", p.Jitter)
	}
	return nil
}

func (p RetryPolicy) withDefaults() RetryPolicy {
	switch {
	case p.MaxRetries == 0:
		p.MaxRetries = 3
	case p.MaxRetries < 0:
		p.MaxRetries = 0
	}
	if p.InitialDelay <= 0 {
		p.InitialDelay = time.Second
	}
	if p.Multiplier < 1 {
		p.Multiplier = 2
	}
	if p.MaxDelay <= 0 {
		p.MaxDelay = 60 * time.Second
	}
	switch {
	case p.Jitter == 0:
		p.Jitter = 0.2
	case p.Jitter < 0:
		p.Jitter = 0
	}
	return p
}

// Delay returns the pause before retry number n (1-based), of a policy
// that Validate accepts, with its defaults applied (as the runner uses it).
// It is never negative, and a delay past what a time.Duration holds is the
// longest one.
func (p RetryPolicy) Delay(n int) time.Duration {
	d := float64(p.InitialDelay)
	for i := 1; i < n && d < float64(p.MaxDelay); i++ {
		d *= p.Multiplier
	}
	d = min(d, float64(p.MaxDelay))
	if p.Jitter > 0 {
		d *= 1 + p.Jitter*(2*rand.Float64()-1)
	}
	switch {
	case !(d > 0): // NaN too
		return 0
	case d >= math.MaxInt64: // converting it would overflow
		return math.MaxInt64
	}
	return time.Duration(d)
}

// DeadLetterPolicy is what happens after an event is dead-lettered.
type DeadLetterPolicy int

const (
	// DefaultPolicy is ParkStream for projections and SkipEvent for observers.
	DefaultPolicy DeadLetterPolicy = iota
	// SkipEvent moves past the event; later events of its stream flow on.
	SkipEvent
	// ParkStream moves past the event and parks every later event of the
	// same stream in the dead-letter table too, in order, until an operator
	// releases the stream (annals dlq retry or skip). Other streams keep
	// flowing; per-stream order is never broken.
	ParkStream
	// Stop halts the subscriber partition until an operator retries or
	// skips the dead letter; other subscribers keep running.
	Stop
)

func (p DeadLetterPolicy) String() string {
	switch p {
	case SkipEvent:
		return "skip-event"
	case ParkStream:
		return "park-stream"
	case Stop:
		return "stop"
	}
	return "default"
}

// Clock is the time source of retry delays, so that tests can control it.
type Clock interface {
	Now() time.Time
	After(d time.Duration) <-chan time.Time
}

type realClock struct{}

func (realClock) Now() time.Time                         { return time.Now() }
func (realClock) After(d time.Duration) <-chan time.Time { return time.After(d) }

// Hooks are called on failures, for metrics and alerts. They must not block.
type Hooks struct {
	// OnRetry is called after a failed attempt that will be retried.
	OnRetry func(subscriber string, e eventstore.Event, attempt int, err error)
	// OnDeadLetter is called when an event is dead-lettered, once its dead
	// letter has committed (a write that fails and is tried again calls it
	// once); reason is "failed" or "parked".
	OnDeadLetter func(subscriber string, e eventstore.Event, reason string, err error)
}

// handlerFunc is a handler call: a Projection's Handle bound to its
// transaction, or an Observer's.
type handlerFunc func(ctx context.Context, e eventstore.Event) error

// deliver runs one handler call for e: e is upcast to its type's current
// schema version first (Config.Registry), inside the handler's timeout, so
// a failing upcaster is a failed attempt of the handler — retried, then
// dead-lettered — never an engine error; a panic becomes an error with its
// stack, and a timeout counts as a failure. Every delivery path (batches,
// retries, re-delivered dead letters) goes through it; the stored event and
// the dead-letter row keep the original data.
//
// This is the hot loop of catch-up, so by default it does no per-event
// telemetry and reuses the timeout context across calls (see handlerContext);
// the batch has the span and the metrics (batchTelemetry). With
// Config.HandlerSpans, each call gets its own span, linked to (or with
// HandlerSpanParent a child of) the span that appended e, and an
// annals.handler.duration record.
func (f *failures) deliver(ctx context.Context, e eventstore.Event, fn handlerFunc) error {
	if f.eventSpans && f.tel.Enabled {
		return f.deliverTraced(ctx, e, fn)
	}
	hctx := f.handlerContext(ctx)
	err := f.call(hctx, e, fn)
	if err != nil && hctx.Err() != nil && ctx.Err() == nil {
		err = errmark.Mark(errors.Wrapf(err, "handler timed out after %s", f.timeout), errHandlerTimedOut)
	}
	return err
}

// unboundedTimeout is the smallest HandlerTimeout that means no timeout at
// all: a handler deadline so far ahead that nobody means one, and
// math.MaxInt64 (a common way to say "never") would overflow the deadline
// arithmetic of handlerContext, which puts it centuries in the past.
const unboundedTimeout = 100 * 365 * 24 * time.Hour

// errHandlerTimedOut marks the error of a handler that ran out of its
// timeout: its own failure, although pgx closes the connection of a query
// whose context ends under it (see connLost).
var errHandlerTimedOut = errors.New("projection: handler timed out")

// call upcasts e and runs fn, turning a panic into an error with its stack.
func (f *failures) call(ctx context.Context, e eventstore.Event, fn handlerFunc) error {
	return recovered.Call("handler", func() error {
		up, err := f.registry.Upcast(e)
		if err != nil {
			return err
		}
		return fn(ctx, up)
	})
}

// deliverTraced is deliver with a span and a duration record per call.
func (f *failures) deliverTraced(ctx context.Context, e eventstore.Event, fn handlerFunc) error {
	var link trace.SpanStartOption = trace.WithLinks()
	if producer := e.Metadata.SpanContext(); producer.IsValid() {
		if f.childSpans {
			ctx = trace.ContextWithRemoteSpanContext(ctx, producer)
		} else {
			link = trace.WithLinks(trace.Link{SpanContext: producer})
		}
	}
	ctx, span := f.tel.Tracer.Start(ctx, "annals.handle "+e.Type, trace.WithSpanKind(trace.SpanKindConsumer), link)
	defer span.End()
	if span.IsRecording() { // no attribute allocations per event when nobody traces
		span.SetAttributes(
			telemetry.Subscriber.String(f.name),
			attribute.String("annals.event_type", e.Type),
			attribute.String("annals.stream_id", e.StreamID),
			attribute.Int64("annals.global_sequence", e.GlobalSequence),
			attribute.String("annals.event_id", e.ID.String()),
			attribute.Int("annals.attempt", f.attempts[e.ID]+1),
		)
	}
	start := time.Now()
	hctx := ctx
	if f.timeout > 0 {
		var cancel context.CancelFunc
		hctx, cancel = context.WithTimeout(ctx, f.timeout)
		defer cancel()
	}
	err := f.call(hctx, e, fn)
	if err != nil && hctx.Err() != nil && ctx.Err() == nil {
		err = errmark.Mark(errors.Wrapf(err, "handler timed out after %s", f.timeout), errHandlerTimedOut)
	}
	outcome := f.okAttrs
	if err != nil {
		outcome = f.errAttrs
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	f.tel.Handler.Record(ctx, time.Since(start).Seconds(), outcome)
	return err
}

// handlerContext returns a context for one handler call, derived from ctx,
// whose deadline is at least HandlerTimeout and at most HandlerTimeout plus
// a slack (1% of it, at most 10ms) from now. Creating a timeout context per
// event (a timer, and a child registered with the parent) was the largest
// per-event cost of catch-up, so one context serves consecutive calls until
// its deadline comes closer than HandlerTimeout; releaseContext cancels it
// at the end of a batch. The check reads only the monotonic clock (time.Since
// a base taken once): time.Now reads the wall clock too, and was the largest
// remaining cost of this path in a catch-up profile. Without a timeout
// (f.timeout 0: see unboundedTimeout) it returns ctx itself.
func (f *failures) handlerContext(ctx context.Context) context.Context {
	if f.timeout <= 0 {
		return ctx
	}
	if f.hbase.IsZero() {
		f.hbase = time.Now()
	}
	elapsed := time.Since(f.hbase)
	if f.hctx != nil && f.hparent == ctx && f.hctx.Err() == nil && f.hdeadline-elapsed >= f.timeout {
		return f.hctx
	}
	f.releaseContext()
	slack := min(f.timeout/100, 10*time.Millisecond)
	f.hdeadline = elapsed + f.timeout + slack
	f.hparent = ctx
	f.hctx, f.hcancel = context.WithDeadline(ctx, f.hbase.Add(f.hdeadline))
	return f.hctx
}

// releaseContext cancels the shared handler context, if any.
func (f *failures) releaseContext() {
	if f.hcancel != nil {
		f.hcancel()
	}
	f.hctx, f.hcancel, f.hparent = nil, nil, nil
}

// batchTelemetry starts the span of one batch (annals.batch, a consumer
// span with the subscriber, partition and positions) and returns ctx with
// it and the function that ends it, recording annals.batch.duration and
// adding the events handled to annals.subscription.events.
func (f *failures) batchTelemetry(ctx context.Context, lease *catchup.Lease, b catchup.Batch) (context.Context, func(handled int, err error)) {
	if !f.tel.Enabled {
		return ctx, func(int, error) {}
	}
	start := time.Now()
	ctx, span := f.tel.Tracer.Start(ctx, "annals.batch", trace.WithSpanKind(trace.SpanKindConsumer))
	if span.IsRecording() {
		span.SetAttributes(
			telemetry.Subscriber.String(f.name),
			telemetry.Partition.Int(lease.Partition),
			attribute.Int64("annals.after", b.After),
			attribute.Int64("annals.through", b.Through),
			attribute.Int("annals.event_count", len(b.Events)),
		)
	}
	return ctx, func(handled int, err error) {
		outcome := f.okAttrs
		if err != nil {
			outcome = f.errAttrs
			span.RecordError(err)
			span.SetStatus(codes.Error, err.Error())
		}
		span.End()
		f.tel.Batch.Record(ctx, time.Since(start).Seconds(), outcome)
		if handled > 0 {
			f.tel.Events.Add(ctx, int64(handled), f.subAttrs)
		}
	}
}

// retrying counts a failed attempt that will be retried.
func (f *failures) retrying(ctx context.Context, e eventstore.Event, attempt int, err error) {
	f.attempts[e.ID] = attempt
	f.tel.Retries.Add(ctx, 1, f.subAttrs)
	if f.hooks.OnRetry != nil {
		f.hooks.OnRetry(f.name, e, attempt, err)
	}
}

// deadLettered counts a dead letter, after its write has committed.
func (f *failures) deadLettered(ctx context.Context, e eventstore.Event, reason string, err error) {
	delete(f.attempts, e.ID)
	f.tel.DeadLetters.Add(ctx, 1, metric.WithAttributes(telemetry.Subscriber.String(f.name), telemetry.Reason.String(reason)))
	if f.hooks.OnDeadLetter != nil {
		f.hooks.OnDeadLetter(f.name, e, reason, err)
	}
}

// errorDetail is the full error with its stack, for the dead-letter table.
func errorDetail(err error) string { return storable(fmt.Sprintf("%+v", err), 64<<10) }

// spent reports whether an event that failed its attempt-th time is done
// retrying.
func spent(p RetryPolicy, attempt int, err error) bool {
	return failure.IsPermanent(err) || attempt > p.MaxRetries
}
