package testkit

import (
	"context"
	"fmt"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/internal/pgtx"
	"github.com/annals-dev/annals/projection"
)

// DefaultStream is the stream of the events given to [ReplayProjection]
// outside a [Stream] when ReplayOptions.Stream is empty.
const DefaultStream = "testkit-1"

// ReplayOptions configures [ReplayProjection]. A nil *ReplayOptions means
// defaults.
type ReplayOptions struct {
	// Registry names the Go types of the events given as plain values (and
	// of EventData with an empty Type). It is also the runner's
	// (projection.Config.Registry, unless Config sets one), as in an
	// annals.Client: every handler, untyped ones too, sees events upcast to
	// their type's current schema version. Defaults to the registry the
	// handler was built with (projection.New, projection.NewObserver,
	// saga.New), so a typed handler's test need not repeat it; for other
	// handlers, to an empty registry: every event must then be an
	// eventstore.EventData with its Type set.
	Registry *eventstore.Registry
	// Stream is the stream of the events given outside a [Stream].
	// Defaults to [DefaultStream].
	Stream string
	// Schema is the annals schema of the test database. Defaults to "annals".
	Schema string
	// Setup prepares the read model (creates its tables) in the fresh
	// database before any event is replayed. It runs in one transaction,
	// followed by the handler's Reset when it implements
	// projection.Resetter, so a projection whose Reset creates its tables
	// (CREATE TABLE IF NOT EXISTS …; TRUNCATE …) needs no Setup.
	// Defaults to none.
	Setup func(ctx context.Context, tx pgx.Tx) error
	// Options are the registration's options (Types, Partitions,
	// BatchSize, …). When Retry is nil the handler is not retried, and when
	// OnDeadLetter is projection.DefaultPolicy it is projection.Stop: the
	// first handler error (or panic) fails the test with its message. A
	// test that sets another OnDeadLetter gets dead letters instead of
	// failures and can inspect them (package deadletter). Defaults to nil.
	Options *projection.Options
	// Config configures the runner (Logger, Clock, Hooks, …). Its Schema
	// is replaced by the test database's, and a nil Registry by Registry.
	// Defaults to nil: the runner's defaults.
	Config *projection.Config
	// Timeout bounds each replay (setup, append and run to the head).
	// Defaults to one minute.
	Timeout time.Duration
}

// StreamEvents are events for one stream, made by [Stream].
type StreamEvents struct {
	// ID is the stream ID.
	ID string
	// Events are plain registered values or eventstore.EventData.
	Events []any
}

// Stream puts events into the stream id:
//
//	testkit.ReplayProjection(t, p, opts,
//		testkit.Stream("account-1", Opened{Owner: "Ann"}, Deposited{Amount: 100}),
//		testkit.Stream("account-2", Opened{Owner: "Bob"}),
//	)
//
// Each argument is a plain value whose type is in ReplayOptions.Registry or
// an eventstore.EventData.
func Stream(id string, events ...any) StreamEvents { return StreamEvents{ID: id, Events: events} }

// Replay is the outcome of [ReplayProjection]: a fresh database holding the
// replayed events and the read model the handler built from them. Query the
// read model through the embedded DB's Pool.
type Replay struct {
	// DB is the test's database: URL, Name, Schema and Pool. It is dropped
	// when the test ends.
	*annalstest.DB
	// Store is an event store on DB with the options' Registry.
	Store *eventstore.Store
	// Events are every event appended so far, as stored (IDs, positions,
	// stream versions), in log order.
	Events []eventstore.Event

	handler any
	opts    ReplayOptions
	runSettings
}

// runSettings are a replay's runner settings: the options' projection
// Options and Config with the kit's defaults (no retries, Stop on the first
// dead letter), and the handler errors the dead-letter hook reported.
type runSettings struct {
	reg      projection.Options
	cfg      projection.Config
	mu       sync.Mutex
	failures []error
	// regName names the events' registry in messages.
	regName string
}

