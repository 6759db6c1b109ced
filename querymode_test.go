package annals_test

import (
	"context"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/annals-dev/annals"
	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/checkpoint"
	"github.com/annals-dev/annals/deadletter"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/projection"
	"github.com/annals-dev/annals/saga"
	"github.com/annals-dev/annals/scheduler"
)

type (
	qmDeposited struct {
		Amount int `json:"amount"`
	}
	qmPoison struct {
		Amount int `json:"amount"`
	}
	qmOrderPlaced struct {
		OrderID string `json:"order_id"`
	}
	qmDeadlinePassed struct {
		OrderID string `json:"order_id"`
	}
	qmOrderExpired struct {
		OrderID string `json:"order_id"`
	}
)

// TestQueryExecModes runs a client through a pool in each of pgx's five
// query exec modes: the default (QueryExecModeCacheStatement) and the ones
// a pooler may need (docs/operations.md, "PgBouncer and other poolers").
// QueryExecModeExec and QueryExecModeSimpleProtocol describe no statement:
// pgx picks each argument's encoding from its Go type alone, so a []byte
// bound to a json parameter went as bytea text ("\x7b...", refused: the
// runner could not register its instance, no timer could be stored) and a
// []uuid.UUID could not be encoded at all (inline projections with
// caller-chosen IDs). Every part of the client runs here: appends with an
// inline projection and caller-chosen IDs, a projection, an observer, a
// saga with a timer, a cron task, a dead letter and its retry, and the
// reads operators use.
func TestQueryExecModes(t *testing.T) {
	t.Parallel()
	for _, mode := range []pgx.QueryExecMode{
		pgx.QueryExecModeCacheStatement,
		pgx.QueryExecModeCacheDescribe,
		pgx.QueryExecModeDescribeExec,
		pgx.QueryExecModeExec,
		pgx.QueryExecModeSimpleProtocol,
	} {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			testQueryExecMode(t, mode)
		})
	}
}

