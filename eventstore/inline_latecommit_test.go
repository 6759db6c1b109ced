package eventstore_test

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/eventstore"
)

// keyedInline is an inline projection keyed by event ID (a read model row
// per event, its primary key the event's ID), as most read models are
// keyed. The first time it handles an event, once its row is written,
// arm (when set) is called with the transaction.
type keyedInline struct {
	armed atomic.Bool
	arm   func(ctx context.Context, tx pgx.Tx) error
}

func (*keyedInline) Name() string { return "keyed" }

func (k *keyedInline) Handle(ctx context.Context, tx pgx.Tx, e eventstore.Event) error {
	if _, err := tx.Exec(ctx, `INSERT INTO inline_keyed (event_id) VALUES ($1)`, e.ID); err != nil {
		return err
	}
	if k.arm != nil && k.armed.CompareAndSwap(false, true) {
		return k.arm(ctx, tx)
	}
	return nil
}

// pipelined reports whether b, whole frontend messages, runs several
// statements (two Execute messages or more): a pipeline such as an append
// with its COMMIT, not a single query.
func pipelined(b []byte) bool {
	n := 0
	for len(b) >= 5 {
		l := int(binary.BigEndian.Uint32(b[1:5]))
		if l < 4 || 1+l > len(b) {
			break
		}
		if b[0] == 'E' {
			n++
		}
		b = b[1+l:]
	}
	return n >= 2
}

// TestInlineRetryBeforeTheLostCommitLands: an Append through an inline
// projection keyed by event ID loses the answer to its append and COMMIT
// (the connection cut right after they were sent), and its backend runs
// them only later (stopped before they were sent, as a loaded machine
// does now and then): the Append is outcome-unknown. The caller does what
// the error says, Append again with its event IDs; the retry finds them not
// stored yet, runs the handler, whose row waits for the first attempt's,
// and the first attempt then commits. The retry must answer as the
// idempotent re-append it is, with the stored position: the event and its
// row are stored once. Before, the handler's unique violation failed the
// retry with ErrInlineProjection, which says nothing was stored, while the
// event was.
func TestInlineRetryBeforeTheLostCommitLands(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := annalstest.NewDB(t, nil)
	if _, err := db.Pool.Exec(ctx, `CREATE TABLE inline_keyed (event_id uuid PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	cp := annalstest.NewCutPool(t, db)
	var (
		frozen atomic.Int32
		cut    atomic.Pointer[annalstest.CutConn]
	)
	resume := func() {
		if pid := frozen.Swap(0); pid != 0 {
			_ = syscall.Kill(int(pid), syscall.SIGCONT)
		}
	}
	t.Cleanup(resume)
	p := &keyedInline{arm: func(ctx context.Context, tx pgx.Tx) error {
		c, err := cp.Of(ctx, tx)
		if err != nil {
			return err
		}
		pid := tx.Conn().PgConn().PID()
		// The append and its COMMIT go in one write, the first of
		// several statements: the backend is stopped before it gets
		// them, and the connection cut right after they are sent.
		c.StopServerAndCutAfter(t, pipelined, pid, func() { frozen.Store(int32(pid)) })
		cut.Store(c)
		return nil
	}}
	store, err := eventstore.New(cp.Pool, &eventstore.Config{Inline: []eventstore.InlineProjection{p}})
	if err != nil {
		t.Fatal(err)
	}
	ev := eventstore.EventData{Type: "t.keyed", Data: json.RawMessage(`{"a": 1}`)}
	_, err = store.Append(ctx, "keyed-1", eventstore.NoStream, ev)
	var unknown *eventstore.OutcomeUnknownError
	if !errors.As(err, &unknown) {
		t.Fatalf("append whose connection was cut after its COMMIT was sent: %v; want an *OutcomeUnknownError", err)
	}
	if c := cut.Load(); c == nil || !c.Cut() || frozen.Load() == 0 {
		t.Fatalf("the first attempt's connection was not cut, or its backend not stopped (is the test cluster on this machine?): %v", err)
	}
	ev.ID = unknown.EventIDs[0]
	type outcome struct {
		res eventstore.AppendResult
		err error
	}
	retried := make(chan outcome, 1)
	go func() {
		res, err := store.Append(ctx, "keyed-1", eventstore.NoStream, ev)
		retried <- outcome{res, err}
	}()
	// Let the first attempt commit once the retry's handler waits for its
	// row: for the stopped backend, not any in the cluster, which the other
	// tests' databases share.
	stopped := frozen.Load()
	annalstest.WaitForErr(t, 20*time.Second, func() error {
		var waiting int
		if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE $1::int4 = ANY(pg_blocking_pids(pid))`, stopped).Scan(&waiting); err != nil {
			return err
		}
		if waiting == 0 {
			select {
			case o := <-retried:
				retried <- o
				return errors.Newf("the retry returned before the first attempt committed: %v", o.err)
			default:
			}
			return errors.New("the retry's handler does not wait for the first attempt's row")
		}
		return nil
	})
	resume()
	var o outcome
	select {
	case o = <-retried:
	case <-time.After(20 * time.Second):
		t.Fatal("the retry did not return")
	}
	var events, rows int
	var pos int64
	if err := db.Pool.QueryRow(ctx, `SELECT count(*), coalesce(max(global_sequence), 0) FROM `+
		pgx.Identifier{db.Schema}.Sanitize()+`.events WHERE stream_id = 'keyed-1'`).Scan(&events, &pos); err != nil {
		t.Fatal(err)
	}
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM inline_keyed`).Scan(&rows); err != nil {
		t.Fatal(err)
	}
	if events != 1 || rows != 1 {
		t.Fatalf("the stream holds %d events and the read model %d rows; want 1 and 1", events, rows)
	}
	if o.err != nil {
		t.Fatalf("retry of the outcome-unknown append (the first attempt committed): %v; want the idempotent re-append's answer", o.err)
	}
	if o.res.Position() != pos || o.res.StreamVersion != 1 {
		t.Fatalf("retry answered position %d, version %d; want the stored %d, 1", o.res.Position(), o.res.StreamVersion, pos)
	}
}
