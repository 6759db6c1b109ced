package aggregate_test

import (
	"context"
	"github.com/annals-dev/annals/annalstest"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/annals-dev/annals/aggregate"
)

// loads records LoadStats.
type loads struct {
	mu  sync.Mutex
	all []aggregate.LoadStats
}

func (l *loads) hook(s aggregate.LoadStats) { l.mu.Lock(); l.all = append(l.all, s); l.mu.Unlock() }

func (l *loads) last(t *testing.T) aggregate.LoadStats {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.all) == 0 {
		t.Fatal("no load reported")
	}
	return l.all[len(l.all)-1]
}

func snapRepo(t *testing.T, b *bundle, schemaVersion int, l *loads, logs *annalstest.LogBuffer) *aggregate.Repository[*Account] {
	t.Helper()
	cfg := &aggregate.Config{Snapshots: &aggregate.SnapshotConfig{Every: 5, SchemaVersion: schemaVersion}, OnLoad: l.hook}
	if logs != nil {
		cfg.Logger = slog.New(slog.NewTextHandler(logs, nil))
	}
	return repo(t, b, cfg)
}

// history creates account 1 and makes n deposits of 1..n, one save each:
// 1+n events.
func history(t *testing.T, r *aggregate.Repository[*Account], n int) {
	t.Helper()
	ctx := context.Background()
	if _, err := r.Create(ctx, "1", func(a *Account) error { return a.Open("ada") }); err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= n; i++ {
		if _, err := r.Update(ctx, "1", func(a *Account) error { return a.Deposit(i) }); err != nil {
			t.Fatal(err)
		}
	}
}

func TestSnapshots(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("UsedOnLoad", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		l := &loads{}
		r := snapRepo(t, b, 1, l, nil)
		history(t, r, 11) // 12 events: snapshots at 5 and 10, the newest kept
		var version int64
		if err := b.db.Pool.QueryRow(ctx, `SELECT stream_version FROM annals.snapshots WHERE aggregate_type = 'account' AND stream_id = 'account-1' AND schema_version = 1`).Scan(&version); err != nil || version != 10 {
			t.Fatalf("snapshot at version %d (%v), want 10", version, err)
		}
		a, err := r.Load(ctx, "1")
		if err != nil {
			t.Fatal(err)
		}
		if s := l.last(t); s.SnapshotVersion != 10 || s.EventsRead != 2 || s.Version != 12 {
			t.Fatalf("load stats %+v, want snapshot 10, 2 events read, version 12", s)
		}
		if a.Version() != 12 || a.Balance != 66 || a.Deposits != 11 || a.Owner != "ada" || a.ID() != "1" {
			t.Fatalf("loaded %+v at version %d, want ada/66/11 at 12", *a, a.Version())
		}
		// Saving after a snapshot load continues from the right version.
		if _, err := r.Update(ctx, "1", func(a *Account) error { return a.Withdraw(6) }); err != nil {
			t.Fatal(err)
		}
		if a, _ := r.Load(ctx, "1"); a.Balance != 60 || a.Version() != 13 {
			t.Fatalf("after an update from a snapshot: %+v at %d", *a, a.Version())
		}
		// Snapshots are a cache: without them the load replays everything.
		if _, err := b.db.Pool.Exec(ctx, `TRUNCATE annals.snapshots`); err != nil {
			t.Fatal(err)
		}
		if a, err := r.Load(ctx, "1"); err != nil || a.Balance != 60 || l.last(t).EventsRead != 13 {
			t.Fatalf("load without snapshot: %+v %v %+v", a, err, l.last(t))
		}
	})

	t.Run("SnapshotIsTheSourceOfState", func(t *testing.T) {
		t.Parallel()
		// A snapshot whose state differs from the events shows through: proof
		// that the load starts from it rather than replaying.
		b := setup(t)
		l := &loads{}
		r := snapRepo(t, b, 1, l, nil)
		history(t, r, 4) // 5 events: snapshot at 5
		if _, err := b.db.Pool.Exec(ctx, `UPDATE annals.snapshots SET state = '{"owner":"ada","balance":1000,"deposits":4}'`); err != nil {
			t.Fatal(err)
		}
		if a, err := r.Load(ctx, "1"); err != nil || a.Balance != 1000 || l.last(t).EventsRead != 0 {
			t.Fatalf("load: %+v %v %+v, want the snapshot's balance 1000 and no events read", a, err, l.last(t))
		}
	})

	t.Run("StaleSchemaVersionIgnored", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		l := &loads{}
		history(t, snapRepo(t, b, 1, l, nil), 11)
		// Mark the v1 snapshot so that using it would show.
		if _, err := b.db.Pool.Exec(ctx, `UPDATE annals.snapshots SET state = '{"owner":"stale","balance":-1}'`); err != nil {
			t.Fatal(err)
		}
		r2 := snapRepo(t, b, 2, l, nil)
		a, err := r2.Load(ctx, "1")
		if err != nil {
			t.Fatal(err)
		}
		if s := l.last(t); s.SnapshotVersion != 0 || s.EventsRead != 12 {
			t.Fatalf("load stats %+v, want a full replay of 12 events", s)
		}
		if a.Owner != "ada" || a.Balance != 66 || a.Version() != 12 {
			t.Fatalf("loaded %+v at %d, want ada/66 at 12", *a, a.Version())
		}
		// The v2 repository writes its own snapshot when due; v1's stays.
		if _, err := r2.Update(ctx, "1", func(a *Account) error {
			for range 3 {
				if err := a.Deposit(1); err != nil {
					return err
				}
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		var rows string
		if err := b.db.Pool.QueryRow(ctx, `SELECT string_agg(schema_version || ':' || stream_version, ',' ORDER BY schema_version) FROM annals.snapshots`).Scan(&rows); err != nil || rows != "1:10,2:15" {
			t.Fatalf("snapshots %q (%v), want 1:10,2:15", rows, err)
		}
	})

	t.Run("UnusableSnapshotReplays", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		l, logs := &loads{}, &annalstest.LogBuffer{}
		r := snapRepo(t, b, 1, l, logs)
		history(t, r, 6)
		if _, err := b.db.Pool.Exec(ctx, `UPDATE annals.snapshots SET state = '{"balance":"not a number"}'`); err != nil {
			t.Fatal(err)
		}
		a, err := r.Load(ctx, "1")
		if err != nil || a.Balance != 21 || l.last(t).EventsRead != 7 {
			t.Fatalf("load: %+v %v %+v, want a full replay", a, err, l.last(t))
		}
		if !strings.Contains(logs.String(), "snapshot unusable") {
			t.Fatalf("no warning logged: %s", logs)
		}
	})

	t.Run("FailedWriteDoesNotFailSave", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		l, logs := &loads{}, &annalstest.LogBuffer{}
		r := snapRepo(t, b, 1, l, logs)
		if _, err := b.db.Pool.Exec(ctx, `ALTER TABLE annals.snapshots RENAME TO gone`); err != nil {
			t.Fatal(err)
		}
		history(t, r, 6) // crosses 5: the snapshot write fails; every save stands
		if n := streamLen(t, b, "account-1"); n != 7 {
			t.Fatalf("stream has %d events, want 7", n)
		}
		if !strings.Contains(logs.String(), "writing a snapshot failed") {
			t.Fatalf("no warning logged: %s", logs)
		}
	})
}