func testQueryExecMode(t *testing.T, mode pgx.QueryExecMode) {
	db := annalstest.NewDB(t, nil)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	pcfg, err := pgxpool.ParseConfig(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	pcfg.ConnConfig.DefaultQueryExecMode = mode
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if got := pool.Config().ConnConfig.DefaultQueryExecMode; got != mode {
		t.Fatalf("pool in %s, want %s", got, mode)
	}

	reg := eventstore.NewRegistry()
	eventstore.MustRegister[qmDeposited](reg, "qm.deposited")
	eventstore.MustRegister[qmPoison](reg, "qm.poison")
	eventstore.MustRegister[qmOrderPlaced](reg, "qm.order_placed")
	eventstore.MustRegister[qmDeadlinePassed](reg, "qm.deadline_passed")
	eventstore.MustRegister[qmOrderExpired](reg, "qm.order_expired")

	// The inline projection counts deposits in the append's transaction.
	inline := projection.New("qm.inline", reg)
	inline.OnSetup(1, projection.Statements(`CREATE TABLE qm_inline (event_id uuid PRIMARY KEY, amount bigint NOT NULL)`))
	projection.On(inline, func(ctx context.Context, tx pgx.Tx, e eventstore.Envelope[qmDeposited]) error {
		_, err := tx.Exec(ctx, `INSERT INTO qm_inline VALUES ($1, $2)`, e.ID, e.Data.Amount)
		return err
	})

	clock := &testClock{now: time.Date(2026, 1, 1, 9, 0, 0, 0, time.UTC)}
	c, err := annals.New(pool, &annals.Config{Registry: reg, Schema: db.Schema, Clock: clock, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Inline: []eventstore.InlineProjection{inline},
		Runner: &projection.Config{PollInterval: 50 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}

	// The projection fails on a poison event while failing is set: the
	// event is dead-lettered and its stream parked until a retry.
	var failing atomic.Bool
	failing.Store(true)
	p := projection.New("qm.balances", reg)
	p.OnSetup(1, projection.Statements(`CREATE TABLE qm_balances (account text PRIMARY KEY, amount bigint NOT NULL)`))
	add := func(ctx context.Context, tx pgx.Tx, account string, amount int) error {
		_, err := tx.Exec(ctx, `INSERT INTO qm_balances VALUES ($1, $2)
			ON CONFLICT (account) DO UPDATE SET amount = qm_balances.amount + $2`, account, amount)
		return err
	}
	projection.On(p, func(ctx context.Context, tx pgx.Tx, e eventstore.Envelope[qmDeposited]) error {
		return add(ctx, tx, e.StreamID, e.Data.Amount)
	})
	projection.On(p, func(ctx context.Context, tx pgx.Tx, e eventstore.Envelope[qmPoison]) error {
		if failing.Load() {
			return annals.Permanent(errors.New("poison"))
		}
		return add(ctx, tx, e.StreamID, e.Data.Amount)
	})
	if err := annals.AddProjection(c, p, nil); err != nil {
		t.Fatal(err)
	}

	var mu sync.Mutex
	seen := map[uuid.UUID]int{}
	o := projection.NewObserver("qm.notifier", reg)
	projection.Observe(o, func(_ context.Context, e eventstore.Envelope[qmDeposited]) error {
		mu.Lock()
		defer mu.Unlock()
		seen[e.ID]++
		return nil
	})
	if err := annals.AddObserver(c, o, &projection.Options{CheckpointEvery: 1}); err != nil {
		t.Fatal(err)
	}
	observed := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(seen)
	}

	type orderState struct{ Placed time.Time }
	s := saga.New[orderState]("qm.orders", reg)
	saga.On(s, func(e eventstore.Envelope[qmOrderPlaced]) string { return e.Data.OrderID },
		func(ctx context.Context, inst *saga.Instance[orderState], e eventstore.Envelope[qmOrderPlaced]) error {
			inst.State.Placed = inst.Now()
			_, err := inst.ScheduleAfter(ctx, time.Hour, "qmorder-"+inst.ID(), eventstore.NewEvent(qmDeadlinePassed{OrderID: inst.ID()}))
			return err
		})
	saga.On(s, func(e eventstore.Envelope[qmDeadlinePassed]) string { return e.Data.OrderID },
		func(ctx context.Context, inst *saga.Instance[orderState], e eventstore.Envelope[qmDeadlinePassed]) error {
			inst.Complete()
			_, err := inst.Append(ctx, "qmorder-"+inst.ID(), eventstore.Any, eventstore.NewEvent(qmOrderExpired{OrderID: inst.ID()}))
			return err
		})
	if err := annals.AddSaga(c, s, nil); err != nil {
		t.Fatal(err)
	}
	if err := annals.AddTask(c, scheduler.Task{Name: "qm.hourly", Spec: "@every 1h", StreamID: "qm-ticks"}); err != nil {
		t.Fatal(err)
	}

	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Stop(context.WithoutCancel(ctx)); err != nil {
			t.Errorf("Stop: %v", err)
		}
	})

	// Appends: one with a caller-chosen ID (the inline projection then
	// looks the IDs up first), its idempotent repeat, a Transact, and the
	// poison event, on a stream of its own.
	chosen := uuid.Must(uuid.NewV7())
	for range 2 {
		if _, err := c.Append(ctx, "qm-a", eventstore.Any, eventstore.EventData{ID: chosen, Data: qmDeposited{Amount: 10}}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.Transact(ctx, func(ctx context.Context, _ pgx.Tx, b *eventstore.Batch) error {
		if err := b.Append("qm-a", eventstore.StreamExists, eventstore.NewEvent(qmDeposited{Amount: 20})); err != nil {
			return err
		}
		return b.Append("qm-b", eventstore.NoStream, eventstore.NewEvent(qmDeposited{Amount: 5}))
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Append(ctx, "qm-poison", eventstore.NoStream, eventstore.NewEvent(qmPoison{Amount: 100})); err != nil {
		t.Fatal(err)
	}
	res, err := c.Append(ctx, "qmorder-1", eventstore.NoStream, eventstore.NewEvent(qmOrderPlaced{OrderID: "1"}))
	if err != nil {
		t.Fatal(err)
	}
	var inlined int64
	if err := pool.QueryRow(ctx, `SELECT coalesce(sum(amount), 0) FROM qm_inline`).Scan(&inlined); err != nil || inlined != 35 {
		t.Fatalf("inline projection: sum %d, %v; want 35", inlined, err)
	}

	// The projection, the observer and the saga process everything but
	// the poison event; Await reads their checkpoints.
	if err := c.Await(ctx, "qm.orders", res.Events[0].GlobalSequence); err != nil {
		t.Fatalf("Await qm.orders: %v", err)
	}
	balances := func() map[string]int64 {
		rows, _ := pool.Query(ctx, `SELECT account, amount FROM qm_balances`)
		m, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (kv struct {
			k string
			v int64
		}, err error) {
			err = r.Scan(&kv.k, &kv.v)
			return kv, err
		})
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]int64{}
		for _, kv := range m {
			out[kv.k] = kv.v
		}
		return out
	}
	annalstest.WaitForErr(t, 30*time.Second, func() error {
		if b := balances(); b["qm-a"] != 30 || b["qm-b"] != 5 || observed() != 3 {
			return errors.Newf("balances %v, observed %d", b, observed())
		}
		return nil
	})

	// The dead letter, as an operator lists and reads it.
	dls, err := deadletter.New(pool, &deadletter.Config{Schema: db.Schema})
	if err != nil {
		t.Fatal(err)
	}
	var dl deadletter.DeadLetter
	annalstest.WaitForErr(t, 30*time.Second, func() error {
		page, err := dls.List(ctx, deadletter.Filter{Subscriber: "qm.balances"})
		if err != nil || len(page.DeadLetters) != 1 || page.DeadLetters[0].Status != deadletter.StatusOpen {
			return errors.Newf("dead letters of qm.balances = %+v, %v; want one open", page, err)
		}
		dl = page.DeadLetters[0]
		return nil
	})
	if got, err := dls.Get(ctx, dl.ID); err != nil || got.StreamID != "qm-poison" || got.EventType != "qm.poison" || !strings.Contains(got.Error, "poison") {
		t.Fatalf("Get(%d) = %+v, %v", dl.ID, got, err)
	}

	// The saga's timer, in the scheduler's views; the cron task.
	annalstest.WaitForErr(t, 30*time.Second, func() error {
		timers, err := c.Scheduler().Timers(ctx, 10)
		if err != nil || len(timers) != 1 || !timers[0].DueAt.Equal(clock.Now().Add(time.Hour)) ||
			timers[0].EventType != "qm.deadline_passed" || timers[0].StreamID != "qmorder-1" {
			return errors.Newf("timers = %+v, %v; want one due in an hour", timers, err)
		}
		return nil
	})
	if st, err := c.Scheduler().TimerStats(ctx); err != nil || st.Pending != 1 || st.NextDue == nil {
		t.Fatalf("TimerStats = %+v, %v", st, err)
	}
	if tasks, err := c.Scheduler().Tasks(ctx); err != nil || len(tasks) != 1 || tasks[0].Name != "qm.hourly" || tasks[0].Paused {
		t.Fatalf("Tasks = %+v, %v", tasks, err)
	}

	// The retry re-delivers the poison event, which now succeeds.
	failing.Store(false)
	if ch, err := dls.Retry(ctx, dl.ID); err != nil || ch.Was != deadletter.StatusOpen {
		t.Fatalf("Retry = %+v, %v", ch, err)
	}
	annalstest.WaitForErr(t, 30*time.Second, func() error {
		got, err := dls.Get(ctx, dl.ID)
		if err != nil || got.Status != deadletter.StatusResolved || balances()["qm-poison"] != 100 {
			return errors.Newf("dead letter %+v, %v; balances %v", got, err, balances())
		}
		return nil
	})

	// The clock passes the deadline and a tick: the timer fires its event
	// (stored byte for byte in the timer's json payload), the saga appends
	// its last, and the task its tick.
	clock.Advance(90 * time.Minute)
	types := func(stream string) ([]string, error) {
		var out []string
		for e, err := range c.ReadStream(ctx, stream, 1) {
			if err != nil {
				return nil, err
			}
			out = append(out, e.Type)
		}
		return out, nil
	}
	annalstest.WaitForErr(t, 30*time.Second, func() error {
		if got, err := types("qmorder-1"); !slices.Equal(got, []string{"qm.order_placed", "qm.deadline_passed", "qm.order_expired"}) {
			return errors.Newf("qmorder-1 = %v, %v", got, err)
		}
		if got, err := types("qm-ticks"); len(got) != 1 || got[0] != scheduler.TickEventType {
			return errors.Newf("qm-ticks = %v, %v", got, err)
		}
		return nil
	})
	st, err := saga.Lookup[orderState](ctx, pool, db.Schema, "qm.orders", "1")
	if err != nil || !st.Completed || !st.State.Placed.Equal(time.Date(2026, 1, 1, 9, 0, 0, 0, time.UTC)) {
		t.Fatalf("saga instance = %+v, %v; want completed, placed at 9:00", st, err)
	}

	// Reads of the log.
	head, err := c.Store().Head(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var all []string
	for e, err := range c.ReadAll(ctx, 0) {
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, e.StreamID+"@"+e.Type)
		if e.GlobalSequence > head {
			head = e.GlobalSequence
		}
	}
	if len(all) < 8 || all[0] != "qm-a@qm.deposited" {
		t.Fatalf("ReadAll = %v", all)
	}
	if v, err := c.StreamVersion(ctx, "qm-a"); err != nil || v != 2 {
		t.Fatalf("StreamVersion(qm-a) = %d, %v; want 2", v, err)
	}
	if info, err := c.Store().StreamInfo(ctx, "qm-a"); err != nil || info.Version != 2 {
		t.Fatalf("StreamInfo(qm-a) = %+v, %v", info, err)
	}

	// Status: every subscriber's checkpoint reaches the head, and the
	// instance's registry row holds its leadership as JSON.
	cps, err := checkpoint.New(db.Schema)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"qm.balances", "qm.notifier", "qm.orders"} {
		if err := c.Await(ctx, name, head); err != nil {
			t.Fatalf("Await %s: %v", name, err)
		}
	}
	list, err := cps.List(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, cp := range list {
		names = append(names, cp.Subscriber)
	}
	for _, want := range []string{"qm.balances", "qm.notifier", "qm.orders"} {
		if !slices.Contains(names, want) {
			t.Fatalf("checkpoints %v lack %s", names, want)
		}
	}
	annalstest.WaitForErr(t, 30*time.Second, func() error {
		var leads string
		err := pool.QueryRow(ctx, `SELECT leads::text FROM `+pgx.Identifier{db.Schema, "instances"}.Sanitize()).Scan(&leads)
		if err != nil || !strings.Contains(leads, `"subscriber": "qm.balances"`) && !strings.Contains(leads, `"subscriber":"qm.balances"`) {
			return errors.Newf("instances.leads = %s, %v", leads, err)
		}
		return nil
	})
}
