package scavenge

import (
	"context"
	_ "embed"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/annals-dev/annals/advisorylock"
	"github.com/annals-dev/annals/internal/poolconn"
	"github.com/annals-dev/annals/internal/schemaname"
	"github.com/annals-dev/annals/internal/sqltmpl"
	"github.com/annals-dev/annals/internal/telemetry"
)

//go:embed queries.sql
var queriesSQL string

// ErrBusy is returned by RunOnce when another scavenger holds the lock.
var ErrBusy = errors.New("scavenge: another scavenger is running")

// Config configures a Scavenger. A nil *Config means defaults.
type Config struct {
	// Schema is the annals schema. Defaults to "annals".
	Schema string
	// BatchSize is how many positions one step scans (one transaction).
	// Defaults to 10000.
	BatchSize int
	// Pause is the wait between steps (throttling). Defaults to 20ms;
	// negative: none.
	Pause time.Duration
	// Interval is how often Run starts a run. Defaults to 1h.
	Interval time.Duration
	// LockRetryInterval is how often Run tries again when another
	// scavenger holds the lock. Defaults to 30s.
	LockRetryInterval time.Duration
	// Clock gives the retention clock of a new run: events older than
	// Clock() minus their stream's maximum age are removed. scavenge()
	// clamps it to the database server's clock when the run starts: a
	// time earlier than the server's is used as given (the run removes
	// less), a later one is replaced by the server's (there is no
	// allowance for skew). A resumed run keeps the clock it started with.
	// Defaults to time.Now.
	Clock func() time.Time
	// InstanceID is recorded with each run started. Defaults to host:pid.
	InstanceID string
	// Lock configures the leader lock's connection. Defaults to
	// advisorylock's defaults.
	Lock *advisorylock.Config
	// Logger receives a line per finished run and errors. Defaults to
	// slog.Default().
	Logger *slog.Logger
	// OnProgress, when set, is called after every step. It must not block.
	OnProgress func(Progress)
}

// Progress is the state of a run after a step.
type Progress struct {
	// RunID identifies the run in scavenge_runs.
	RunID int64 `json:"run_id"`
	// StartedBy is the database role that started the run.
	StartedBy string `json:"started_by"`
	// StartedAt is when it started (the server's clock); Now its
	// retention clock, never later than StartedAt (since migration 0027).
	StartedAt time.Time `json:"started_at"`
	Now       time.Time `json:"now"`
	// From and Target bound the positions it scans: (From, Target].
	From   int64 `json:"from_position"`
	Target int64 `json:"target_position"`
	// ScannedTo is how far it has got.
	ScannedTo int64 `json:"scanned_to"`
	// Removed counts the events removed so far, Steps the steps made.
	Removed int64 `json:"removed"`
	Steps   int   `json:"steps"`
	// Done reports a finished run.
	Done bool `json:"done"`
}

// Fraction is how much of the run's range is scanned, from 0 to 1.
func (p Progress) Fraction() float64 {
	if p.Target <= p.From {
		return 1
	}
	return float64(p.ScannedTo-p.From) / float64(p.Target-p.From)
}

// Scavenger runs scavenge runs. It is safe for concurrent use.
type Scavenger struct {
	pool   *pgxpool.Pool
	cfg    Config
	schema string
	q      map[string]string
}

