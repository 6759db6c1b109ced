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

// The gate a cut-over holds over the live generation's leaders on its pool:
// hold waits for the batch in flight, the next batch waits for the release,
// a wait in line ends with its context, and a batch that does not end in
// time does not keep the cut-over waiting.
func TestLeaderGate(t *testing.T) {
	ctx := t.Context()
	lease := &catchup.Lease{} // no lock: Stopping and Lost never close
	g := &leaderGate{}

	if ok, err := g.enter(ctx, lease); !ok || err != nil {
		t.Fatalf("enter an open gate: %v %v", ok, err)
	}
	type held struct {
		release func()
		drained bool
	}
	holding := make(chan held, 1)
	go func() {
		release, drained := g.hold(ctx, time.Minute)
		holding <- held{release, drained}
	}()
	// The next batch waits in line once the gate is held.
	entered := make(chan bool, 1)
	waitHeld(t, g)
	go func() {
		ok, err := g.enter(ctx, lease)
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
	g.leave() // the batch in flight ends
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
	release, drained := g.hold(ctx, 10*time.Millisecond)
	if drained {
		t.Fatal("hold says drained with a batch in flight")
	}
	cctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		ok, err := g.enter(cctx, lease)
		if ok {
			err = context.DeadlineExceeded // anything but nil: it must not enter
		}
		done <- err
	}()
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("a wait in line whose context ended: %v, want context.Canceled", err)
	}
	g.leave()
	release()
	if ok, err := g.enter(ctx, lease); !ok || err != nil {
		t.Fatalf("enter the gate opened again: %v %v", ok, err)
	}
	g.leave()
	if release, drained := g.hold(ctx, time.Minute); !drained {
		t.Fatal("hold of an idle gate waited")
	} else {
		release()
	}
}

// waitHeld waits until g is held.
func waitHeld(t *testing.T, g *leaderGate) {
	t.Helper()
	annalstest.WaitFor(t, 10*time.Second, func() bool {
		g.mu.Lock()
		defer g.mu.Unlock()
		return g.held > 0
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
	if r1.leaderGate("x#g1") != r2.leaderGate("x#g1") {
		t.Error("two Runners on one pool have different gates for a generation")
	}
	if r1.leaderGate("x#g1") == r3.leaderGate("x#g1") {
		t.Error("Runners on different pools share a gate")
	}
	if r1.leaderGate("x#g1") == r1.leaderGate("x#g2") {
		t.Error("two generations share a gate")
	}
}
