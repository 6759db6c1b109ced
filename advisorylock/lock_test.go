package advisorylock_test

import (
	"context"
	stderrors "errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"

	"github.com/annals-dev/annals/advisorylock"
	"github.com/annals-dev/annals/annalstest"
)

// lossTimeout is how soon a lost lock must be noticed.
const lossTimeout = 2 * time.Second

type testBundle struct {
	db *annalstest.DB
	cc *pgx.ConnConfig
}

func newBundle(t *testing.T) *testBundle {
	t.Helper()
	db := annalstest.NewDB(t, nil)
	cc, err := pgx.ParseConfig(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	return &testBundle{db: db, cc: cc}
}

// acquire takes key or fails the test; the lock is released when the test ends.
func (b *testBundle) acquire(t *testing.T, key string, cfg *advisorylock.Config) *advisorylock.Lock {
	t.Helper()
	l, err := advisorylock.TryAcquire(t.Context(), b.cc, key, cfg)
	if err != nil {
		t.Fatalf("TryAcquire(%q): %+v", key, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := l.Release(ctx); err != nil && !errors.Is(err, advisorylock.ErrLost) {
			t.Errorf("Release(%q) at cleanup: %v", key, err)
		}
	})
	return l
}

// notAcquired asserts that key is taken by someone else.
func (b *testBundle) notAcquired(t *testing.T, key string) {
	t.Helper()
	l, err := advisorylock.TryAcquire(t.Context(), b.cc, key, nil)
	if !errors.Is(err, advisorylock.ErrNotAcquired) {
		if l != nil {
			_ = l.Release(t.Context())
		}
		t.Fatalf("TryAcquire(%q) = %v, want ErrNotAcquired", key, err)
	}
	if l != nil {
		t.Fatalf("TryAcquire(%q) returned a Lock with ErrNotAcquired", key)
	}
}

// acquireSoon takes key once the server has freed it (a terminated backend
// frees its locks just after it says goodbye).
func (b *testBundle) acquireSoon(t *testing.T, key string) *advisorylock.Lock {
	t.Helper()
	var l *advisorylock.Lock
	annalstest.WaitForErr(t, lossTimeout, func() error {
		var err error
		l, err = advisorylock.TryAcquire(t.Context(), b.cc, key, nil)
		return err
	})
	t.Cleanup(func() { _ = l.Release(context.Background()) })
	return l
}

// terminate ends the lock's backend from another connection.
func (b *testBundle) terminate(t *testing.T, l *advisorylock.Lock) {
	t.Helper()
	var ok bool
	if err := b.db.Pool.QueryRow(t.Context(), "SELECT pg_terminate_backend($1)", int32(l.PID())).Scan(&ok); err != nil || !ok {
		t.Fatalf("pg_terminate_backend(%d) = %v, %v", l.PID(), ok, err)
	}
}

// waitLost fails the test unless l.Lost() closes within lossTimeout.
func waitLost(t *testing.T, l *advisorylock.Lock) {
	t.Helper()
	select {
	case <-l.Lost():
	case <-time.After(lossTimeout):
		t.Fatalf("Lost() still open %v after the loss", lossTimeout)
	}
	if err := l.Err(); !errors.Is(err, advisorylock.ErrLost) || !stderrors.Is(err, advisorylock.ErrLost) {
		t.Fatalf("Err() = %v, want ErrLost", err)
	}
}

func isHeld(l *advisorylock.Lock) bool {
	select {
	case <-l.Lost():
		return false
	default:
		return l.Err() == nil
	}
}

func query[T any](ctx context.Context, l *advisorylock.Lock, sql string, args ...any) (T, error) {
	var v T
	err := l.Do(ctx, func(conn *pgx.Conn) error { return conn.QueryRow(ctx, sql, args...).Scan(&v) })
	return v, err
}

func TestKey(t *testing.T) {
	t.Parallel()

	setup := func(t *testing.T) *testBundle { return newBundle(t) }

	t.Run("GoAndSQLAgree", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		keys := []string{
			"a", "annals:orders:0", "héllo wörld ☃", `it's "quoted"`, "Robert'); DROP TABLE x;--",
			"\\x00 not a nul", "🦀🐘", strings.Repeat("long key ", 200), " leading and trailing ",
		}
		for _, key := range keys {
			var s1, s2 int32
			err := b.db.Pool.QueryRow(t.Context(),
				"SELECT ('x' || substr(md5($1), 1, 8))::bit(32)::int4, ('x' || substr(md5($1), 9, 8))::bit(32)::int4",
				key).Scan(&s1, &s2)
			if err != nil {
				t.Fatal(err)
			}
			if g1, g2 := advisorylock.Key(key); g1 != s1 || g2 != s2 {
				t.Errorf("Key(%q) = (%d, %d), SQL says (%d, %d)", key, g1, g2, s1, s2)
			}
		}
	})

	t.Run("PgLocksShowsTheKey", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		key := "keys: pg_locks"
		l := b.acquire(t, key, nil)
		k1, k2 := advisorylock.Key(key)
		var n int
		err := b.db.Pool.QueryRow(t.Context(), `
			SELECT count(*) FROM pg_locks
			 WHERE locktype = 'advisory' AND objsubid = 2 AND granted
			   AND classid = $1::int8::oid AND objid = $2::int8::oid AND pid = $3`,
			int64(uint32(k1)), int64(uint32(k2)), int32(l.PID())).Scan(&n)
		if err != nil || n != 1 {
			t.Fatalf("pg_locks rows for the lock = %d, %v; want 1", n, err)
		}
	})
}

