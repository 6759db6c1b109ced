package catchup_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/catchup"
	"github.com/annals-dev/annals/checkpoint"
)

// idleProcessor is nopProcessor that reports each Idle call: the leader is
// about to wait for new events.
type idleProcessor struct {
	nopProcessor
	idle chan struct{} // capacity 1
}

func (p *idleProcessor) Idle(context.Context, *catchup.Lease) error {
	select {
	case p.idle <- struct{}{}:
	default:
	}
	return nil
}

// silentWaker is a Waker that listens at once and never signals: a leader
// woken by something other than NOTIFY (package walsource's Wake, which
// signals only for events of its partition) that no event wakes.
type silentWaker struct{ up chan struct{} }

func (w silentWaker) Subscribe() (<-chan struct{}, func()) { return make(chan struct{}), func() {} }
func (w silentWaker) Listening() <-chan struct{}           { return w.up }

// fenceNoticePoll is the leader's PollInterval in the fence tests: without
// the announcement it would notice a fence only after this.
const fenceNoticePoll = 30 * time.Second

// fenceNoticeBound is how soon a fenced idle leader must let go: far below
// fenceNoticePoll, and well above the few tens of milliseconds it takes,
// for a loaded machine running -race.
const fenceNoticeBound = 2 * time.Second

// startIdleLeader runs subscriber "s" on an engine of its own with a
// Listener, a PollInterval of fenceNoticePoll and, if wake is set, that
// WakeFor, waits until it leads and waits idle for new events with its
// Listener listening, and returns a channel that receives the time at which
// it stopped leading (each time it does).
func startIdleLeader(t *testing.T, db *annalstest.DB, wake catchup.WakeFor) <-chan time.Time {
	t.Helper()
	ctx := t.Context()
	pool, err := pgxpool.New(ctx, db.URL)
	if err != nil {
		t.Fatal(err)
	}
	listener, err := catchup.NewPoolListener(pool, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	lctx, stopListener := context.WithCancel(context.Background())
	listened := make(chan struct{})
	go func() { defer close(listened); _ = listener.Run(lctx) }()
	stopped := make(chan time.Time, 16)
	e, err := catchup.NewEngine(pool, listener, &catchup.Config{
		Owner: "leader", PollInterval: fenceNoticePoll, WakeFor: wake,
		OnLeadership: func(_ string, _ int, _ int64, leading bool) {
			if !leading {
				select {
				case stopped <- time.Now():
				default:
				}
			}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	p := &idleProcessor{idle: make(chan struct{}, 1)}
	rctx, stop := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- e.Run(rctx, &catchup.Subscription{Name: "s", Processor: p}) }()
	t.Cleanup(func() {
		stop()
		if err := <-ran; err != nil {
			t.Errorf("the leader's Run: %v", err)
		}
		stopListener()
		<-listened
		pool.Close()
	})
	select {
	case <-p.idle:
	case err := <-ran:
		t.Fatalf("the leader's Run returned: %v", err)
	case <-time.After(20 * time.Second):
		t.Fatal("the leader was not idle within 20 s")
	}
	select {
	case <-listener.Listening():
	case <-time.After(20 * time.Second):
		t.Fatal("the leader's Listener did not listen within 20 s")
	}
	return stopped
}

// A leader waiting idle for new events lets go as soon as it is fenced,
// not at its next poll (30 s here): TakeOver's fence, an operator's
// checkpoint move and a layout replacement announce the new epoch on the
// fence channel, and the engine's Listener passes it to the partition's
// leader, whatever wakes that leader for events (NOTIFY, or a WakeFor such
// as walsource's that no event wakes). Without the announcement, TakeOver
// timed out after 10 s and the others went unnoticed for 30 s.
func TestFencedIdleLeaderLetsGoAtOnce(t *testing.T) {
	t.Parallel()
	silent := func(context.Context, *catchup.Subscription, *catchup.Lease) (catchup.Waker, func()) {
		up := make(chan struct{})
		close(up)
		return silentWaker{up: up}, func() {}
	}
	takeOver := func(t *testing.T, db *annalstest.DB) {
		e, err := catchup.NewEngine(db.Pool, nil, &catchup.Config{Owner: "rebuild"})
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		lease, err := e.TakeOver(t.Context(), &catchup.Subscription{Name: "s", Processor: nopProcessor{}}, 10*time.Second)
		if err != nil {
			t.Fatalf("TakeOver of an idle leader's partition: %+v", err)
		}
		t.Logf("TakeOver took %v", time.Since(start))
		e.Release(context.WithoutCancel(t.Context()), lease)
	}
	move := func(t *testing.T, db *annalstest.DB) {
		store, err := checkpoint.New("")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := store.Move(t.Context(), db.Pool, "s", 0, 0); err != nil {
			t.Fatal(err)
		}
	}
	relayout := func(t *testing.T, db *annalstest.DB) {
		e, err := catchup.NewEngine(db.Pool, nil, &catchup.Config{Owner: "other"})
		if err != nil {
			t.Fatal(err)
		}
		// Nothing was processed: the layout is replaced, every checkpoint's
		// epoch bumped.
		if err := e.CheckLayout(t.Context(), &catchup.Subscription{Name: "s", Partitions: 2, Processor: nopProcessor{}}); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name  string
		wake  catchup.WakeFor
		fence func(*testing.T, *annalstest.DB)
	}{
		{"TakeOver", nil, takeOver},
		{"TakeOverWakeFor", silent, takeOver},
		{"CheckpointMove", silent, move},
		{"LayoutReplaced", nil, relayout},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			db := annalstest.NewDB(t, nil)
			stopped := startIdleLeader(t, db, tc.wake)
			start := time.Now()
			tc.fence(t, db)
			select {
			case at := <-stopped:
				took := at.Sub(start)
				t.Logf("the fenced leader let go after %v", took)
				if took > fenceNoticeBound {
					t.Fatalf("the fenced leader let go after %v, want at most %v (its PollInterval is %v)", took, fenceNoticeBound, fenceNoticePoll)
				}
			case <-time.After(fenceNoticePoll / 2):
				t.Fatalf("the fenced leader still leads %v after the fence (its PollInterval is %v)", fenceNoticePoll/2, fenceNoticePoll)
			}
		})
	}
}
