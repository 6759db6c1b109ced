package catchup

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/eventstore"
)

// behindRecorder records, for each batch, whether its commit may skip the
// WAL flush (the lease's behind flag while Process runs).
type behindRecorder struct {
	behind []bool
	last   []int64
}

func (r *behindRecorder) Start(context.Context, *Lease) error     { return nil }
func (r *behindRecorder) Redeliver(context.Context, *Lease) error { return nil }
func (r *behindRecorder) Idle(context.Context, *Lease) error      { return nil }
func (r *behindRecorder) End(context.Context, *Lease) error       { return nil }
func (r *behindRecorder) Process(_ context.Context, lease *Lease, b Batch) (int64, error) {
	r.behind = append(r.behind, lease.behind)
	r.last = append(r.last, b.Through)
	return b.Through, nil
}

// A batch read while its partition is behind the head commits without
// waiting for its WAL flush, the batch that reaches the head waits (so a
// catch-up ends durable), SyncCommits turns it off, and a transaction that
// appended events (it holds the append lock) always waits.
func TestAsyncCommitWhileBehind(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	ctx := t.Context()
	store, err := eventstore.New(db.Pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		evs := make([]eventstore.EventData, 100)
		for j := range evs {
			evs[j] = eventstore.EventData{Type: "t.x", Data: map[string]int{"i": i*100 + j}}
		}
		if _, err := store.Append(ctx, fmt.Sprintf("s-%d", i), eventstore.NoStream, evs...); err != nil {
			t.Fatal(err)
		}
	}
	e, err := NewEngine(db.Pool, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, sync := range []bool{false, true} {
		r := &behindRecorder{}
		sub := &Subscription{Name: fmt.Sprintf("behind-%v", sync), BatchSize: 100, Processor: r, SyncCommits: sync}
		if err := e.CatchUp(ctx, sub, 1000); err != nil {
			t.Fatal(err)
		}
		if len(r.behind) != 10 {
			t.Fatalf("SyncCommits %v: %d batches, want 10 (through %v)", sync, len(r.behind), r.last)
		}
		for i, b := range r.behind {
			want := !sync && i < 9
			if b != want {
				t.Fatalf("SyncCommits %v: batch %d (through %d) behind = %v, want %v", sync, i, r.last[i], b, want)
			}
		}
	}

	// The statement queued before COMMIT: off, unless the transaction
	// holds the append lock.
	setting := func(appendFirst bool) string {
		t.Helper()
		var got string
		err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `SET LOCAL synchronous_commit = on`); err != nil {
				return err
			}
			if appendFirst {
				if _, err := store.AppendTx(ctx, tx, "appended", eventstore.Any, eventstore.EventData{Type: "t.x", Data: map[string]int{}}); err != nil {
					return err
				}
			}
			if _, err := tx.Exec(ctx, e.q["AsyncCommit"]); err != nil {
				return err
			}
			return tx.QueryRow(ctx, `SELECT current_setting('synchronous_commit')`).Scan(&got)
		})
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	if got := setting(false); got != "off" {
		t.Fatalf("a batch transaction that appended nothing commits with synchronous_commit %q, want off", got)
	}
	if got := setting(true); got != "on" {
		t.Fatalf("a batch transaction that appended an event commits with synchronous_commit %q, want on", got)
	}
}
