package advisorylock_test

// A holder that stops running while its connections stay up (SIGSTOP, a
// paused container, a debugger) used to keep its locks for ever: the
// kernel answers TCP keepalives for it, and the server keeps an idle
// session. Config.FreezeTimeout sets idle_session_timeout on every lock
// session, and a live holder pings its idle session, so only a frozen one
// is evicted.

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/advisorylock"
	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/internal/childproc"
)

// freezeChildEnv holds a freezeChild's configuration (JSON). When it is
// set, TestMain runs the child instead of the tests.
const freezeChildEnv = "ANNALS_ADVISORYLOCK_FREEZE_CHILD"

// freezeChild is what a child holding locks is told: it takes Lock with
// TryAcquire and Taken on a Standby that goes on waiting (as a runner's
// lock session does), with FreezeTimeout.
type freezeChild struct {
	URL           string        `json:"url"`
	Lock          string        `json:"lock"`
	Taken         string        `json:"taken"`
	FreezeTimeout time.Duration `json:"freeze_timeout"`
}

// Lines the child prints.
const (
	childReady       = "child: holding"
	childLockLost    = "child: lock lost:"
	childStandbyLost = "child: standby session lost:"
)

// runFreezeChild is the child's main. It holds its locks until it finds
// them lost (a resumed process whose session the server ended), says so,
// and exits; or until its parent goes away.
func runFreezeChild(raw string) int {
	var spec freezeChild
	if err := json.Unmarshal([]byte(raw), &spec); err != nil {
		fmt.Fprintf(os.Stderr, "child: bad %s: %v\n", freezeChildEnv, err)
		return 2
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, nil))
	ctx, stop := childproc.Context(logger)
	defer stop()
	cc, err := pgx.ParseConfig(spec.URL)
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 1
	}
	cfg := &advisorylock.Config{FreezeTimeout: spec.FreezeTimeout, Logger: logger}
	lock, err := advisorylock.TryAcquire(ctx, cc, spec.Lock, cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "child: TryAcquire:", err)
		return 1
	}
	sb, err := advisorylock.NewStandby(ctx, cc, cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "child: NewStandby:", err)
		return 1
	}
	if won, err := sb.Take(ctx, []string{spec.Taken}); err != nil || len(won) != 1 {
		fmt.Fprintln(os.Stderr, "child: Take:", won, err)
		return 1
	}
	fmt.Printf("%s lock pid %d, standby pid %d\n", childReady, lock.PID(), sb.PID())
	standbyLost := make(chan struct{})
	go func() {
		defer close(standbyLost)
		for ctx.Err() == nil {
			if _, err := sb.Wait(ctx, 50*time.Millisecond); err != nil {
				fmt.Println(childStandbyLost, err)
				return
			}
		}
	}()
	select {
	case <-lock.Lost():
		fmt.Println(childLockLost, lock.Err())
	case <-ctx.Done():
		return 0
	}
	select {
	case <-standbyLost:
	case <-ctx.Done():
	}
	return 0
}

