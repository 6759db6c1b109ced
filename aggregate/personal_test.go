package aggregate_test

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"github.com/annals-dev/annals/annalstest"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/annals-dev/annals/aggregate"
	"github.com/annals-dev/annals/eventstore"
)

// The personal-data test domain: a customer whose registration carries
// their name, encrypted with the customer's key (eventstore.PersonalData).

type Registered struct {
	CustomerID string `json:"customer_id"`
	Name       string `json:"name" annals:"personal"`
}

type Upgraded struct {
	Plan string `json:"plan"`
}

type Customer struct {
	aggregate.Base
	Name string `json:"name"`
	Plan string `json:"plan"`
}

func (c *Customer) Apply(event any) error {
	switch e := event.(type) {
	case Registered:
		c.Name = e.Name
	case Upgraded:
		c.Plan = e.Plan
	default:
		return aggregate.ErrUnhandledEvent
	}
	return nil
}

// forgetLock is the advisory lock forget_subject takes exclusively and a
// snapshot write takes shared (schema "annals", the test databases').
const forgetLock = `hashtextextended('annals' || ':forget', 0)`

type personalBundle struct {
	*bundle
	repo *aggregate.Repository[*Customer]
	logs *annalstest.LogBuffer
}

func setupPersonal(t *testing.T, every int) *personalBundle {
	t.Helper()
	b := setup(t)
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		t.Fatal(err)
	}
	kek, err := eventstore.NewLocalKEK(key)
	if err != nil {
		t.Fatal(err)
	}
	reg := eventstore.NewRegistry()
	eventstore.MustRegister[Registered](reg, "customer.registered", eventstore.PersonalData("CustomerID"))
	eventstore.MustRegister[Upgraded](reg, "customer.upgraded")
	store, err := eventstore.New(b.db.Pool, &eventstore.Config{Registry: reg, KEK: kek})
	if err != nil {
		t.Fatal(err)
	}
	logs := &annalstest.LogBuffer{}
	r, err := aggregate.NewRepository(store, "customer", func() *Customer { return &Customer{} },
		&aggregate.Config{Snapshots: &aggregate.SnapshotConfig{Every: every}, Logger: slogTo(logs)})
	if err != nil {
		t.Fatal(err)
	}
	return &personalBundle{bundle: &bundle{db: b.db, store: store}, repo: r, logs: logs}
}

func (p *personalBundle) register(t *testing.T, id, name string) {
	t.Helper()
	if _, err := p.repo.Create(t.Context(), id, func(c *Customer) error {
		return aggregate.Record(c, Registered{CustomerID: id, Name: name})
	}); err != nil {
		t.Fatal(err)
	}
}

