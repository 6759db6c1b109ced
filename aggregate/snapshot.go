package aggregate

import (
	"context"
	"encoding/json"
	"log/slog"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/internal/lockfallback"
	"github.com/annals-dev/annals/internal/pgtx"
	"github.com/annals-dev/annals/internal/telemetry"
)

// Snapshotter is implemented by aggregates that encode their own snapshot
// state. Without it a snapshot is the aggregate encoded with encoding/json
// (its exported fields; Base is left out): state kept in unexported fields
// is not in the snapshot, and a load from it leaves them zero, so an
// aggregate with such state must implement Snapshotter.
type Snapshotter interface {
	// MarshalSnapshot returns the aggregate's state, as JSON (the snapshots
	// table stores json): other bytes fail the snapshot write, which is
	// logged and does not fail the save, and loads replay the stream.
	MarshalSnapshot() ([]byte, error)
	// UnmarshalSnapshot restores state written by MarshalSnapshot into a
	// new, empty aggregate.
	UnmarshalSnapshot(data []byte) error
}

// loadSnapshot returns the aggregate restored from its newest snapshot of
// the configured schema version, with its ID and version set, or false when
// there is none or it is unusable (logged: the load replays the stream).
//
// With tx, it reads in tx, and a failed read is returned (it has aborted
// tx); an undecodable snapshot is still only logged.
func (r *Repository[A]) loadSnapshot(ctx context.Context, tx pgx.Tx, id, stream string) (A, bool, error) {
	var zero A
	s := r.cfg.Snapshots
	if s == nil {
		return zero, false, nil
	}
	var version, from int64
	var state []byte
	var row pgx.Row
	if tx != nil {
		row = tx.QueryRow(ctx, r.q["LoadSnapshot"], r.typ, stream, s.SchemaVersion)
	} else {
		row = r.store.Pool().QueryRow(ctx, r.q["LoadSnapshot"], r.typ, stream, s.SchemaVersion)
	}
	err := row.Scan(&version, &state, &from)
	if errors.Is(err, pgx.ErrNoRows) {
		return zero, false, nil
	}
	if err != nil && tx != nil {
		return zero, false, errors.Wrapf(err, "aggregate %s %q: read snapshot", r.typ, id)
	}
	if err == nil {
		a := r.newAgg()
		if sn, ok := any(a).(Snapshotter); ok {
			err = sn.UnmarshalSnapshot(state)
		} else {
			err = json.Unmarshal(state, a)
		}
		if err == nil {
			a.root().id = id
			a.root().version = version
			a.root().from = from
			return a, true, nil
		}
	}
	if ctx.Err() == nil {
		r.cfg.Logger.WarnContext(ctx, "annals: snapshot unusable; replaying the stream",
			slog.String("aggregate", r.typ), slog.String("stream", stream), telemetry.Err(err))
	}
	return zero, false, nil
}

// saveSnapshot writes a's state as the stream's snapshot. It runs after the
// save's append has committed, in a transaction of its own: it never holds
// the log's ordering lock, and its failure only costs later loads time.
//
// Personal data. a's state may hold personal fields decrypted before their
// subject was forgotten (a was loaded before the Forget, or by a process
// whose key cache still held the key). Writing it would put the plaintext
// back into the snapshots Forget has just emptied. Which subjects a state
// holds only the log knows (reads return the fields decrypted), so
// SaveSnapshot reads the envelopes of the events the state folds and writes
// nothing when one belongs to a subject whose key is gone. The check and a
// concurrent Forget are serialised by the advisory lock SnapshotLock takes
// shared and forget_subject exclusively: a write holding it has committed
// before forget_subject destroys the key and deletes the stream's
// snapshots (including this one), and a write after that sees the key gone.
// While a Forget runs the lock is not waited for: the write is skipped.
func (r *Repository[A]) saveSnapshot(ctx context.Context, a A, stream string) {
	b := a.root()
	var state []byte
	var err error
	if sn, ok := any(a).(Snapshotter); ok {
		state, err = sn.MarshalSnapshot()
	} else {
		state, err = json.Marshal(a)
	}
	if err == nil && !json.Valid(state) {
		err = errors.New("the snapshot state is not valid JSON")
	}
	skipped := false
	if err == nil {
		// READ COMMITTED whatever the session's default: SaveSnapshot must
		// read what committed before the lock was granted.
		for again := false; ; again = true {
			err = pgx.BeginTxFunc(ctx, r.store.Pool(), pgtx.ReadCommitted, func(tx pgx.Tx) error {
				locked, err := r.snapshotLock(ctx, tx, again)
				if err != nil {
					return err
				}
				if !locked {
					skipped = true
					return nil
				}
				_, err = tx.Exec(ctx, r.q["SaveSnapshot"], r.typ, stream, r.cfg.Snapshots.SchemaVersion, b.version,
					json.RawMessage(state), max(b.from, 1))
				return err
			})
			if !errors.Is(err, lockfallback.ErrSwitched) || again {
				break // the lock statement was the transaction's first: nothing else is lost
			}
		}
	}
	switch {
	case err != nil:
		r.cfg.Logger.WarnContext(ctx, "annals: writing a snapshot failed; the save stands",
			slog.String("aggregate", r.typ), slog.String("stream", stream), slog.Int64("version", b.version), telemetry.Err(err))
	case skipped:
		r.cfg.Logger.DebugContext(ctx, "annals: snapshot not written: a Forget is running",
			slog.String("aggregate", r.typ), slog.String("stream", stream), slog.Int64("version", b.version))
	}
}

// snapshotLock takes, in tx (whose first statement this is), the shared
// side of Forget's lock, and reports whether it got it (false: a Forget is
// running). Through the schema's snapshot_lock (migration 0034), or, on a
// schema migrated before it, through pg_try_advisory_xact_lock_shared with
// the same key, as clients before 0034 took it, so that a Forget of either
// version still excludes the write (internal/lockfallback). A failure that
// switches the choice returns lockfallback.ErrSwitched (the write is made
// again), unless last is set: then migrations.ErrNotMigrated.
func (r *Repository[A]) snapshotLock(ctx context.Context, tx pgx.Tx, last bool) (bool, error) {
	direct := r.snapshotLockFn.Direct()
	q := r.q["SnapshotLock"]
	if direct {
		q = r.q["SnapshotLockDirect"]
	}
	var locked bool
	if err := tx.QueryRow(ctx, q).Scan(&locked); err != nil {
		return false, r.snapshotLockFn.Failed(errors.Wrap(err, "aggregate: take the snapshot lock"), direct, last, "snapshot_lock")
	}
	return locked, nil
}
