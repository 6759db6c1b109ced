package catchup

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/checkpoint"
)

// TakeOver's claims are bounded by its context alone, not by a
// lock_timeout or statement_timeout that the role or the database sets (a
// production guard): while the checkpoint row is held for longer than
// those (an open transaction here; a batch's commit in flight in real
// life), its fence of the leader on the pool and its claim on its lock's
// own connection wait, and go through once the row is free. Before, both
// failed after the database's lock_timeout, and TakeOver with them.
func TestTakeOverIgnoresServerTimeouts(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		// leader: a leader runs, so TakeOver fences it (on the pool) while
		// the row is held; otherwise nobody leads, TakeOver's look for its
		// queued request is made to fail, and it claims on its lock's
		// connection (the lock comes at once) while the row is held.
		leader bool
	}{
		{"Fence", true},
		{"Claim", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			db := annalstest.NewDB(t, nil)
			ctx := t.Context()
			if _, err := db.Pool.Exec(ctx, `ALTER DATABASE `+pgx.Identifier{db.Name}.Sanitize()+` SET lock_timeout = '100ms'`); err != nil {
				t.Fatal(err)
			}
			if _, err := db.Pool.Exec(ctx, `ALTER ROLE CURRENT_USER IN DATABASE `+pgx.Identifier{db.Name}.Sanitize()+` SET statement_timeout = '1s'`); err != nil {
				t.Fatal(err)
			}
			// Pools opened now: their connections (and the lock connections
			// made like them) have the settings.
			newPool := func(name string) *pgxpool.Pool {
				pc, err := pgxpool.ParseConfig(db.URL)
				if err != nil {
					t.Fatal(err)
				}
				pc.ConnConfig.RuntimeParams["application_name"] = name
				pool, err := pgxpool.NewWithConfig(ctx, pc)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(pool.Close)
				var lt, st string
				if err := pool.QueryRow(ctx, `SELECT current_setting('lock_timeout'), current_setting('statement_timeout')`).Scan(&lt, &st); err != nil {
					t.Fatal(err)
				}
				if lt != "100ms" || st != "1s" {
					t.Fatalf("a new connection has lock_timeout %s and statement_timeout %s; want 100ms and 1s", lt, st)
				}
				return pool
			}
			sub := &Subscription{Name: "s", Processor: nopLeader{}}
			if tc.leader {
				var leading atomic.Bool
				leader, err := NewEngine(newPool("leader"), nil, &Config{Owner: "leader", PollInterval: 50 * time.Millisecond,
					OnLeadership: func(_ string, _ int, _ int64, l bool) { leading.Store(l) }})
				if err != nil {
					t.Fatal(err)
				}
				runCtx, stop := context.WithCancel(ctx)
				ran := make(chan error, 1)
				go func() { ran <- leader.Run(runCtx, sub) }()
				defer func() { stop(); <-ran }()
				annalstest.WaitFor(t, 10*time.Second, leading.Load)
			} else {
				store, err := checkpoint.New("")
				if err != nil {
					t.Fatal(err)
				}
				if _, err := store.Set(ctx, db.Pool, "s", 0, 0); err != nil {
					t.Fatal(err)
				}
			}

			// An open transaction holds the checkpoint row.
			holder, err := db.Pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = holder.Rollback(context.WithoutCancel(ctx)) }()
			if _, err := holder.Exec(ctx, `SELECT 1 FROM annals.checkpoints WHERE subscriber_id = 's' AND partition = 0 FOR UPDATE`); err != nil {
				t.Fatal(err)
			}

			rebuild, err := NewEngine(newPool("rebuild"), nil, &Config{Owner: "rebuild"})
			if err != nil {
				t.Fatal(err)
			}
			if !tc.leader {
				rebuild.takeOverSeen = func(uint32) uint32 { return 0 } // no backend has PID 0
			}
			type result struct {
				lease *Lease
				err   error
			}
			got := make(chan result, 1)
			go func() {
				lease, err := rebuild.TakeOver(ctx, sub, 30*time.Second)
				got <- result{lease, err}
			}()
			// Let a claim of TakeOver's wait for the row longer than both
			// timeouts, then free the row.
			deadline := time.Now().Add(20 * time.Second)
			for {
				var waited bool
				err := db.Pool.QueryRow(ctx, `
					SELECT coalesce(bool_or(clock_timestamp() - query_start > interval '1500ms'), false)
					  FROM pg_stat_activity
					 WHERE datname = current_database() AND application_name = 'rebuild'
					   AND wait_event_type = 'Lock' AND wait_event <> 'advisory'`).Scan(&waited)
				if err != nil {
					t.Fatal(err)
				}
				if waited {
					break
				}
				select {
				case r := <-got:
					t.Fatalf("TakeOver returned while the checkpoint row was held: %+v", r.err)
				case <-time.After(20 * time.Millisecond):
				}
				if time.Now().After(deadline) {
					t.Fatal("no claim of TakeOver waited for the checkpoint row for 1.5 s")
				}
			}
			if err := holder.Rollback(ctx); err != nil {
				t.Fatal(err)
			}
			r := <-got
			if r.err != nil {
				t.Fatalf("TakeOver under the database's lock_timeout and the role's statement_timeout: %+v", r.err)
			}
			defer rebuild.Release(context.WithoutCancel(ctx), r.lease)
			var owner string
			var epoch int64
			if err := db.Pool.QueryRow(ctx, `SELECT owner, epoch FROM annals.checkpoints WHERE subscriber_id = 's' AND partition = 0`).Scan(&owner, &epoch); err != nil {
				t.Fatal(err)
			}
			if owner != "rebuild" || epoch != r.lease.Epoch {
				t.Fatalf("the checkpoint says owner %q at epoch %d; the lease has epoch %d", owner, epoch, r.lease.Epoch)
			}
			// The work under the lease runs with the server's settings again.
			err = r.lease.Do(ctx, func(conn *pgx.Conn) error {
				var lt string
				if err := conn.QueryRow(ctx, `SELECT current_setting('lock_timeout')`).Scan(&lt); err != nil {
					return err
				}
				if lt != "100ms" {
					t.Errorf("under the lease: lock_timeout %s, want the database's 100ms", lt)
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
		})
	}
}
