package scheduler

import (
	"context"
	_ "embed"
	"log/slog"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/internal/sqltmpl"
	"github.com/annals-dev/annals/internal/telemetry"
)

//go:embed queries.sql
var queriesSQL string

// Clock tells the scheduler the time. It has the method set of
// projection.Clock, so one fake clock can drive a runner and a scheduler.
// Every due-time decision (is a timer due, which cron tick is next, when to
// retry a failing timer) uses it, never the database's clock.
type Clock interface {
	// Now returns the current time.
	Now() time.Time
	// After returns a channel that receives once d has passed on this clock.
	After(d time.Duration) <-chan time.Time
}

type wallClock struct{}

func (wallClock) Now() time.Time                         { return time.Now() }
func (wallClock) After(d time.Duration) <-chan time.Time { return time.After(d) }

// Config configures a Scheduler. A nil *Config means defaults.
type Config struct {
	// Schema is the PostgreSQL schema holding the annals tables. Defaults to
	// the store's schema (itself "annals" by default); when set, it must be
	// the store's.
	Schema string
	// Clock decides when timers and cron ticks are due. Defaults to the wall
	// clock.
	Clock Clock
	// Logger receives the dispatcher's warnings and errors. Defaults to
	// warnings and errors on slog.Default() (information and debug records
	// dropped).
	Logger *slog.Logger
	// PollInterval bounds the dispatcher's sleep (on Clock) when nothing is
	// due sooner; a NOTIFY wakes it earlier. Defaults to 10 s.
	PollInterval time.Duration
	// BatchSize is the number of timers claimed per transaction. Defaults to 100.
	BatchSize int
	// MaxAttempts is how many times a timer's append may fail before the
	// timer is kept as failed and no longer retried. A serialization
	// failure or a deadlock does not count, unless it is the
	// 10 × MaxAttempts-th in a row (the retries after them back off as
	// failed attempts' do). Defaults to 5.
	MaxAttempts int
	// RetryBackoff is the delay before a failed timer, or a cron task whose
	// tick failed, is tried again; it doubles with each consecutive failed
	// attempt (of a cron task: each failure of its own, not the database's),
	// up to MaxRetryBackoff. Defaults to 1 s.
	RetryBackoff time.Duration
	// MaxRetryBackoff caps RetryBackoff's doubling: a task whose ticks
	// keep failing is tried (and logs an error) once per MaxRetryBackoff.
	// Defaults to 10 min.
	MaxRetryBackoff time.Duration
	// MissedGrace is how late a cron tick may be fired and still count as on
	// time. A tick older than that when a dispatcher gets to it is missed,
	// and the task's MissedPolicy decides. Defaults to 1 min.
	MissedGrace time.Duration
	// TickRetention is how long fired ticks are kept in cron_ticks; older
	// rows are pruned (at most once an hour per process). Defaults to 7 days.
	TickRetention time.Duration
	// ContentionBackoff is how long (wall time) the dispatcher waits before
	// looking again when due work exists but another dispatcher holds it.
	// Defaults to 100 ms.
	ContentionBackoff time.Duration
	// ClaimTimeout bounds how long a claim's transaction (of timers or of a
	// cron task's tick) may sit idle on the server: longer, and the server
	// ends its session and rolls the claim back, so a dispatcher that hangs
	// while connected cannot keep what it claimed; another dispatcher fires
	// it. Wall time, set with SET LOCAL idle_in_transaction_session_timeout.
	// A claim is idle only between its round trips (a task's Event func runs
	// before its claim begins, so a slow one does not count). At least 1 ms
	// and at most 2^31-1 ms (about 24.8 days, PostgreSQL's limit for the
	// setting); New rejects other values. Defaults to 10 s.
	ClaimTimeout time.Duration
}

// maxClaimTimeout is the largest idle_in_transaction_session_timeout
// PostgreSQL accepts: INT_MAX milliseconds.
const maxClaimTimeout = math.MaxInt32 * time.Millisecond

