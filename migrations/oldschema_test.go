package migrations_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/migrations"
)

// interferingInline is an inline projection that, the first time it runs
// for a stream, appends to that stream through another Store (another
// connection, committed at once), as a concurrent writer would: the inline
// append it runs in then meets a wrong expected version it did not ask for,
// and Append retries it, first queueing on the stream's retry lock.
type interferingInline struct {
	other *eventstore.Store
	mu    sync.Mutex
	seen  map[string]bool
}

func (p *interferingInline) Name() string { return "interfering" }

func (p *interferingInline) Handle(ctx context.Context, _ pgx.Tx, e eventstore.Event) error {
	p.mu.Lock()
	first := !p.seen[e.StreamID]
	if p.seen == nil {
		p.seen = map[string]bool{}
	}
	p.seen[e.StreamID] = true
	p.mu.Unlock()
	if !first {
		return nil
	}
	_, err := p.other.Append(ctx, e.StreamID, eventstore.Any, eventstore.EventData{Type: "other", Data: json.RawMessage(`{}`)})
	return err
}

// TestCurrentClientOnOlderSchemas: a client of the current code deployed
// before `annals migrate` ran (the schema migrated through an older
// version) appends through every path: group commit (append_one, or
// append_batch before 0018), a group of several, a lone append without
// group commit, a lone append's re-send after a unique violation (the
// retry racing its original), AppendTx and Transact (append_events before
// 0035), and inline appends, whose retry queues on the stream's lock
// (inline_stream_lock, 0034; before it, the same key through
// pg_advisory_xact_lock, as clients before 0034 took it). The inline retry
// failed with 42883 on a schema before 0034.
func TestCurrentClientOnOlderSchemas(t *testing.T) {
	t.Parallel()
	// Through 0017 (no append_one), 0019 (append_batch before 0020's
	// optimistic look-up), 0024 (before 0025's retry race), 0033 (no
	// inline_stream_lock), 0034 (no append_events_json).
	for _, through := range []int{17, 19, 24, 33, 34} {
		t.Run(fmt.Sprintf("through%04d", through), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db := annalstest.NewDB(t, nil)
			cfg := &migrations.Config{Schema: fmt.Sprintf("old_%d", through)}
			if _, err := migrations.UpWith(ctx, db.Pool, cfg, func(ms []migrations.Migration) []migrations.Migration {
				return ms[:through]
			}); err != nil {
				t.Fatal(err)
			}
			store, err := eventstore.New(db.Pool, &eventstore.Config{Schema: cfg.Schema})
			if err != nil {
				t.Fatal(err)
			}
			alone, err := eventstore.New(db.Pool, &eventstore.Config{Schema: cfg.Schema, GroupCommit: eventstore.GroupCommit{Disabled: true}})
			if err != nil {
				t.Fatal(err)
			}
			p := &interferingInline{other: store}
			inline, err := eventstore.New(db.Pool, &eventstore.Config{Schema: cfg.Schema, Inline: []eventstore.InlineProjection{p}})
			if err != nil {
				t.Fatal(err)
			}
			ev := func() eventstore.EventData { return eventstore.EventData{Type: "t", Data: json.RawMessage(`{"a": 1}`)} }
			check := func(what string, res eventstore.AppendResult, err error, version int64) {
				t.Helper()
				if err != nil || res.StreamVersion != version {
					t.Fatalf("%s: %+v, %v; want version %d", what, res, err, version)
				}
			}

			res, err := store.Append(ctx, "one", eventstore.NoStream, ev())
			check("Append of one event", res, err, 1)
			res, err = store.Append(ctx, "two", eventstore.NoStream, ev(), ev())
			check("Append of two events", res, err, 2)
			res, err = alone.Append(ctx, "alone", eventstore.NoStream, ev())
			check("Append without group commit", res, err, 1)
			err = pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
				res, err = store.AppendTx(ctx, tx, "tx", eventstore.NoStream, ev())
				return err
			})
			check("AppendTx", res, err, 1)
			rs, err := store.Transact(ctx, func(_ context.Context, _ pgx.Tx, b *eventstore.Batch) error {
				return b.Append("transact", eventstore.NoStream, ev())
			})
			if err != nil || len(rs) != 1 || rs[0].StreamVersion != 1 {
				t.Fatalf("Transact: %+v, %v", rs, err)
			}

			// The inline append conflicts once and is retried under the
			// stream's retry lock; then the stream is hot, and the next
			// append takes the lock at its first attempt.
			res, err = inline.Append(ctx, "inline", eventstore.Any, ev())
			check("inline Append retried after a conflict", res, err, 2)
			res, err = inline.Append(ctx, "inline", eventstore.Any, ev())
			check("inline Append to a hot stream", res, err, 3)

			// A retry whose original commits while it waits for the
			// ordering lock: append_one (or append_batch) looked the ID up
			// before the lock, and the insert raises 23505; the client
			// re-sends it alone, which answers the stored position.
			id := uuid.New()
			first := eventstore.EventData{ID: id, Type: "t", Data: json.RawMessage(`{"race": 1}`)}
			tx, err := db.Pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = tx.Rollback(ctx) }()
			orig, err := store.AppendTx(ctx, tx, "race", eventstore.Any, first) // holds the ordering lock
			if err != nil {
				t.Fatal(err)
			}
			retried := make(chan error, 1)
			var again eventstore.AppendResult
			go func() {
				var err error
				again, err = store.Append(ctx, "race", eventstore.Any, first)
				retried <- err
			}()
			waitForLockWait(t, db)
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			if err := <-retried; err != nil || again.Events[0].GlobalSequence != orig.Events[0].GlobalSequence {
				t.Fatalf("a retry racing its original: %+v, %v; want the stored position %+v", again, err, orig)
			}
		})
	}
}

