package projection_test

// Blue/green generations when the session's default isolation is REPEATABLE
// READ: the generations lock only makes the second of two concurrent
// changes see the first one's generation if the list after the lock takes a
// new snapshot. Before, the second one's list (in the snapshot taken before
// the lock's wait) missed the first one's generation, and it created the
// same generation again.

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/internal/lockkey"
	"github.com/annals-dev/annals/projection"
)

// heldStatsProjection is statsProjection(version) whose setup runs held
// first: it calls held (if not nil) before creating its table.
func heldStatsProjection(version int, held func(ctx context.Context) error) *projection.Typed {
	p := statsProjection(version)
	p.OnSetup(1, func(ctx context.Context, tx pgx.Tx) error {
		if held != nil {
			if err := held(ctx); err != nil {
				return err
			}
		}
		_, err := tx.Exec(ctx, `CREATE TABLE stats (stream text PRIMARY KEY, n bigint NOT NULL, total bigint NOT NULL)`)
		return err
	})
	return p
}

// waitForAdvisoryWaiter polls pg_locks until a session of db waits for the
// advisory lock of key (lockkey.Pair), for 30 seconds at most.
func waitForAdvisoryWaiter(ctx context.Context, db *annalstest.DB, key string) error {
	return waitForAdvisoryWaiters(ctx, db, key, 1)
}

