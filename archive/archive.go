package archive

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
)

//go:embed queries.sql
var queriesSQL string

// ErrBusy is returned by RunOnce when another archiver holds the lock.
var ErrBusy = errors.New("archive: another archiver is running")

// Config configures an Archiver. A nil *Config means defaults.
type Config struct {
	// Schema is the annals schema. Defaults to "annals".
	Schema string
	// BatchSize is how many positions one step moves (one transaction,
	// during which appends wait). Defaults to 2000.
	BatchSize int
	// Pause is the wait between steps (throttling). Defaults to 20ms;
	// negative: none.
	Pause time.Duration
	// InstanceID is recorded with each run started. Defaults to host:pid.
	InstanceID string
	// Lock configures the leader lock's connection. Defaults to
	// advisorylock's defaults.
	Lock *advisorylock.Config
	// Logger receives a line per finished run. Defaults to slog.Default().
	Logger *slog.Logger
	// OnProgress, when set, is called after every step. It must not block.
	OnProgress func(Progress)
}

// Progress is the state of a run after a step.
type Progress struct {
	// RunID identifies the run in archive_runs.
	RunID int64 `json:"run_id"`
	// StartedBy is the database role that started the run, StartedAt when.
	StartedBy string    `json:"started_by"`
	StartedAt time.Time `json:"started_at"`
	// Before is the position the run was asked to archive below.
	Before int64 `json:"before"`
	// From and Target bound the positions it moves: (From, Target]. Target
	// is below Before and below the newest event when the run started.
	From   int64 `json:"from_position"`
	Target int64 `json:"target_position"`
	// ArchivedTo is how far it has got: positions up to it are archived.
	ArchivedTo int64 `json:"archived_to"`
	// Moved counts the events moved so far, Steps the steps made.
	Moved int64 `json:"moved"`
	Steps int   `json:"steps"`
	// Done reports a finished run.
	Done bool `json:"done"`
}

// Fraction is how much of the run's range is done, from 0 to 1.
func (p Progress) Fraction() float64 {
	if p.Target <= p.From {
		return 1
	}
	return float64(p.ArchivedTo-p.From) / float64(p.Target-p.From)
}

// Archiver runs archive runs. It is safe for concurrent use.
type Archiver struct {
	pool   *pgxpool.Pool
	cfg    Config
	schema string
	q      map[string]string
}

