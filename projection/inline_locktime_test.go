package projection_test

import (
	"context"
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/annals-dev/annals/annalstest"
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

// BenchmarkInlineAppendLock compares, with 8 concurrent writers, appends
// in transactions of their own (Transact; no group commit, so the ordering
// lock is what they queue for): without an inline projection, with one
// whose handler sends 3 statements per event (before the lock), and with
// the same handler run after the append, under the lock. The lock's hold
// time is what serializes the writers, so throughput shows it.
//
//	go run ./cmd/annals dev -- go test -run '^$' -bench BenchmarkInlineAppendLock -benchtime 2000x ./projection/
func BenchmarkInlineAppendLock(b *testing.B) {
	db := annalstest.NewDB(b, nil)
	reg := eventstore.NewRegistry()
	eventstore.MustRegister[Deposited](reg, "account.deposited")
	eventstore.MustRegister[Withdrawn](reg, "account.withdrawn")
	if _, err := db.Pool.Exec(b.Context(), `CREATE TABLE balances (account text PRIMARY KEY, amount bigint NOT NULL, events int NOT NULL, version bigint NOT NULL DEFAULT 0)`); err != nil {
		b.Fatal(err)
	}
	heavy := &roundTrips{Typed: balancesWithVersion(reg, nil), n: 2}
	plain, err := eventstore.New(db.Pool, &eventstore.Config{Registry: reg})
	if err != nil {
		b.Fatal(err)
	}
	inline, err := eventstore.New(db.Pool, &eventstore.Config{Registry: reg, Inline: []eventstore.InlineProjection{heavy}})
	if err != nil {
		b.Fatal(err)
	}
	var writer atomic.Int64
	run := func(b *testing.B, appendOne func(ctx context.Context, stream string) error) {
		b.SetParallelism(8 / max(1, runtime.GOMAXPROCS(0)))
		start := time.Now()
		b.RunParallel(func(pb *testing.PB) {
			stream := fmt.Sprintf("%s-%d", b.Name(), writer.Add(1))
			for pb.Next() {
				if err := appendOne(b.Context(), stream); err != nil {
					b.Error(err)
					return
				}
			}
		})
		b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "appends/s")
	}
	ev := eventstore.NewEvent(Deposited{Amount: 1})
	b.Run("Plain", func(b *testing.B) {
		run(b, func(ctx context.Context, stream string) error {
			_, err := plain.Transact(ctx, func(ctx context.Context, tx pgx.Tx, batch *eventstore.Batch) error {
				return batch.Append(stream, eventstore.Any, ev)
			})
			return err
		})
	})
	b.Run("Inline", func(b *testing.B) {
		run(b, func(ctx context.Context, stream string) error {
			_, err := inline.Transact(ctx, func(ctx context.Context, tx pgx.Tx, batch *eventstore.Batch) error {
				return batch.Append(stream, eventstore.Any, ev)
			})
			return err
		})
	})
	b.Run("HandlerUnderTheLock", func(b *testing.B) {
		run(b, func(ctx context.Context, stream string) error {
			return pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
				res, err := plain.AppendTx(ctx, tx, stream, eventstore.Any, ev)
				if err != nil {
					return err
				}
				return heavy.Handle(ctx, tx, eventstore.Event{StreamID: stream, StreamVersion: res.StreamVersion,
					Type: "account.deposited", Data: []byte(`{"amount":1}`)})
			})
		})
	})
}
