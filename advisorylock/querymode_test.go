package advisorylock_test

import (
	"testing"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/advisorylock"
)

// TryAcquire, Acquire and AcquireQueued send their session's mark in the
// lock's round trip (a batch), and the lock statement answers NULL on a
// session without it: in each of pgx's query exec modes (the simple
// protocol sends the batch as one query string) they take the lock, and
// a second session's try finds it held.
func TestSingleLocksInEveryQueryExecMode(t *testing.T) {
	t.Parallel()
	b := newBundle(t)
	ctx := t.Context()
	modes := []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeCacheDescribe,
		pgx.QueryExecModeDescribeExec, pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol}
	for _, mode := range modes {
		cc := b.cc.Copy()
		cc.DefaultQueryExecMode = mode
		var pid uint32
		takers := []struct {
			name string
			take func(key string) (*advisorylock.Lock, error)
		}{
			{"TryAcquire", func(key string) (*advisorylock.Lock, error) { return advisorylock.TryAcquire(ctx, cc, key, nil) }},
			{"Acquire", func(key string) (*advisorylock.Lock, error) { return advisorylock.Acquire(ctx, cc, key, nil) }},
			{"AcquireQueued", func(key string) (*advisorylock.Lock, error) {
				return advisorylock.AcquireQueued(ctx, cc, key, nil, func(p uint32) { pid = p })
			}},
		}
		for _, tk := range takers {
			key := mode.String() + ":" + tk.name
			l, err := tk.take(key)
			if err != nil {
				t.Fatalf("%s in %s: %+v", tk.name, mode, err)
			}
			if _, err := advisorylock.TryAcquire(ctx, cc, key, nil); !errors.Is(err, advisorylock.ErrNotAcquired) {
				t.Errorf("%s in %s: a second session's TryAcquire = %v; want ErrNotAcquired", tk.name, mode, err)
			}
			if err := l.Release(ctx); err != nil {
				t.Errorf("%s in %s: Release: %v", tk.name, mode, err)
			}
		}
		if pid == 0 {
			t.Errorf("AcquireQueued in %s reported no PID", mode)
		}
	}
}