// defaults fills in opts's defaults for handler and derives the runner
// settings from it.
func (s *runSettings) defaults(opts *ReplayOptions, handler any) {
	s.regName = "ReplayOptions.Registry"
	if opts.Registry == nil {
		if opts.Registry = handlerRegistry(handler); opts.Registry != nil {
			s.regName = "the handler's registry (ReplayOptions.Registry is nil)"
		}
	}
	if opts.Registry == nil {
		opts.Registry = eventstore.NewRegistry()
	}
	if opts.Stream == "" {
		opts.Stream = DefaultStream
	}
	if opts.Timeout <= 0 {
		opts.Timeout = time.Minute
	}
	if opts.Options != nil {
		s.reg = *opts.Options
	}
	if s.reg.Retry == nil {
		s.reg.Retry = &projection.RetryPolicy{MaxRetries: -1}
	}
	if s.reg.OnDeadLetter == projection.DefaultPolicy {
		s.reg.OnDeadLetter = projection.Stop
	}
	if opts.Config != nil {
		s.cfg = *opts.Config
	}
	// Untyped handlers get events upcast as a Client's runner gives them
	// (its Registry is the client's).
	if s.cfg.Registry == nil {
		s.cfg.Registry = opts.Registry
	}
	// Report the handler's own error, not only "the subscriber is stopped".
	userHook := s.cfg.Hooks.OnDeadLetter
	s.cfg.Hooks.OnDeadLetter = func(sub string, e eventstore.Event, reason string, err error) {
		if reason == "failed" && s.reg.OnDeadLetter == projection.Stop {
			s.mu.Lock()
			s.failures = append(s.failures, err)
			s.mu.Unlock()
		}
		if userHook != nil {
			userHook(sub, e, reason, err)
		}
	}
}

// result returns the run's outcome: the handler errors reported since the
// last call (with the event each failed on), else runErr.
func (s *runSettings) result(runErr error) error {
	s.mu.Lock()
	failures := s.failures
	s.failures = nil
	s.mu.Unlock()
	if len(failures) > 0 {
		return errors.Wrap(errors.Join(failures...), "replay")
	}
	return errors.Wrap(runErr, "replay")
}

// ReplayProjection replays events through a projection (or an observer, or
// any handler projection.Runner.Register accepts) and returns the database
// with the read model it built.
//
// It creates a fresh migrated database for t (annalstest.NewDB: set
// ANNALS_TEST_DATABASE_URL or let it start a throwaway cluster), runs
// opts.Setup, the handler's setup (projection.Setupper) and its Reset, appends events in the order given
// (consecutive events of one stream in one append, all appends in one
// transaction), and runs the handler synchronously up to the head with
// projection.Runner.RunUntilCaughtUp, exactly as a production runner would
// process them. Events are plain values of types in opts.Registry,
// eventstore.EventData, or [Stream] groups; values outside a Stream go to
// opts.Stream.
//
// Everything that goes wrong fails the test with t.Fatalf: bad events, a
// handler the runner refuses (an unregistered event type in a typed
// projection), setup errors, and the first handler error or panic, quoted
// with its event.
//
// A nil opts means defaults; the events' registry is then the one a typed
// handler was built with (projection.New(name, reg)):
//
//	r := testkit.ReplayProjection(t, balances, nil,
//		testkit.Stream("account-1", Opened{Owner: "Ann"}, Deposited{Amount: 100}))
//	var amount int
//	err := r.Pool.QueryRow(t.Context(), `SELECT amount FROM balances WHERE account = 'account-1'`).Scan(&amount)
func ReplayProjection(t testing.TB, handler any, opts *ReplayOptions, events ...any) *Replay {
	t.Helper()
	if isNilHandler(handler) {
		t.Fatalf("testkit: ReplayProjection with a nil handler (%T)", handler)
		return nil
	}
	r := &Replay{handler: handler}
	if opts != nil {
		r.opts = *opts
	}
	r.defaults(&r.opts, handler)
	// Check what needs no database first: bad input costs nothing.
	appends, err := r.plan(events)
	if err != nil {
		t.Fatalf("testkit: %v", err)
		return nil
	}

	r.DB = annalstest.NewDB(t, &annalstest.Options{Schema: r.opts.Schema})
	r.cfg.Schema = r.DB.Schema
	if r.Store, err = eventstore.New(r.DB.Pool, &eventstore.Config{Schema: r.DB.Schema, Registry: r.opts.Registry}); err != nil {
		t.Fatalf("testkit: %v", err)
		return nil
	}
	ctx, cancel := context.WithTimeout(t.Context(), r.opts.Timeout)
	defer cancel()
	if err := r.setup(ctx); err != nil {
		t.Fatalf("testkit: set up the read model: %v", err)
		return nil
	}
	if err := r.replay(ctx, appends); err != nil {
		t.Fatalf("testkit: %v", err)
		return nil
	}
	return r
}

