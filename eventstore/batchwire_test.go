package eventstore_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/eventstore"
)

// poolWithMode returns a pool on db whose connections use mode, closed when
// the test ends.
func poolWithMode(t *testing.T, db *annalstest.DB, mode pgx.QueryExecMode, maxConns int32) *pgxpool.Pool {
	t.Helper()
	cfg := db.Pool.Config().Copy()
	cfg.ConnConfig.DefaultQueryExecMode = mode
	if maxConns > 0 {
		cfg.MaxConns = maxConns
	}
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// Appends that go through append_batch (more than one event, or several
// appends in a group) have the same outcomes whichever way the pool sends
// statements: prepared and kept (the default), or unnamed with the
// parameter types (CacheDescribe, DescribeExec, Exec, and SimpleProtocol,
// whose lone appends and appends without group commit go through pgx's own
// encoding with the arguments in the statement's text). Each
// case covers what the binary encoding and decoding must get right: NULL
// and present metadata, an expected version of "any" (NULL) beside exact
// ones, a refused append and its actual version, a stored re-append
// (status 3) and concurrent groups.
func TestAppendBatchInEveryQueryExecMode(t *testing.T) {
	t.Parallel()
	db := annalstest.NewDB(t, nil)
	modes := []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeCacheDescribe,
		pgx.QueryExecModeDescribeExec, pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol}
	for _, mode := range modes {
		t.Run(mode.String(), func(t *testing.T) {
			ctx := context.Background()
			store, err := eventstore.New(poolWithMode(t, db, mode, 0), &eventstore.Config{Schema: db.Schema})
			if err != nil {
				t.Fatal(err)
			}
			prefix := mode.String() + "-"
			evs := func(n int, meta bool) []eventstore.EventData {
				out := make([]eventstore.EventData, n)
				for i := range out {
					out[i] = eventstore.EventData{ID: uuid.New(), Type: "t.batchwire", Data: map[string]any{"i": i, "s": "ünïcødé \"quoted\" \\"}}
					if meta && i%2 == 0 {
						out[i].Metadata = eventstore.Metadata{CorrelationID: fmt.Sprintf("c-%d", i)}
					}
				}
				return out
			}

			first := evs(3, true)
			res, err := store.Append(ctx, prefix+"a", eventstore.NoStream, first...)
			if err != nil {
				t.Fatal(err)
			}
			if res.StreamVersion != 3 || len(res.Events) != 3 {
				t.Fatalf("append of 3: %+v", res)
			}
			got := readStream(t, store, prefix+"a")
			for i, e := range got {
				if e.ID != first[i].ID || e.GlobalSequence != res.Events[i].GlobalSequence || e.StreamVersion != int64(i+1) ||
					res.Events[i].ID != first[i].ID || res.Events[i].StreamVersion != int64(i+1) {
					t.Fatalf("event %d stored as %+v, reported as %+v; sent ID %s", i, e, res.Events[i], first[i].ID)
				}
				if want := map[bool]string{true: fmt.Sprintf("c-%d", i), false: ""}[i%2 == 0]; e.Metadata.CorrelationID != want {
					t.Fatalf("event %d: correlation ID %q, want %q", i, e.Metadata.CorrelationID, want)
				}
			}

			// A lone single-event append (append_one) beside them.
			one := evs(1, true)
			if r, err := store.Append(ctx, prefix+"one", eventstore.NoStream, one...); err != nil || r.StreamVersion != 1 || r.Events[0].ID != one[0].ID {
				t.Fatalf("lone append: %+v, %v", r, err)
			}

			// Without group commit (append_events), in a transaction of its
			// own and in the caller's.
			alone, err := eventstore.New(poolWithMode(t, db, mode, 0), &eventstore.Config{Schema: db.Schema, GroupCommit: eventstore.GroupCommit{Disabled: true}})
			if err != nil {
				t.Fatal(err)
			}
			if r, err := alone.Append(ctx, prefix+"alone", eventstore.NoStream, evs(2, true)...); err != nil || r.StreamVersion != 2 {
				t.Fatalf("append without group commit: %+v, %v", r, err)
			}

			tx, err := alone.Pool().Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if r, err := alone.AppendTx(ctx, tx, prefix+"tx", eventstore.NoStream, evs(2, true)...); err != nil || r.StreamVersion != 2 {
				t.Fatalf("append in a transaction: %+v, %v", r, err)
			}
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}

			// The same events again: stored, answered with their positions.
			again, err := store.Append(ctx, prefix+"a", eventstore.NoStream, first...)
			if err != nil {
				t.Fatalf("re-append: %v", err)
			}
			for i := range again.Events {
				if again.Events[i] != res.Events[i] {
					t.Fatalf("re-append answered %+v, the append %+v", again.Events, res.Events)
				}
			}

			// A stale expected version: refused with the actual one.
			_, err = store.Append(ctx, prefix+"a", eventstore.Exact(1), evs(2, false)...)
			var wrong *eventstore.WrongExpectedVersionError
			if !errors.As(err, &wrong) || wrong.Actual != 3 {
				t.Fatalf("stale append: %v, want a WrongExpectedVersionError with actual version 3", err)
			}

			// Concurrent appends, grouped as they come: any, exact and new.
			var wg sync.WaitGroup
			errs := make(chan error, 24)
			for w := range 8 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					stream := fmt.Sprintf("%sw%d", prefix, w)
					for k := range 3 {
						exp := eventstore.Exact(int64(2 * k))
						if w%2 == 1 {
							exp = eventstore.Any
						}
						r, err := store.Append(ctx, stream, exp, evs(2, w%3 == 0)...)
						if err == nil && r.StreamVersion != int64(2*k+2) {
							err = fmt.Errorf("%s: version %d after append %d", stream, r.StreamVersion, k)
						}
						if err != nil {
							errs <- err
							return
						}
					}
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Fatal(err)
			}
			for w := range 8 {
				if got := readStream(t, store, fmt.Sprintf("%sw%d", prefix, w)); len(got) != 6 {
					t.Fatalf("stream w%d holds %d events, want 6", w, len(got))
				}
			}
		})
	}
}

