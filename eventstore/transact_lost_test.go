package eventstore_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/eventstore"
)

// TestTransactCommitAnswerLost: the connection of a Transact is cut right
// after its staged appends and COMMIT are sent. The server may commit them
// (and the body's own write); the error must say the outcome is unknown
// (ErrOutcomeUnknown), not be the bare connection error that reads as
// "nothing committed" and has the caller do the body's work again. A
// Transact that the server answers (a wrong expected version) is no such
// case.
func TestTransactCommitAnswerLost(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := annalstest.NewDB(t, nil)
	if _, err := db.Pool.Exec(ctx, `CREATE TABLE transact_orders (id int PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	cp := annalstest.NewCutPool(t, db)
	store, err := eventstore.New(cp.Pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	id := uuid.Must(uuid.NewV7())
	var pid uint32
	_, err = store.Transact(ctx, func(ctx context.Context, tx pgx.Tx, b *eventstore.Batch) error {
		if _, err := tx.Exec(ctx, `INSERT INTO transact_orders VALUES (1)`); err != nil {
			return err
		}
		c, err := cp.Of(ctx, tx)
		if err != nil {
			return err
		}
		pid = tx.Conn().PgConn().PID()
		c.CutAfter(pipelined)
		return b.Append("order-1", eventstore.NoStream, eventstore.EventData{ID: id, Type: "order.placed", Data: json.RawMessage(`{"n":1}`)})
	})
	if !errors.Is(err, eventstore.ErrOutcomeUnknown) {
		t.Fatalf("Transact whose connection was cut after its COMMIT was sent: %v; want ErrOutcomeUnknown", err)
	}
	// Whether the server ran the COMMIT (it may, or end the session at its
	// first failed write to the client), it did so for both: the body's
	// row and the event, or neither. Once the backend is gone the outcome
	// is settled.
	annalstest.WaitFor(t, 20*time.Second, func() bool {
		var n int
		err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE pid = $1`, int32(pid)).Scan(&n)
		return err == nil && n == 0
	})
	var rows int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM transact_orders`).Scan(&rows); err != nil {
		t.Fatal(err)
	}
	v, err := store.StreamVersion(ctx, "order-1")
	if err != nil && !errors.Is(err, eventstore.ErrStreamNotFound) {
		t.Fatal(err)
	}
	if int64(rows) != v {
		t.Fatalf("the body's rows %d, the stream's version %d: one transaction, both or neither", rows, v)
	}
	t.Logf("the lost COMMIT committed: %v", rows == 1)
	if rows == 0 {
		// Not committed: stage it again, to have the stream below.
		if _, err := store.Append(ctx, "order-1", eventstore.NoStream, eventstore.EventData{ID: id, Type: "order.placed", Data: json.RawMessage(`{"n":1}`)}); err != nil {
			t.Fatal(err)
		}
	}
	_, err = store.Transact(ctx, func(ctx context.Context, tx pgx.Tx, b *eventstore.Batch) error {
		return b.Append("order-1", eventstore.NoStream, eventstore.EventData{Type: "order.placed", Data: json.RawMessage(`{"n":2}`)})
	})
	if !errors.Is(err, eventstore.ErrWrongExpectedVersion) || errors.Is(err, eventstore.ErrOutcomeUnknown) {
		t.Fatalf("Transact refused by the server: %v; want ErrWrongExpectedVersion alone", err)
	}
	// A body that stages nothing: its COMMIT alone, cut after it is sent.
	_, err = store.Transact(ctx, func(ctx context.Context, tx pgx.Tx, b *eventstore.Batch) error {
		if _, err := tx.Exec(ctx, `INSERT INTO transact_orders VALUES (2)`); err != nil {
			return err
		}
		c, err := cp.Of(ctx, tx)
		if err != nil {
			return err
		}
		c.CutAfter(annalstest.HasCommit)
		return nil
	})
	if !errors.Is(err, eventstore.ErrOutcomeUnknown) {
		t.Fatalf("Transact staging nothing, its COMMIT's answer lost: %v; want ErrOutcomeUnknown", err)
	}
}
