package projection_test

// Child processes: the failover tests run each runner in a process of its
// own (the test binary, re-executed), so that a leader can be killed with
// SIGKILL the way a crashed or OOM-killed service dies: no deferred call, no
// graceful release, only the kernel closing its sockets.

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/annals-dev/annals/advisorylock"
	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/internal/childproc"
	"github.com/annals-dev/annals/projection"
)

// childEnv holds a child's configuration (a JSON childSpec). When it is set,
// TestMain runs the child instead of the tests.
const childEnv = "ANNALS_PROJECTION_CHILD"

// What a child runs.
const (
	// kindProjection runs recordingBalances, subscriber "balances".
	kindProjection = "projection"
	// kindObserver runs deliveryObserver, subscriber "notifier".
	kindObserver = "observer"
)

// childMode says what a child runs and how.
type childMode struct {
	Kind string `json:"kind"`
	// BatchSize, CheckpointEvery and CheckpointInterval go to
	// projection.Options (zero: the defaults).
	BatchSize          int           `json:"batch_size,omitempty"`
	CheckpointEvery    int           `json:"checkpoint_every,omitempty"`
	CheckpointInterval time.Duration `json:"checkpoint_interval,omitempty"`
	// HandleDelay is how long the observer works on each event.
	HandleDelay time.Duration `json:"handle_delay,omitempty"`
	// FailStream, if set, makes the projection fail every event of that
	// stream (kindProjection only).
	FailStream string `json:"fail_stream,omitempty"`
	// Retry goes to projection.Config.Retry (nil: the defaults).
	Retry *projection.RetryPolicy `json:"retry,omitempty"`
	// Partitions goes to projection.Options (zero: 1).
	Partitions int `json:"partitions,omitempty"`
	// Defaults runs the runner's leader election at its defaults
	// (LockRetryInterval, PollInterval, the lock's CheckInterval) instead of
	// the child tuning below.
	Defaults bool `json:"defaults,omitempty"`
	// FreezeTimeout goes to the lock's advisorylock.Config (zero: its
	// default).
	FreezeTimeout time.Duration `json:"freeze_timeout,omitempty"`
	// HandlerTimeout goes to projection.Options (zero: the default).
	HandlerTimeout time.Duration `json:"handler_timeout,omitempty"`
	// PauseStream, if set, makes the projection work PauseFor after it
	// has written each event of that stream, before the handler returns
	// (its transaction idle meanwhile; kindProjection only).
	PauseStream string        `json:"pause_stream,omitempty"`
	PauseFor    time.Duration `json:"pause_for,omitempty"`
}

// subscriber returns the subscriber name the mode's handler registers.
func (m childMode) subscriber() string {
	if m.Kind == kindObserver {
		return "notifier"
	}
	return "balances"
}

type childSpec struct {
	childMode
	URL      string `json:"url"`
	Instance string `json:"instance"`
}

// childTables are what the children record, besides the balances of setup.
// applied has one row per event a projection committed; its primary key
// makes a second application of an event fail (and the batch with it)
// instead of passing unnoticed. epoch is the checkpoint's epoch as the
// applying transaction saw it. delivered has one row per delivery to an
// observer, and no key: duplicates are allowed and counted.
const childTables = `
CREATE TABLE applied (
    event_id        uuid PRIMARY KEY,
    instance        text   NOT NULL,
    global_sequence bigint NOT NULL,
    epoch           bigint NOT NULL
);
CREATE TABLE delivered (
    event_id        uuid   NOT NULL,
    instance        text   NOT NULL,
    global_sequence bigint NOT NULL
);`

// Child tuning: short enough that a takeover takes well under a second.
const (
	childLockRetry     = 200 * time.Millisecond
	childPoll          = 200 * time.Millisecond
	childRetryBackoff  = 500 * time.Millisecond
	childCheckInterval = 100 * time.Millisecond
)

