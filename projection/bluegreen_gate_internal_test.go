package projection

import (
	"context"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/catchup"
)

// newGateSet is an empty set of gates, apart from the process's.
func newGateSet() *gateSet { return &gateSet{m: map[gateKey]*leaderGate{}} }

var testGate = gateKey{schema: "annals", subscriber: "x#g1"}

// The gate a cut-over holds over the live generation's leaders on its pool:
// hold waits for the batch in flight, the next batch waits for the release,
// a wait in line ends with its context, and a batch that does not end in
// time does not keep the cut-over waiting.
func TestLeaderGate(t *testing.T) {
	ctx := t.Context()
	lease := &catchup.Lease{} // no lock: Stopping and Lost never close
	s, k := newGateSet(), testGate

	if ok, err := s.enter(ctx, k, lease); !ok || err != nil {
		t.Fatalf("enter an open gate: %v %v", ok, err)
	}
	type held struct {
		release func()
		drained bool
	}
	holding := make(chan held, 1)
	go func() {
		release, drained := s.hold(ctx, k, time.Minute)
		holding <- held{release, drained}
	}()
	// The next batch waits in line once the gate is held.
	entered := make(chan bool, 1)
	waitHeld(t, s, k)
	go func() {
		ok, err := s.enter(ctx, k, lease)
		if err != nil {
			t.Error(err)
		}
		entered <- ok
	}()
	select {
	case h := <-holding:
		t.Fatalf("hold returned (drained %v) with a batch in flight", h.drained)
	case <-entered:
		t.Fatal("a batch entered a held gate")
	default:
	}
	s.leave(k) // the batch in flight ends
	h := <-holding
	if !h.drained {
		t.Fatal("hold did not see the batch in flight end")
	}
	select {
	case <-entered:
		t.Fatal("a batch entered a held gate")
	default:
	}
	h.release()
	h.release() // a second release changes nothing
	if ok := <-entered; !ok {
		t.Fatal("the batch in line did not enter once the gate opened")
	}

	// A batch that stays in flight (a retry's wait): hold gives up waiting
	// for it after wait, and the gate is held all the same.
	release, drained := s.hold(ctx, k, 10*time.Millisecond)
	if drained {
		t.Fatal("hold says drained with a batch in flight")
	}
	cctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		ok, err := s.enter(cctx, k, lease)
		if ok {
			err = context.DeadlineExceeded // anything but nil: it must not enter
		}
		done <- err
	}()
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("a wait in line whose context ended: %v, want context.Canceled", err)
	}
	s.leave(k)
	release()
	if ok, err := s.enter(ctx, k, lease); !ok || err != nil {
		t.Fatalf("enter the gate opened again: %v %v", ok, err)
	}
	s.leave(k)
	if release, drained := s.hold(ctx, k, time.Minute); !drained {
		t.Fatal("hold of an idle gate waited")
	} else {
		release()
	}
}

// waitHeld waits until k's gate in s is held.
func waitHeld(t *testing.T, s *gateSet, k gateKey) {
	t.Helper()
	annalstest.WaitFor(t, 10*time.Second, func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		g := s.m[k]
		return g != nil && g.held > 0
	})
}

// Every Runner on a pool shares the pool's gate of a generation: the
// leaders a cut-over must keep off its pool are those on the same pool.
func TestLeaderGatePerPool(t *testing.T) {
	pool := func() *pgxpool.Pool {
		p, err := pgxpool.New(t.Context(), "postgres://nobody@127.0.0.1:1/none") // never dialled
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(p.Close)
		return p
	}
	runner := func(p *pgxpool.Pool) *Runner {
		r, err := NewRunner(p, nil)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	p, q := pool(), pool()
	r1, r2, r3 := runner(p), runner(p), runner(q)
	if r1.gateOf("x#g1") != r2.gateOf("x#g1") {
		t.Error("two Runners on one pool have different gates for a generation")
	}
	if r1.gateOf("x#g1") == r3.gateOf("x#g1") {
		t.Error("Runners on different pools share a gate")
	}
	if r1.gateOf("x#g1") == r1.gateOf("x#g2") {
		t.Error("two generations share a gate")
	}
	// A cut-over on the pool holds the leaders of the other Runner.
	s := newGateSet()
	release, _ := s.hold(t.Context(), r1.gateOf("x#g1"), time.Minute)
	cctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	if ok, _ := s.enter(cctx, r2.gateOf("x#g1"), &catchup.Lease{}); ok {
		t.Error("a leader of another Runner on the pool entered the gate a cut-over holds")
	}
	if ok, err := s.enter(t.Context(), r3.gateOf("x#g1"), &catchup.Lease{}); !ok || err != nil {
		t.Errorf("a leader on another pool was held: %v %v", ok, err)
	}
	s.leave(r3.gateOf("x#g1"))
	release()
}

// A gate is kept only while something enters or holds it: the gates of the
// generations that a process ran, or cut over from, used to stay for as
// long as their pool, one more with each generation.
func TestLeaderGateGoesWhenUnused(t *testing.T) {
	ctx := t.Context()
	s := newGateSet()
	lease := &catchup.Lease{}
	gates := func() int {
		s.mu.Lock()
		defer s.mu.Unlock()
		return len(s.m)
	}
	for gen := range 3 {
		k := gateKey{schema: "annals", subscriber: "x#g" + string(rune('1'+gen))}
		// Batches, one in flight while a cut-over holds the gate, another
		// waiting in line until its context ends, another after.
		if ok, err := s.enter(ctx, k, lease); !ok || err != nil {
			t.Fatalf("enter: %v %v", ok, err)
		}
		release, _ := s.hold(ctx, k, time.Millisecond)
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		if ok, _ := s.enter(cctx, k, lease); ok {
			t.Fatal("entered a held gate")
		}
		if n := gates(); n != 1 {
			t.Fatalf("%d gates in use, want 1", n)
		}
		s.leave(k)
		release()
		if ok, err := s.enter(ctx, k, lease); !ok || err != nil {
			t.Fatalf("enter: %v %v", ok, err)
		}
		s.leave(k)
		if n := gates(); n != 0 {
			t.Fatalf("generation %d: %d gates left after its batches and cut-over ended, want 0", gen+1, n)
		}
	}
}

// stoppingLease is a lease whose run is stopping.
type stoppingLease struct{ stopping chan struct{} }

func (l stoppingLease) Stopping() <-chan struct{} { return l.stopping }
func (l stoppingLease) Lost() <-chan struct{}     { return nil }
func (l stoppingLease) Err() error                { return nil }

// A batch waiting at a held gate when its run stops is not started, and
// says so with nil, also once the processors' context has ended too (after
// the ShutdownTimeout, both are): an error would be logged as a failed
// batch to retry.
func TestLeaderGateStoppingIsNoError(t *testing.T) {
	s, k := newGateSet(), testGate
	release, _ := s.hold(t.Context(), k, time.Minute)
	defer release()
	lease := stoppingLease{stopping: make(chan struct{})}
	close(lease.stopping)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	for range 200 {
		if ok, err := s.enter(ctx, k, lease); ok || err != nil {
			t.Fatalf("a held batch of a stopping run whose context ended: entered %v, %v; want false, nil", ok, err)
		}
	}
}
