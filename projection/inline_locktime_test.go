package projection_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/internal/locktrace"
	"github.com/annals-dev/annals/projection"
)

// An inline projection runs before its append takes the log's ordering lock:
// the lock is held for no round trip (the append and the COMMIT travel
// together), with or without the projection, however many statements the
// handler sends. The same handler run after the append, in the append's
// transaction, would hold the lock for each of its round trips: the tracer
// sees that too, so the figure is not a blind spot of the tracer.
func TestInlineHoldsTheAppendLockNoLonger(t *testing.T) {
	t.Parallel()
	b := setupInline(t)
	tracer := locktrace.New()
	cfg := b.db.Pool.Config().Copy()
	cfg.ConnConfig.Tracer = tracer
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	// A handler of three round trips per event.
	slow := balancesWithVersion(b.reg, func(e eventstore.Envelope[Withdrawn]) error { return nil })
	heavy := &roundTrips{Typed: slow, n: 2}
	plain, err := eventstore.New(pool, &eventstore.Config{Registry: b.reg})
	if err != nil {
		t.Fatal(err)
	}
	inline, err := eventstore.New(pool, &eventstore.Config{Registry: b.reg, Inline: []eventstore.InlineProjection{heavy}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	const n = 200
	measure := func(name string, s *eventstore.Store) {
		start := time.Now()
		for i := range n {
			if _, err := s.Append(ctx, fmt.Sprintf("%s-%d", name, i%10), eventstore.Any, eventstore.NewEvent(Deposited{Amount: 1})); err != nil {
				t.Fatal(err)
			}
			if _, err := s.Transact(ctx, func(ctx context.Context, tx pgx.Tx, batch *eventstore.Batch) error {
				return batch.Append(fmt.Sprintf("%s-t%d", name, i%10), eventstore.Any, eventstore.NewEvent(Withdrawn{Amount: 1}))
			}); err != nil {
				t.Fatal(err)
			}
		}
		under, total := tracer.Counts()
		t.Logf("%s: %d appends in %v (%v each); round trips under the append lock: %d of %d; most in one transaction: %d",
			name, 2*n, time.Since(start).Round(time.Millisecond), (time.Since(start) / (2 * n)).Round(time.Microsecond),
			under, total, tracer.MaxPerTransaction())
		if under != 0 || tracer.MaxPerTransaction() != 0 {
			t.Errorf("%s: %d round trips sent under the append lock; want none", name, under)
		}
	}
	measure("plain", plain)
	measure("inline", inline)
	if got := readModel(t, b.bundle)["inline-3"]; got.Events != n/10 {
		t.Fatalf("inline read model for inline-3: %+v, want %d events", got, n/10)
	}

	// The same work done after the append (AppendTx, then the handler's
	// statements, then COMMIT): the lock is held for every one of them.
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		res, err := plain.AppendTx(ctx, tx, "after-1", eventstore.Any, eventstore.NewEvent(Deposited{Amount: 1}))
		if err != nil {
			return err
		}
		e := eventstore.Event{StreamID: "after-1", StreamVersion: res.StreamVersion, Type: "account.deposited", Data: []byte(`{"amount":1}`)}
		return heavy.Handle(ctx, tx, e)
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := tracer.MaxPerTransaction(); got < 3 {
		t.Fatalf("a handler run after the append held the lock for %d round trips; the tracer should see at least 3", got)
	}
}

// roundTrips sends n extra round trips per event before handling it.
type roundTrips struct {
	*projection.Typed
	n int
}

func (r *roundTrips) Handle(ctx context.Context, tx pgx.Tx, e eventstore.Event) error {
	for range r.n {
		if _, err := tx.Exec(ctx, `SELECT amount FROM balances WHERE account = $1`, e.StreamID); err != nil {
			return err
		}
	}
	return r.Typed.Handle(ctx, tx, e)
}
