package advisorylock_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/advisorylock"
	"github.com/annals-dev/annals/annalstest"
)

// newStandby opens a Standby that is closed when the test ends.
func (b *testBundle) newStandby(t *testing.T, cfg *advisorylock.Config) *advisorylock.Standby {
	t.Helper()
	s, err := advisorylock.NewStandby(t.Context(), b.cc, cfg)
	if err != nil {
		t.Fatalf("NewStandby: %+v", err)
	}
	t.Cleanup(func() { _ = s.Close(context.Background()) })
	return s
}

// holderPID returns the backend holding key's lock, 0 if none.
func (b *testBundle) holderPID(t *testing.T, key string) uint32 {
	t.Helper()
	k1, k2 := advisorylock.Key(key)
	var pid uint32
	err := b.db.Pool.QueryRow(t.Context(), `
		SELECT pid FROM pg_locks
		 WHERE locktype = 'advisory' AND granted AND objsubid = 2
		   AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
		   AND classid = ($1::int4::int8 & 4294967295)::oid AND objid = ($2::int4::int8 & 4294967295)::oid`, k1, k2).Scan(&pid)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	return pid
}

func TestStandby(t *testing.T) {
	t.Parallel()

	t.Run("NoneFree", func(t *testing.T) {
		t.Parallel()
		b := newBundle(t)
		b.acquire(t, "a", nil)
		b.acquire(t, "b", nil)
		s := b.newStandby(t, nil)
		for range 3 {
			l, won, err := s.TryLock(t.Context(), []string{"a", "b"})
			if !errors.Is(err, advisorylock.ErrNotAcquired) || l != nil || won != nil {
				t.Fatalf("TryLock of held keys = %v, %v, %v; want ErrNotAcquired", l, won, err)
			}
		}
		if pid := b.holderPID(t, "a"); pid == s.PID() {
			t.Fatal("the standby's session holds a key it did not win")
		}
	})

	// The first free key becomes a Lock on the standby's own session; the
	// other free keys are given back at once.
	t.Run("WinsOnItsSession", func(t *testing.T) {
		t.Parallel()
		b := newBundle(t)
		b.acquire(t, "held", nil)
		s := b.newStandby(t, nil)
		keys := []string{"free 1", "held", "free 2", "free 3"}
		l, won, err := s.TryLock(t.Context(), keys)
		if err != nil {
			t.Fatalf("TryLock: %+v", err)
		}
		t.Cleanup(func() { _ = l.Release(context.Background()) })
		if !slices.Equal(won, []int{0, 2, 3}) {
			t.Fatalf("won %v, want [0 2 3]", won)
		}
		if l.Key() != "free 1" || l.PID() != s.PID() {
			t.Fatalf("Lock of %q on backend %d, want %q on the standby's backend %d", l.Key(), l.PID(), "free 1", s.PID())
		}
		if pid := b.holderPID(t, "free 1"); pid != s.PID() {
			t.Fatalf("pg_locks: %q held by backend %d, want %d", "free 1", pid, s.PID())
		}
		if err := l.Verify(t.Context()); err != nil {
			t.Fatalf("Verify: %v", err)
		}
		for _, k := range []string{"free 2", "free 3"} {
			if pid := b.holderPID(t, k); pid != 0 {
				t.Errorf("%q is still held (backend %d) after TryLock gave it back", k, pid)
			}
		}
		b.acquire(t, "free 2", nil)
		b.notAcquired(t, "free 1")
		if _, _, err := s.TryLock(t.Context(), []string{"x"}); err == nil || errors.Is(err, advisorylock.ErrNotAcquired) {
			t.Fatalf("TryLock on a spent standby = %v, want an error", err)
		}
		if err := s.Close(t.Context()); err != nil {
			t.Fatalf("Close of a spent standby = %v (it must leave the Lock's connection alone)", err)
		}
		// The Lock is an ordinary one: its loss is noticed, and it frees.
		b.terminate(t, l)
		waitLost(t, l)
		b.acquireSoon(t, "free 1")
	})

	t.Run("BadKeys", func(t *testing.T) {
		t.Parallel()
		b := newBundle(t)
		s := b.newStandby(t, nil)
		for _, keys := range [][]string{{"a", ""}, {"a", "b", "a"}} {
			if _, _, err := s.TryLock(t.Context(), keys); err == nil || errors.Is(err, advisorylock.ErrNotAcquired) {
				t.Errorf("TryLock(%q) = %v, want an error", keys, err)
			}
		}
	})

	// A graceful Release announces the key; a standby listening on the
	// channel wakes at once instead of at its next poll.
	t.Run("ReleaseIsAnnounced", func(t *testing.T) {
		t.Parallel()
		b := newBundle(t)
		cfg := &advisorylock.Config{ReleaseChannel: "test_locks"}
		l := b.acquire(t, "leader", cfg)
		s := b.newStandby(t, cfg)
		if _, _, err := s.TryLock(t.Context(), []string{"leader"}); !errors.Is(err, advisorylock.ErrNotAcquired) {
			t.Fatalf("TryLock = %v, want ErrNotAcquired", err)
		}
		// Nothing announced: Wait lasts its whole d, and the session lives on.
		start := time.Now()
		if announced, err := s.Wait(t.Context(), 50*time.Millisecond); announced || err != nil {
			t.Fatalf("Wait with nothing released = %v, %v", announced, err)
		}
		if d := time.Since(start); d < 50*time.Millisecond {
			t.Fatalf("Wait returned after %v, before its 50ms", d)
		}
		waited := make(chan error, 1)
		go func() {
			announced, err := s.Wait(t.Context(), time.Minute)
			if err == nil && !announced {
				err = errors.New("Wait returned without an announcement")
			}
			waited <- err
		}()
		time.Sleep(20 * time.Millisecond) // let Wait block (a notice before it would count too)
		released := time.Now()
		if err := l.Release(t.Context()); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-waited:
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("announcement arrived %v after Release began", time.Since(released))
		case <-time.After(10 * time.Second):
			t.Fatal("the standby was not woken by the release")
		}
		got, won, err := s.TryLock(t.Context(), []string{"leader"})
		if err != nil || !slices.Equal(won, []int{0}) {
			t.Fatalf("TryLock after the release = %v, %v", won, err)
		}
		// The Lock's session no longer listens: releases elsewhere do not
		// pile up on it.
		other := b.acquire(t, "other", cfg)
		if err := other.Release(t.Context()); err != nil {
			t.Fatal(err)
		}
		var listening int
		err = got.Do(t.Context(), func(conn *pgx.Conn) error {
			return conn.QueryRow(t.Context(), "SELECT count(*) FROM pg_listening_channels()").Scan(&listening)
		})
		if err != nil || listening != 0 {
			t.Fatalf("the won Lock's session listens on %d channels (%v), want 0", listening, err)
		}
		_ = got.Release(t.Context())
	})

	// Interrupt ends the Wait in progress, or the next one; so does ctx;
	// the session stays usable after each.
	t.Run("Interrupt", func(t *testing.T) {
		t.Parallel()
		b := newBundle(t)
		b.acquire(t, "held", nil)
		s := b.newStandby(t, nil)
		quick := func(what string, wait func() (bool, error)) {
			t.Helper()
			start := time.Now()
			announced, err := wait()
			if announced || err != nil {
				t.Fatalf("%s: Wait = %v, %v", what, announced, err)
			}
			if d := time.Since(start); d > 5*time.Second {
				t.Fatalf("%s: Wait returned after %v, not at once", what, d)
			}
			if _, _, err := s.TryLock(t.Context(), []string{"held"}); !errors.Is(err, advisorylock.ErrNotAcquired) {
				t.Fatalf("%s: TryLock after the Wait = %v, want ErrNotAcquired (a usable session)", what, err)
			}
		}
		s.Interrupt()
		quick("interrupted before", func() (bool, error) { return s.Wait(t.Context(), time.Minute) })
		quick("interrupted during", func() (bool, error) {
			go func() { time.Sleep(50 * time.Millisecond); s.Interrupt() }()
			return s.Wait(t.Context(), time.Minute)
		})
		quick("context ends", func() (bool, error) {
			ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
			defer cancel()
			return s.Wait(ctx, time.Minute)
		})
		// An Interrupt consumed by a Wait does not end the next one.
		start := time.Now()
		if _, err := s.Wait(t.Context(), 100*time.Millisecond); err != nil || time.Since(start) < 100*time.Millisecond {
			t.Fatalf("Wait after the interrupts = %v after %v, want nil after 100ms", err, time.Since(start))
		}
	})

	t.Run("SessionLost", func(t *testing.T) {
		t.Parallel()
		b := newBundle(t)
		s := b.newStandby(t, nil)
		var ok bool
		if err := b.db.Pool.QueryRow(t.Context(), "SELECT pg_terminate_backend($1)", int32(s.PID())).Scan(&ok); err != nil || !ok {
			t.Fatalf("pg_terminate_backend = %v, %v", ok, err)
		}
		done := make(chan error, 1)
		go func() { _, err := s.Wait(t.Context(), time.Minute); done <- err }()
		select {
		case err := <-done:
			if err == nil {
				t.Fatal("Wait on a terminated session returned nil")
			}
		case <-time.After(lossTimeout):
			t.Fatalf("Wait did not notice the terminated session within %v", lossTimeout)
		}
	})

	t.Run("ChannelTooLong", func(t *testing.T) {
		t.Parallel()
		b := newBundle(t)
		long := string(make([]byte, 64))
		if _, err := advisorylock.NewStandby(t.Context(), b.cc, &advisorylock.Config{ReleaseChannel: long}); err == nil {
			t.Fatal("NewStandby with a 64-byte channel succeeded")
		}
	})
}