// A child process holds a lock (TryAcquire) and a lock on a Standby that
// goes on waiting. Stopped with SIGSTOP, its sessions stay up; the server
// ends them FreezeTimeout after their last statement, and a standby here
// takes both keys. Resumed with SIGCONT, the child finds both lost.
// Before FreezeTimeout, the stopped child kept its locks for ever.
func TestFrozenHolderIsEvicted(t *testing.T) {
	t.Parallel()
	const freeze = time.Second
	b := newBundle(t)
	ctx := t.Context()
	spec, err := json.Marshal(freezeChild{URL: b.db.URL, Lock: "frozen:lock", Taken: "frozen:taken", FreezeTimeout: freeze})
	if err != nil {
		t.Fatal(err)
	}
	c := childproc.Start(t, "frozen", freezeChildEnv+"="+string(spec))
	annalstest.WaitFor(t, 20*time.Second, func() bool { return strings.Contains(c.Log(), childReady) || !c.Alive() })
	if !strings.Contains(c.Log(), childReady) {
		t.Fatalf("the child did not take its locks; it is %s", c.State())
	}
	keys := []string{"frozen:lock", "frozen:taken"}
	sb := b.newStandby(t, &advisorylock.Config{FreezeTimeout: freeze})
	if won, err := sb.Take(ctx, keys); err != nil || len(won) != 0 {
		t.Fatalf("Take of the child's keys while it runs = %v, %v; want none", won, err)
	}

	stopped, resume := c.Freeze()
	defer resume()

	// The standby here takes each key once the server has ended the
	// frozen session holding it.
	took := map[string]time.Duration{}
	annalstest.WaitFor(t, freeze+10*time.Second, func() bool {
		var want []string
		for _, k := range keys {
			if _, ok := took[k]; !ok {
				want = append(want, k)
			}
		}
		won, err := sb.Take(ctx, want)
		if err != nil {
			t.Fatalf("Take: %+v", err)
		}
		for _, i := range won {
			took[want[i]] = time.Since(stopped)
		}
		return len(took) == len(keys)
	})
	for _, k := range keys {
		t.Logf("%s taken %v after SIGSTOP of its holder (FreezeTimeout %v)", k, took[k].Round(time.Millisecond), freeze)
		// The session was idle for at most a third of the timeout when it
		// stopped: the server ended it for its idleness, not before.
		if took[k] < freeze*2/3-50*time.Millisecond {
			t.Errorf("%s was free %v after SIGSTOP, before its session can have idled for FreezeTimeout %v", k, took[k], freeze)
		}
	}

	// Resumed, the child finds its lock lost and its standby session gone.
	resume()
	annalstest.WaitFor(t, 10*time.Second, func() bool {
		return strings.Contains(c.Log(), childLockLost) && strings.Contains(c.Log(), childStandbyLost)
	})
	for line := range strings.Lines(c.Log()) {
		if strings.HasPrefix(line, childLockLost) && !strings.Contains(line, advisorylock.ErrLost.Error()) {
			t.Errorf("the resumed child's lock: %s; want ErrLost", strings.TrimSpace(line))
		}
	}
	for _, k := range keys {
		if pid := b.holderPID(t, k); pid != sb.PID() {
			t.Errorf("%s is held by backend %d after the child resumed, want this standby's %d", k, pid, sb.PID())
		}
	}
}

// A live holder that has nothing to do keeps its locks however long it
// idles: the Lock's watcher and a Standby's Wait ping the session every
// third of FreezeTimeout, and the server never finds it idle for that long.
func TestIdleHolderKeepsItsLocks(t *testing.T) {
	t.Parallel()
	// Long enough that a ping (every third of it) is not late under make
	// test's load on 2 cores: a stall of two thirds of it would lose the
	// lock.
	const freeze = time.Second
	b := newBundle(t)
	ctx := t.Context()
	cfg := &advisorylock.Config{FreezeTimeout: freeze}
	l := b.acquire(t, "idle:lock", cfg)
	sb := b.newStandby(t, cfg)
	if won, err := sb.Take(ctx, []string{"idle:taken"}); err != nil || len(won) != 1 {
		t.Fatalf("Take = %v, %v", won, err)
	}
	pid := sb.PID()

	// One long Wait (it pings within), then many short ones (the pings
	// come due across them), each over five times the timeout, while the
	// Lock sits idle.
	if _, err := sb.Wait(ctx, 5*freeze); err != nil {
		t.Fatalf("a Wait of 5 × FreezeTimeout: %+v", err)
	}
	for end := time.Now().Add(5 * freeze); time.Now().Before(end); {
		if _, err := sb.Wait(ctx, 20*time.Millisecond); err != nil {
			t.Fatalf("short Waits: %+v", err)
		}
	}
	select {
	case <-l.Lost():
		t.Fatalf("the idle Lock was lost: %v", l.Err())
	default:
	}
	if err := l.Verify(ctx); err != nil {
		t.Fatalf("Verify after idling 10 × FreezeTimeout: %+v", err)
	}
	if got := b.holderPID(t, "idle:taken"); got != pid {
		t.Fatalf("the standby's lock is held by %d, want its session %d", got, pid)
	}
	if won, err := sb.Take(ctx, []string{"idle:more"}); err != nil || len(won) != 1 {
		t.Fatalf("Take on the standby after idling = %v, %v", won, err)
	}
	// The timeout is set on both sessions.
	if got, err := query[string](ctx, l, `SHOW idle_session_timeout`); err != nil || got != "1s" {
		t.Fatalf("the Lock's idle_session_timeout = %q, %v; want 1s", got, err)
	}
	var got string
	if err := sb.Do(ctx, func(conn *pgx.Conn) error {
		return conn.QueryRow(ctx, `SHOW idle_session_timeout`).Scan(&got)
	}); err != nil || got != "1s" {
		t.Fatalf("the standby's idle_session_timeout = %q, %v; want 1s", got, err)
	}
}

