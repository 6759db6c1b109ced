package walsource

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/annals-dev/annals/internal/lockkey"
	"github.com/annals-dev/annals/internal/pgtx"
	"github.com/annals-dev/annals/internal/schemaname"
	"github.com/annals-dev/annals/internal/sqltmpl"
)

// maxNameLen is PostgreSQL's identifier length (NAMEDATALEN - 1).
const maxNameLen = 63

// SlotName returns the replication slot of a subscriber partition of a
// database: "annals_" and a readable part of the subscriber's name, the
// partition, and a hash of database, schema, subscriber and partition (slot
// names are cluster-wide and may hold only a-z, 0-9 and "_").
func SlotName(database, schema, subscriber string, partition int) string {
	schema = schemaname.Or(schema)
	h := sha256.Sum256([]byte(database + "\x00" + schema + "\x00" + subscriber + "\x00" + fmt.Sprint(partition)))
	suffix := fmt.Sprintf("_%d_%s", partition, hex.EncodeToString(h[:6]))
	readable := sanitize(subscriber)
	if room := maxNameLen - len("annals_") - len(suffix); len(readable) > room {
		readable = readable[:room]
	}
	return "annals_" + readable + suffix
}

// PublicationName returns the publication on a schema's events table:
// "<schema>_events", sanitized like a slot name (plus a hash when the schema
// needed changes, so that two schemas never share one).
func PublicationName(schema string) string {
	schema = schemaname.Or(schema)
	s := sanitize(schema)
	if s != schema || len(s)+len("_events") > maxNameLen {
		h := sha256.Sum256([]byte(schema))
		s = s[:min(len(s), 40)] + "_" + hex.EncodeToString(h[:4])
	}
	return s + "_events"
}

func sanitize(s string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(s) {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '_' {
			b.WriteRune(r)
		} else {
			b.WriteByte('_')
		}
	}
	return b.String()
}

// publicationExists looks the publication up.
const publicationExists = `SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_publication WHERE pubname = $1)`

// EnsurePublication creates the publication of the schema's events table
// (inserts only) unless it exists. The role needs CREATE on the database
// and ownership of the events table (the schema owner that ran the
// migrations has both); it needs neither when the publication exists.
//
// Processes starting at once (replicas, each with a Wake) create it one
// at a time: a READ COMMITTED transaction under an advisory lock on the
// publication's name (lockkey.Pair("walsource:publication:" + name))
// looks again and creates it only if still missing. A concurrent CREATE
// PUBLICATION alone fails for the loser with a unique violation on the
// catalogs (23505), not 42710.
func EnsurePublication(ctx context.Context, pool *pgxpool.Pool, schema string) (string, error) {
	schema, err := schemaname.Resolve(schema)
	if err != nil {
		return "", err
	}
	name := PublicationName(schema)
	var exists bool
	if err := pool.QueryRow(ctx, publicationExists, name).Scan(&exists); err != nil {
		return "", errors.Wrap(err, "walsource: look up the publication")
	}
	if exists {
		return name, nil
	}
	sql := "CREATE PUBLICATION " + pgx.Identifier{name}.Sanitize() + " FOR TABLE " +
		pgx.Identifier{schema, "events"}.Sanitize() + " WITH (publish = 'insert')"
	k1, k2 := lockkey.Pair("walsource:publication:" + name)
	err = pgx.BeginTxFunc(ctx, pool, pgtx.ReadCommitted, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_catalog.pg_advisory_xact_lock($1::int4, $2::int4)`, k1, k2); err != nil {
			return errors.Wrap(err, "walsource: take the publication's lock")
		}
		// A statement after the wait: it sees what the lock's previous
		// holder committed.
		if err := tx.QueryRow(ctx, publicationExists, name).Scan(&exists); err != nil {
			return errors.Wrap(err, "walsource: look up the publication")
		}
		if exists {
			return nil
		}
		_, err := tx.Exec(ctx, sql)
		return errors.Wrapf(err, "walsource: create publication %s", name)
	})
	if err != nil && !isCode(err, "42710") { // duplicate_object: made by hand meanwhile
		return "", err
	}
	return name, nil
}

// EnsureSlot creates the logical replication slot (pgoutput) unless it
// exists, and reports whether it created it. Creating a slot waits for the
// transactions running at that moment to end (PostgreSQL needs a
// consistent starting point).
func EnsureSlot(ctx context.Context, pool *pgxpool.Pool, slot string) (bool, error) {
	var exists bool
	if err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_replication_slots WHERE slot_name = $1)`, slot).Scan(&exists); err != nil {
		return false, errors.Wrap(err, "walsource: look up the slot")
	}
	if exists {
		return false, nil
	}
	_, err := pool.Exec(ctx, `SELECT pg_catalog.pg_create_logical_replication_slot($1, 'pgoutput')`, slot)
	if isCode(err, "42710") {
		return false, nil
	}
	if isCode(err, "55000") {
		return false, errors.Wrapf(err, "walsource: create slot %s: logical replication needs wal_level = logical", slot)
	}
	return err == nil, errors.Wrapf(err, "walsource: create slot %s", slot)
}

