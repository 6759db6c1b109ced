package annals_test

// The code of docs/recipes.md, run for real: each recipe's snippet is a
// function here (the doc quotes it), and TestRecipes exercises it.

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals"
	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/deadletter"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/projection"
	"github.com/annals-dev/annals/saga"
	"github.com/annals-dev/annals/testkit"
)

// Recipe: add a projection to a running service.
func addDailyDeposits(client *annals.Client) error {
	p := projection.New("deposits-per-day", client.Registry())
	p.OnSetup(1, projection.Statements(
		`CREATE TABLE IF NOT EXISTS deposits_per_day (day date PRIMARY KEY, total bigint NOT NULL)`))
	projection.On(p, func(ctx context.Context, tx pgx.Tx, e eventstore.Envelope[MoneyDeposited]) error {
		_, err := tx.Exec(ctx, `INSERT INTO deposits_per_day VALUES ($1::timestamptz::date, $2)
			ON CONFLICT (day) DO UPDATE SET total = deposits_per_day.total + $2`, e.RecordedAt, e.Data.Amount)
		return err
	})
	p.OnReset(func(ctx context.Context, tx pgx.Tx) error { // for rebuilds
		_, err := tx.Exec(ctx, `TRUNCATE deposits_per_day`)
		return err
	})
	return annals.AddProjection(client, p, nil)
}

// Recipe: handle a poison event.
type LargeDeposit struct {
	Amount int `json:"amount"`
}

func addAuditor(client *annals.Client) error {
	p := projection.New("auditor", client.Registry())
	p.OnSetup(1, projection.Statements(`CREATE TABLE IF NOT EXISTS audited (id uuid PRIMARY KEY, amount bigint)`))
	projection.On(p, func(ctx context.Context, tx pgx.Tx, e eventstore.Envelope[LargeDeposit]) error {
		if e.Data.Amount <= 0 {
			// Retrying cannot fix the data: dead-letter it after this attempt.
			return annals.Permanent(errors.Newf("deposit %s has amount %d", e.ID, e.Data.Amount))
		}
		_, err := tx.Exec(ctx, `INSERT INTO audited VALUES ($1, $2)`, e.ID, e.Data.Amount)
		return err
	})
	return annals.AddProjection(client, p, &projection.Options{OnDeadLetter: projection.SkipEvent})
}

// Recipe: change an event's shape. Version 1 stored {"cents": n}; version
// 2 is {"amount": n}.
type MemberPaid struct {
	Amount int `json:"amount"`
}

func registerMemberPaid(reg *eventstore.Registry) error {
	eventstore.MustRegister[MemberPaid](reg, "member.paid")
	return reg.RegisterUpcaster("member.paid", 1, func(data json.RawMessage) (json.RawMessage, error) {
		var v1 struct {
			Cents int `json:"cents"`
		}
		if err := json.Unmarshal(data, &v1); err != nil {
			return nil, err
		}
		return json.Marshal(MemberPaid{Amount: v1.Cents})
	})
}

// Recipe: test a saga.
type (
	TrialStarted struct {
		Account string `json:"account"`
	}
	TrialEnded struct {
		Account string `json:"account"`
	}
)

func trialSaga(reg *eventstore.Registry) *saga.Typed[struct{}] {
	s := saga.New[struct{}]("trials", reg)
	saga.On(s, func(e eventstore.Envelope[TrialStarted]) string { return e.Data.Account },
		func(ctx context.Context, inst *saga.Instance[struct{}], e eventstore.Envelope[TrialStarted]) error {
			_, err := inst.ScheduleAfter(ctx, 14*24*time.Hour, "trial-"+inst.ID(), eventstore.NewEvent(TrialEnded{Account: inst.ID()}))
			return err
		})
	saga.On(s, func(e eventstore.Envelope[TrialEnded]) string { return e.Data.Account },
		func(ctx context.Context, inst *saga.Instance[struct{}], e eventstore.Envelope[TrialEnded]) error {
			inst.Complete()
			return nil
		})
	return s
}

func testTrialEnds(t *testing.T) {
	reg := eventstore.NewRegistry()
	eventstore.MustRegister[TrialStarted](reg, "trial.started")
	eventstore.MustRegister[TrialEnded](reg, "trial.ended")
	r := testkit.ReplaySaga(t, trialSaga(reg), nil, // nil options: the saga's registry
		testkit.Stream("trial-ann", TrialStarted{Account: "ann"}))
	if got := len(r.Timers(t)); got != 1 {
		t.Fatalf("%d timers pending, want the trial's end", got)
	}
	r.Advance(t, 15*24*time.Hour) // the fake clock passes the end; the timer fires, the saga handles it
	if st := r.Instance(t, "ann"); !st.Completed {
		t.Fatalf("the trial did not end: %+v", st)
	}
}