// waitForAdvisoryWaiters is waitForAdvisoryWaiter for n sessions waiting.
func waitForAdvisoryWaiters(ctx context.Context, db *annalstest.DB, key string, n int) error {
	k1, k2 := lockkey.Pair(key)
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		var waiting int
		err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_locks
			WHERE locktype = 'advisory' AND NOT granted
			  AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
			  AND classid = $1::int4::oid AND objid = $2::int4::oid AND objsubid = 2`, k1, k2).Scan(&waiting)
		if err != nil {
			return errors.Wrapf(err, "wait for sessions waiting for lock %q", key)
		}
		if waiting >= n {
			return nil
		}
		select {
		case <-ctx.Done():
			return errors.Wrapf(ctx.Err(), "%d of %d sessions waited for lock %q", waiting, n, key)
		case <-tick.C:
		}
	}
}

// TestBlueGreenGenerationsUnderRepeatableReadDefault: a runner creating the
// first generation holds its setup (inside the generations lock) until a
// second instance waits for the lock; the second then sees the first
// generation and does not create it again.
func TestBlueGreenGenerationsUnderRepeatableReadDefault(t *testing.T) {
	t.Parallel()
	for _, second := range []string{"RunUntilCaughtUp", "RebuildBlueGreen"} {
		t.Run(second, func(t *testing.T) {
			t.Parallel()
			db, _, newPool := repeatableReadDB(t)
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			defer cancel()
			if err := (&bgLog{db: db}).add(ctx, 3, 5); err != nil {
				t.Fatal(err)
			}
			var setups atomic.Int32
			started := make(chan struct{})
			held := func(ctx context.Context) error {
				if setups.Add(1) != 1 {
					return nil
				}
				close(started)
				return waitForAdvisoryWaiter(ctx, db, db.Schema+":generations:"+bgName)
			}
			newRunner := func(id string, version int) *projection.Runner {
				r, err := projection.NewRunner(newPool(), &projection.Config{InstanceID: id,
					PollInterval: 100 * time.Millisecond, RetryBackoff: 100 * time.Millisecond, ShutdownTimeout: 5 * time.Second})
				if err != nil {
					t.Fatal(err)
				}
				if err := r.Register(heldStatsProjection(version, held), &projection.Options{BlueGreen: &projection.BlueGreen{
					Version: version, CheckInterval: 100 * time.Millisecond}}); err != nil {
					t.Fatal(err)
				}
				return r
			}
			first := newRunner("first", 1)
			var wg sync.WaitGroup
			errs := make([]error, 2)
			wg.Add(2)
			go func() { defer wg.Done(); errs[0] = first.RunUntilCaughtUp(ctx) }()
			go func() {
				defer wg.Done()
				select {
				case <-started:
				case <-ctx.Done():
					errs[1] = ctx.Err()
					return
				}
				switch second {
				case "RunUntilCaughtUp":
					errs[1] = newRunner("second", 1).RunUntilCaughtUp(ctx)
				case "RebuildBlueGreen":
					var c projection.Cutover
					if c, errs[1] = newRunner("second", 2).RebuildBlueGreen(ctx, bgName, nil); errs[1] == nil && (c.From != 1 || c.To != 2) {
						errs[1] = errors.Newf("cut-over %d → %d; want 1 → 2", c.From, c.To)
					}
				}
			}()
			wg.Wait()
			for i, err := range errs {
				if err != nil {
					t.Errorf("instance %d: %v", i, err)
				}
			}
			gens, err := projection.ListGenerations(ctx, db.Pool, db.Schema, bgName)
			if err != nil {
				t.Fatal(err)
			}
			var got []int
			for _, g := range gens {
				got = append(got, g.Version)
			}
			want := []int{1}
			if second == "RebuildBlueGreen" {
				want = []int{1, 2}
			}
			if len(got) != len(want) || got[0] != want[0] || got[len(got)-1] != want[len(want)-1] {
				t.Fatalf("the generations' versions are %v; want %v", got, want)
			}
			if n := int(setups.Load()); n != len(want) {
				t.Fatalf("the setup ran %d times; want %d", n, len(want))
			}
		})
	}
}

// TestBlueGreenRollbackAndDropUnderRepeatableReadDefault: two rollbacks of
// the same generation, then two drops of the retired one, each pair run at
// once from pools whose sessions default to REPEATABLE READ and let go
// together from the generations lock: one does it, the other finds it done
// (ErrNotLive; nothing to drop). Before, the second one's reads kept the
// snapshot taken before the lock's wait and it rolled back or dropped again
// (failing to serialize, or on the dropped schema).
func TestBlueGreenRollbackAndDropUnderRepeatableReadDefault(t *testing.T) {
	t.Parallel()
	db, _, newPool := repeatableReadDB(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	if err := (&bgLog{db: db}).add(ctx, 3, 5); err != nil {
		t.Fatal(err)
	}
	if err := bgRunner(t, db, "v1", 1, false).RunUntilCaughtUp(ctx); err != nil {
		t.Fatal(err)
	}
	if c, err := bgRunner(t, db, "v2", 2, false).RebuildBlueGreen(ctx, bgName, nil); err != nil || c.To != 2 {
		t.Fatalf("RebuildBlueGreen: %+v, %v", c, err)
	}
	pools := []*pgxpool.Pool{newPool(), newPool()}
	// together runs do with each pool at once, all of them waiting for the
	// generations lock (which the test holds) before they go on together.
	together := func(do func(pool *pgxpool.Pool) error) []error {
		t.Helper()
		hold, err := db.Pool.Begin(ctx) // db.Pool's sessions predate the ALTER: READ COMMITTED
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = hold.Rollback(context.WithoutCancel(ctx)) }()
		k1, k2 := lockkey.Pair(db.Schema + ":generations:" + bgName)
		if _, err := hold.Exec(ctx, `SELECT pg_advisory_xact_lock($1::int4, $2::int4)`, k1, k2); err != nil {
			t.Fatal(err)
		}
		errs := make([]error, len(pools))
		var wg sync.WaitGroup
		for i, pool := range pools {
			wg.Add(1)
			go func() { defer wg.Done(); errs[i] = do(pool) }()
		}
		if err := waitForAdvisoryWaiters(ctx, db, db.Schema+":generations:"+bgName, len(pools)); err != nil {
			t.Error(err)
		}
		if err := hold.Commit(ctx); err != nil {
			t.Error(err)
		}
		wg.Wait()
		return errs
	}

	errs := together(func(pool *pgxpool.Pool) error {
		_, err := projection.RollbackFrom(ctx, pool, db.Schema, bgName, 2)
		return err
	})
	if ok, notLive := countErrs(errs, nil), countErrs(errs, projection.ErrNotLive); ok != 1 || notLive != 1 {
		t.Fatalf("two rollbacks from generation 2 at once: %v; want one nil and one ErrNotLive", errs)
	}

	var dropped [2][]int
	errs = together(func(pool *pgxpool.Pool) error {
		i := 0
		if pool == pools[1] {
			i = 1
		}
		var err error
		dropped[i], err = projection.DropRetired(ctx, pool, db.Schema, bgName, 0)
		return err
	})
	if errs[0] != nil || errs[1] != nil || len(dropped[0])+len(dropped[1]) != 1 {
		t.Fatalf("two drops at once: %v, %v, dropped %v; want generation 2 dropped once", errs[0], errs[1], dropped)
	}
	gens, err := projection.ListGenerations(ctx, db.Pool, db.Schema, bgName)
	if err != nil {
		t.Fatal(err)
	}
	if len(gens) != 2 || gens[0].State != projection.GenerationLive || gens[1].State != projection.GenerationDropped {
		t.Fatalf("generations after the rollback and the drop: %+v", gens)
	}
}

// countErrs counts the errors of errs that are target (nil: the nil ones).
func countErrs(errs []error, target error) int {
	n := 0
	for _, err := range errs {
		if (target == nil && err == nil) || (target != nil && errors.Is(err, target)) {
			n++
		}
	}
	return n
}