// DropSlot drops a replication slot, ending the session that streams from
// it first if there is one. A slot that does not exist is no error.
func DropSlot(ctx context.Context, pool *pgxpool.Pool, slot string) error {
	for range 50 {
		_, err := pool.Exec(ctx, `SELECT pg_catalog.pg_terminate_backend(active_pid) FROM pg_catalog.pg_replication_slots WHERE slot_name = $1 AND active_pid IS NOT NULL`, slot)
		if err != nil {
			return errors.Wrapf(err, "walsource: end the session of slot %s", slot)
		}
		_, err = pool.Exec(ctx, `SELECT pg_catalog.pg_drop_replication_slot(slot_name) FROM pg_catalog.pg_replication_slots WHERE slot_name = $1`, slot)
		if !isCode(err, "55006") { // object_in_use: the session has not ended yet
			return errors.Wrapf(err, "walsource: drop slot %s", slot)
		}
		if err := sleep(ctx, 20e6); err != nil {
			return err
		}
	}
	return errors.Newf("walsource: slot %s stays in use", slot)
}

// slotLost reports whether the slot exists and has been invalidated
// (wal_status lost: max_slot_wal_keep_size let PostgreSQL remove WAL it
// needed), so that it can never be streamed again.
func slotLost(ctx context.Context, pool *pgxpool.Pool, slot string) (bool, error) {
	var lost bool
	err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_replication_slots WHERE slot_name = $1 AND wal_status = 'lost')`, slot).Scan(&lost)
	return lost, errors.Wrapf(err, "walsource: look up slot %s", slot)
}

// SlotStatus is a replication slot as pg_replication_slots shows it.
type SlotStatus struct {
	// Slot is the slot's name.
	Slot string `json:"slot"`
	// Database is the database the slot decodes.
	Database string `json:"database"`
	// Active reports whether a session streams from it; ActivePID is that
	// session's backend (0 when inactive).
	Active    bool  `json:"active"`
	ActivePID int32 `json:"active_pid"`
	// ConfirmedFlushLSN is how far the consumer confirmed; "" while the
	// slot is being created (Active then, waiting for the transactions
	// that were open when its creation began).
	ConfirmedFlushLSN string `json:"confirmed_flush_lsn"`
	// RetainedBytes is the WAL the slot keeps from being recycled
	// (pg_current_wal_lsn() - restart_lsn).
	RetainedBytes int64 `json:"retained_bytes"`
	// WALStatus is reserved, extended, unreserved or lost (max_slot_wal_keep_size).
	WALStatus string `json:"wal_status"`
}

// Slots lists the annals replication slots (named "annals_…") of the
// current database, as docs/operations.md's monitoring query does.
func Slots(ctx context.Context, db interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}) ([]SlotStatus, error) {
	q, err := sqltmpl.Named("queries.sql", queriesSQL, sqltmpl.NewData(""))
	if err != nil {
		return nil, err
	}
	rows, err := db.Query(ctx, q["Slots"])
	if err != nil {
		return nil, errors.Wrap(err, "walsource: list slots")
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (SlotStatus, error) {
		var s SlotStatus
		err := r.Scan(&s.Slot, &s.Database, &s.Active, &s.ActivePID, &s.ConfirmedFlushLSN, &s.RetainedBytes, &s.WALStatus)
		return s, err
	})
	return out, errors.Wrap(err, "walsource: list slots")
}

func isCode(err error, code string) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == code
}