func TestTryAcquire(t *testing.T) {
	t.Parallel()

	setup := func(t *testing.T) *testBundle { return newBundle(t) }

	t.Run("ExactlyOneWins", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		const contenders = 8
		var (
			wg      sync.WaitGroup
			won     atomic.Int32
			lost    atomic.Int32
			winners = make(chan *advisorylock.Lock, contenders)
		)
		for range contenders {
			wg.Go(func() {
				l, err := advisorylock.TryAcquire(t.Context(), b.cc, "one wins", nil)
				switch {
				case err == nil:
					won.Add(1)
					winners <- l
				case errors.Is(err, advisorylock.ErrNotAcquired):
					lost.Add(1)
				default:
					t.Errorf("TryAcquire: %v", err)
				}
			})
		}
		wg.Wait()
		close(winners)
		for l := range winners {
			t.Cleanup(func() { _ = l.Release(context.Background()) })
		}
		if won.Load() != 1 || lost.Load() != contenders-1 {
			t.Fatalf("%d won and %d got ErrNotAcquired; want 1 and %d", won.Load(), lost.Load(), contenders-1)
		}
	})

	t.Run("OtherAcquiresAfterRelease", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		l := b.acquire(t, "handover", nil)
		b.notAcquired(t, "handover")
		if err := l.Release(t.Context()); err != nil {
			t.Fatal(err)
		}
		// No waiting: Release unlocks before it returns.
		b.acquire(t, "handover", nil)
	})

	t.Run("DifferentKeysDoNotInterfere", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		a := b.acquire(t, "key a", nil)
		c := b.acquire(t, "key b", nil)
		b.notAcquired(t, "key a")
		b.notAcquired(t, "key b")
		if err := a.Release(t.Context()); err != nil {
			t.Fatal(err)
		}
		if err := c.Verify(t.Context()); err != nil {
			t.Fatalf("releasing key a disturbed key b: %v", err)
		}
		b.notAcquired(t, "key b")
	})

	t.Run("ArbitraryKeys", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		for _, key := range []string{`it's "quoted"`, "ünïcødé ☃ 🐘", "a\nnew line", "%s %d $1 ?", strings.Repeat("x", 10000)} {
			l := b.acquire(t, key, nil)
			if l.Key() != key {
				t.Errorf("Key() = %q, want %q", l.Key(), key)
			}
			if err := l.Verify(t.Context()); err != nil {
				t.Errorf("Verify(%q): %v", key, err)
			}
			b.notAcquired(t, key)
		}
	})

	t.Run("SessionSettings", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		show := func(l *advisorylock.Lock, name string) string {
			t.Helper()
			v, err := query[string](t.Context(), l, "SELECT current_setting($1)", name)
			if err != nil {
				t.Fatal(err)
			}
			return v
		}
		def := b.acquire(t, "settings: default", nil)
		custom := b.acquire(t, "settings: custom", &advisorylock.Config{
			CheckInterval:     750 * time.Millisecond,
			KeepAliveIdle:     7 * time.Second,
			KeepAliveInterval: 3 * time.Second,
			KeepAliveCount:    4,
			UserTimeout:       12500 * time.Millisecond,
		})
		off := b.acquire(t, "settings: off", &advisorylock.Config{CheckInterval: -1, UserTimeout: -1})
		for _, c := range []struct {
			l          *advisorylock.Lock
			name, want string
		}{
			{def, "client_connection_check_interval", "1s"},
			{def, "tcp_keepalives_idle", "5"},
			{def, "tcp_keepalives_interval", "2"},
			{def, "tcp_keepalives_count", "3"},
			{def, "tcp_user_timeout", "10000"},
			{custom, "client_connection_check_interval", "750ms"},
			{custom, "tcp_keepalives_idle", "7"},
			{custom, "tcp_keepalives_interval", "3"},
			{custom, "tcp_keepalives_count", "4"},
			{custom, "tcp_user_timeout", "12500"},
			{off, "client_connection_check_interval", "0"},
			{off, "tcp_user_timeout", "0"},
		} {
			if got := show(c.l, c.name); got != c.want {
				t.Errorf("%s: %s = %q, want %q", c.l.Key(), c.name, got, c.want)
			}
		}
		// The caller's config is copied, not changed.
		if _, ok := b.cc.RuntimeParams["client_connection_check_interval"]; ok {
			t.Error("TryAcquire changed the caller's RuntimeParams")
		}
	})

	t.Run("BadInput", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		for _, c := range []struct {
			name string
			cc   *pgx.ConnConfig
			key  string
			cfg  *advisorylock.Config
			want string
		}{
			{"NilConnConfig", nil, "k", nil, "connConfig is nil"},
			{"HandMadeConnConfig", &pgx.ConnConfig{}, "k", nil, "not created by pgx.ParseConfig"},
			{"EmptyKey", b.cc, "", nil, "key is empty"},
			{"FractionalKeepAlive", b.cc, "k", &advisorylock.Config{KeepAliveIdle: 1500 * time.Millisecond}, "whole number of seconds"},
			{"TinyCheckInterval", b.cc, "k", &advisorylock.Config{CheckInterval: time.Microsecond}, "resolution"},
		} {
			l, err := advisorylock.TryAcquire(t.Context(), c.cc, c.key, c.cfg)
			if err == nil || !strings.Contains(err.Error(), c.want) || l != nil {
				t.Errorf("%s: TryAcquire = %v, %v; want an error containing %q", c.name, l, err, c.want)
			}
		}
		// Nothing was taken.
		b.acquire(t, "k", nil)
	})

	t.Run("CancelledContext", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		if l, err := advisorylock.TryAcquire(ctx, b.cc, "cancelled", nil); !errors.Is(err, context.Canceled) || l != nil {
			t.Fatalf("TryAcquire with a cancelled context = %v, %v", l, err)
		}
		b.acquire(t, "cancelled", nil)
	})

	t.Run("UnreachableServer", func(t *testing.T) {
		t.Parallel()
		cc, err := pgx.ParseConfig("postgres://postgres@127.0.0.1:1/postgres?sslmode=disable&connect_timeout=5")
		if err != nil {
			t.Fatal(err)
		}
		if l, err := advisorylock.TryAcquire(t.Context(), cc, "k", nil); err == nil || l != nil ||
			!strings.Contains(err.Error(), "connect") {
			t.Fatalf("TryAcquire on a closed port = %v, %v", l, err)
		}
	})
}

