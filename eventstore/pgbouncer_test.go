package eventstore_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/internal/pgcluster"
)

// Appends and reads go through a pooler in transaction mode, as
// docs/operations.md ("PgBouncer and other poolers") says they can: a real
// PgBouncer with two server sessions for the writer role's many clients, so
// that every client's transactions run on sessions other clients used
// before. For each query mode that sends a statement's text with each
// execution, without a prepared statement kept on the session (PgBouncer
// before 1.21 cannot keep them; Debian 12 has 1.18): concurrent appends with group commit and exact expected versions,
// refused appends, idempotent re-appends, multi-stream transactions,
// rolled-back transactions and appends without group commit, as the
// least-privilege writer role. Then the log must hold exactly the events
// acknowledged, in position order with every stream's versions 1..n, and
// the shared server sessions must have kept none of annals' settings.
func TestThroughPgBouncer(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	db := annalstest.NewDB(t, nil)
	writer := testRole(t, db, true, grantNew)
	cfg, err := pgx.ParseConfig(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	_, bouncer := annalstest.PgBouncer(t, db.URL, &pgcluster.PgBouncerOptions{PoolSize: 2, Users: []string{writer}})
	viaBouncer := bouncer.URL(cfg.Database, writer)

	// What a fresh server session of the writer says, before annals ran.
	settings := `SELECT current_user, current_setting('synchronous_commit'), current_setting('plan_cache_mode'),
		current_setting('enable_seqscan'), current_setting('search_path'), current_setting('lock_timeout'),
		current_setting('statement_timeout'), current_setting('default_transaction_isolation'),
		current_setting('idle_in_transaction_session_timeout'), pg_catalog.txid_current_if_assigned() IS NULL`
	readSettings := func(q interface {
		QueryRow(context.Context, string, ...any) pgx.Row
	}) string {
		t.Helper()
		var user, sc, pcm, ess, sp, lt, st, iso, idle string
		var noTx bool
		if err := q.QueryRow(ctx, settings).Scan(&user, &sc, &pcm, &ess, &sp, &lt, &st, &iso, &idle, &noTx); err != nil {
			t.Fatalf("read the session's settings through PgBouncer: %v", err)
		}
		return fmt.Sprintf("user=%s synchronous_commit=%s plan_cache_mode=%s enable_seqscan=%s search_path=%s lock_timeout=%s statement_timeout=%s isolation=%s idle_timeout=%s no_open_tx=%v",
			user, sc, pcm, ess, sp, lt, st, iso, idle, noTx)
	}
	// readEach reads the settings of each of the pooler's two server
	// sessions of the writer: two transactions open at once hold both.
	readEach := func(pool *pgxpool.Pool) []string {
		t.Helper()
		var out []string
		var txs []pgx.Tx
		for range 2 {
			tx, err := pool.BeginTx(ctx, pgx.TxOptions{})
			if err != nil {
				t.Fatal(err)
			}
			txs = append(txs, tx)
			// In a transaction no_open_tx is false whatever the session held.
			out = append(out, readSettings(tx))
		}
		var pids []int32
		for _, tx := range txs {
			var pid int32
			if err := tx.QueryRow(ctx, "SELECT pg_catalog.pg_backend_pid()").Scan(&pid); err != nil {
				t.Fatal(err)
			}
			pids = append(pids, pid)
			if err := tx.Rollback(ctx); err != nil {
				t.Fatal(err)
			}
		}
		if pids[0] == pids[1] {
			t.Fatalf("two open transactions through PgBouncer on one server session (%d)", pids[0])
		}
		return out
	}
	poolOf := func(mode pgx.QueryExecMode, maxConns int32) *pgxpool.Pool {
		t.Helper()
		pc, err := pgxpool.ParseConfig(viaBouncer)
		if err != nil {
			t.Fatal(err)
		}
		pc.ConnConfig.DefaultQueryExecMode = mode
		pc.MaxConns = maxConns
		pool, err := pgxpool.NewWithConfig(ctx, pc)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		return pool
	}
	probe := poolOf(pgx.QueryExecModeSimpleProtocol, 2)
	before := readEach(probe)
	if before[0] != before[1] {
		t.Fatalf("two fresh server sessions differ:\n  %s\n  %s", before[0], before[1])
	}

	// The modes whose execution carries its statement's text (CacheDescribe
	// asks for the description once in a round trip of its own, then sends
	// the text with every execution). QueryExecModeDescribeExec does not:
	// it executes the unnamed statement its describe left on a server
	// session, which the pooler may have given to another client meanwhile
	// ("bind message supplies 7 parameters, but prepared statement ""
	// requires 0"), for any statement, not only annals'.
	modes := []pgx.QueryExecMode{pgx.QueryExecModeCacheDescribe, pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol}
	for _, mode := range modes {
		prefix := "pgb-" + mode.String() + "-"
		pool := poolOf(mode, 16)
		store, err := eventstore.New(pool, &eventstore.Config{Schema: db.Schema})
		if err != nil {
			t.Fatal(err)
		}
		alone, err := eventstore.New(pool, &eventstore.Config{Schema: db.Schema, GroupCommit: eventstore.GroupCommit{Disabled: true}})
		if err != nil {
			t.Fatal(err)
		}

		const writers, appends = 12, 15
		var mu sync.Mutex
		acked := map[string]int64{} // stream → last version acknowledged
		var wg sync.WaitGroup
		errs := make(chan error, writers)
		for w := range writers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				stream := fmt.Sprintf("%sw%d", prefix, w)
				s := store
				if w%4 == 3 {
					s = alone // some writers without group commit
				}
				version := eventstore.NoStream
				for i := range appends {
					n := 1 + i%3
					evs := make([]eventstore.EventData, n)
					for j := range evs {
						evs[j] = eventstore.EventData{Type: "t.pgbouncer", Data: map[string]int{"w": w, "i": i, "j": j}}
					}
					res, err := s.Append(ctx, stream, version, evs...)
					if err != nil {
						errs <- fmt.Errorf("writer %d append %d: %w", w, i, err)
						return
					}
					version = eventstore.ExpectedVersion(res.StreamVersion)
					// The same events again (their IDs now set) are stored already.
					if i%5 == 0 {
						for j := range evs {
							evs[j].ID = res.Events[j].ID
						}
						again, err := s.Append(ctx, stream, eventstore.Any, evs...)
						if err != nil || again.StreamVersion != res.StreamVersion {
							errs <- fmt.Errorf("writer %d re-append %d: %+v, %w", w, i, again, err)
							return
						}
					}
					// A stale expected version is refused and changes nothing.
					if rand.IntN(4) == 0 {
						_, err := s.Append(ctx, stream, version-1, eventstore.EventData{Type: "t.pgbouncer.stale", Data: map[string]int{}})
						if !errors.Is(err, eventstore.ErrWrongExpectedVersion) {
							errs <- fmt.Errorf("writer %d stale append %d: %v, want ErrWrongExpectedVersion", w, i, err)
							return
						}
					}
					mu.Lock()
					acked[stream] = res.StreamVersion
					mu.Unlock()
				}
			}()
		}
		// Beside them, multi-stream transactions: some commit, some roll back.
		for i := range 10 {
			a, bs := fmt.Sprintf("%stx%d-a", prefix, i), fmt.Sprintf("%stx%d-b", prefix, i)
			rollBack := i%3 == 2
			errRollBack := errors.New("roll back")
			_, err := store.Transact(ctx, func(ctx context.Context, tx pgx.Tx, b *eventstore.Batch) error {
				// The caller's own statement in the transaction, beside the appends.
				if _, err := tx.Exec(ctx, "SELECT pg_catalog.txid_current()"); err != nil {
					return err
				}
				if err := b.Append(a, eventstore.NoStream, eventstore.EventData{Type: "t.pgbouncer.tx", Data: map[string]int{"i": i}}); err != nil {
					return err
				}
				if err := b.Append(bs, eventstore.NoStream, eventstore.EventData{Type: "t.pgbouncer.tx", Data: map[string]int{"i": i}}); err != nil {
					return err
				}
				if rollBack {
					return errRollBack
				}
				return nil
			})
			switch {
			case rollBack && !errors.Is(err, errRollBack):
				t.Fatalf("%s: transaction %d: %v, want the rollback's error", mode, i, err)
			case !rollBack && err != nil:
				t.Fatalf("%s: transaction %d: %v", mode, i, err)
			case !rollBack:
				mu.Lock()
				acked[a], acked[bs] = 1, 1
				mu.Unlock()
			}
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatalf("%s: %v", mode, err)
		}

		// The log holds exactly what was acknowledged, in order.
		seen := map[string]int64{}
		last := int64(0)
		for e, err := range store.ReadAll(ctx, 0) {
			if err != nil {
				t.Fatalf("%s: read all: %v", mode, err)
			}
			if e.GlobalSequence <= last {
				t.Fatalf("%s: position %d after %d", mode, e.GlobalSequence, last)
			}
			last = e.GlobalSequence
			if len(e.StreamID) < len(prefix) || e.StreamID[:len(prefix)] != prefix {
				continue
			}
			if e.StreamVersion != seen[e.StreamID]+1 {
				t.Fatalf("%s: %s version %d after %d", mode, e.StreamID, e.StreamVersion, seen[e.StreamID])
			}
			seen[e.StreamID] = e.StreamVersion
			if e.Type == "t.pgbouncer.stale" {
				t.Fatalf("%s: a refused append is in the log: %+v", mode, e)
			}
		}
		if fmt.Sprint(seen) != fmt.Sprint(acked) {
			t.Fatalf("%s: the log holds %v, acknowledged %v", mode, seen, acked)
		}
		for stream, version := range acked {
			var n int64
			for e, err := range store.ReadStream(ctx, stream, 1) {
				if err != nil {
					t.Fatalf("%s: read %s: %v", mode, stream, err)
				}
				n++
				if e.StreamVersion != n {
					t.Fatalf("%s: %s read at version %d, want %d", mode, stream, e.StreamVersion, n)
				}
			}
			if n != version {
				t.Fatalf("%s: %s has %d events, acknowledged %d", mode, stream, n, version)
			}
		}
	}

	// The two server sessions every client shared kept nothing of annals'.
	for i, after := range readEach(probe) {
		if after != before[0] {
			t.Fatalf("server session %d after annals' traffic:\n  %s\nbefore:\n  %s", i, after, before[0])
		}
	}
}

