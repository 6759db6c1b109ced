package projection_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/projection"
	"github.com/annals-dev/annals/scheduler"
)

// versions is a read model that records the last stream version it saw per
// account: an inline projection must see the versions that are stored.
func balancesWithVersion(reg *eventstore.Registry, fail func(eventstore.Envelope[Withdrawn]) error) *projection.Typed {
	p := projection.New("balances", reg)
	apply := func(ctx context.Context, tx pgx.Tx, account string, version int64, delta int) error {
		_, err := tx.Exec(ctx, `INSERT INTO balances VALUES ($1, $2, 1, $3)
			ON CONFLICT (account) DO UPDATE SET amount = balances.amount + $2, events = balances.events + 1, version = $3`, account, delta, version)
		return err
	}
	projection.On(p, func(ctx context.Context, tx pgx.Tx, e eventstore.Envelope[Deposited]) error {
		return apply(ctx, tx, e.StreamID, e.StreamVersion, e.Data.Amount)
	})
	projection.On(p, func(ctx context.Context, tx pgx.Tx, e eventstore.Envelope[Withdrawn]) error {
		if fail != nil {
			if err := fail(e); err != nil {
				return err
			}
		}
		return apply(ctx, tx, e.StreamID, e.StreamVersion, -e.Data.Amount)
	})
	p.OnReset(func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `DELETE FROM balances`)
		return err
	})
	return p
}

type inlineBundle struct {
	*bundle
	inline *eventstore.Store // a store with the inline projection
}

var errOverdrawn = errors.New("overdrawn")

func setupInline(t *testing.T) *inlineBundle {
	t.Helper()
	b := setup(t)
	if _, err := b.db.Pool.Exec(t.Context(), `ALTER TABLE balances ADD COLUMN version bigint NOT NULL DEFAULT 0`); err != nil {
		t.Fatal(err)
	}
	p := balancesWithVersion(b.reg, func(e eventstore.Envelope[Withdrawn]) error {
		if e.Data.Amount > 1000 {
			return errOverdrawn
		}
		return nil
	})
	store, err := eventstore.New(b.db.Pool, &eventstore.Config{Registry: b.reg, Inline: []eventstore.InlineProjection{p}})
	if err != nil {
		t.Fatal(err)
	}
	return &inlineBundle{bundle: b, inline: store}
}