func TestAcquire(t *testing.T) {
	t.Parallel()

	// A session queued in Acquire gets the lock the moment the holder dies,
	// and while it queues nobody who only tries can take the lock.
	t.Run("QueuesAheadOfTriers", func(t *testing.T) {
		t.Parallel()
		b := newBundle(t)
		holder := b.acquire(t, "queued", nil)
		got := make(chan *advisorylock.Lock, 1)
		go func() {
			l, err := advisorylock.Acquire(t.Context(), b.cc, "queued", nil)
			if err != nil {
				t.Errorf("Acquire: %+v", err)
			}
			got <- l
		}()
		annalstest.WaitFor(t, 10*time.Second, func() bool {
			var n int
			err := b.db.Pool.QueryRow(t.Context(), `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`).Scan(&n)
			return err == nil && n == 1
		})
		b.terminate(t, holder)
		var l *advisorylock.Lock
		select {
		case l = <-got:
		case <-time.After(lossTimeout):
			t.Fatalf("Acquire did not get the lock within %v of the holder's end", lossTimeout)
		}
		if l == nil {
			t.FailNow()
		}
		t.Cleanup(func() { _ = l.Release(context.Background()) })
		if pid := b.holderPID(t, "queued"); pid != l.PID() {
			t.Fatalf("held by backend %d, want the acquirer's %d", pid, l.PID())
		}
		b.notAcquired(t, "queued")
	})

	t.Run("ContextEnds", func(t *testing.T) {
		t.Parallel()
		b := newBundle(t)
		b.acquire(t, "busy", nil)
		ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
		defer cancel()
		l, err := advisorylock.Acquire(ctx, b.cc, "busy", nil)
		if l != nil || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Acquire of a held lock until ctx ends = %v, %v; want DeadlineExceeded", l, err)
		}
		// The abandoned session left the queue.
		annalstest.WaitFor(t, lossTimeout, func() bool {
			var n int
			err := b.db.Pool.QueryRow(t.Context(), `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`).Scan(&n)
			return err == nil && n == 0
		})
	})
}