// The pings take turns with Do, Verify and Wait's interrupts without
// harming the connection: Do calls at random moments over many ping
// intervals all succeed, as do Waits interrupted at random, and the locks
// stay held.
func TestPingsTakeTurns(t *testing.T) {
	t.Parallel()
	// A ping every ~333 ms: not late under make test's load on 2 cores
	// (100 ms, a ping every 33 ms, lost the lock there once).
	const freeze = time.Second
	b := newBundle(t)
	ctx := t.Context()
	cfg := &advisorylock.Config{FreezeTimeout: freeze}
	l := b.acquire(t, "turns:lock", cfg)
	sb := b.newStandby(t, cfg)
	if won, err := sb.Take(ctx, []string{"turns:taken"}); err != nil || len(won) != 1 {
		t.Fatalf("Take = %v, %v", won, err)
	}
	var wg sync.WaitGroup
	end := time.Now().Add(8 * freeze)
	wg.Go(func() {
		for n := 0; time.Now().Before(end); n++ {
			if n%2 == 0 {
				if got, err := query[int](ctx, l, `SELECT $1::int`, n); err != nil || got != n {
					t.Errorf("Do %d = %d, %v", n, got, err)
					return
				}
			} else if err := l.Verify(ctx); err != nil {
				t.Errorf("Verify %d: %v", n, err)
				return
			}
			// Land the next call anywhere in a ping interval.
			idle := time.NewTimer(time.Duration(rand.IntN(int(freeze / 2))))
			select {
			case <-idle.C:
			case <-l.Lost():
				idle.Stop()
				t.Errorf("lost: %v", l.Err())
				return
			}
		}
	})
	interrupts := make(chan struct{})
	wg.Go(func() {
		defer close(interrupts)
		for time.Now().Before(end) {
			sb.Interrupt()
			idle := time.NewTimer(time.Duration(rand.IntN(int(freeze))))
			<-idle.C
		}
	})
	waits := 0
	for done := false; !done; waits++ {
		select {
		case <-interrupts:
			done = true
		default:
		}
		if _, err := sb.Wait(ctx, freeze); err != nil {
			t.Fatalf("Wait %d: %+v", waits, err)
		}
	}
	wg.Wait()
	if err := l.Verify(ctx); err != nil {
		t.Fatalf("Verify: %+v", err)
	}
	if got := b.holderPID(t, "turns:taken"); got != sb.PID() {
		t.Fatalf("the standby's lock is held by %d, want its session %d", got, sb.PID())
	}
	t.Logf("%d Waits", waits)
}

// FreezeTimeout is checked, defaults to 30s, and -1 leaves
// idle_session_timeout alone.
func TestFreezeTimeoutConfig(t *testing.T) {
	t.Parallel()
	b := newBundle(t)
	ctx := t.Context()
	for _, d := range []time.Duration{
		time.Millisecond, 999 * time.Millisecond, // below the minimum
		1500*time.Millisecond + 500*time.Microsecond, // not whole milliseconds
		1 << 31 * time.Millisecond,                   // beyond the server's int
	} {
		_, err := advisorylock.TryAcquire(ctx, b.cc, "config", &advisorylock.Config{FreezeTimeout: d})
		if err == nil || !strings.Contains(err.Error(), "FreezeTimeout") {
			t.Errorf("FreezeTimeout %v: %v; want an error naming FreezeTimeout", d, err)
		}
		_, err = advisorylock.NewStandby(ctx, b.cc, &advisorylock.Config{FreezeTimeout: d})
		if err == nil || !strings.Contains(err.Error(), "FreezeTimeout") {
			t.Errorf("NewStandby with FreezeTimeout %v: %v; want an error naming FreezeTimeout", d, err)
		}
	}
	var server string
	if err := b.db.Pool.QueryRow(ctx, `SHOW idle_session_timeout`).Scan(&server); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		cfg  *advisorylock.Config
		want string
	}{
		{nil, "30s"},
		{&advisorylock.Config{FreezeTimeout: 2 * time.Minute}, "2min"},
		{&advisorylock.Config{FreezeTimeout: -1}, server},
	} {
		l, err := advisorylock.TryAcquire(ctx, b.cc, "config", c.cfg)
		if err != nil {
			t.Fatal(err)
		}
		got, err := query[string](ctx, l, `SHOW idle_session_timeout`)
		if rerr := l.Release(ctx); err == nil {
			err = rerr
		}
		if err != nil || got != c.want {
			t.Errorf("%+v: idle_session_timeout %q, %v; want %q", c.cfg, got, err, c.want)
		}
	}
}