func TestLoss(t *testing.T) {
	t.Parallel()

	setup := func(t *testing.T) *testBundle { return newBundle(t) }

	t.Run("TerminatedWhileIdle", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		l := b.acquire(t, "terminated idle", nil)
		if !isHeld(l) {
			t.Fatal("a fresh lock is not held")
		}
		start := time.Now()
		b.terminate(t, l)
		waitLost(t, l)
		t.Logf("loss noticed %v after pg_terminate_backend", time.Since(start))
		if err := l.Err(); !strings.Contains(err.Error(), "57P01") {
			t.Errorf("Err() = %v, want the server's reason (SQLSTATE 57P01)", err)
		}
		if err := l.Do(t.Context(), func(*pgx.Conn) error { t.Error("fn ran on a lost lock"); return nil }); !errors.Is(err, advisorylock.ErrLost) {
			t.Errorf("Do after loss = %v, want ErrLost", err)
		}
		if err := l.Verify(t.Context()); !errors.Is(err, advisorylock.ErrLost) {
			t.Errorf("Verify after loss = %v, want ErrLost", err)
		}
		b.acquireSoon(t, "terminated idle")
	})

	t.Run("TerminatedDuringDo", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		l := b.acquire(t, "terminated busy", nil)
		doErr := make(chan error, 1)
		go func() {
			doErr <- l.Do(t.Context(), func(conn *pgx.Conn) error {
				_, err := conn.Exec(t.Context(), "SELECT pg_sleep(5)")
				return err
			})
		}()
		annalstest.WaitFor(t, 5*time.Second, func() bool {
			var n int
			err := b.db.Pool.QueryRow(t.Context(),
				"SELECT count(*) FROM pg_stat_activity WHERE pid = $1 AND state = 'active' AND query LIKE '%pg_sleep%'",
				int32(l.PID())).Scan(&n)
			return err == nil && n == 1
		})
		start := time.Now()
		b.terminate(t, l)
		select {
		case err := <-doErr:
			if !errors.Is(err, advisorylock.ErrLost) {
				t.Errorf("Do = %v, want ErrLost", err)
			}
			t.Logf("Do returned %v after pg_terminate_backend: %v", time.Since(start), err)
		case <-time.After(lossTimeout):
			t.Fatalf("Do still running %v after its backend was terminated", lossTimeout)
		}
		waitLost(t, l)
		b.acquireSoon(t, "terminated busy")
	})

	t.Run("UnlockedBehindItsBack", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		l := b.acquire(t, "unlocked", nil)
		if err := l.Verify(t.Context()); err != nil {
			t.Fatalf("Verify on a held lock: %v", err)
		}
		if err := l.Do(t.Context(), func(conn *pgx.Conn) error {
			_, err := conn.Exec(t.Context(), "SELECT pg_advisory_unlock_all()")
			return err
		}); err != nil {
			t.Fatal(err)
		}
		if err := l.Verify(t.Context()); !errors.Is(err, advisorylock.ErrLost) {
			t.Fatalf("Verify after pg_advisory_unlock_all = %v, want ErrLost", err)
		}
		waitLost(t, l)
		b.acquire(t, "unlocked", nil)
	})

	t.Run("NoticedByRelease", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		l := b.acquire(t, "unlocked, then released", nil)
		if err := l.Do(t.Context(), func(conn *pgx.Conn) error {
			_, err := conn.Exec(t.Context(), "SELECT pg_advisory_unlock_all()")
			return err
		}); err != nil {
			t.Fatal(err)
		}
		if err := l.Release(t.Context()); !errors.Is(err, advisorylock.ErrLost) {
			t.Fatalf("Release of a lock unlocked behind its back = %v, want ErrLost", err)
		}
		if err := l.Err(); !errors.Is(err, advisorylock.ErrLost) {
			t.Fatalf("Err() = %v, want ErrLost", err)
		}
	})

	t.Run("ConnectionClosedByFn", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		l := b.acquire(t, "closed by fn", nil)
		err := l.Do(t.Context(), func(conn *pgx.Conn) error { return conn.Close(t.Context()) })
		if !errors.Is(err, advisorylock.ErrLost) {
			t.Fatalf("Do that closed the connection = %v, want ErrLost", err)
		}
		waitLost(t, l)
		b.acquireSoon(t, "closed by fn")
	})

	t.Run("ReleaseAfterLoss", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		l := b.acquire(t, "release after loss", nil)
		b.terminate(t, l)
		waitLost(t, l)
		for i := range 2 {
			if err := l.Release(t.Context()); err != nil {
				t.Errorf("Release #%d after loss = %v, want nil", i+1, err)
			}
		}
		if err := l.Err(); !errors.Is(err, advisorylock.ErrLost) || errors.Is(err, advisorylock.ErrReleased) {
			t.Errorf("Err() after loss and Release = %v, want ErrLost", err)
		}
		annalstest.WaitFor(t, lossTimeout, func() bool { return advisorylock.Watchers(l) == 0 })
	})
}