// Through such a pooler, pgx's default statement cache fails once the
// server sessions carry another client's statements (42P05 "prepared
// statement ... already exists", or 26000 "does not exist"): the append's
// error says what is in between and what to do, not only the SQLSTATE.
func TestThroughPgBouncerTheStatementCacheErrorExplains(t *testing.T) {
	t.Parallel()
	for name, cfg := range map[string]*eventstore.Config{
		"group commit":    nil,
		"no group commit": {GroupCommit: eventstore.GroupCommit{Disabled: true}},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db := annalstest.NewDB(t, nil)
			pooled, _ := annalstest.PgBouncer(t, db.URL, nil)
			var stores []*eventstore.Store
			for range 3 {
				pool, err := pgxpool.New(ctx, pooled) // pgx's default: QueryExecModeCacheStatement
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(pool.Close)
				s, err := eventstore.New(pool, cfg)
				if err != nil {
					t.Fatal(err)
				}
				stores = append(stores, s)
			}
			var failed error
			for i := 0; i < 30 && failed == nil; i++ {
				_, failed = stores[i%len(stores)].Append(ctx, fmt.Sprintf("cache-%d", i), eventstore.NoStream, eventstore.EventData{Type: "T", Data: map[string]int{"i": i}})
			}
			if failed == nil {
				t.Fatal("30 appends of three clients through two server sessions with pgx's statement cache all passed; the test shows nothing")
			}
			if !strings.Contains(failed.Error(), "a pooler in transaction mode without prepared-statement support") {
				t.Fatalf("append through a transaction pooler with the statement cache: %v; want the pooler named", failed)
			}
		})
	}
}