// Append appends more events (as [ReplayProjection] takes them) to the
// database and runs the handler to the new head again, from its
// checkpoint: for tests of incremental updates. It fails the test like
// ReplayProjection.
func (r *Replay) Append(t testing.TB, events ...any) {
	t.Helper()
	appends, err := r.plan(events)
	if err != nil {
		t.Fatalf("testkit: %v", err)
		return
	}
	ctx, cancel := context.WithTimeout(t.Context(), r.opts.Timeout)
	defer cancel()
	if err := r.replay(ctx, appends); err != nil {
		t.Fatalf("testkit: %v", err)
	}
}

// pendingAppend is one append_events call: consecutive events of a stream.
type pendingAppend struct {
	stream string
	events []eventstore.EventData
}

// plan turns the arguments into appends, in order.
func (r *Replay) plan(events []any) ([]pendingAppend, error) {
	var out []pendingAppend
	add := func(stream string, v any, where string) error {
		var ed eventstore.EventData
		switch e := v.(type) {
		case nil:
			return errors.Wrapf(eventstore.ErrInvalidEvent, "%s is nil", where)
		case eventstore.EventData:
			ed = e
		case *eventstore.EventData:
			if e == nil {
				return errors.Wrapf(eventstore.ErrInvalidEvent, "%s is a nil *EventData", where)
			}
			ed = *e
		case StreamEvents, *StreamEvents:
			return errors.Wrapf(eventstore.ErrInvalidEvent, "%s: a Stream inside a Stream", where)
		case eventstore.Event:
			return errors.Wrapf(eventstore.ErrInvalidEvent, "%s is a stored eventstore.Event; pass its payload or an EventData", where)
		default:
			if _, ok := r.opts.Registry.NameOf(v); !ok {
				return errors.Wrapf(eventstore.ErrUnknownEventType,
					"%s: %T is not in %s (register it, or pass an eventstore.EventData with a Type)", where, v, r.regName)
			}
			ed = eventstore.NewEvent(v)
		}
		if _, ok := r.opts.Registry.NameOf(ed.Data); ed.Type == "" && !ok {
			return errors.Wrapf(eventstore.ErrUnknownEventType,
				"%s has no Type and its Data (%T) is not in %s", where, ed.Data, r.regName)
		}
		if n := len(out); n > 0 && out[n-1].stream == stream {
			out[n-1].events = append(out[n-1].events, ed)
		} else {
			out = append(out, pendingAppend{stream: stream, events: []eventstore.EventData{ed}})
		}
		return nil
	}
	for i, v := range events {
		var err error
		switch s := v.(type) {
		case StreamEvents:
			err = r.addStream(s, i, add)
		case *StreamEvents:
			if s == nil {
				err = errors.Wrapf(eventstore.ErrInvalidEvent, "event %d is a nil *StreamEvents", i+1)
			} else {
				err = r.addStream(*s, i, add)
			}
		default:
			err = add(r.opts.Stream, v, fmt.Sprintf("event %d", i+1))
		}
		if err != nil {
			return nil, err
		}
	}
	if len(out) == 0 && len(events) > 0 {
		return nil, errors.Wrap(eventstore.ErrInvalidEvent, "the Streams given hold no events")
	}
	return out, nil
}

