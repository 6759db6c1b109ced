package deadletter

import (
	"context"
	_ "embed"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/annals-dev/annals/internal/pgtx"
	"github.com/annals-dev/annals/internal/schemaname"
	"github.com/annals-dev/annals/internal/sqltmpl"
)

//go:embed queries.sql
var queriesSQL string

var (
	// ErrNotFound is matched (errors.Is) when there is no dead letter with
	// the given ID, or RetryAll names a subscriber that has neither dead
	// letters nor a checkpoint. Nothing is changed.
	ErrNotFound = errors.New("deadletter: not found")
	// ErrInvalid is matched by bad arguments: an ID below 1, an empty
	// subscriber, an unknown status, a limit or offset out of range, a
	// purge cutoff outside the years 1 to 9999.
	// Nothing is read or changed.
	ErrInvalid = errors.New("deadletter: invalid argument")
)

// Status is where a dead letter is in its lifecycle (see the package
// documentation).
type Status string

const (
	// StatusOpen: the event waits for an operator; its stream is parked
	// for the subscriber partition.
	StatusOpen Status = "open"
	// StatusRetry: an operator released the event; the subscriber's live
	// runner re-delivers it, in position order, and marks it resolved (or
	// open again if it fails).
	StatusRetry Status = "retry"
	// StatusResolved: re-delivered successfully.
	StatusResolved Status = "resolved"
	// StatusSkipped: an operator gave up on the event; it is never delivered.
	StatusSkipped Status = "skipped"
)

// Valid reports whether s is one of the four statuses.
func (s Status) Valid() bool {
	switch s {
	case StatusOpen, StatusRetry, StatusResolved, StatusSkipped:
		return true
	}
	return false
}

// Unresolved reports whether the dead letter still parks its stream (open
// or retry).
func (s Status) Unresolved() bool { return s == StatusOpen || s == StatusRetry }

// Reason says why an event was dead-lettered.
type Reason string

const (
	// ReasonFailed: the handler failed and its retry policy was spent, or
	// the error was permanent.
	ReasonFailed Reason = "failed"
	// ReasonParked: the event was never tried; it belongs to a stream that
	// an earlier failure parked, and waits behind it in order.
	ReasonParked Reason = "parked"
)

// DeadLetter is one row of the dead_letters table.
type DeadLetter struct {
	// ID identifies the dead letter.
	ID int64
	// Subscriber and Partition name the subscriber partition that could
	// not process the event.
	Subscriber string
	Partition  int
	// EventID, GlobalSequence, StreamID and EventType describe the event.
	EventID        uuid.UUID
	GlobalSequence int64
	StreamID       string
	EventType      string
	// Reason is why the event is here.
	Reason Reason
	// Error is the last error's message ("" for a parked event).
	Error string
	// ErrorDetail is the last error with its stack trace, as the runner
	// formatted it ("" when there is none).
	ErrorDetail string
	// Attempts is how many times the handler was tried.
	Attempts int
	// Status is where the dead letter is in its lifecycle.
	Status Status
	// FirstFailedAt and LastFailedAt bound the failed attempts; zero for an
	// event that was never tried (ReasonParked).
	FirstFailedAt time.Time
	LastFailedAt  time.Time
	// CreatedAt is when the event was dead-lettered; UpdatedAt when the row
	// last changed (Purge compares it).
	CreatedAt time.Time
	UpdatedAt time.Time
}

// Config configures a Store. A nil *Config means defaults.
type Config struct {
	// Schema is the PostgreSQL schema holding the annals tables (migrated to
	// version 3 or later). Defaults to "annals".
	Schema string
}

// Store reads and changes the dead letters of one schema through a
// connection pool. It is safe for concurrent use.
type Store struct {
	pool   *pgxpool.Pool
	schema string
	q      map[string]string
}

// New returns a Store on pool. It does not touch the database.
func New(pool *pgxpool.Pool, cfg *Config) (*Store, error) {
	var c Config
	if cfg != nil {
		c = *cfg
	}
	if pool == nil {
		return nil, errors.New("deadletter: pool is nil")
	}
	var err error
	if c.Schema, err = schemaname.Resolve(c.Schema); err != nil {
		return nil, err
	}
	q, err := sqltmpl.Named("queries.sql", queriesSQL, sqltmpl.NewData(c.Schema))
	if err != nil {
		return nil, err
	}
	return &Store{pool: pool, schema: c.Schema, q: q}, nil
}

// Schema returns the schema the store works in.
func (s *Store) Schema() string { return s.schema }

// inTx runs fn in a transaction on the pool. The operations lock rows in
// one order, but the runner may not; a transaction that PostgreSQL chose as
// a deadlock victim changed nothing and is run again (every operation is
// idempotent), up to three times in all.
func (s *Store) inTx(ctx context.Context, fn func(tx pgx.Tx) error) error {
	return pgtx.Retrying(ctx, s.pool, fn)
}

func validID(id int64) error {
	if id < 1 {
		return errors.Wrapf(ErrInvalid, "dead letter ID %d: want 1 or more", id)
	}
	return nil
}

func notFound(id int64) error {
	return errors.WithStackDepth(errors.Wrapf(ErrNotFound, "dead letter %d", id), 1)
}
