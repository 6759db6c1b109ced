package advisorylock_test

import (
	"errors"
	"strings"
	"testing"

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