// After DEALLOCATE ALL on its connection (a pooler resetting it, DISCARD
// ALL), the append_batch statement the connection had prepared is gone: the
// next group prepares it again and is sent again, and the append succeeds.
func TestAppendBatchAfterDeallocateAll(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := annalstest.NewDB(t, nil)
	pool := poolWithMode(t, db, pgx.QueryExecModeCacheStatement, 1)
	store, err := eventstore.New(pool, &eventstore.Config{Schema: db.Schema})
	if err != nil {
		t.Fatal(err)
	}
	two := func() []eventstore.EventData {
		return []eventstore.EventData{{Type: "t.batchwire", Data: map[string]int{"n": 1}}, {Type: "t.batchwire", Data: map[string]int{"n": 2}}}
	}
	prepared := func() int {
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_prepared_statements WHERE statement LIKE '%append_batch(%'`,
			pgx.QueryExecModeSimpleProtocol).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if _, err := store.Append(ctx, "dealloc", eventstore.NoStream, two()...); err != nil {
		t.Fatal(err)
	}
	if n := prepared(); n != 1 {
		t.Fatalf("%d append_batch statements prepared on the connection, want 1", n)
	}
	if _, err := pool.Exec(ctx, "DEALLOCATE ALL", pgx.QueryExecModeSimpleProtocol); err != nil {
		t.Fatal(err)
	}
	res, err := store.Append(ctx, "dealloc", eventstore.Exact(2), two()...)
	if err != nil {
		t.Fatalf("append after DEALLOCATE ALL: %v", err)
	}
	if res.StreamVersion != 4 {
		t.Fatalf("version %d after the second append, want 4", res.StreamVersion)
	}
	if n := prepared(); n != 1 {
		t.Fatalf("%d append_batch statements prepared after the retry, want 1", n)
	}
}

// Only QueryExecModeCacheStatement keeps append_batch prepared on the
// server. The other modes exist for poolers in transaction mode, where a
// statement prepared in one transaction may be gone, or another client's, on
// the server connection of the next: CacheDescribe included, they send it
// unnamed.
func TestAppendBatchPreparedOnlyWhenCaching(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := annalstest.NewDB(t, nil)
	modes := map[pgx.QueryExecMode]int{pgx.QueryExecModeCacheStatement: 1, pgx.QueryExecModeCacheDescribe: 0,
		pgx.QueryExecModeDescribeExec: 0, pgx.QueryExecModeExec: 0, pgx.QueryExecModeSimpleProtocol: 0}
	for mode, want := range modes {
		pool := poolWithMode(t, db, mode, 1)
		store, err := eventstore.New(pool, &eventstore.Config{Schema: db.Schema})
		if err != nil {
			t.Fatal(err)
		}
		stream := "prepared-" + mode.String()
		for k := range 2 {
			evs := []eventstore.EventData{{Type: "t.batchwire", Data: map[string]int{"n": 1}}, {Type: "t.batchwire", Data: map[string]int{"n": 2}}}
			if _, err := store.Append(ctx, stream, eventstore.Exact(int64(2*k)), evs...); err != nil {
				t.Fatalf("%s: append %d: %v", mode, k, err)
			}
		}
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_prepared_statements WHERE statement LIKE '%append_batch(%'`,
			pgx.QueryExecModeSimpleProtocol).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n != want {
			t.Errorf("%s: %d append_batch statements prepared on the connection, want %d", mode, n, want)
		}
	}
}

// readStream reads every event of stream.
func readStream(t *testing.T, store *eventstore.Store, stream string) []eventstore.Event {
	t.Helper()
	var out []eventstore.Event
	for e, err := range store.ReadStream(context.Background(), stream, 1) {
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, e)
	}
	return out
}