// waitForLockWait returns once some session of db waits for an advisory
// lock (an append queued behind the ordering lock), or fails t after a
// deadline.
func waitForLockWait(t *testing.T, db *annalstest.DB) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		var waiting bool
		if err := db.Pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
			WHERE l.locktype = 'advisory' AND NOT l.granted AND a.datname = current_database())`).Scan(&waiting); err != nil {
			t.Fatalf("waiting for an append to queue on the ordering lock: %v", err)
		}
		if waiting {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatal("no append queued on the ordering lock within 30s")
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// TestInlineRetryLockAcrossUpgrade: a writer's inline retries keep their
// lock while the schema moves under a running process. On a schema
// migrated before 0034 the retry lock is taken with pg_advisory_xact_lock
// (the key clients before 0034 took); once advisory locks are restricted
// (which takes that function from the writer), a schema still without
// inline_stream_lock fails the retry with migrations.ErrNotMigrated; after
// `annals migrate` the same Store takes the lock through
// inline_stream_lock.
func TestInlineRetryLockAcrossUpgrade(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := annalstest.NewDB(t, nil)
	cfg := &migrations.Config{Schema: `Inline "Old"`}
	if _, err := migrations.UpWith(ctx, db.Pool, cfg, func(ms []migrations.Migration) []migrations.Migration {
		return ms[:33] // through 0033
	}); err != nil {
		t.Fatal(err)
	}
	w := newRole(t, db, "")
	// What `annals grant writer` ran before 0034.
	stmts, err := migrations.GrantSQL(w.Name, migrations.Writer, cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range stmts {
		if strings.Contains(s, ".inline_stream_lock(") || strings.Contains(s, ".snapshot_lock(") ||
			strings.Contains(s, ".append_events_json(") {
			continue
		}
		if _, err := db.Pool.Exec(ctx, s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
	other, err := eventstore.New(db.Pool, &eventstore.Config{Schema: cfg.Schema})
	if err != nil {
		t.Fatal(err)
	}
	inline, err := eventstore.New(w.Pool, &eventstore.Config{Schema: cfg.Schema,
		Inline: []eventstore.InlineProjection{&interferingInline{other: other}}})
	if err != nil {
		t.Fatal(err)
	}
	ev := eventstore.EventData{Type: "t", Data: json.RawMessage(`{}`)}
	if res, err := inline.Append(ctx, "before", eventstore.Any, ev); err != nil || res.StreamVersion != 2 {
		t.Fatalf("inline retry on a schema through 0033: %+v, %v", res, err)
	}

	if _, err := migrations.RestrictAdvisoryLocks(ctx, db.Pool); err != nil {
		t.Fatal(err)
	}
	_, err = inline.Append(ctx, "restricted", eventstore.Any, ev)
	if !errors.Is(err, migrations.ErrNotMigrated) || !strings.Contains(err.Error(), "annals migrate") {
		t.Fatalf("inline retry without inline_stream_lock nor pg_advisory_xact_lock: %v, want ErrNotMigrated", err)
	}

	if _, err := migrations.Up(ctx, db.Pool, cfg); err != nil {
		t.Fatal(err)
	}
	if res, err := inline.Append(ctx, "after", eventstore.Any, ev); err != nil || res.StreamVersion != 2 {
		t.Fatalf("inline retry after the upgrade: %+v, %v", res, err)
	}
}
