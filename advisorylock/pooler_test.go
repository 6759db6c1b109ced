package advisorylock_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/advisorylock"
	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/internal/pgcluster"
)

// Through PgBouncer as most run it (transaction mode, no
// ignore_startup_parameters for the lock's keepalive and check settings),
// every way to open a lock session fails at connect, and the error says why
// and what to do: a direct connection or a session-mode pooler. Before,
// it was PgBouncer's bare "unsupported startup parameter", repeated in
// the runner's WARN for ever.
func TestThroughATransactionPoolerTheConnectErrorExplains(t *testing.T) {
	t.Parallel()
	b := newBundle(t)
	ctx := t.Context()
	via, _ := annalstest.PgBouncer(t, b.db.URL, nil)
	cc, err := pgx.ParseConfig(via)
	if err != nil {
		t.Fatal(err)
	}
	check := func(what string, err error) {
		t.Helper()
		if err == nil {
			t.Fatalf("%s through PgBouncer in transaction mode succeeded", what)
		}
		for _, want := range []string{"unsupported startup parameter", "a pooler", "session mode", "ignore_startup_parameters"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("%s: %q lacks %q", what, err, want)
			}
		}
	}
	_, err = advisorylock.TryAcquire(ctx, cc, "pooler:try", nil)
	check("TryAcquire", err)
	_, err = advisorylock.NewStandby(ctx, cc, nil)
	check("NewStandby", err)
}

// Through a pooler in transaction mode that lets the lock session's
// start-up parameters through (PgBouncer with ignore_startup_parameters),
// two standbys of two processes share one server session: each would take
// a lock the other holds (advisory locks are re-entrant on a session), so
// both would lead. A Standby marks its server session at connect, and
// TryLock and Take on a session without its mark take nothing and fail
// with ErrPooledSession.
func TestThroughATransactionPoolerAStandbyTakesNothing(t *testing.T) {
	t.Parallel()
	b := newBundle(t)
	ctx := t.Context()
	via, _ := annalstest.PgBouncer(t, b.db.URL, &pgcluster.PgBouncerOptions{PoolSize: 1, IgnoreStartupParameters: pgcluster.LockSessionParameters})
	cc, err := pgx.ParseConfig(via)
	if err != nil {
		t.Fatal(err)
	}
	cc.DefaultQueryExecMode = pgx.QueryExecModeExec // no statement kept on a session
	first, err := advisorylock.NewStandby(ctx, cc, nil)
	if err != nil {
		t.Fatalf("NewStandby: %+v", err)
	}
	defer first.Close(ctx)
	second, err := advisorylock.NewStandby(ctx, cc, nil) // marks the one server session again
	if err != nil {
		t.Fatalf("NewStandby: %+v", err)
	}
	defer second.Close(ctx)
	if won, err := first.Take(ctx, []string{"pooler:a", "pooler:b"}); !errors.Is(err, advisorylock.ErrPooledSession) || len(won) != 0 {
		t.Fatalf("Take through a transaction pooler = %v, %v; want ErrPooledSession", won, err)
	}
	if l, _, err := first.TryLock(ctx, []string{"pooler:a"}); !errors.Is(err, advisorylock.ErrPooledSession) || l != nil {
		t.Fatalf("TryLock through a transaction pooler = %v, %v; want ErrPooledSession", l, err)
	}
	// Nothing was taken: the keys are free for a direct session.
	b.acquire(t, "pooler:a", nil)
	b.acquire(t, "pooler:b", nil)
	// The standby that marked last is on its mark's session (the pooler has
	// one): it takes, as through a session-mode pooler or directly.
	if won, err := second.Take(ctx, []string{"pooler:c"}); err != nil || len(won) != 1 {
		t.Fatalf("Take on the marked session = %v, %v", won, err)
	}
}