func (r *Replay) addStream(s StreamEvents, i int, add func(stream string, v any, where string) error) error {
	if s.ID == "" {
		return errors.Wrapf(eventstore.ErrInvalidEvent, "event %d: Stream with an empty ID", i+1)
	}
	for j, v := range s.Events {
		if err := add(s.ID, v, fmt.Sprintf("event %d of Stream(%q)", j+1, s.ID)); err != nil {
			return err
		}
	}
	return nil
}

// setup runs opts.Setup, the handler's own setup (projection.Setupper,
// recorded as the runner records it) and its Reset in one transaction.
func (r *Replay) setup(ctx context.Context) error {
	reset, _ := r.handler.(projection.Resetter)
	setup, _ := r.handler.(projection.Setupper)
	named, _ := r.handler.(interface{ Name() string })
	if named == nil {
		setup = nil
	}
	if r.opts.Setup == nil && reset == nil && setup == nil {
		return nil
	}
	return pgx.BeginTxFunc(ctx, r.DB.Pool, pgtx.ReadCommitted, func(tx pgx.Tx) error {
		if r.opts.Setup != nil {
			if err := r.opts.Setup(ctx, tx); err != nil {
				return errors.Wrap(err, "Setup")
			}
		}
		if setup != nil {
			if _, err := projection.EnsureSetup(ctx, tx, r.DB.Schema, named.Name(), setup, "testkit"); err != nil {
				return err
			}
		}
		if reset != nil {
			if err := reset.Reset(ctx, tx); err != nil {
				return errors.Wrapf(err, "%T.Reset", r.handler)
			}
		}
		return nil
	})
}

// replay appends the events, records them and runs the handler to the head.
func (r *Replay) replay(ctx context.Context, appends []pendingAppend) error {
	if len(appends) > 0 {
		after := int64(0)
		if n := len(r.Events); n > 0 {
			after = r.Events[n-1].GlobalSequence
		}
		if _, err := r.Store.Transact(ctx, func(_ context.Context, _ pgx.Tx, b *eventstore.Batch) error {
			for _, a := range appends {
				if err := b.Append(a.stream, eventstore.Any, a.events...); err != nil {
					return errors.Wrapf(err, "append to %q", a.stream)
				}
			}
			return nil
		}); err != nil {
			return err
		}
		for e, err := range r.Store.ReadAll(ctx, after+1) {
			if err != nil {
				return err
			}
			r.Events = append(r.Events, e)
		}
	}

	runner, err := projection.NewRunner(r.DB.Pool, &r.cfg)
	if err != nil {
		return err
	}
	if err := runner.Register(r.handler, &r.reg); err != nil {
		return err
	}
	return r.result(runner.RunUntilCaughtUp(ctx))
}

// handlerRegistry returns the registry a typed handler (projection.Typed,
// projection.TypedObserver, saga.Typed[S]: their Registry method) was
// built with, or nil for any other handler.
func handlerRegistry(h any) *eventstore.Registry {
	if r, ok := h.(interface{ Registry() *eventstore.Registry }); ok && !isNilHandler(h) {
		return r.Registry()
	}
	return nil
}

// isNilHandler reports whether a handler is nil or a nil pointer (a nil
// *projection.Typed), which the kit refuses before it makes a database.
func isNilHandler(h any) bool {
	if h == nil {
		return true
	}
	v := reflect.ValueOf(h)
	return v.Kind() == reflect.Pointer && v.IsNil()
}