// Recipe: call append from SQL.
const appendFromSQL = `SELECT global_sequence FROM annals.append_events(
	'member-7', 0,
	'[{"type": "member.paid", "data": {"cents": 1500}, "event_id": "0193a1b2-7c3d-7e4f-8a5b-6c7d8e9f0a1b"}]')`

func TestRecipes(t *testing.T) {
	t.Parallel()
	newClient := func(t *testing.T) *annals.Client {
		t.Helper()
		reg := eventstore.NewRegistry()
		eventstore.MustRegister[MoneyDeposited](reg, "account.deposited")
		eventstore.MustRegister[LargeDeposit](reg, "audit.large_deposit")
		if err := registerMemberPaid(reg); err != nil {
			t.Fatal(err)
		}
		c, err := annals.New(annalstest.NewDB(t, nil).Pool, &annals.Config{Registry: reg,
			Retry: &projection.RetryPolicy{MaxRetries: 3, InitialDelay: time.Millisecond}})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	total := func(t *testing.T, c *annals.Client) int64 {
		t.Helper()
		var n int64
		if err := c.Pool().QueryRow(t.Context(), `SELECT coalesce(sum(total), 0) FROM deposits_per_day`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}

	// A projection added after events exist starts at the beginning of the
	// log: its table is set up, and it catches up; a rebuild restores it.
	t.Run("AddProjectionThenRebuild", func(t *testing.T) {
		t.Parallel()
		c := newClient(t)
		if err := c.Migrate(t.Context()); err != nil {
			t.Fatal(err)
		}
		for _, amount := range []int{5, 7} {
			if _, err := c.Append(t.Context(), "account-1", eventstore.Any, eventstore.NewEvent(MoneyDeposited{Amount: amount})); err != nil {
				t.Fatal(err)
			}
		}
		if err := addDailyDeposits(c); err != nil {
			t.Fatal(err)
		}
		if err := c.RunUntilCaughtUp(t.Context()); err != nil {
			t.Fatal(err)
		}
		if got := total(t, c); got != 12 {
			t.Fatalf("deposits_per_day total = %d, want 12", got)
		}
		if _, err := c.Pool().Exec(t.Context(), `UPDATE deposits_per_day SET total = -1`); err != nil {
			t.Fatal(err)
		}
		if err := c.Rebuild(t.Context(), "deposits-per-day", nil); err != nil {
			t.Fatal(err)
		}
		if got := total(t, c); got != 12 {
			t.Fatalf("after the rebuild total = %d, want 12", got)
		}
	})

	// A Permanent error dead-letters the event after one attempt; the
	// projection moves on (SkipEvent) and the dead letter says why.
	t.Run("PoisonEvent", func(t *testing.T) {
		t.Parallel()
		c := newClient(t)
		if err := addAuditor(c); err != nil {
			t.Fatal(err)
		}
		if err := c.Migrate(t.Context()); err != nil {
			t.Fatal(err)
		}
		for _, amount := range []int{-3, 9} {
			if _, err := c.Append(t.Context(), "audit-1", eventstore.Any, eventstore.NewEvent(LargeDeposit{Amount: amount})); err != nil {
				t.Fatal(err)
			}
		}
		if err := c.RunUntilCaughtUp(t.Context()); err != nil {
			t.Fatal(err)
		}
		dl, err := deadletter.New(c.Pool(), nil)
		if err != nil {
			t.Fatal(err)
		}
		page, err := dl.List(t.Context(), deadletter.Filter{Subscriber: "auditor"})
		if err != nil || len(page.DeadLetters) != 1 || page.DeadLetters[0].Attempts != 1 {
			t.Fatalf("dead letters = %+v, %v; want one, after one attempt", page, err)
		}
		var n int
		if err := c.Pool().QueryRow(t.Context(), `SELECT count(*) FROM audited`).Scan(&n); err != nil || n != 1 {
			t.Fatalf("audited rows = %d, %v; want 1 (the good event)", n, err)
		}
	})

	// An event appended from SQL in the old shape is read in the new one.
	t.Run("AppendFromSQLAndUpcast", func(t *testing.T) {
		t.Parallel()
		c := newClient(t)
		if err := c.Migrate(t.Context()); err != nil {
			t.Fatal(err)
		}
		var pos int64
		if err := c.Pool().QueryRow(t.Context(), appendFromSQL).Scan(&pos); err != nil || pos != 1 {
			t.Fatalf("append from SQL: position %d, %v", pos, err)
		}
		read := 0
		for e, err := range c.ReadStream(t.Context(), "member-7", 1) {
			if err != nil {
				t.Fatal(err)
			}
			read++
			paid, err := eventstore.Decode[MemberPaid](c.Registry(), e)
			if err != nil || paid.Data.Amount != 1500 {
				t.Fatalf("decoded %+v, %v; want amount 1500", paid.Data, err)
			}
		}
		if read != 1 {
			t.Fatalf("read %d events of member-7, want 1", read)
		}
	})

	t.Run("TestASaga", func(t *testing.T) {
		t.Parallel()
		testTrialEnds(t)
	})
}