// Through the same pooler, a standby that connects once another one holds
// locks on the pooler's server session (a second process, or the first
// reconnecting after ErrPooledSession, as a runner does) lands on that
// session: marking it again would make it the mark's owner, and its Take
// would take the other's locks again (re-entrant), two leaders. A Standby
// marks only a server session that holds no advisory lock; NewStandby fails
// with ErrPooledSession on one that does.
func TestThroughATransactionPoolerAStandbyMarksNoSessionWithLocks(t *testing.T) {
	t.Parallel()
	b := newBundle(t)
	ctx := t.Context()
	via, _ := annalstest.PgBouncer(t, b.db.URL, &pgcluster.PgBouncerOptions{PoolSize: 1, IgnoreStartupParameters: pgcluster.LockSessionParameters})
	cc, err := pgx.ParseConfig(via)
	if err != nil {
		t.Fatal(err)
	}
	cc.DefaultQueryExecMode = pgx.QueryExecModeExec
	first, err := advisorylock.NewStandby(ctx, cc, nil)
	if err != nil {
		t.Fatalf("NewStandby: %+v", err)
	}
	defer first.Close(ctx)
	// Alone on the pooler's one server session, the first takes.
	if won, err := first.Take(ctx, []string{"pooler:a"}); err != nil || len(won) != 1 {
		t.Fatalf("Take of the only standby = %v, %v", won, err)
	}
	second, err := advisorylock.NewStandby(ctx, cc, nil)
	if err == nil {
		defer second.Close(ctx)
		won, err := second.Take(ctx, []string{"pooler:a"})
		t.Fatalf("a second standby on the server session that holds the first's lock: NewStandby succeeded, Take = %v, %v; want NewStandby to fail with ErrPooledSession", won, err)
	}
	if !errors.Is(err, advisorylock.ErrPooledSession) {
		t.Fatalf("NewStandby on a server session with another's locks: %v; want ErrPooledSession", err)
	}
	// The first still holds its lock, and still takes on its session.
	b.notAcquired(t, "pooler:a")
	if won, err := first.Take(ctx, []string{"pooler:b"}); err != nil || len(won) != 1 {
		t.Fatalf("Take of the first standby after the second's refusal = %v, %v", won, err)
	}
}

// throughBouncer returns b's database reached through a PgBouncer of
// poolSize server sessions in mode, with the lock session's start-up
// parameters on its ignore list, in QueryExecModeExec (no statement kept on
// a session).
func throughBouncer(t *testing.T, b *testBundle, mode string, poolSize int) *pgx.ConnConfig {
	t.Helper()
	via, _ := annalstest.PgBouncer(t, b.db.URL, &pgcluster.PgBouncerOptions{
		PoolMode: mode, PoolSize: poolSize, IgnoreStartupParameters: pgcluster.LockSessionParameters})
	cc, err := pgx.ParseConfig(via)
	if err != nil {
		t.Fatal(err)
	}
	cc.DefaultQueryExecMode = pgx.QueryExecModeExec
	return cc
}

// Through a transaction pooler that lets the lock session's start-up
// parameters through, the single-lock sessions (TryAcquire, Acquire,
// AcquireQueued: a rebuild's TakeOver, the archiver, the scavenger) of two
// processes share the pooler's one server session, where the lock is
// re-entrant: each would take the lock the other holds, and both would
// lead. Each marks its server session as a Standby does, only one that
// holds no advisory lock, and takes the lock only on a session with its
// mark, in the same statement: the second fails with ErrPooledSession and
// takes nothing.
func TestThroughATransactionPoolerASingleLockTakesNoHeldLock(t *testing.T) {
	t.Parallel()
	b := newBundle(t)
	ctx := t.Context()
	cc := throughBouncer(t, b, "transaction", 1)
	first, err := advisorylock.TryAcquire(ctx, cc, "pooler:single", nil)
	if err != nil {
		t.Fatalf("TryAcquire of the only lock session: %+v", err)
	}
	defer first.Release(ctx)
	refused := func(what string, l *advisorylock.Lock, err error) {
		t.Helper()
		if l != nil {
			_ = l.Release(ctx)
			t.Errorf("%s on the pooler's server session, which holds the first lock: acquired (two holders); want ErrPooledSession", what)
			return
		}
		if !errors.Is(err, advisorylock.ErrPooledSession) {
			t.Errorf("%s on the pooler's server session, which holds the first lock: %v; want ErrPooledSession", what, err)
		}
	}
	for _, key := range []string{"pooler:single", "pooler:other"} {
		l, err := advisorylock.TryAcquire(ctx, cc, key, nil)
		refused("TryAcquire("+key+")", l, err)
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		l, err = advisorylock.Acquire(wctx, cc, key, nil)
		refused("Acquire("+key+")", l, err)
		var asked []uint32
		l, err = advisorylock.AcquireQueued(wctx, cc, key, nil, func(pid uint32) { asked = append(asked, pid) })
		cancel()
		refused("AcquireQueued("+key+")", l, err)
		if len(asked) != 0 {
			t.Errorf("AcquireQueued(%s) reported PID %v for a session it did not mark", key, asked)
		}
	}
	// The first lock is intact: held, and verified on its session.
	b.notAcquired(t, "pooler:single")
	if err := first.Verify(ctx); err != nil {
		t.Fatalf("Verify of the first lock after the refusals: %v", err)
	}
	if err := first.Release(ctx); err != nil {
		t.Fatalf("Release of the first lock: %v", err)
	}
	// Once it is released the server session is free, and a lock session
	// marks it and takes.
	l, err := advisorylock.Acquire(ctx, cc, "pooler:single", nil)
	if err != nil {
		t.Fatalf("Acquire on the freed server session: %+v", err)
	}
	_ = l.Release(ctx)
}

