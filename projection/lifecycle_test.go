package projection_test

import (
	"context"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/projection"
)

// A typed projection receives a stream's deletion event exactly once, live
// and across a restart, and can remove its read-model rows with it.
func TestProjectionReceivesStreamDeletedOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := annalstest.NewDB(t, nil)
	reg := eventstore.NewRegistry()
	eventstore.MustRegister[AccountOpened](reg, "account.opened")
	if err := eventstore.RegisterLifecycleEvents(reg); err != nil {
		t.Fatal(err)
	}
	store, err := eventstore.New(db.Pool, &eventstore.Config{Registry: reg})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, `CREATE TABLE accounts (account text PRIMARY KEY, owner text NOT NULL);
		CREATE TABLE deletions (account text NOT NULL, hard boolean NOT NULL, position bigint NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	newRunner := func() *projection.Runner {
		p := projection.New("accounts", reg)
		projection.On(p, func(ctx context.Context, tx pgx.Tx, e eventstore.Envelope[AccountOpened]) error {
			_, err := tx.Exec(ctx, `INSERT INTO accounts VALUES ($1, $2)`, e.StreamID, e.Data.Owner)
			return err
		})
		projection.On(p, func(ctx context.Context, tx pgx.Tx, e eventstore.Envelope[eventstore.StreamDeleted]) error {
			if _, err := tx.Exec(ctx, `DELETE FROM accounts WHERE account = $1`, e.StreamID); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `INSERT INTO deletions VALUES ($1, $2, $3)`, e.StreamID, e.Data.Hard, e.GlobalSequence)
			return err
		})
		r, err := projection.NewRunner(db.Pool, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := r.Register(p, nil); err != nil {
			t.Fatal(err)
		}
		return r
	}
	count := func(q string) int {
		var n int
		if err := db.Pool.QueryRow(ctx, q).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	for _, s := range []string{"a-1", "a-2", "a-3"} {
		if _, err := store.Append(ctx, s, eventstore.NoStream, eventstore.NewEvent(AccountOpened{Owner: s})); err != nil {
			t.Fatal(err)
		}
	}

	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	r := newRunner()
	go func() { done <- r.Run(runCtx) }()
	annalstest.WaitFor(t, 10*time.Second, func() bool { return count(`SELECT count(*) FROM accounts`) == 3 })

	if _, err := store.DeleteStream(ctx, "a-1", eventstore.Any, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := store.DeleteStream(ctx, "a-2", eventstore.Exact(1), &eventstore.DeleteOptions{Hard: true}); err != nil {
		t.Fatal(err)
	}
	annalstest.WaitFor(t, 10*time.Second, func() bool { return count(`SELECT count(*) FROM deletions`) == 2 })
	cancel()
	if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}

	// A restart processes nothing twice; a recreation is an ordinary event.
	if _, err := store.Append(ctx, "a-1", eventstore.Exact(2), eventstore.NewEvent(AccountOpened{Owner: "again"})); err != nil {
		t.Fatal(err)
	}
	if err := newRunner().RunUntilCaughtUp(ctx); err != nil {
		t.Fatal(err)
	}
	if n := count(`SELECT count(*) FROM deletions`); n != 2 {
		t.Fatalf("%d deletion rows after a restart, want 2", n)
	}
	if n := count(`SELECT count(*) FROM deletions WHERE (account = 'a-1' AND NOT hard) OR (account = 'a-2' AND hard)`); n != 2 {
		t.Fatalf("deletion rows do not match the deletes")
	}
	var owners []string
	rows, _ := db.Pool.Query(ctx, `SELECT account || '=' || owner FROM accounts ORDER BY account`)
	owners, err = pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil || len(owners) != 2 || owners[0] != "a-1=again" || owners[1] != "a-3=a-3" {
		t.Fatalf("read model %v %v", owners, err)
	}
}
