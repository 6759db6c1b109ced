package saga

import (
	"context"
	"encoding/json"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// DB is what Lookup reads with: a *pgxpool.Pool, *pgx.Conn or pgx.Tx.
type DB interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// Stored is a saga instance as stored in saga_states.
type Stored[S any] struct {
	// ID is the correlation ID.
	ID string
	// State is the state the last Handle left.
	State S
	// Version is the number of events the instance has handled.
	Version int64
	// Completed reports whether the instance has completed.
	Completed bool
	// CreatedAt, UpdatedAt and CompletedAt (zero unless completed) are
	// Config.Clock's times.
	CreatedAt, UpdatedAt, CompletedAt time.Time
}

// Lookup reads the stored instance id of the saga named sagaName from the
// annals schema (default "annals" when schema is ""), or returns ErrNotFound.
// For tests, tools and read paths; a saga's own handler reads its instance
// through the Instance it is given.
func Lookup[S any](ctx context.Context, db DB, schema, sagaName, id string) (Stored[S], error) {
	q, err := queries(schema)
	if err != nil {
		return Stored[S]{}, err
	}
	out := Stored[S]{ID: id}
	var raw []byte
	var completedAt *time.Time
	err = db.QueryRow(ctx, q["Lookup"], sagaName, id).Scan(&raw, &out.Version, &out.Completed, &out.CreatedAt, &out.UpdatedAt, &completedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return out, errors.Wrapf(ErrNotFound, "saga %q instance %q", sagaName, id)
	}
	if err != nil {
		return out, errors.Wrapf(err, "saga %q instance %q: lookup", sagaName, id)
	}
	if completedAt != nil {
		out.CompletedAt = *completedAt
	}
	if err := json.Unmarshal(raw, &out.State); err != nil {
		return out, errors.Wrapf(err, "saga %q instance %q: decode state %.200s into %T", sagaName, id, raw, out.State)
	}
	return out, nil
}