func (c *Config) withDefaults(storeSchema string) (Config, error) {
	var out Config
	if c != nil {
		out = *c
	}
	if out.Schema == "" {
		out.Schema = storeSchema
	}
	if out.Schema != storeSchema {
		return out, errors.Wrapf(ErrInvalidConfig, "scheduler: Config.Schema %q differs from the store's schema %q", out.Schema, storeSchema)
	}
	if out.Clock == nil {
		out.Clock = wallClock{}
	}
	if out.Logger == nil {
		out.Logger = telemetry.DefaultLogger()
	}
	if out.PollInterval < 0 || out.BatchSize < 0 || out.MaxAttempts < 0 || out.RetryBackoff < 0 ||
		out.MaxRetryBackoff < 0 || out.MissedGrace < 0 || out.TickRetention < 0 || out.ContentionBackoff < 0 ||
		out.ClaimTimeout < 0 {
		return out, errors.Wrap(ErrInvalidConfig, "scheduler: Config durations and counts must not be negative")
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(&out.PollInterval, 10*time.Second)
	def(&out.RetryBackoff, time.Second)
	def(&out.MaxRetryBackoff, 10*time.Minute)
	def(&out.MissedGrace, time.Minute)
	def(&out.TickRetention, 7*24*time.Hour)
	def(&out.ContentionBackoff, 100*time.Millisecond)
	def(&out.ClaimTimeout, 10*time.Second)
	if out.BatchSize == 0 {
		out.BatchSize = 100
	}
	if out.MaxAttempts == 0 {
		out.MaxAttempts = 5
	}
	// Sent to the server as whole milliseconds: under 1 ms would be 0, which
	// turns the timeout off, and over INT_MAX ms the server refuses it, so
	// that every claim (and so every pass) would fail.
	if out.ClaimTimeout < time.Millisecond || out.ClaimTimeout > maxClaimTimeout {
		return out, errors.Wrapf(ErrInvalidConfig, "scheduler: Config.ClaimTimeout %v: want 1ms to %v", out.ClaimTimeout, maxClaimTimeout)
	}
	return out, nil
}

// Scheduler stores timers (delayed appends) and cron tasks in the database
// and, in Run, fires them when they are due. Any number of processes may run
// a Scheduler on the same database: each timer and each cron tick fires
// exactly once among them. It is safe for concurrent use.
type Scheduler struct {
	store   *eventstore.Store
	pool    *pgxpool.Pool
	cfg     Config
	channel string
	q       queries

	mu        sync.Mutex
	factories map[string]func(time.Time) (eventstore.EventData, error)
	retries   map[string]taskRetry // per failing task: its back-off
	badSpecs  map[string]string    // per stored task that does not parse: the definition (spec, zone) logged
	lastPrune time.Time

	wake chan struct{} // coalesced: a timer was scheduled, or the listener (re)connected

	// Test instrumentation.
	fired      atomic.Int64 // timers fired (appended and deleted) by this Scheduler
	ticksFired atomic.Int64
	sleeping   atomic.Int64 // dispatcher sleeps entered
	listenUp   atomic.Bool
	listenPID  atomic.Uint32 // backend PID of the LISTEN connection
	reconnects atomic.Int64
	notified   atomic.Int64    // notifications received
	afterClaim func(tx pgx.Tx) // called inside a claim transaction once timers are claimed or a task row locked
}

// taskRetry is the back-off of a cron task whose latest attempts failed.
type taskRetry struct {
	failures int       // consecutive failed attempts
	at       time.Time // when to try again (by the Clock)
}

type queries struct {
	boundClaim, insertTimer, jsonbStorable, claimDue, claimTimer, failTimer, boundCancel, unboundCancel, cancelTimer, cancelOwned,
	nextDue, listTimers, timerStats, upsertTask, pauseTask, resumeTask, deleteTask,
	listTasks, lockTask, recordTick, skipTick, pruneTicks string
}

// New returns a Scheduler that appends through store, on store's pool and
// schema (which must have been migrated). It does not touch the database;
// call Run to fire timers and tasks.
func New(store *eventstore.Store, cfg *Config) (*Scheduler, error) {
	if store == nil {
		return nil, errors.New("scheduler: store is nil")
	}
	c, err := cfg.withDefaults(store.Schema())
	if err != nil {
		return nil, err
	}
	named, err := sqltmpl.Named("queries.sql", queriesSQL, sqltmpl.NewData(c.Schema))
	if err != nil {
		return nil, err
	}
	return &Scheduler{
		store:     store,
		pool:      store.Pool(),
		cfg:       c,
		channel:   TimersChannel(c.Schema),
		factories: map[string]func(time.Time) (eventstore.EventData, error){},
		retries:   map[string]taskRetry{},
		badSpecs:  map[string]string{},
		wake:      make(chan struct{}, 1),
		q: queries{
			boundClaim:    named["BoundClaim"],
			insertTimer:   named["InsertTimer"],
			jsonbStorable: named["JsonbStorable"],
			claimDue:      named["ClaimDue"],
			claimTimer:    named["ClaimTimer"],
			failTimer:     named["FailTimer"],
			boundCancel:   named["BoundCancel"],
			unboundCancel: named["UnboundCancel"],
			cancelTimer:   named["CancelTimer"],
			cancelOwned:   named["CancelOwned"],
			nextDue:       named["NextDue"],
			listTimers:    named["ListTimers"],
			timerStats:    named["TimerStats"],
			upsertTask:    named["UpsertTask"],
			pauseTask:     named["PauseTask"],
			resumeTask:    named["ResumeTask"],
			deleteTask:    named["DeleteTask"],
			listTasks:     named["ListTasks"],
			lockTask:      named["LockTask"],
			recordTick:    named["RecordTick"],
			skipTick:      named["SkipTick"],
			pruneTicks:    named["PruneTicks"],
		},
	}, nil
}

// TimersChannel returns the NOTIFY channel on which scheduling a timer in
// the schema wakes the dispatchers: the schema name followed by "_timers".
func TimersChannel(schema string) string { return schema + "_timers" }

// signal wakes the local dispatcher (coalesced).
func (s *Scheduler) signal() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// execer is what a pool and a transaction share.
type execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// db returns tx, or the pool when tx is nil.
func (s *Scheduler) db(tx pgx.Tx) execer {
	if tx == nil {
		return s.pool
	}
	return tx
}