// runChild is the child's main: it runs a Runner until SIGTERM (a graceful
// stop, exit status 0) or until its parent goes away. It returns the exit
// status.
func runChild(raw string) int {
	var spec childSpec
	if err := json.Unmarshal([]byte(raw), &spec); err != nil {
		fmt.Fprintf(os.Stderr, "child: bad %s: %v\n", childEnv, err)
		return 2
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo})).
		With(slog.String("instance", spec.Instance))

	ctx, stop := childproc.Context(logger)
	defer stop()
	pool, err := childproc.Pool(ctx, spec.URL, spec.Instance)
	if err != nil {
		logger.Error("child: connect", slog.Any("error", err))
		return 1
	}
	defer pool.Close()

	reg := eventstore.NewRegistry()
	eventstore.MustRegister[Deposited](reg, "account.deposited")
	eventstore.MustRegister[Withdrawn](reg, "account.withdrawn")

	cfg := &projection.Config{
		InstanceID:        spec.Instance,
		PollInterval:      childPoll,
		LockRetryInterval: childLockRetry,
		RetryBackoff:      childRetryBackoff,
		HeartbeatInterval: time.Second,
		ShutdownTimeout:   5 * time.Second,
		Retry:             spec.Retry,
		Lock:              &advisorylock.Config{CheckInterval: childCheckInterval, Logger: logger},
		Logger:            logger,
	}
	if spec.Defaults {
		cfg.PollInterval, cfg.LockRetryInterval, cfg.Lock = 0, 0, &advisorylock.Config{Logger: logger}
	}
	cfg.Lock.FreezeTimeout = spec.FreezeTimeout
	r, err := projection.NewRunner(pool, cfg)
	if err != nil {
		logger.Error("child: new runner", slog.Any("error", err))
		return 1
	}
	opts := &projection.Options{
		BatchSize:          spec.BatchSize,
		CheckpointEvery:    spec.CheckpointEvery,
		CheckpointInterval: spec.CheckpointInterval,
		Partitions:         spec.Partitions,
		HandlerTimeout:     spec.HandlerTimeout,
	}
	var handler any
	switch spec.Kind {
	case kindProjection:
		var p projection.Projection = recordingBalances(reg, spec.Instance)
		if spec.FailStream != "" {
			p = failingStream{Projection: p, stream: spec.FailStream, instance: spec.Instance}
		}
		if spec.PauseStream != "" {
			p = pausingStream{Projection: p, stream: spec.PauseStream, pause: spec.PauseFor}
		}
		handler = p
	case kindObserver:
		handler = deliveryObserver(reg, pool, spec.Instance, spec.HandleDelay)
	case kindBalanced:
		handler = streamCounter(spec.Instance)
		if err := r.Register(orderObserver(pool, spec.Instance), opts); err != nil {
			logger.Error("child: register", slog.Any("error", err))
			return 1
		}
	default:
		logger.Error("child: unknown kind", slog.String("kind", spec.Kind))
		return 2
	}
	if err := r.Register(handler, opts); err != nil {
		logger.Error("child: register", slog.Any("error", err))
		return 1
	}
	logger.Info("child: running", slog.String("kind", spec.Kind), slog.Int("pid", os.Getpid()))
	if err := r.Run(ctx); err != nil {
		logger.Error("child: run", slog.Any("error", err))
		return 1
	}
	logger.Info("child: stopped gracefully")
	return 0
}

// recordingBalances is the balances projection of runner_test.go that also
// records each event it applies in applied, in the same statement (one round
// trip per event) and so in the batch's transaction.
func recordingBalances(reg *eventstore.Registry, instance string) *projection.Typed {
	p := projection.New("balances", reg)
	apply := func(ctx context.Context, tx pgx.Tx, e eventstore.Event, delta int) error {
		_, err := tx.Exec(ctx, `
			WITH rec AS (
			    INSERT INTO applied (event_id, instance, global_sequence, epoch)
			    VALUES ($1, $2, $3, (SELECT epoch FROM annals.checkpoints
			                          WHERE subscriber_id = 'balances' AND partition = 0))
			)
			INSERT INTO balances (account, amount, events) VALUES ($4, $5, 1)
			ON CONFLICT (account) DO UPDATE
			   SET amount = balances.amount + EXCLUDED.amount, events = balances.events + 1`,
			e.ID, instance, e.GlobalSequence, e.StreamID, delta)
		return err
	}
	projection.On(p, func(ctx context.Context, tx pgx.Tx, e eventstore.Envelope[Deposited]) error {
		return apply(ctx, tx, e.Event, e.Data.Amount)
	})
	projection.On(p, func(ctx context.Context, tx pgx.Tx, e eventstore.Envelope[Withdrawn]) error {
		return apply(ctx, tx, e.Event, -e.Data.Amount)
	})
	return p
}

