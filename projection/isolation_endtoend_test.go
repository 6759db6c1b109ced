package projection_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/projection"
)

// TestRunnerUnderRepeatableReadDefault: on a database whose sessions
// default to REPEATABLE READ, two runner instances, each with a pool of its
// own, start at once with a partitioned projection (its table from
// OnSetup) and an observer, over events appended beside them from such a
// pool too; then one rebuilds the projection. Everything works as under
// READ COMMITTED: the setup runs once, the layout is recorded once, every
// event lands once in the read model and reaches the observer, and the
// rebuild gives the same read model.
func TestRunnerUnderRepeatableReadDefault(t *testing.T) {
	t.Parallel()
	db, reg, newPool := repeatableReadDB(t) // 3 deposits of 10 already
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	if _, err := db.Pool.Exec(ctx, `CREATE TABLE su_e2e_seen (event_id uuid PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	store, err := eventstore.New(newPool(), &eventstore.Config{Registry: reg})
	if err != nil {
		t.Fatal(err)
	}
	appendSome := func(from, n int) {
		t.Helper()
		for i := from; i < from+n; i++ {
			if _, err := store.Append(ctx, fmt.Sprintf("acct-%c", 'a'+i%5), eventstore.Any,
				eventstore.NewEvent(setupDeposited{Amount: i})); err != nil {
				t.Fatal(err)
			}
		}
	}
	appendSome(0, 10)
	var setups sync.Map
	runners := make([]*projection.Runner, 2)
	for i := range runners {
		r, err := projection.NewRunner(newPool(), &projection.Config{InstanceID: fmt.Sprintf("rr-%d", i),
			PollInterval: 50 * time.Millisecond, RetryBackoff: 50 * time.Millisecond, ShutdownTimeout: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		p := projection.New("su.e2e", reg)
		p.OnSetup(1, func(ctx context.Context, tx pgx.Tx) error {
			if _, loaded := setups.LoadOrStore("ran", i); loaded {
				return fmt.Errorf("the setup ran a second time (instance %d)", i)
			}
			_, err := tx.Exec(ctx, `CREATE TABLE su_e2e (account text PRIMARY KEY, amount bigint NOT NULL, events int NOT NULL)`)
			return err
		})
		projection.On(p, func(ctx context.Context, tx pgx.Tx, e eventstore.Envelope[setupDeposited]) error {
			_, err := tx.Exec(ctx, `INSERT INTO su_e2e VALUES ($1, $2, 1)
				ON CONFLICT (account) DO UPDATE SET amount = su_e2e.amount + $2, events = su_e2e.events + 1`, e.StreamID, e.Data.Amount)
			return err
		})
		p.OnReset(func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `TRUNCATE su_e2e`)
			return err
		})
		if err := r.Register(p, &projection.Options{Partitions: 2}); err != nil {
			t.Fatal(err)
		}
		o := projection.NewObserver("su.e2e_seen", reg)
		projection.Observe(o, func(ctx context.Context, e eventstore.Envelope[setupDeposited]) error {
			_, err := db.Pool.Exec(ctx, `INSERT INTO su_e2e_seen VALUES ($1) ON CONFLICT DO NOTHING`, e.ID)
			return err
		})
		if err := r.Register(o, &projection.Options{Partitions: 2}); err != nil {
			t.Fatal(err)
		}
		runners[i] = r
	}
	check := func(what string) {
		t.Helper()
		var amount, events, seen, logged int64
		if err := db.Pool.QueryRow(ctx, `SELECT (SELECT coalesce(sum(amount), 0) FROM su_e2e), (SELECT coalesce(sum(events), 0) FROM su_e2e),
			(SELECT count(*) FROM su_e2e_seen), (SELECT count(*) FROM `+pgx.Identifier{db.Schema, "events"}.Sanitize()+`)`).
			Scan(&amount, &events, &seen, &logged); err != nil {
			t.Fatal(err)
		}
		wantAmount := int64(3*10 + 45 + 145) // the 3 first deposits, 0..9, 10..19
		if amount != wantAmount || events != logged || seen != logged || logged != 23 {
			t.Fatalf("%s: read model %d in %d events, observer saw %d, log %d; want %d in 23, 23, 23", what, amount, events, seen, logged, wantAmount)
		}
	}

	// The two instances start at once, while events are appended.
	start := make(chan struct{})
	var wg sync.WaitGroup
	errs := make([]error, len(runners))
	for i, r := range runners {
		wg.Add(1)
		go func() { defer wg.Done(); <-start; errs[i] = r.RunUntilCaughtUp(ctx) }()
	}
	close(start)
	appendSome(10, 10)
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("instance %d: %v", i, err)
		}
	}
	// What was appended after an instance's head: caught up now.
	for i, r := range runners {
		if err := r.RunUntilCaughtUp(ctx); err != nil {
			t.Fatalf("instance %d: %v", i, err)
		}
	}
	check("after the starts")
	if err := runners[1].Rebuild(ctx, "su.e2e", nil); err != nil {
		t.Fatal(err)
	}
	check("after the rebuild")
}