// New returns an Archiver on pool; the schema must be migrated.
func New(pool *pgxpool.Pool, cfg *Config) (*Archiver, error) {
	if pool == nil {
		return nil, errors.New("archive: pool is nil")
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
		return nil, errors.New("archive: BatchSize must not be negative")
	}
	if c.BatchSize == 0 {
		c.BatchSize = 2000
	}
	if c.Pause == 0 {
		c.Pause = 20 * time.Millisecond
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
	return &Archiver{pool: pool, cfg: c, schema: c.Schema, q: q}, nil
}

// RunOnce takes the archiver lock and makes steps until the open run (or a
// new one, archiving the positions below before) is done, then releases the
// lock and returns the run's final progress. An open run (one that was
// interrupted) is finished first, with the target it started with; call
// RunOnce again to go on to before. It returns ErrBusy at once if another
// archiver holds the lock. When ctx ends it stops (a step in flight commits
// or rolls back whole) and returns ctx's error with the progress so far: the
// run stays open, and the next RunOnce, from any process, resumes it. A step
// interrupted by ctx closes the lock's connection, so the lock is free once
// the server notices, a moment later: a RunOnce started right after may get
// ErrBusy until then.
func (a *Archiver) RunOnce(ctx context.Context, before int64) (Progress, error) {
	if before < 1 {
		return Progress{}, errors.Newf("archive: before must be a position of at least 1, not %d", before)
	}
	lock, err := advisorylock.TryAcquire(ctx, a.pool.Config().ConnConfig, a.schema+":archiver", poolconn.LockConfig(a.pool, a.cfg.Lock))
	if errors.Is(err, advisorylock.ErrNotAcquired) {
		return Progress{}, errors.WithStack(ErrBusy)
	}
	if err != nil {
		return Progress{}, errors.Wrap(err, "archive: take the archiver lock")
	}
	defer func() { _ = lock.Release(context.WithoutCancel(ctx)) }()

	var p Progress
	for {
		err := lock.Do(ctx, func(conn *pgx.Conn) error {
			return conn.QueryRow(ctx, a.q["Step"], a.cfg.InstanceID, before, a.cfg.BatchSize).Scan(
				&p.RunID, &p.StartedBy, &p.StartedAt, &p.Before, &p.From, &p.ArchivedTo, &p.Target, &p.Moved, &p.Steps, &p.Done)
		})
		if err != nil {
			if ctx.Err() != nil {
				return p, errors.Wrap(ctx.Err(), "archive: stopped; the run resumes with the next RunOnce")
			}
			return p, errors.Wrap(err, "archive: step")
		}
		if a.cfg.OnProgress != nil {
			a.cfg.OnProgress(p)
		}
		if p.Done {
			a.cfg.Logger.InfoContext(ctx, "annals: archive run finished", slog.Int64("run", p.RunID),
				slog.Int64("moved", p.Moved), slog.Int64("from", p.From), slog.Int64("to", p.Target), slog.Int("steps", p.Steps))
			return p, nil
		}
		if a.cfg.Pause > 0 {
			t := time.NewTimer(a.cfg.Pause)
			select {
			case <-ctx.Done():
				t.Stop()
				return p, errors.Wrap(ctx.Err(), "archive: stopped; the run resumes with the next RunOnce")
			case <-t.C:
			}
		}
	}
}

// Run is one row of archive_runs.
type Run struct {
	Progress
	// Instance is the InstanceID of the archiver that started the run.
	Instance string `json:"instance"`
	// FinishedAt is when it finished (nil: open).
	FinishedAt *time.Time `json:"finished_at"`
}

// Runs returns the newest limit runs, newest first.
func (a *Archiver) Runs(ctx context.Context, limit int) ([]Run, error) {
	rows, err := a.pool.Query(ctx, a.q["Runs"], limit)
	if err != nil {
		return nil, errors.Wrap(err, "archive: list runs")
	}
	var r Run
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (Run, error) {
		r = Run{}
		err := row.Scan(&r.RunID, &r.StartedBy, &r.Instance, &r.StartedAt, &r.Before, &r.From, &r.ArchivedTo, &r.Target,
			&r.Moved, &r.Steps, &r.Done, &r.FinishedAt)
		return r, err
	})
}

// Status is the state of the archive.
type Status struct {
	// Horizon is the archive horizon: every position below it is archived
	// (or was scavenged), every position at or above it is in events.
	Horizon int64 `json:"horizon"`
	// Moved counts the events all runs moved (scavenging may have removed
	// some of them since).
	Moved int64 `json:"moved"`
	// NewestArchived is the newest position in events_archive (0: none);
	// Head the newest position of the log.
	NewestArchived int64 `json:"newest_archived"`
	Head           int64 `json:"head"`
	// HotBytes and ArchiveBytes are the tables' sizes with indexes and
	// TOAST; HotRows and ArchiveRows PostgreSQL's row estimates (-1: the
	// table was never analyzed).
	HotBytes     int64 `json:"hot_bytes"`
	ArchiveBytes int64 `json:"archive_bytes"`
	HotRows      int64 `json:"hot_rows_estimate"`
	ArchiveRows  int64 `json:"archive_rows_estimate"`
	// Runs are the newest runs, newest first.
	Runs []Run `json:"runs"`
}

// Status returns the archive's state with the newest runs (at most runs).
func (a *Archiver) Status(ctx context.Context, runs int) (Status, error) {
	var s Status
	if err := a.pool.QueryRow(ctx, a.q["Status"]).Scan(&s.Horizon, &s.Moved, &s.NewestArchived, &s.Head,
		&s.HotBytes, &s.ArchiveBytes, &s.HotRows, &s.ArchiveRows); err != nil {
		return Status{}, errors.Wrap(err, "archive: status")
	}
	var err error
	if s.Runs, err = a.Runs(ctx, runs); err != nil {
		return Status{}, err
	}
	if s.Runs == nil {
		s.Runs = []Run{}
	}
	return s, nil
}