// hammerOneStream has writers goroutines each Append each deposits of 1
// with Any to stream through store (inline projections: every conflict is
// Append's to retry), and requires every append to land and the read model
// to hold all of them at the stream's final version.
func hammerOneStream(t *testing.T, b *bundle, store *eventstore.Store, stream string, writers, each int) {
	t.Helper()
	ctx := t.Context()
	var wg sync.WaitGroup
	errs := make(chan error, writers*each)
	for w := range writers {
		wg.Go(func() {
			for i := range each {
				if _, err := store.Append(ctx, stream, eventstore.Any, eventstore.NewEvent(Deposited{Amount: 1})); err != nil {
					errs <- fmt.Errorf("writer %d, append %d: %w", w, i, err)
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	n := int64(writers * each)
	if got := readModel(t, b)[stream]; got != (balanceRow{n, n, n}) {
		t.Fatalf("read model %+v, want %d deposits of 1 at version %d", got, n, n)
	}
}

type balanceRow struct {
	Amount, Events, Version int64
}

func readModel(t *testing.T, b *bundle) map[string]balanceRow {
	t.Helper()
	rows, err := b.db.Pool.Query(t.Context(), `SELECT account, amount, events, version FROM balances`)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]balanceRow{}
	var a string
	var r balanceRow
	if _, err := pgx.ForEachRow(rows, []any{&a, &r.Amount, &r.Events, &r.Version}, func() error { got[a] = r; return nil }); err != nil {
		t.Fatal(err)
	}
	return got
}

func streamVersion(t *testing.T, b *bundle, stream string) int64 {
	t.Helper()
	var v int64
	err := b.db.Pool.QueryRow(t.Context(), `SELECT coalesce((SELECT version FROM annals.streams WHERE stream_id = $1), 0)`, stream).Scan(&v)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func TestInlineProjection(t *testing.T) {
	t.Parallel()

	t.Run("ReadModelCommitsWithTheAppend", func(t *testing.T) {
		t.Parallel()
		b := setupInline(t)
		ctx := t.Context()
		if _, err := b.inline.Append(ctx, "acct-1", eventstore.NoStream, eventstore.NewEvent(Deposited{Amount: 50})); err != nil {
			t.Fatal(err)
		}
		// The writer reads its own write at once: no runner is running.
		if got := readModel(t, b.bundle)["acct-1"]; got != (balanceRow{50, 1, 1}) {
			t.Fatalf("read model after the append: %+v, want {50 1 1}", got)
		}
		// Events the projection does not handle take the ordinary path and
		// leave the read model alone.
		eventstore.MustRegister[struct {
			X int `json:"x"`
		}](b.reg, "other.thing")
		if _, err := b.inline.Append(ctx, "other-1", eventstore.Any, eventstore.EventData{Type: "other.thing", Data: []byte(`{"x":1}`)}); err != nil {
			t.Fatal(err)
		}
		if n := len(readModel(t, b.bundle)); n != 1 {
			t.Fatalf("read model has %d rows, want 1", n)
		}
	})

	t.Run("FailingHandlerFailsTheAppend", func(t *testing.T) {
		t.Parallel()
		b := setupInline(t)
		ctx := t.Context()
		if _, err := b.inline.Append(ctx, "acct-1", eventstore.NoStream, eventstore.NewEvent(Deposited{Amount: 10})); err != nil {
			t.Fatal(err)
		}
		// Two events: the first is applied, the second fails; neither is kept.
		_, err := b.inline.Append(ctx, "acct-1", eventstore.Exact(1),
			eventstore.NewEvent(Deposited{Amount: 5}), eventstore.NewEvent(Withdrawn{Amount: 5000}))
		var ie *eventstore.InlineError
		if !errors.Is(err, errOverdrawn) || !errors.Is(err, eventstore.ErrInlineProjection) || !errors.As(err, &ie) {
			t.Fatalf("append with a failing handler: %v; want ErrInlineProjection wrapping the handler's error", err)
		}
		if ie.Projection != "balances" || ie.StreamVersion != 3 || ie.Type != "account.withdrawn" {
			t.Errorf("InlineError %+v names the wrong event", ie)
		}
		if v := streamVersion(t, b.bundle, "acct-1"); v != 1 {
			t.Errorf("stream at version %d after the failed append, want 1 (nothing stored)", v)
		}
		if got := readModel(t, b.bundle)["acct-1"]; got != (balanceRow{10, 1, 1}) {
			t.Errorf("read model %+v after the failed append, want {10 1 1}", got)
		}
		// The same through Transact: the body's own writes roll back too.
		_, err = b.inline.Transact(ctx, func(ctx context.Context, tx pgx.Tx, batch *eventstore.Batch) error {
			if _, err := tx.Exec(ctx, `INSERT INTO balances VALUES ('side', 1, 1, 1)`); err != nil {
				return err
			}
			return batch.Append("acct-2", eventstore.Any, eventstore.NewEvent(Withdrawn{Amount: 2000}))
		})
		if !errors.Is(err, errOverdrawn) {
			t.Fatalf("Transact with a failing handler: %v", err)
		}
		if m := readModel(t, b.bundle); len(m) != 1 {
			t.Errorf("read model %v after the failed Transact, want only acct-1", m)
		}
		if v := streamVersion(t, b.bundle, "acct-2"); v != 0 {
			t.Errorf("acct-2 at version %d, want no stream", v)
		}
	})

	t.Run("ConflictsAreReported", func(t *testing.T) {
		t.Parallel()
		b := setupInline(t)
		ctx := t.Context()
		if _, err := b.inline.Append(ctx, "acct-1", eventstore.NoStream, eventstore.NewEvent(Deposited{Amount: 10})); err != nil {
			t.Fatal(err)
		}
		// A stale expected version: a typed error with the actual version.
		_, err := b.inline.Append(ctx, "acct-1", eventstore.NoStream, eventstore.NewEvent(Deposited{Amount: 1}))
		var wev *eventstore.WrongExpectedVersionError
		if !errors.As(err, &wev) || wev.Actual != 1 {
			t.Fatalf("stale append: %v, want WrongExpectedVersionError with actual 1", err)
		}
		// Concurrent writers that all expect version 1: exactly one wins,
		// and only its event is in the read model.
		const writers = 8
		var wg sync.WaitGroup
		errs := make([]error, writers)
		for i := range writers {
			wg.Go(func() {
				_, errs[i] = b.inline.Append(ctx, "acct-1", eventstore.Exact(1), eventstore.NewEvent(Deposited{Amount: 100 + i}))
			})
		}
		wg.Wait()
		won := -1
		for i, err := range errs {
			switch {
			case err == nil && won == -1:
				won = i
			case err == nil:
				t.Fatalf("writers %d and %d both appended at version 1", won, i)
			case !errors.Is(err, eventstore.ErrWrongExpectedVersion):
				t.Fatalf("writer %d: %v, want ErrWrongExpectedVersion", i, err)
			}
		}
		if won == -1 {
			t.Fatal("no writer won")
		}
		if got := readModel(t, b.bundle)["acct-1"]; got != (balanceRow{10 + 100 + int64(won), 2, 2}) {
			t.Fatalf("read model %+v, want the winner's event only", got)
		}
	})

	t.Run("ConcurrentAnyAppendsRebuildToTheSameReadModel", func(t *testing.T) {
		t.Parallel()
		b := setupInline(t)
		ctx := t.Context()
		// Inline appends with Any from many goroutines to few streams (the
		// pinned versions conflict and are retried), mixed with Transact and
		// AppendTx, and a caller-chosen ID appended twice.
		const writers, each = 8, 25
		var wg sync.WaitGroup
		errs := make(chan error, writers*each)
		for w := range writers {
			wg.Go(func() {
				for i := range each {
					stream := fmt.Sprintf("acct-%d", (w+i)%3)
					var err error
					switch i % 3 {
					case 0:
						_, err = b.inline.Append(ctx, stream, eventstore.Any, eventstore.NewEvent(Deposited{Amount: w*100 + i}))
					case 1:
						_, err = b.inline.Transact(ctx, func(ctx context.Context, tx pgx.Tx, batch *eventstore.Batch) error {
							return batch.Append(stream, eventstore.Any, eventstore.NewEvent(Withdrawn{Amount: i}), eventstore.NewEvent(Deposited{Amount: 1}))
						})
					default:
						err = pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
							_, err := b.inline.AppendTx(ctx, tx, stream, eventstore.Any, eventstore.NewEvent(Deposited{Amount: 2}))
							return err
						})
					}
					if errors.Is(err, eventstore.ErrWrongExpectedVersion) && i%3 != 0 {
						continue // Transact and AppendTx report a pinned conflict; Append retries it
					}
					if err != nil {
						errs <- err
					}
				}
			})
		}
		id := uuid.Must(uuid.NewV7())
		for range 2 {
			wg.Go(func() {
				_, err := b.inline.Append(ctx, "acct-9", eventstore.Any, eventstore.EventData{ID: id, Data: Deposited{Amount: 7}})
				if err != nil {
					errs <- err
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		if got := readModel(t, b.bundle)["acct-9"]; got != (balanceRow{7, 1, 1}) {
			t.Fatalf("an event appended twice with one ID was applied as %+v, want once", got)
		}
		inline := readModel(t, b.bundle)
		for acct, row := range inline {
			if v := streamVersion(t, b.bundle, acct); row.Version != v || row.Events != v {
				t.Errorf("%s: read model %+v, stream at version %d", acct, row, v)
			}
		}

		// The same projection through the runner (the async path), from
		// the start of the log into a cleared read model.
		r, err := projection.NewRunner(b.db.Pool, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := r.Register(balancesWithVersion(b.reg, nil), nil); err != nil {
			t.Fatal(err)
		}
		if err := r.Rebuild(ctx, "balances", nil); err != nil {
			t.Fatal(err)
		}
		if rebuilt := readModel(t, b.bundle); fmt.Sprint(rebuilt) != fmt.Sprint(inline) {
			t.Fatalf("rebuilt read model differs:\n inline  %v\n rebuilt %v", inline, rebuilt)
		}
	})

	t.Run("HotStreamAnyAppendsAllLand", func(t *testing.T) {
		t.Parallel()
		// Sixteen writers appending with Any to one stream: every pinned
		// conflict is Append's to retry, and none may fail. Before the
		// retries queued on the stream's lock, a writer could lose ten
		// races in a row (a few appends in 640 failed); with the lock on
		// retries only, a retry still lost to first attempts about a third
		// of the time. Once the stream is hot every Append takes the lock:
		// in ten -race runs, 6,400 appends, no append needed a fourth try.
		b := setupInline(t)
		hammerOneStream(t, b.bundle, b.inline, "acct-hot", 16, 40)
	})

	t.Run("HotStreamUnderRepeatableReadDefault", func(t *testing.T) {
		t.Parallel()
		// The same race on a pool whose sessions default to REPEATABLE
		// READ: Append's own transaction is READ COMMITTED whatever the
		// default. (Under REPEATABLE READ the stream lock, the first
		// statement, would take the snapshot before its wait, and every
		// attempt that waited would read the version it waited past.)
		b := setupInline(t)
		ctx := t.Context()
		cfg, err := pgxpool.ParseConfig(b.db.URL)
		if err != nil {
			t.Fatal(err)
		}
		cfg.ConnConfig.RuntimeParams["default_transaction_isolation"] = "repeatable read"
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer pool.Close()
		store, err := eventstore.New(pool, &eventstore.Config{Registry: b.reg,
			Inline: []eventstore.InlineProjection{balancesWithVersion(b.reg, nil)}})
		if err != nil {
			t.Fatal(err)
		}
		hammerOneStream(t, b.bundle, store, "acct-rr", 8, 25)
	})

	t.Run("EventIDStoredDuringTheHandler", func(t *testing.T) {
		t.Parallel()
		// The race the InlineWritten guard closes, forced: while the inline
		// handler runs, another writer stores the same event (same ID); the
		// inline append must not commit the handler's write of an event it
		// did not write, and answers as an idempotent re-append.
		b := setup(t)
		ctx := t.Context()
		id := uuid.Must(uuid.NewV7())
		ev := eventstore.EventData{ID: id, Data: Deposited{Amount: 3}}
		calls := 0
		p := projection.New("racing", b.reg)
		projection.On(p, func(ctx context.Context, tx pgx.Tx, e eventstore.Envelope[Deposited]) error {
			calls++
			if calls == 1 {
				if _, err := b.store.Append(ctx, "acct-1", eventstore.Any, ev); err != nil {
					return err
				}
			}
			_, err := tx.Exec(ctx, `INSERT INTO balances VALUES ($1, $2, 1)
				ON CONFLICT (account) DO UPDATE SET amount = balances.amount + $2, events = balances.events + 1`, e.StreamID, e.Data.Amount)
			return err
		})
		store, err := eventstore.New(b.db.Pool, &eventstore.Config{Registry: b.reg, Inline: []eventstore.InlineProjection{p}})
		if err != nil {
			t.Fatal(err)
		}
		res, err := store.Append(ctx, "acct-1", eventstore.Any, ev)
		if err != nil {
			t.Fatal(err)
		}
		if calls != 1 || res.StreamVersion != 1 || res.Events[0].ID != id {
			t.Fatalf("handler called %d times, result %+v; want one call and the stored event", calls, res)
		}
		if got := readBalances(t, b); len(got) != 0 {
			t.Fatalf("the handler's write of an event another writer stored was committed: %v", got)
		}
		// The guard in AppendTx's round trip too.
		calls = 0
		id = uuid.Must(uuid.NewV7())
		ev = eventstore.EventData{ID: id, Data: Deposited{Amount: 3}}
		err = pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
			_, err := store.AppendTx(ctx, tx, "acct-1", eventstore.Any, ev)
			return err
		})
		if !errors.Is(err, eventstore.ErrStoredConcurrently) {
			t.Fatalf("AppendTx racing a writer of the same ID: %v, want ErrStoredConcurrently", err)
		}
		if got := readBalances(t, b); len(got) != 0 {
			t.Fatalf("read model %v after the refused AppendTx", got)
		}
		// Without a race, under a savepoint (the row's xmin is then the
		// subtransaction's), the guard lets a caller-chosen ID through.
		calls = 1
		err = pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
			return pgx.BeginFunc(ctx, tx, func(sp pgx.Tx) error {
				_, err := store.AppendTx(ctx, sp, "acct-2", eventstore.NoStream, eventstore.EventData{ID: uuid.Must(uuid.NewV7()), Data: Deposited{Amount: 4}})
				return err
			})
		})
		if err != nil {
			t.Fatalf("AppendTx with a caller-chosen ID under a savepoint: %v", err)
		}
		if got := readBalances(t, b); got["acct-2"] != 4 {
			t.Fatalf("read model %v, want acct-2 at 4", got)
		}
	})

	t.Run("TransactAndTimers", func(t *testing.T) {
		t.Parallel()
		b := setupInline(t)
		ctx := t.Context()
		// Two staged appends to one stream in one Transact: the second is
		// pinned after the first.
		_, err := b.inline.Transact(ctx, func(ctx context.Context, tx pgx.Tx, batch *eventstore.Batch) error {
			if err := batch.Append("acct-1", eventstore.Any, eventstore.NewEvent(Deposited{Amount: 1})); err != nil {
				return err
			}
			return batch.Append("acct-1", eventstore.StreamExists, eventstore.NewEvent(Deposited{Amount: 2}), eventstore.NewEvent(Deposited{Amount: 3}))
		})
		if err != nil {
			t.Fatal(err)
		}
		if got := readModel(t, b.bundle)["acct-1"]; got != (balanceRow{6, 3, 3}) {
			t.Fatalf("read model %+v, want {6 3 3}", got)
		}
		// A timer fired by a scheduler on the inline store (an encoded
		// append) is applied with its append.
		sched, err := scheduler.New(b.inline, nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := sched.ScheduleTimer(ctx, nil, scheduler.Timer{At: time.Now().Add(-time.Second), StreamID: "acct-1",
			Expected: eventstore.Any, Events: []eventstore.EventData{eventstore.NewEvent(Deposited{Amount: 4})}}); err != nil {
			t.Fatal(err)
		}
		if n, err := sched.FireDue(ctx); err != nil || n != 1 {
			t.Fatalf("fired %d timers: %v", n, err)
		}
		if got := readModel(t, b.bundle)["acct-1"]; got != (balanceRow{10, 4, 4}) {
			t.Fatalf("read model %+v after the timer, want {10 4 4}", got)
		}
	})

	t.Run("BadConfig", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		p := balances(b.reg)
		_, err := eventstore.New(b.db.Pool, &eventstore.Config{Registry: b.reg, Inline: []eventstore.InlineProjection{p, p}})
		if err == nil {
			t.Fatal("the same inline projection twice was accepted")
		}
		_, err = eventstore.New(b.db.Pool, &eventstore.Config{Registry: b.reg, Inline: []eventstore.InlineProjection{nil}})
		if err == nil {
			t.Fatal("a nil inline projection was accepted")
		}
	})
}