// A standby's mark does not survive a single lock taken on its server
// session: the lock session marks it its own, so that the standby, handed
// the same server session by the pooler, takes nothing there (its Take
// would take the lock again, re-entrant: two holders).
func TestThroughATransactionPoolerASingleLockUnmarksAStandby(t *testing.T) {
	t.Parallel()
	b := newBundle(t)
	ctx := t.Context()
	cc := throughBouncer(t, b, "transaction", 1)
	sb, err := advisorylock.NewStandby(ctx, cc, nil)
	if err != nil {
		t.Fatalf("NewStandby: %+v", err)
	}
	defer sb.Close(ctx)
	l, err := advisorylock.TryAcquire(ctx, cc, "pooler:k", nil)
	if err != nil {
		t.Fatalf("TryAcquire: %+v", err)
	}
	defer l.Release(ctx)
	if won, err := sb.Take(ctx, []string{"pooler:k"}); !errors.Is(err, advisorylock.ErrPooledSession) || len(won) != 0 {
		t.Fatalf("Take on the server session that holds a single lock = %v, %v; want ErrPooledSession", won, err)
	}
}

// Through PgBouncer in session mode, which a lock session may use, every
// way to take a lock takes it, and a second session's try of the same key
// finds it held: the mark checks refuse nothing there.
func TestThroughASessionPoolerSingleLocksTake(t *testing.T) {
	t.Parallel()
	b := newBundle(t)
	ctx := t.Context()
	cc := throughBouncer(t, b, "session", 8)
	var asked uint32
	takers := map[string]func(key string) (*advisorylock.Lock, error){
		"TryAcquire": func(key string) (*advisorylock.Lock, error) { return advisorylock.TryAcquire(ctx, cc, key, nil) },
		"Acquire":    func(key string) (*advisorylock.Lock, error) { return advisorylock.Acquire(ctx, cc, key, nil) },
		"AcquireQueued": func(key string) (*advisorylock.Lock, error) {
			return advisorylock.AcquireQueued(ctx, cc, key, nil, func(pid uint32) { asked = pid })
		},
	}
	for name, take := range takers {
		key := "session:" + name
		l, err := take(key)
		if err != nil {
			t.Fatalf("%s through a session pooler: %+v", name, err)
		}
		if _, err := advisorylock.TryAcquire(ctx, cc, key, nil); !errors.Is(err, advisorylock.ErrNotAcquired) {
			t.Fatalf("a second session's TryAcquire of %s's key: %v; want ErrNotAcquired", name, err)
		}
		b.notAcquired(t, key)
		// FreezeTimeout reaches the server session through the pooler: it is
		// set by a statement, not a start-up parameter (which PgBouncer
		// refuses, or drops when told to ignore it).
		var idle string
		if err := l.Do(ctx, func(conn *pgx.Conn) error {
			return conn.QueryRow(ctx, `SHOW idle_session_timeout`).Scan(&idle)
		}); err != nil || idle != "30s" {
			t.Fatalf("%s through a session pooler: idle_session_timeout %q, %v; want 30s (FreezeTimeout's default)", name, idle, err)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatalf("%s: Release: %v", name, err)
		}
	}
	if asked == 0 {
		t.Error("AcquireQueued reported no PID")
	}
}
