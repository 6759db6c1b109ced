package annals_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/annals-dev/annals"
	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/projection"
	"github.com/annals-dev/annals/saga"
	"github.com/annals-dev/annals/scheduler"
)

func TestMain(m *testing.M) { annalstest.Main(m) }

type (
	clDeposited struct {
		Amount int `json:"amount"`
	}
	clOrderPlaced struct {
		OrderID string `json:"order_id"`
	}
	clDeadlinePassed struct {
		OrderID string `json:"order_id"`
	}
	clOrderExpired struct {
		OrderID string `json:"order_id"`
	}
)

// testClock moves only when told; After waits for Advance (unlike
// testkit.FakeClock), so a live dispatcher sleeps until the test moves time.
type testClock struct {
	mu      sync.Mutex
	now     time.Time
	waiters []clockWaiter
}

type clockWaiter struct {
	at time.Time
	ch chan time.Time
}

func (c *testClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }

func (c *testClock) After(d time.Duration) <-chan time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	ch := make(chan time.Time, 1)
	if d <= 0 {
		ch <- c.now
		return ch
	}
	c.waiters = append(c.waiters, clockWaiter{c.now.Add(d), ch})
	return ch
}

func (c *testClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	kept := c.waiters[:0]
	for _, w := range c.waiters {
		if w.at.After(c.now) {
			kept = append(kept, w)
			continue
		}
		w.ch <- c.now
	}
	c.waiters = kept
}

// clientBundle is a client with one handler of each kind registered.
type clientBundle struct {
	db     *annalstest.DB
	client *annals.Client
	clock  *testClock
	mu     sync.Mutex
	seen   map[string]int // observer: deliveries per event ID
}

func (b *clientBundle) observed() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.seen)
}