// inSnapshots counts the snapshot rows holding plain as text.
func (p *personalBundle) inSnapshots(t *testing.T, plain string) int {
	t.Helper()
	var n int
	if err := p.db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM annals.snapshots s WHERE s::text LIKE '%' || $1 || '%'`, plain).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func (p *personalBundle) snapshotVersion(t *testing.T, stream string) int64 {
	t.Helper()
	var v int64
	err := p.db.Pool.QueryRow(context.Background(), `SELECT coalesce(max(stream_version), 0) FROM annals.snapshots WHERE stream_id = $1`, stream).Scan(&v)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// A Save after Forget of an aggregate loaded before it (its state holds the
// name decrypted then) must not write that state as a snapshot: no byte of a
// forgotten subject's personal data may stay in the snapshots.
func TestSnapshotAfterForget(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	p := setupPersonal(t, 2)
	const secret = "Ada Lovelace Secret"
	p.register(t, "c-1", secret)
	p.register(t, "c-2", "Other Customer")
	c, err := p.repo.Load(ctx, "c-1")
	if err != nil || c.Name != secret {
		t.Fatalf("load: %+v %v", c, err)
	}
	if res, err := p.store.Forget(ctx, "c-1"); err != nil || !res.HadKey {
		t.Fatalf("forget: %+v %v", res, err)
	}
	if err := aggregate.Record(c, Upgraded{Plan: "pro"}); err != nil {
		t.Fatal(err)
	}
	if err := p.repo.Save(ctx, c); err != nil || c.Version() != 2 {
		t.Fatalf("save at the snapshot boundary: version %d, %v", c.Version(), err)
	}
	if n := p.inSnapshots(t, secret); n != 0 {
		t.Fatalf("the forgotten name is in %d snapshot(s) after a save", n)
	}
	// The stream holds personal data of a forgotten subject: its snapshots
	// are not written any more, even of redacted state (the writer cannot
	// tell redacted state from state decrypted before the Forget).
	c, err = p.repo.Update(ctx, "c-1", func(c *Customer) error {
		return aggregate.Record(c, Upgraded{Plan: "gold"})
	})
	if err != nil || c.Name != eventstore.Forgotten {
		t.Fatalf("update after forget: %+v %v", c, err)
	}
	if _, err := p.repo.Update(ctx, "c-1", func(c *Customer) error {
		return aggregate.Record(c, Upgraded{Plan: "platinum"})
	}); err != nil {
		t.Fatal(err)
	}
	if v := p.snapshotVersion(t, "customer-c-1"); v != 0 {
		t.Fatalf("a snapshot at version %d of the forgotten customer's stream", v)
	}
	// Other subjects' streams are snapshotted as before.
	if _, err := p.repo.Update(ctx, "c-2", func(c *Customer) error {
		return aggregate.Record(c, Upgraded{Plan: "pro"})
	}); err != nil {
		t.Fatal(err)
	}
	if v := p.snapshotVersion(t, "customer-c-2"); v != 2 {
		t.Fatalf("c-2's snapshot at version %d, want 2", v)
	}
	if n := p.inSnapshots(t, "Other Customer"); n != 1 {
		t.Fatalf("c-2's name in %d snapshots, want 1", n)
	}
	// Once the forgotten subject's events are truncated away, the stream's
	// visible events hold no personal data: snapshots resume.
	tb := int64(2)
	if _, err := p.store.SetStreamRetention(ctx, "customer-c-1", eventstore.RetentionChange{TruncateBefore: &tb}); err != nil {
		t.Fatal(err)
	}
	for _, plan := range []string{"diamond", "unobtainium"} {
		if _, err := p.repo.Update(ctx, "c-1", func(c *Customer) error {
			return aggregate.Record(c, Upgraded{Plan: plan})
		}); err != nil {
			t.Fatal(err)
		}
	}
	if v := p.snapshotVersion(t, "customer-c-1"); v != 6 {
		t.Fatalf("c-1's snapshot at version %d after the truncation, want 6", v)
	}
}

// A snapshot row that older code wrote (or overwrote) does not record that
// its events were checked: the next write reads all the events its state
// folds again, not only those after the row.
func TestSnapshotAfterForgetOverOlderRow(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	p := setupPersonal(t, 2)
	const secret = "Mary Somerville Secret"
	p.register(t, "c-1", secret)
	c, err := p.repo.Load(ctx, "c-1")
	if err != nil || c.Name != secret {
		t.Fatalf("load: %+v %v", c, err)
	}
	if _, err := p.store.Forget(ctx, "c-1"); err != nil {
		t.Fatal(err)
	}
	// What code without the check wrote after the Forget (its name redacted
	// here, so that only the write below can put it in a snapshot).
	if _, err := p.db.Pool.Exec(ctx, `INSERT INTO annals.snapshots (aggregate_type, stream_id, schema_version, stream_version, state, first_version)
		VALUES ('customer', 'customer-c-1', 1, 1, '{"name":"[forgotten]"}', 1)`); err != nil {
		t.Fatal(err)
	}
	if err := aggregate.Record(c, Upgraded{Plan: "pro"}); err != nil {
		t.Fatal(err)
	}
	if err := p.repo.Save(ctx, c); err != nil || c.Version() != 2 {
		t.Fatalf("save: version %d, %v", c.Version(), err)
	}
	if n := p.inSnapshots(t, secret); n != 0 {
		t.Fatalf("the forgotten name is in %d snapshot(s) after a save", n)
	}
}

// A snapshot write racing a Forget either happens before it (and the Forget,
// which waits for it, deletes the row) or after it (and sees the subject
// forgotten), or is skipped while the Forget runs.
func TestSnapshotWriteRacingForget(t *testing.T) {
	t.Parallel()

	t.Run("ForgetWaitsForAWriteInProgress", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
		defer cancel()
		p := setupPersonal(t, 1)
		const secret = "Grace Hopper Secret"
		p.register(t, "c-1", secret)
		// A writer that has taken the lock and checked the subject (alive):
		// its row is not committed yet when Forget starts.
		tx, err := p.db.Pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = tx.Rollback(context.Background()) }()
		var locked bool
		if err := tx.QueryRow(ctx, `SELECT pg_try_advisory_xact_lock_shared(`+forgetLock+`)`).Scan(&locked); err != nil || !locked {
			t.Fatalf("shared lock: %v %v", locked, err)
		}
		done := make(chan error, 1)
		go func() {
			_, err := p.store.Forget(ctx, "c-1")
			done <- err
		}()
		waitForLockWait(ctx, t, p.bundle)
		select {
		case err := <-done:
			t.Fatalf("Forget returned (%v) while a snapshot write held the lock", err)
		default:
		}
		if _, err := tx.Exec(ctx, `INSERT INTO annals.snapshots (aggregate_type, stream_id, schema_version, stream_version, state)
			VALUES ('customer', 'customer-c-1', 2, 1, json_build_object('name', $1::text))`, secret); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if n := p.inSnapshots(t, secret); n != 0 {
			t.Fatalf("the forgotten name is in %d snapshot(s)", n)
		}
	})

	t.Run("WriteSkippedWhileForgetRuns", func(t *testing.T) {
		t.Parallel()
		ctx := t.Context()
		p := setupPersonal(t, 1)
		p.register(t, "c-1", "Someone")
		// A Forget in progress (of anyone) holds the lock exclusively.
		tx, err := p.db.Pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = tx.Rollback(context.Background()) }()
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(`+forgetLock+`)`); err != nil {
			t.Fatal(err)
		}
		if _, err := p.repo.Update(ctx, "c-1", func(c *Customer) error {
			return aggregate.Record(c, Upgraded{Plan: "pro"})
		}); err != nil {
			t.Fatalf("save while a Forget runs: %v", err)
		}
		if v := p.snapshotVersion(t, "customer-c-1"); v != 1 {
			t.Fatalf("snapshot at version %d while a Forget runs, want the old one at 1", v)
		}
		if err := tx.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := p.repo.Update(ctx, "c-1", func(c *Customer) error {
			return aggregate.Record(c, Upgraded{Plan: "gold"})
		}); err != nil {
			t.Fatal(err)
		}
		if v := p.snapshotVersion(t, "customer-c-1"); v != 3 {
			t.Fatalf("snapshot at version %d after the Forget, want 3", v)
		}
	})

	t.Run("Concurrent", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := context.WithTimeout(t.Context(), 120*time.Second)
		defer cancel()
		p := setupPersonal(t, 1)
		const rounds = 20
		for i := range rounds {
			id := fmt.Sprintf("c-%d", i)
			secret := fmt.Sprintf("Secret Name %03d", i)
			p.register(t, id, secret)
			c, err := p.repo.Load(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			if err := aggregate.Record(c, Upgraded{Plan: "pro"}); err != nil {
				t.Fatal(err)
			}
			var wg sync.WaitGroup
			errs := make(chan error, 2)
			wg.Add(2)
			go func() { defer wg.Done(); _, err := p.store.Forget(ctx, id); errs <- err }()
			go func() { defer wg.Done(); errs <- p.repo.Save(ctx, c) }()
			wg.Wait()
			close(errs)
			for err := range errs {
				if err != nil {
					t.Fatal(err)
				}
			}
			if n := p.inSnapshots(t, secret); n != 0 {
				t.Fatalf("round %d: the forgotten name is in %d snapshot(s)", i, n)
			}
		}
	})
}