// failingStream is a projection that fails every event of one stream and
// hands the others to the projection it wraps. Its error names the instance,
// so that a failures row tells which process made the attempt.
type failingStream struct {
	projection.Projection
	stream, instance string
}

func (f failingStream) Handle(ctx context.Context, tx pgx.Tx, e eventstore.Event) error {
	if e.StreamID == f.stream {
		return errors.Newf("child %s: stream %q always fails (event %d)", f.instance, f.stream, e.GlobalSequence)
	}
	return f.Projection.Handle(ctx, tx, e)
}

// pausingStream is a projection that, after the projection it wraps has
// written an event of one stream, works for a while before it returns (a
// call to another service, say), within its HandlerTimeout: the batch's
// transaction is idle meanwhile, holding the rows it wrote.
type pausingStream struct {
	projection.Projection
	stream string
	pause  time.Duration
}

func (p pausingStream) Handle(ctx context.Context, tx pgx.Tx, e eventstore.Event) error {
	if err := p.Projection.Handle(ctx, tx, e); err != nil || e.StreamID != p.stream {
		return err
	}
	select {
	case <-time.After(p.pause): // the handler's work, not a wait for a condition
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// deliveryObserver records every delivery in delivered, through the pool:
// a side effect outside the runner's transaction, as an observer's is.
func deliveryObserver(reg *eventstore.Registry, pool *pgxpool.Pool, instance string, delay time.Duration) *projection.TypedObserver {
	o := projection.NewObserver("notifier", reg)
	record := func(ctx context.Context, e eventstore.Event) error {
		if delay > 0 { // simulated work on the event
			t := time.NewTimer(delay)
			select {
			case <-ctx.Done():
				t.Stop()
				return ctx.Err()
			case <-t.C:
			}
		}
		_, err := pool.Exec(ctx, `INSERT INTO delivered (event_id, instance, global_sequence) VALUES ($1, $2, $3)`,
			e.ID, instance, e.GlobalSequence)
		return err
	}
	projection.Observe(o, func(ctx context.Context, e eventstore.Envelope[Deposited]) error { return record(ctx, e.Event) })
	projection.Observe(o, func(ctx context.Context, e eventstore.Envelope[Withdrawn]) error { return record(ctx, e.Event) })
	return o
}

// startChild starts the test binary as a runner process named instanceID
// (its instance ID and the application_name of its connections) on db. The
// child is killed, at the latest, when the test ends, before db is dropped;
// if the test failed, its log is shown.
func startChild(t testing.TB, db *annalstest.DB, instanceID string, mode childMode) *childproc.Child {
	t.Helper()
	return startChildAt(t, db.URL, instanceID, mode)
}

// startChildAt is startChild with the runner connecting to url (a pooler
// in front of the test's database, say).
func startChildAt(t testing.TB, url, instanceID string, mode childMode) *childproc.Child {
	t.Helper()
	spec, err := json.Marshal(childSpec{childMode: mode, URL: url, Instance: instanceID})
	if err != nil {
		t.Fatal(err)
	}
	return childproc.Start(t, instanceID, childEnv+"="+string(spec))
}

// eventually polls cond every 10 ms until it returns true or timeout has
// passed, and returns how long it polled and whether cond held. Unlike
// annalstest.WaitFor it leaves the failure to the caller, whose message can
// say what the state was, and it measures.
func eventually(timeout time.Duration, cond func() bool) (time.Duration, bool) {
	start := time.Now()
	for {
		if cond() {
			return time.Since(start), true
		}
		if time.Since(start) >= timeout {
			return time.Since(start), false
		}
		time.Sleep(10 * time.Millisecond) // the polling period, not a wait for the condition
	}
}