func setupClient(t *testing.T) *clientBundle {
	t.Helper()
	b := &clientBundle{db: annalstest.NewDB(t, nil), seen: map[string]int{},
		clock: &testClock{now: time.Date(2026, 1, 1, 9, 0, 0, 0, time.UTC)}}
	reg := eventstore.NewRegistry()
	eventstore.MustRegister[clDeposited](reg, "cl.deposited")
	eventstore.MustRegister[clOrderPlaced](reg, "cl.order_placed")
	eventstore.MustRegister[clDeadlinePassed](reg, "cl.deadline_passed")
	eventstore.MustRegister[clOrderExpired](reg, "cl.order_expired")
	c, err := annals.New(b.db.Pool, &annals.Config{Registry: reg, Clock: b.clock,
		Runner: &projection.Config{PollInterval: 50 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	b.client = c

	p := projection.New("cl.balances", reg)
	p.OnSetup(1, projection.Statements(`CREATE TABLE cl_balances (account text PRIMARY KEY, amount bigint NOT NULL)`))
	projection.On(p, func(ctx context.Context, tx pgx.Tx, e eventstore.Envelope[clDeposited]) error {
		_, err := tx.Exec(ctx, `INSERT INTO cl_balances VALUES ($1, $2)
			ON CONFLICT (account) DO UPDATE SET amount = cl_balances.amount + $2`, e.StreamID, e.Data.Amount)
		return err
	})
	if err := annals.AddProjection(c, p, nil); err != nil {
		t.Fatal(err)
	}

	o := projection.NewObserver("cl.notifier", reg)
	projection.Observe(o, func(_ context.Context, e eventstore.Envelope[clDeposited]) error {
		b.mu.Lock()
		defer b.mu.Unlock()
		b.seen[e.ID.String()]++
		return nil
	})
	if err := annals.AddObserver(c, o, &projection.Options{CheckpointEvery: 1}); err != nil {
		t.Fatal(err)
	}

	type orderState struct{ Placed time.Time }
	s := saga.New[orderState]("cl.orders", reg)
	saga.On(s, func(e eventstore.Envelope[clOrderPlaced]) string { return e.Data.OrderID },
		func(ctx context.Context, inst *saga.Instance[orderState], e eventstore.Envelope[clOrderPlaced]) error {
			inst.State.Placed = inst.Now()
			_, err := inst.ScheduleAfter(ctx, time.Hour, "order-"+inst.ID(), eventstore.NewEvent(clDeadlinePassed{OrderID: inst.ID()}))
			return err
		})
	saga.On(s, func(e eventstore.Envelope[clDeadlinePassed]) string { return e.Data.OrderID },
		func(ctx context.Context, inst *saga.Instance[orderState], e eventstore.Envelope[clDeadlinePassed]) error {
			inst.Complete()
			_, err := inst.Append(ctx, "order-"+inst.ID(), eventstore.Any, eventstore.NewEvent(clOrderExpired{OrderID: inst.ID()}))
			return err
		})
	if err := annals.AddSaga(c, s, nil); err != nil {
		t.Fatal(err)
	}
	if err := annals.AddTask(c, scheduler.Task{Name: "cl.hourly", Spec: "@every 1h", StreamID: "cl-ticks"}); err != nil {
		t.Fatal(err)
	}
	return b
}

func (b *clientBundle) total(t *testing.T) int64 {
	t.Helper()
	var n int64
	if err := b.db.Pool.QueryRow(t.Context(), `SELECT coalesce(sum(amount), 0) FROM cl_balances`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// types returns the event types of a stream, or the read error (a stream
// that does not exist yet is one).
func (b *clientBundle) types(t *testing.T, stream string) ([]string, error) {
	t.Helper()
	var out []string
	for e, err := range b.client.ReadStream(t.Context(), stream, 1) {
		if err != nil {
			return nil, err
		}
		out = append(out, e.Type)
	}
	return out, nil
}

func TestClient(t *testing.T) {
	t.Parallel()

	// Every kind of handler through one client: append, the typed
	// projection (its table made by OnSetup at Start), the observer, the
	// saga with a deadline on the client's clock, a cron task, Stop, a
	// restart with Run, and the shutdown.
	t.Run("EndToEnd", func(t *testing.T) {
		t.Parallel()
		b := setupClient(t)
		c := b.client
		ctx := t.Context()
		if err := c.Start(ctx); err != nil {
			t.Fatal(err)
		}
		if err := c.Start(ctx); err == nil {
			t.Fatal("a second Start succeeded")
		}
		if b.total(t) != 0 { // the read model exists as soon as Start returns
			t.Fatal("cl_balances not empty")
		}
		if err := annals.AddProjection(c, projection.New("cl.late", c.Registry()), nil); err == nil {
			t.Fatal("AddProjection while running succeeded")
		}
		for i, acct := range []string{"acct-a", "acct-b", "acct-a"} {
			if _, err := c.Append(ctx, acct, eventstore.Any, eventstore.NewEvent(clDeposited{Amount: 10 * (i + 1)})); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := c.Append(ctx, "order-1", eventstore.NoStream, eventstore.NewEvent(clOrderPlaced{OrderID: "1"})); err != nil {
			t.Fatal(err)
		}
		annalstest.WaitFor(t, 30*time.Second, func() bool { return b.total(t) == 60 && b.observed() == 3 })
		// The saga scheduled its deadline on the client's clock: nothing
		// fires until the clock passes it.
		annalstest.WaitForErr(t, 30*time.Second, func() error {
			timers, err := c.Scheduler().Timers(ctx, 10)
			if err != nil || len(timers) != 1 || !timers[0].DueAt.Equal(b.clock.Now().Add(time.Hour)) {
				return errorf("timers = %+v, %v; want one due in an hour", timers, err)
			}
			return nil
		})
		if got, err := b.types(t, "order-1"); len(got) != 1 {
			t.Fatalf("order-1 before the deadline = %v, %v", got, err)
		}
		b.clock.Advance(90 * time.Minute)
		annalstest.WaitForErr(t, 30*time.Second, func() error {
			if got, err := b.types(t, "order-1"); len(got) != 3 || got[1] != "cl.deadline_passed" || got[2] != "cl.order_expired" {
				return errorf("order-1 = %v, %v", got, err)
			}
			if got, err := b.types(t, "cl-ticks"); len(got) != 1 || got[0] != scheduler.TickEventType {
				return errorf("cl-ticks = %v, %v", got, err)
			}
			return nil
		})
		st, err := saga.Lookup[struct{ Placed time.Time }](ctx, c.Pool(), c.Schema(), "cl.orders", "1")
		if err != nil || !st.Completed {
			t.Fatalf("saga instance = %+v, %v; want completed", st, err)
		}

		if err := c.Stop(ctx); err != nil {
			t.Fatal(err)
		}
		if err := c.Stop(ctx); err != nil {
			t.Fatalf("a second Stop = %v", err)
		}
		var instances int
		if err := c.Pool().QueryRow(ctx, `SELECT count(*) FROM annals.instances`).Scan(&instances); err != nil || instances != 0 {
			t.Fatalf("instances after Stop = %d, %v; want 0 (deregistered)", instances, err)
		}

		// Events appended while stopped are processed by the next run, from
		// the checkpoints; the observer sees each event once more at most
		// (its checkpoint was flushed at Stop: none again).
		if _, err := c.Append(ctx, "acct-c", eventstore.Any, eventstore.NewEvent(clDeposited{Amount: 40})); err != nil {
			t.Fatal(err)
		}
		runCtx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- c.Run(runCtx) }()
		annalstest.WaitFor(t, 30*time.Second, func() bool { return b.total(t) == 100 && b.observed() == 4 })
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("Run = %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("Run did not return after its context ended")
		}
		b.mu.Lock()
		for id, n := range b.seen {
			if n != 1 {
				t.Errorf("event %s observed %d times across a graceful restart", id, n)
			}
		}
		b.mu.Unlock()
	})

	// RunUntilCaughtUp migrates, sets up and processes to the head, then
	// returns: what tests and batch jobs use.
	t.Run("RunUntilCaughtUp", func(t *testing.T) {
		t.Parallel()
		b := setupClient(t)
		if _, err := b.client.Append(t.Context(), "acct-a", eventstore.NoStream, eventstore.NewEvent(clDeposited{Amount: 7})); err != nil {
			t.Fatal(err)
		}
		if err := b.client.RunUntilCaughtUp(t.Context()); err != nil {
			t.Fatal(err)
		}
		if got := b.total(t); got != 7 {
			t.Fatalf("total = %d, want 7", got)
		}
	})

	// Mistakes are reported when registering, and register nothing.
	t.Run("BadRegistration", func(t *testing.T) {
		t.Parallel()
		b := setupClient(t)
		c := b.client
		type unregistered struct{}
		p := projection.New("cl.bad", c.Registry())
		projection.On(p, func(context.Context, pgx.Tx, eventstore.Envelope[unregistered]) error { return nil })
		if err := annals.AddProjection(c, p, nil); err == nil {
			t.Fatal("a projection of an unregistered type was added")
		}
		if err := annals.AddObserver(c, projection.NewObserver("cl.notifier", c.Registry()), nil); err == nil {
			t.Fatal("a second subscriber named cl.notifier was added")
		}
		if err := annals.AddTask(c, scheduler.Task{Name: "cl.hourly", Spec: "@daily", StreamID: "x"}); err == nil {
			t.Fatal("a second task named cl.hourly was added")
		}
		if _, err := annals.New(nil, nil); err == nil {
			t.Fatal("New(nil, nil) succeeded")
		}
	})

	// A bad cron task is refused when it is added, not when the client
	// starts, and registers nothing: Start then succeeds.
	t.Run("BadTask", func(t *testing.T) {
		t.Parallel()
		b := setupClient(t)
		for _, bad := range []scheduler.Task{
			{Name: "cl.bad", Spec: "not cron", StreamID: "x"},
			{Name: "cl.bad", Spec: "@daily", StreamID: "x", TimeZone: "Nowhere/Atlantis"},
			{Name: "cl.bad", Spec: "@daily"},
			{Spec: "@daily", StreamID: "x"},
		} {
			if err := annals.AddTask(b.client, bad); !errors.Is(err, scheduler.ErrInvalidTask) {
				t.Fatalf("AddTask(%+v) = %v, want ErrInvalidTask", bad, err)
			}
		}
		if err := b.client.Start(t.Context()); err != nil {
			t.Fatalf("Start after refused tasks: %v", err)
		}
		if err := b.client.Stop(t.Context()); err != nil {
			t.Fatalf("Stop = %v", err)
		}
	})
}

func errorf(format string, args ...any) error { return fmt.Errorf(format, args...) }

// The client's schema: Config.Schema when set, else the one the per-part
// configs set, else "annals"; parts that name another schema are refused.
func TestClientSchema(t *testing.T) {
	t.Parallel()
	// New does not connect: a pool on an unused port will do.
	pool, err := pgxpool.New(t.Context(), "postgres://annals@127.0.0.1:1/none")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	for _, tc := range []struct {
		name string
		cfg  *annals.Config
		want string // "" for an error
		err  string
	}{
		{name: "Default", cfg: nil, want: "annals"},
		{name: "TopLevel", cfg: &annals.Config{Schema: "bank"}, want: "bank"},
		{name: "StoreOnly", cfg: &annals.Config{Store: &eventstore.Config{Schema: "bank"}}, want: "bank"},
		{name: "RunnerOnly", cfg: &annals.Config{Runner: &projection.Config{Schema: "bank"}}, want: "bank"},
		{name: "SchedulerOnly", cfg: &annals.Config{Scheduler: &scheduler.Config{Schema: "bank"}}, want: "bank"},
		{name: "PartsAgree", cfg: &annals.Config{
			Store: &eventstore.Config{Schema: "bank"}, Runner: &projection.Config{Schema: "bank"}, Scheduler: &scheduler.Config{Schema: "bank"},
		}, want: "bank"},
		{name: "TopLevelAndPartAgree", cfg: &annals.Config{Schema: "bank", Store: &eventstore.Config{Schema: "bank"}}, want: "bank"},
		{name: "PartsDisagree", cfg: &annals.Config{
			Store: &eventstore.Config{Schema: "bank"}, Scheduler: &scheduler.Config{Schema: "shop"},
		}, err: `Config.Scheduler.Schema is "shop" but Config.Store.Schema is "bank"`},
		{name: "PartDisagreesWithTopLevel", cfg: &annals.Config{Schema: "bank", Runner: &projection.Config{Schema: "shop"}},
			err: `Config.Runner.Schema is "shop" but Config.Schema is "bank"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c, err := annals.New(pool, tc.cfg)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("New = %v, want an error saying %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if c.Schema() != tc.want || c.Store().Schema() != tc.want || c.Runner().Schema() != tc.want {
				t.Fatalf("schemas: client %q, store %q, runner %q; want %q", c.Schema(), c.Store().Schema(), c.Runner().Schema(), tc.want)
			}
		})
	}
}