func TestDo(t *testing.T) {
	t.Parallel()

	setup := func(t *testing.T) *testBundle { return newBundle(t) }

	t.Run("RunsOnTheLockConnection", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		l := b.acquire(t, "do: conn", nil)
		pid, err := query[int32](t.Context(), l, "SELECT pg_backend_pid()")
		if err != nil || uint32(pid) != l.PID() {
			t.Fatalf("pg_backend_pid() in Do = %d, %v; want PID() %d", pid, err, l.PID())
		}
		err = l.Do(t.Context(), func(conn *pgx.Conn) error {
			return pgx.BeginFunc(t.Context(), conn, func(tx pgx.Tx) error {
				_, err := tx.Exec(t.Context(), "CREATE TABLE fenced (v int); INSERT INTO fenced VALUES (42)")
				return err
			})
		})
		if err != nil {
			t.Fatal(err)
		}
		var v int
		if err := b.db.Pool.QueryRow(t.Context(), "SELECT v FROM fenced").Scan(&v); err != nil || v != 42 {
			t.Fatalf("the transaction in Do did not commit: %d, %v", v, err)
		}
	})

	t.Run("FnErrorKeepsTheLock", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		l := b.acquire(t, "do: fn error", nil)
		boom := errors.New("boom")
		if err := l.Do(t.Context(), func(*pgx.Conn) error { return boom }); !errors.Is(err, boom) {
			t.Fatalf("Do = %v, want fn's error", err)
		}
		_, err := query[int](t.Context(), l, "SELECT 1/0")
		if err == nil || errors.Is(err, advisorylock.ErrLost) {
			t.Fatalf("Do with a failing statement = %v, want the server's error and no loss", err)
		}
		if err := l.Verify(t.Context()); err != nil {
			t.Fatalf("Verify: %v", err)
		}
	})

	// Each Do stops the watcher by cutting its read with a deadline; the
	// connection must come out of that usable, many times over.
	t.Run("ManySequentialCallsBetweenWatches", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		l := b.acquire(t, "do: sequential", nil)
		const calls = 200
		for i := range calls {
			// Let the watcher block in its read: wait until it runs, then
			// give it a round trip on another connection.
			annalstest.WaitFor(t, lossTimeout, func() bool { return advisorylock.Watchers(l) == 1 })
			if _, err := b.db.Pool.Exec(t.Context(), "SELECT 1"); err != nil {
				t.Fatal(err)
			}
			got, err := query[int](t.Context(), l, "SELECT $1::int + 1", i)
			if err != nil || got != i+1 {
				t.Fatalf("Do #%d = %d, %v; want %d", i, got, err, i+1)
			}
		}
		cut := advisorylock.WatcherCancels(l)
		t.Logf("%d of %d Do calls cut a blocked watcher read", cut, calls)
		if cut < calls/2 {
			t.Errorf("only %d of %d Do calls cut a blocked watcher read; the test does not test what it should", cut, calls)
		}
		if err := l.Verify(t.Context()); err != nil {
			t.Fatal(err)
		}
	})

	// The same with notifications arriving at the watcher, large enough to
	// span several reads, so that reads are cut in the middle of messages.
	// Every notification must arrive intact.
	t.Run("ManySequentialCallsWithNotifications", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		l := b.acquire(t, "do: notifications", nil)
		if err := l.Do(t.Context(), func(conn *pgx.Conn) error {
			_, err := conn.Exec(t.Context(), "LISTEN advisorylock_test")
			return err
		}); err != nil {
			t.Fatal(err)
		}
		const calls, burst = 200, 10
		received := 0
		drain := func(conn *pgx.Conn) error {
			for {
				wctx, cancel := context.WithTimeout(t.Context(), time.Millisecond)
				n, err := conn.WaitForNotification(wctx)
				cancel()
				if err != nil {
					if conn.IsClosed() {
						return err
					}
					return nil // nothing more buffered or arriving
				}
				var i, g, size int
				if _, err := fmt.Sscanf(n.Payload, "%d:%d:%d:", &i, &g, &size); err != nil {
					return errors.Wrapf(err, "payload %.40q", n.Payload)
				}
				if want := fmt.Sprintf("%d:%d:%d:%s", i, g, size, strings.Repeat("x", size)); n.Payload != want {
					return errors.Newf("payload %.40q… of %d bytes is damaged", n.Payload, len(n.Payload))
				}
				received++
			}
		}
		for i := range calls {
			if _, err := b.db.Pool.Exec(t.Context(), `
				SELECT pg_notify('advisorylock_test', format('%s:%s:%s:%s', $1::int, g, $2::int, repeat('x', $2::int)))
				  FROM generate_series(1, $3::int) g`, i, 100+i*39, burst); err != nil {
				t.Fatal(err)
			}
			err := l.Do(t.Context(), func(conn *pgx.Conn) error {
				var got int
				if err := conn.QueryRow(t.Context(), "SELECT $1::int * 2", i).Scan(&got); err != nil {
					return err
				}
				if got != 2*i {
					return errors.Newf("got %d, want %d", got, 2*i)
				}
				return drain(conn)
			})
			if err != nil {
				t.Fatalf("Do #%d: %v", i, err)
			}
		}
		annalstest.WaitForErr(t, 5*time.Second, func() error {
			if err := l.Do(t.Context(), drain); err != nil {
				t.Fatal(err)
			}
			if received != calls*burst {
				return errors.Newf("%d of %d notifications received", received, calls*burst)
			}
			return nil
		})
		t.Logf("%d notifications received intact; %d watcher reads cut", received, advisorylock.WatcherCancels(l))
		if err := l.Verify(t.Context()); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("ConcurrentCallsTakeTurns", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		l := b.acquire(t, "do: concurrent", nil)
		const goroutines, each = 8, 25
		var (
			inside, maxInside, done atomic.Int32
			wg                      sync.WaitGroup
		)
		for g := range goroutines {
			wg.Go(func() {
				for i := range each {
					err := l.Do(t.Context(), func(conn *pgx.Conn) error {
						n := inside.Add(1)
						defer inside.Add(-1)
						if n > maxInside.Load() {
							maxInside.Store(n)
						}
						var got string
						want := fmt.Sprint(g, "-", i)
						if err := conn.QueryRow(t.Context(), "SELECT $1::text", want).Scan(&got); err != nil {
							return err
						}
						if got != want {
							return errors.Newf("got %q, want %q", got, want)
						}
						return nil
					})
					if err != nil {
						t.Errorf("goroutine %d, Do #%d: %v", g, i, err)
						return
					}
					done.Add(1)
				}
			})
		}
		wg.Wait()
		if done.Load() != goroutines*each || maxInside.Load() != 1 {
			t.Fatalf("%d of %d Do calls succeeded, at most %d at once; want all and 1",
				done.Load(), goroutines*each, maxInside.Load())
		}
		if err := l.Verify(t.Context()); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("OpenTransactionIsRolledBack", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		l := b.acquire(t, "do: open tx", nil)
		err := l.Do(t.Context(), func(conn *pgx.Conn) error {
			_, err := conn.Exec(t.Context(), "BEGIN; CREATE TABLE never (v int)")
			return err
		})
		if err == nil || !strings.Contains(err.Error(), "transaction open") {
			t.Fatalf("Do that left a transaction open = %v, want an error", err)
		}
		err = l.Do(t.Context(), func(conn *pgx.Conn) error {
			if s := conn.PgConn().TxStatus(); s != 'I' {
				return errors.Newf("transaction status %q, want idle", s)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		var exists bool
		if err := b.db.Pool.QueryRow(t.Context(), "SELECT to_regclass('never') IS NOT NULL").Scan(&exists); err != nil || exists {
			t.Fatalf("the open transaction was not rolled back: %v, %v", exists, err)
		}
		if err := l.Verify(t.Context()); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("ContextEndsWhileWaitingForTurn", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		l := b.acquire(t, "do: wait", nil)
		entered, leave := make(chan struct{}), make(chan struct{})
		first := make(chan error, 1)
		go func() {
			first <- l.Do(t.Context(), func(*pgx.Conn) error { close(entered); <-leave; return nil })
		}()
		<-entered
		ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
		defer cancel()
		if err := l.Do(ctx, func(*pgx.Conn) error { t.Error("fn ran during another Do"); return nil }); !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Do while another runs, with a short context = %v, want DeadlineExceeded", err)
		}
		close(leave)
		if err := <-first; err != nil {
			t.Fatal(err)
		}
		if err := l.Verify(t.Context()); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("CancelRequestHandlerKeepsTheLock", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.cc.BuildContextWatcherHandler = func(pc *pgconn.PgConn) ctxwatch.Handler {
			return &pgconn.CancelRequestContextWatcherHandler{Conn: pc, DeadlineDelay: 5 * time.Second}
		}
		l := b.acquire(t, "do: cancel request", nil)
		// The context ends once the statement runs (not at a deadline,
		// which a loaded machine can pass before Do sends it).
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		go func() {
			defer cancel()
			deadline := time.Now().Add(30 * time.Second)
			for time.Now().Before(deadline) && ctx.Err() == nil {
				// A failed look (a loaded server refusing a connection) is
				// looked again: cancelling then would end the context before
				// Do sent its statement.
				// Sleeping, not only parsed: the statement shows as active
				// while pgx prepares it too, and a context ended then ends
				// it before its execution is sent ("context already done").
				var running bool
				if err := b.db.Pool.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_stat_activity
					WHERE datname = current_database() AND query = 'SELECT pg_sleep(5)::text'
					  AND state = 'active' AND wait_event = 'PgSleep')`).Scan(&running); err == nil && running {
					return
				}
				time.Sleep(5 * time.Millisecond)
			}
		}()
		_, err := query[string](ctx, l, "SELECT pg_sleep(5)::text")
		if pgErr := (*pgconn.PgError)(nil); !errors.As(err, &pgErr) || pgErr.Code != "57014" {
			t.Fatalf("Do cancelled by its context = %v, want query_canceled (57014)", err)
		}
		// The watcher's stops do not go through the cancel-request handler:
		// if they did, each Do would wait DeadlineDelay for the watcher, and
		// a late cancel request could hit one of these statements.
		for i := range 50 {
			if got, err := query[int](t.Context(), l, "SELECT $1::int", i); err != nil || got != i {
				t.Fatalf("Do #%d after a cancelled statement = %d, %v", i, got, err)
			}
		}
		if err := l.Verify(t.Context()); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("NilFn", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		l := b.acquire(t, "do: nil", nil)
		if err := l.Do(t.Context(), nil); err == nil || !strings.Contains(err.Error(), "nil fn") {
			t.Fatalf("Do(nil) = %v", err)
		}
	})
}

func TestRelease(t *testing.T) {
	t.Parallel()

	setup := func(t *testing.T) *testBundle { return newBundle(t) }

	t.Run("Twice", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		l := b.acquire(t, "release twice", nil)
		for i := range 2 {
			if err := l.Release(t.Context()); err != nil {
				t.Fatalf("Release #%d = %v", i+1, err)
			}
		}
		select {
		case <-l.Lost():
		default:
			t.Error("Lost() is open after Release")
		}
		if err := l.Err(); !errors.Is(err, advisorylock.ErrReleased) || errors.Is(err, advisorylock.ErrLost) {
			t.Errorf("Err() after Release = %v, want ErrReleased", err)
		}
		if err := l.Do(t.Context(), func(*pgx.Conn) error { t.Error("fn ran after Release"); return nil }); !errors.Is(err, advisorylock.ErrReleased) {
			t.Errorf("Do after Release = %v, want ErrReleased", err)
		}
		if err := l.Verify(t.Context()); !errors.Is(err, advisorylock.ErrReleased) {
			t.Errorf("Verify after Release = %v, want ErrReleased", err)
		}
		if n := advisorylock.Watchers(l); n != 0 {
			t.Errorf("%d watchers running after Release", n)
		}
		var n int
		if err := b.db.Pool.QueryRow(t.Context(), "SELECT count(*) FROM pg_stat_activity WHERE pid = $1", int32(l.PID())).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n != 0 {
			// Close sends Terminate without waiting; the backend may take a moment.
			annalstest.WaitFor(t, lossTimeout, func() bool {
				err := b.db.Pool.QueryRow(t.Context(), "SELECT count(*) FROM pg_stat_activity WHERE pid = $1", int32(l.PID())).Scan(&n)
				return err == nil && n == 0
			})
		}
	})

	t.Run("WaitsForDo", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		l := b.acquire(t, "release waits", nil)
		entered, leave := make(chan struct{}), make(chan struct{})
		var fnDone atomic.Bool
		go func() {
			_ = l.Do(t.Context(), func(*pgx.Conn) error { close(entered); <-leave; fnDone.Store(true); return nil })
		}()
		<-entered
		released := make(chan error, 1)
		go func() { released <- l.Release(t.Context()) }()
		close(leave)
		if err := <-released; err != nil {
			t.Fatal(err)
		}
		if !fnDone.Load() {
			t.Fatal("Release returned while fn was running")
		}
		b.acquire(t, "release waits", nil)
	})

	t.Run("ContextEndsDuringDo", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		l := b.acquire(t, "release cuts do", nil)
		doErr := make(chan error, 1)
		entered := make(chan struct{})
		go func() {
			doErr <- l.Do(t.Context(), func(conn *pgx.Conn) error {
				close(entered)
				_, err := conn.Exec(t.Context(), "SELECT pg_sleep(5)")
				return err
			})
		}()
		<-entered
		ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
		defer cancel()
		if err := l.Release(ctx); !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Release while a Do runs past ctx = %v, want DeadlineExceeded", err)
		}
		select {
		case err := <-doErr:
			if err == nil {
				t.Error("the Do cut short by Release returned nil")
			}
		case <-time.After(lossTimeout):
			t.Fatal("the Do was not cut short by Release")
		}
		if err := l.Err(); !errors.Is(err, advisorylock.ErrReleased) {
			t.Errorf("Err() = %v, want ErrReleased", err)
		}
		if err := l.Release(t.Context()); err != nil {
			t.Errorf("second Release = %v", err)
		}
		annalstest.WaitFor(t, lossTimeout, func() bool { return advisorylock.Watchers(l) == 0 })
		b.acquireSoon(t, "release cuts do")
	})
}

// TestNoGoroutineLeak is not parallel: it counts every goroutine of the test
// binary, which only holds still while no other test runs.
func TestNoGoroutineLeak(t *testing.T) {
	b := newBundle(t)
	ctx := t.Context()
	if _, err := b.db.Pool.Exec(ctx, "SELECT 1"); err != nil {
		t.Fatal(err)
	}
	before := runtime.NumGoroutine()

	for i := range 3 {
		key := fmt.Sprint("leak ", i)
		released, err := advisorylock.TryAcquire(ctx, b.cc, key, nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := query[int](ctx, released, "SELECT 1"); err != nil {
			t.Fatal(err)
		}
		if _, err := advisorylock.TryAcquire(ctx, b.cc, key, nil); !errors.Is(err, advisorylock.ErrNotAcquired) {
			t.Fatalf("second TryAcquire = %v", err)
		}
		if err := released.Release(ctx); err != nil {
			t.Fatal(err)
		}

		lost, err := advisorylock.TryAcquire(ctx, b.cc, key, nil)
		if err != nil {
			t.Fatal(err)
		}
		b.terminate(t, lost)
		waitLost(t, lost)
		if err := lost.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}

	annalstest.WaitFor(t, 20*time.Second, func() bool { return runtime.NumGoroutine() <= before })
}
