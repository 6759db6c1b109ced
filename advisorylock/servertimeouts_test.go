package advisorylock_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/advisorylock"
)

// Acquire's wait is bounded by its context alone: a lock_timeout or
// statement_timeout of the database (a common production guard) does not
// cut it short, and the session has them back for the work under the lock.
func TestAcquireIgnoresServerTimeouts(t *testing.T) {
	t.Parallel()
	b := newBundle(t)
	ctx := t.Context()
	if _, err := b.db.Pool.Exec(ctx, `ALTER DATABASE `+pgx.Identifier{b.cc.Database}.Sanitize()+` SET lock_timeout = '300ms'`); err != nil {
		t.Fatal(err)
	}
	if _, err := b.db.Pool.Exec(ctx, `ALTER DATABASE `+pgx.Identifier{b.cc.Database}.Sanitize()+` SET statement_timeout = '400ms'`); err != nil {
		t.Fatal(err)
	}
	holder := b.acquire(t, "timeouts", nil)
	type result struct {
		l   *advisorylock.Lock
		err error
	}
	got := make(chan result, 1)
	var pid atomic.Uint32
	go func() {
		actx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		l, err := advisorylock.AcquireQueued(actx, b.cc, "timeouts", nil, func(p uint32) { pid.Store(p) })
		got <- result{l, err}
	}()
	// Let the wait outlast both timeouts (it shows in pg_stat_activity),
	// then free the lock.
	deadline := time.Now().Add(15 * time.Second)
	for {
		var waited bool
		err := b.db.Pool.QueryRow(ctx, `SELECT coalesce(bool_or(wait_event_type = 'Lock' AND clock_timestamp() - query_start > interval '1s'), false)
			FROM pg_stat_activity WHERE pid = $1`, int32(pid.Load())).Scan(&waited)
		if err != nil {
			t.Fatal(err)
		}
		if waited {
			break
		}
		select {
		case r := <-got:
			t.Fatalf("Acquire returned while the lock was held: %v", r.err)
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatal("Acquire's session did not wait for the lock for 1s")
		}
	}
	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-got
	if r.err != nil {
		t.Fatalf("Acquire under the database's lock_timeout and statement_timeout: %+v", r.err)
	}
	defer r.l.Release(ctx)
	err := r.l.Do(ctx, func(conn *pgx.Conn) error {
		var lt, st string
		if err := conn.QueryRow(ctx, `SELECT current_setting('lock_timeout'), current_setting('statement_timeout')`).Scan(&lt, &st); err != nil {
			return err
		}
		if lt != "300ms" || st != "400ms" {
			return errors.Newf("under the lock: lock_timeout %s, statement_timeout %s; want the database's 300ms and 400ms", lt, st)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