// forget_subject refuses to run under REPEATABLE READ: its deletion of the
// snapshots would read the transaction's snapshot, taken before it waited
// for snapshot writes in progress, and miss their rows.
func TestForgetRefusesRepeatableRead(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	p := setupPersonal(t, 1)
	p.register(t, "c-1", "Someone")
	err := pgx.BeginTxFunc(ctx, p.db.Pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead}, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `SELECT * FROM annals.forget_subject('c-1')`)
		return err
	})
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "25000" {
		t.Fatalf("forget_subject under REPEATABLE READ: %v; want SQLSTATE 25000", err)
	}
	if res, err := p.store.Forget(ctx, "c-1"); err != nil || !res.HadKey || res.SnapshotsDeleted != 1 {
		t.Fatalf("Forget: %+v %v", res, err)
	}
}

// waitForLockWait waits until a backend of b's database waits for an
// advisory lock.
func waitForLockWait(ctx context.Context, t *testing.T, b *bundle) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var n int
		err := b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_locks l JOIN pg_database d ON d.oid = l.database
			WHERE d.datname = current_database() AND l.locktype = 'advisory' AND NOT l.granted`).Scan(&n)
		if err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("nobody waits for the advisory lock")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func slogTo(w *annalstest.LogBuffer) *slog.Logger {
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelDebug}))
}