// New returns a Scavenger on pool; the schema must be migrated.
func New(pool *pgxpool.Pool, cfg *Config) (*Scavenger, error) {
	if pool == nil {
		return nil, errors.New("scavenge: pool is nil")
	}
	var c Config
	if cfg != nil {
		c = *cfg
	}
	var err error
	if c.Schema, err = schemaname.Resolve(c.Schema); err != nil {
		return nil, err
	}
	if c.BatchSize < 0 {
		return nil, errors.New("scavenge: BatchSize must not be negative")
	}
	if c.BatchSize == 0 {
		c.BatchSize = 10000
	}
	if c.Pause == 0 {
		c.Pause = 20 * time.Millisecond
	}
	if c.Interval <= 0 {
		c.Interval = time.Hour
	}
	if c.LockRetryInterval <= 0 {
		c.LockRetryInterval = 30 * time.Second
	}
	if c.Clock == nil {
		c.Clock = time.Now
	}
	if c.InstanceID == "" {
		host, _ := os.Hostname()
		c.InstanceID = fmt.Sprintf("%s:%d", host, os.Getpid())
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	q, err := sqltmpl.Named("queries.sql", queriesSQL, sqltmpl.NewData(c.Schema))
	if err != nil {
		return nil, err
	}
	return &Scavenger{pool: pool, cfg: c, schema: c.Schema, q: q}, nil
}

// RunOnce takes the scavenger lock and makes steps until the open run (or
// a new one) is done, then releases the lock and returns the run's final
// progress. It returns ErrBusy at once if another scavenger holds the lock.
// When ctx ends it stops after the step in flight (which commits or rolls
// back whole) and returns ctx's error with the progress so far: the run
// stays open, and the next RunOnce, from any process, resumes it.
func (s *Scavenger) RunOnce(ctx context.Context) (Progress, error) {
	lock, err := advisorylock.TryAcquire(ctx, s.pool.Config().ConnConfig, s.schema+":scavenger", poolconn.LockConfig(s.pool, s.cfg.Lock))
	if errors.Is(err, advisorylock.ErrNotAcquired) {
		return Progress{}, errors.WithStack(ErrBusy)
	}
	if err != nil {
		return Progress{}, errors.Wrap(err, "scavenge: take the scavenger lock")
	}
	defer func() { _ = lock.Release(context.WithoutCancel(ctx)) }()

	var p Progress
	for {
		err := lock.Do(ctx, func(conn *pgx.Conn) error {
			return conn.QueryRow(ctx, s.q["Step"], s.cfg.InstanceID, s.cfg.Clock(), s.cfg.BatchSize).Scan(
				&p.RunID, &p.StartedBy, &p.StartedAt, &p.Now, &p.From, &p.ScannedTo, &p.Target, &p.Removed, &p.Steps, &p.Done)
		})
		if err != nil {
			if ctx.Err() != nil {
				return p, errors.Wrap(ctx.Err(), "scavenge: stopped; the run resumes with the next RunOnce")
			}
			return p, errors.Wrap(err, "scavenge: step")
		}
		if s.cfg.OnProgress != nil {
			s.cfg.OnProgress(p)
		}
		if p.Done {
			s.cfg.Logger.InfoContext(ctx, "annals: scavenge run finished", slog.Int64("run", p.RunID),
				slog.Int64("removed", p.Removed), slog.Int64("from", p.From), slog.Int64("to", p.Target), slog.Int("steps", p.Steps))
			return p, nil
		}
		if s.cfg.Pause > 0 {
			t := time.NewTimer(s.cfg.Pause)
			select {
			case <-ctx.Done():
				t.Stop()
				return p, errors.Wrap(ctx.Err(), "scavenge: stopped; the run resumes with the next RunOnce")
			case <-t.C:
			}
		}
	}
}

// Run is the scavenger service: every Interval it makes a run (RunOnce) if
// no other process is making one, until ctx ends; then it returns nil.
// Errors are logged and retried after LockRetryInterval. It satisfies
// projection.Service (Runner.AddService).
func (s *Scavenger) Run(ctx context.Context) error {
	for {
		_, err := s.RunOnce(ctx)
		wait := s.cfg.Interval
		switch {
		case ctx.Err() != nil:
			return nil
		case errors.Is(err, ErrBusy):
			wait = s.cfg.LockRetryInterval
		case err != nil:
			s.cfg.Logger.WarnContext(ctx, "annals: scavenge run failed; retrying", telemetry.Err(err))
			wait = s.cfg.LockRetryInterval
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
	}
}

// Run is one row of scavenge_runs.
type Run struct {
	Progress
	// Instance is the InstanceID of the scavenger that started the run.
	Instance string `json:"instance"`
	// FinishedAt is when it finished (nil: open).
	FinishedAt *time.Time `json:"finished_at"`
}

// Runs returns the newest limit runs, newest first.
func (s *Scavenger) Runs(ctx context.Context, limit int) ([]Run, error) {
	rows, err := s.pool.Query(ctx, s.q["Runs"], limit)
	if err != nil {
		return nil, errors.Wrap(err, "scavenge: list runs")
	}
	var r Run
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (Run, error) {
		r = Run{}
		err := row.Scan(&r.RunID, &r.StartedBy, &r.Instance, &r.StartedAt, &r.Now, &r.From, &r.ScannedTo, &r.Target,
			&r.Removed, &r.Steps, &r.Done, &r.FinishedAt)
		return r, err
	})
}
