package deadletter_test

import (
	"context"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/deadletter"
	"github.com/annals-dev/annals/eventstore"
)

// bundle is what each test works on: a fresh database and a store on it.
type bundle struct {
	db    *annalstest.DB
	store *deadletter.Store
}

func setup(t *testing.T) *bundle {
	t.Helper()
	db := annalstest.NewDB(t, nil)
	store, err := deadletter.New(db.Pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	// The log's positions 1 to 50, which the dead letters the tests add
	// point at: an entry whose event is not in the log is skipped rather
	// than released (TestDeadLetterRetryGone).
	es, err := eventstore.New(db.Pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	evs := make([]eventstore.EventData, 50)
	for i := range evs {
		evs[i] = eventstore.EventData{Type: "order.placed", Data: map[string]int{"n": i}}
	}
	if res, err := es.Append(t.Context(), "log-1", eventstore.NoStream, evs...); err != nil || res.Events[49].GlobalSequence != 50 {
		t.Fatalf("append the log's first 50 events: %v", err)
	}
	return &bundle{db: db, store: store}
}

func nullTime(tm time.Time) any {
	if tm.IsZero() {
		return nil
	}
	return tm
}

// add inserts a dead letter as the runner would write it. Zero fields get
// defaults: subscriber orders, stream order-1, type order.placed, reason
// failed, status open, a fresh event ID, creation and update times now.
func (b *bundle) add(t *testing.T, d deadletter.DeadLetter) int64 {
	t.Helper()
	if d.Subscriber == "" {
		d.Subscriber = "orders"
	}
	if d.StreamID == "" {
		d.StreamID = "order-1"
	}
	if d.EventType == "" {
		d.EventType = "order.placed"
	}
	if d.Reason == "" {
		d.Reason = deadletter.ReasonFailed
	}
	if d.Status == "" {
		d.Status = deadletter.StatusOpen
	}
	if d.EventID == uuid.Nil {
		d.EventID = uuid.New()
	}
	var id int64
	err := b.db.Pool.QueryRow(t.Context(), `
		INSERT INTO annals.dead_letters
		       (subscriber_id, partition, event_id, global_sequence, stream_id, event_type, reason,
		        error, error_detail, attempts, status, first_failed_at, last_failed_at, created_at, updated_at)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13,
		        coalesce($14, clock_timestamp()), coalesce($15, clock_timestamp()))
		RETURNING id`,
		d.Subscriber, d.Partition, d.EventID, d.GlobalSequence, d.StreamID, d.EventType, string(d.Reason),
		d.Error, d.ErrorDetail, d.Attempts, string(d.Status), nullTime(d.FirstFailedAt), nullTime(d.LastFailedAt),
		nullTime(d.CreatedAt), nullTime(d.UpdatedAt)).Scan(&id)
	if err != nil {
		t.Fatalf("insert dead letter %+v: %v", d, err)
	}
	return id
}

// halt makes a checkpoint for the subscriber partition, halted by the Stop
// policy when reason is not empty.
func (b *bundle) halt(t *testing.T, sub string, part int, reason string) {
	t.Helper()
	var r any
	if reason != "" {
		r = reason
	}
	_, err := b.db.Pool.Exec(t.Context(), `
		INSERT INTO annals.checkpoints (subscriber_id, partition, position, epoch, stopped_reason, stopped_at)
		VALUES ($1, $2, 0, 1, $3, CASE WHEN $3::text IS NOT NULL THEN clock_timestamp() END)`, sub, part, r)
	if err != nil {
		t.Fatal(err)
	}
}

// stopped returns the subscriber partition's stopped_reason ("" when NULL)
// and whether stopped_at is set.
func (b *bundle) stopped(t *testing.T, sub string, part int) (string, bool) {
	t.Helper()
	var reason *string
	var at *time.Time
	err := b.db.Pool.QueryRow(t.Context(), `SELECT stopped_reason, stopped_at FROM annals.checkpoints WHERE subscriber_id = $1 AND partition = $2`,
		sub, part).Scan(&reason, &at)
	if err != nil {
		t.Fatal(err)
	}
	if reason == nil {
		return "", at != nil
	}
	return *reason, at != nil
}

// statuses returns every dead letter's status by ID.
func (b *bundle) statuses(t *testing.T) map[int64]deadletter.Status {
	t.Helper()
	rows, err := b.db.Pool.Query(t.Context(), `SELECT id, status FROM annals.dead_letters`)
	if err != nil {
		t.Fatal(err)
	}
	out := map[int64]deadletter.Status{}
	var id int64
	var st string
	if _, err := pgx.ForEachRow(rows, []any{&id, &st}, func() error {
		out[id] = deadletter.Status(st)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

func ids(page deadletter.Page) []int64 {
	out := make([]int64, len(page.DeadLetters))
	for i, d := range page.DeadLetters {
		out[i] = d.ID
	}
	return out
}

func TestDeadLetterList(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := t.Context()
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	at := func(min int) time.Time { return t0.Add(time.Duration(min) * time.Minute) }
	// Listed by ID, newest first (the order they were created in; two share
	// a creation time).
	a := b.add(t, deadletter.DeadLetter{GlobalSequence: 1, CreatedAt: at(0)})
	bb := b.add(t, deadletter.DeadLetter{GlobalSequence: 2, EventType: "order.shipped", CreatedAt: at(1), Reason: deadletter.ReasonParked})
	c := b.add(t, deadletter.DeadLetter{GlobalSequence: 3, StreamID: "order-2", CreatedAt: at(2), Status: deadletter.StatusResolved})
	d := b.add(t, deadletter.DeadLetter{GlobalSequence: 4, Subscriber: "mailer", CreatedAt: at(2)})
	e := b.add(t, deadletter.DeadLetter{GlobalSequence: 5, Subscriber: "mailer", StreamID: "order-2", CreatedAt: at(3), Status: deadletter.StatusSkipped})

	list := func(t *testing.T, f deadletter.Filter) deadletter.Page {
		t.Helper()
		page, err := b.store.List(ctx, f)
		if err != nil {
			t.Fatalf("List(%+v): %v", f, err)
		}
		return page
	}
	for _, tc := range []struct {
		name string
		f    deadletter.Filter
		want []int64
		more bool
	}{
		{"NewestFirst", deadletter.Filter{}, []int64{e, d, c, bb, a}, false},
		{"Subscriber", deadletter.Filter{Subscriber: "orders"}, []int64{c, bb, a}, false},
		{"Stream", deadletter.Filter{Stream: "order-2"}, []int64{e, c}, false},
		{"Type", deadletter.Filter{Type: "order.shipped"}, []int64{bb}, false},
		{"Status", deadletter.Filter{Status: deadletter.StatusOpen}, []int64{d, bb, a}, false},
		{"Combined", deadletter.Filter{Subscriber: "mailer", Stream: "order-2", Status: deadletter.StatusSkipped}, []int64{e}, false},
		{"NoMatch", deadletter.Filter{Subscriber: "nobody"}, []int64{}, false},
		{"FirstPage", deadletter.Filter{Limit: 2}, []int64{e, d}, true},
		{"SecondPage", deadletter.Filter{Limit: 2, Offset: 2}, []int64{c, bb}, true},
		{"LastPage", deadletter.Filter{Limit: 2, Offset: 4}, []int64{a}, false},
		{"ExactLastPage", deadletter.Filter{Limit: 3, Offset: 2}, []int64{c, bb, a}, false},
		{"BeyondTheEnd", deadletter.Filter{Offset: 10}, []int64{}, false},
		{"FilteredPage", deadletter.Filter{Status: deadletter.StatusOpen, Limit: 1, Offset: 1}, []int64{bb}, true},
		{"Before", deadletter.Filter{Before: c}, []int64{bb, a}, false},
		{"BeforePage", deadletter.Filter{Limit: 2, Before: d}, []int64{c, bb}, true},
		{"BeforeFiltered", deadletter.Filter{Status: deadletter.StatusOpen, Limit: 1, Before: d}, []int64{bb}, true},
		{"BeforeTheFirst", deadletter.Filter{Before: a}, []int64{}, false},
		{"BeforeBeyondTheNewest", deadletter.Filter{Before: e + 100}, []int64{e, d, c, bb, a}, false},
		{"After", deadletter.Filter{After: c}, []int64{e, d}, false},
		{"AfterPage", deadletter.Filter{Limit: 2, After: a}, []int64{c, bb}, true},
		{"AfterFiltered", deadletter.Filter{Subscriber: "orders", Limit: 1, After: a}, []int64{bb}, true},
		{"AfterTheNewest", deadletter.Filter{After: e}, []int64{}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			page := list(t, tc.f)
			if got := ids(page); !slices.Equal(got, tc.want) || page.More != tc.more {
				t.Errorf("List(%+v) = %v more=%v, want %v more=%v", tc.f, got, page.More, tc.want, tc.more)
			}
		})
	}

	t.Run("DefaultAndMaxLimit", func(t *testing.T) {
		t.Parallel()
		db := annalstest.NewDB(t, nil)
		store, err := deadletter.New(db.Pool, nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := db.Pool.Exec(ctx, `
			INSERT INTO annals.dead_letters (subscriber_id, event_id, global_sequence, stream_id, event_type, reason, error)
			SELECT 's', gen_random_uuid(), g, 'st', 't', 'failed', 'e' FROM generate_series(1, 1001) g`); err != nil {
			t.Fatal(err)
		}
		page, err := store.List(ctx, deadletter.Filter{})
		if err != nil || len(page.DeadLetters) != deadletter.DefaultLimit || !page.More {
			t.Fatalf("default page: %d more=%v %v", len(page.DeadLetters), page.More, err)
		}
		page, err = store.List(ctx, deadletter.Filter{Limit: deadletter.MaxLimit})
		if err != nil || len(page.DeadLetters) != deadletter.MaxLimit || !page.More {
			t.Fatalf("max page: %d more=%v %v", len(page.DeadLetters), page.More, err)
		}
	})

	t.Run("BadFilter", func(t *testing.T) {
		t.Parallel()
		for _, f := range []deadletter.Filter{
			{Limit: -1}, {Limit: deadletter.MaxLimit + 1}, {Offset: -1}, {Status: "pending"}, {Status: "OPEN"},
			{Before: -1}, {After: -1}, {Before: 5, After: 1}, {Before: 5, Offset: 1}, {After: 1, Offset: 1},
		} {
			if _, err := b.store.List(ctx, f); !errors.Is(err, deadletter.ErrInvalid) {
				t.Errorf("List(%+v): %v, want ErrInvalid", f, err)
			}
		}
	})
}

func TestDeadLetterGet(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := t.Context()
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 123456000, time.UTC)
	want := deadletter.DeadLetter{
		Subscriber:     "orders",
		Partition:      3,
		EventID:        uuid.New(),
		GlobalSequence: 42,
		StreamID:       "order-7",
		EventType:      "order.placed",
		Reason:         deadletter.ReasonFailed,
		Error:          "boom: no such customer",
		ErrorDetail:    "boom: no such customer\n(1) attached stack trace\n  -- stack trace:\n  | main.handle\n  | \tmain.go:12",
		Attempts:       4,
		Status:         deadletter.StatusOpen,
		FirstFailedAt:  t0,
		LastFailedAt:   t0.Add(7 * time.Second),
		CreatedAt:      t0.Add(8 * time.Second),
		UpdatedAt:      t0.Add(9 * time.Second),
	}
	want.ID = b.add(t, want)
	got, err := b.store.Get(ctx, want.ID)
	if err != nil {
		t.Fatal(err)
	}
	if !got.FirstFailedAt.Equal(want.FirstFailedAt) || !got.LastFailedAt.Equal(want.LastFailedAt) ||
		!got.CreatedAt.Equal(want.CreatedAt) || !got.UpdatedAt.Equal(want.UpdatedAt) {
		t.Errorf("times: got %+v, want %+v", got, want)
	}
	got.FirstFailedAt, got.LastFailedAt, got.CreatedAt, got.UpdatedAt = want.FirstFailedAt, want.LastFailedAt, want.CreatedAt, want.UpdatedAt
	if got != want {
		t.Errorf("Get = %+v,\nwant %+v", got, want)
	}

	// A parked event was never tried: no failure times.
	parked := b.add(t, deadletter.DeadLetter{GlobalSequence: 43, StreamID: "order-7", Reason: deadletter.ReasonParked})
	if got, err := b.store.Get(ctx, parked); err != nil || !got.FirstFailedAt.IsZero() || !got.LastFailedAt.IsZero() || got.Reason != deadletter.ReasonParked {
		t.Errorf("parked: %+v, %v", got, err)
	}

	if _, err := b.store.Get(ctx, 999); !errors.Is(err, deadletter.ErrNotFound) {
		t.Errorf("Get(999): %v, want ErrNotFound", err)
	}
	if _, err := b.store.Get(ctx, 0); !errors.Is(err, deadletter.ErrInvalid) {
		t.Errorf("Get(0): %v, want ErrInvalid", err)
	}
}

// A parked stream: the failed event at position 10 and the events parked
// behind it at 12 and 15, inserted out of order.
type parkedStream struct {
	failed, parked12, parked15 int64
	// Not of the stream: another stream of the partition, the same stream
	// in another partition and of another subscriber, and an entry of the
	// stream resolved long ago.
	otherStream, otherPartition, otherSubscriber, resolved int64
}

func (b *bundle) parkStream(t *testing.T) parkedStream {
	t.Helper()
	var p parkedStream
	p.resolved = b.add(t, deadletter.DeadLetter{GlobalSequence: 2, Status: deadletter.StatusResolved})
	p.parked15 = b.add(t, deadletter.DeadLetter{GlobalSequence: 15, Reason: deadletter.ReasonParked})
	p.failed = b.add(t, deadletter.DeadLetter{GlobalSequence: 10, Attempts: 4, Error: "boom"})
	p.parked12 = b.add(t, deadletter.DeadLetter{GlobalSequence: 12, Reason: deadletter.ReasonParked})
	p.otherStream = b.add(t, deadletter.DeadLetter{GlobalSequence: 11, StreamID: "order-2"})
	p.otherPartition = b.add(t, deadletter.DeadLetter{GlobalSequence: 13, Partition: 1})
	p.otherSubscriber = b.add(t, deadletter.DeadLetter{GlobalSequence: 14, Subscriber: "mailer"})
	b.halt(t, "orders", 0, "handler failed at position 10")
	b.halt(t, "orders", 1, "handler failed at position 13")
	b.halt(t, "mailer", 0, "handler failed at position 14")
	return p
}

func TestDeadLetterRetry(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("ReleasesTheParkedStreamInOrder", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		p := b.parkStream(t)
		before := b.statuses(t)

		// Any entry of the stream releases all of it.
		c, err := b.store.Retry(ctx, p.parked12)
		if err != nil {
			t.Fatal(err)
		}
		if want := []int64{p.failed, p.parked12, p.parked15}; !slices.Equal(c.Retried, want) {
			t.Errorf("Retried %v, want %v (position order)", c.Retried, want)
		}
		if c.Was != deadletter.StatusOpen || len(c.Skipped) != 0 || !c.Changed() {
			t.Errorf("change %+v", c)
		}
		if len(c.Resumed) != 1 || c.Resumed[0].Subscriber != "orders" || c.Resumed[0].Partition != 0 ||
			c.Resumed[0].Reason != "handler failed at position 10" || c.Resumed[0].Since.IsZero() {
			t.Errorf("Resumed %+v", c.Resumed)
		}
		after := b.statuses(t)
		for id, st := range before {
			want := st
			if id == p.failed || id == p.parked12 || id == p.parked15 {
				want = deadletter.StatusRetry
			}
			if after[id] != want {
				t.Errorf("dead letter %d: %s, want %s", id, after[id], want)
			}
		}
		if r, at := b.stopped(t, "orders", 0); r != "" || at {
			t.Errorf("orders/0 still stopped: %q %v", r, at)
		}
		if r, _ := b.stopped(t, "orders", 1); r == "" {
			t.Error("orders/1 was resumed too")
		}
		if r, _ := b.stopped(t, "mailer", 0); r == "" {
			t.Error("mailer/0 was resumed too")
		}

		// Twice: nothing to do, for any entry of the released stream.
		for _, id := range []int64{p.parked12, p.failed} {
			c, err = b.store.Retry(ctx, id)
			if err != nil || c.Changed() || c.Was != deadletter.StatusRetry {
				t.Errorf("second Retry(%d): %+v, %v", id, c, err)
			}
		}
		c, err = b.store.Retry(ctx, p.resolved)
		if err != nil || c.Changed() || c.Was != deadletter.StatusResolved {
			t.Errorf("Retry of a resolved entry: %+v, %v", c, err)
		}
		if again := b.statuses(t); !maps.Equal(again, after) {
			t.Errorf("no-op retries changed statuses: %v, was %v", again, after)
		}
	})

	t.Run("UnknownID", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		p := b.parkStream(t)
		before := b.statuses(t)
		for _, id := range []int64{p.otherSubscriber + 100, 0, -1} {
			_, err := b.store.Retry(ctx, id)
			if id > 0 && !errors.Is(err, deadletter.ErrNotFound) || id <= 0 && !errors.Is(err, deadletter.ErrInvalid) {
				t.Errorf("Retry(%d): %v", id, err)
			}
		}
		if after := b.statuses(t); !maps.Equal(after, before) {
			t.Errorf("changed: %v, was %v", after, before)
		}
	})

	t.Run("RetryTxRollsBack", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		p := b.parkStream(t)
		before := b.statuses(t)
		tx, err := b.db.Pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		c, err := b.store.RetryTx(ctx, tx, p.failed)
		if err != nil || len(c.Retried) != 3 {
			t.Fatalf("RetryTx: %+v, %v", c, err)
		}
		if err := tx.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
		if after := b.statuses(t); !maps.Equal(after, before) {
			t.Errorf("rolled back RetryTx changed: %v, was %v", after, before)
		}
		if r, _ := b.stopped(t, "orders", 0); r == "" {
			t.Error("rolled back RetryTx resumed orders/0")
		}
	})

	// Operators racing on the same stream take turns: each entry is
	// released once, by one of them.
	t.Run("Concurrent", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		p := b.parkStream(t)
		var wg sync.WaitGroup
		changes := make([]deadletter.Change, 8)
		errs := make([]error, len(changes))
		for i := range changes {
			id := []int64{p.failed, p.parked12, p.parked15}[i%3]
			wg.Go(func() { changes[i], errs[i] = b.store.Retry(ctx, id) })
		}
		wg.Wait()
		var all []int64
		resumed := 0
		for i, c := range changes {
			if errs[i] != nil {
				t.Fatal(errs[i])
			}
			all = append(all, c.Retried...)
			resumed += len(c.Resumed)
		}
		if want := []int64{p.failed, p.parked12, p.parked15}; !slices.Equal(all, want) || resumed != 1 {
			t.Errorf("released %v (resumed %d times), want %v once", all, resumed, want)
		}
	})

	// Retry, RetryAll and Skip racing on one stream end in the same state
	// whatever their order.
	t.Run("ConcurrentMixed", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		p := b.parkStream(t)
		ops := []func() (deadletter.Change, error){
			func() (deadletter.Change, error) { return b.store.Retry(ctx, p.failed) },
			func() (deadletter.Change, error) { return b.store.Skip(ctx, p.parked15) },
			func() (deadletter.Change, error) { return b.store.RetryAll(ctx, "orders") },
			func() (deadletter.Change, error) { return b.store.Retry(ctx, p.parked12) },
		}
		var wg sync.WaitGroup
		errs := make([]error, len(ops))
		for i, op := range ops {
			wg.Go(func() { _, errs[i] = op() })
		}
		wg.Wait()
		for _, err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
		st := b.statuses(t)
		want := map[int64]deadletter.Status{
			p.failed: deadletter.StatusRetry, p.parked12: deadletter.StatusRetry, p.parked15: deadletter.StatusSkipped,
			p.otherStream: deadletter.StatusRetry, p.otherPartition: deadletter.StatusRetry,
			p.otherSubscriber: deadletter.StatusOpen, p.resolved: deadletter.StatusResolved,
		}
		if !maps.Equal(st, want) {
			t.Errorf("statuses %v, want %v", st, want)
		}
	})
}

func TestDeadLetterRetryAll(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := setup(t)
	p := b.parkStream(t)
	retrying := b.add(t, deadletter.DeadLetter{GlobalSequence: 20, StreamID: "order-3", Status: deadletter.StatusRetry})
	b.halt(t, "orders", 2, "stopped with no dead letter left") // resumed as well

	c, err := b.store.RetryAll(ctx, "orders")
	if err != nil {
		t.Fatal(err)
	}
	// By partition, then position.
	if want := []int64{p.failed, p.otherStream, p.parked12, p.parked15, p.otherPartition}; !slices.Equal(c.Retried, want) {
		t.Errorf("Retried %v, want %v", c.Retried, want)
	}
	if len(c.Resumed) != 3 || c.Resumed[0].Partition != 0 || c.Resumed[1].Partition != 1 || c.Resumed[2].Partition != 2 {
		t.Errorf("Resumed %+v", c.Resumed)
	}
	st := b.statuses(t)
	if st[p.otherSubscriber] != deadletter.StatusOpen || st[p.resolved] != deadletter.StatusResolved || st[retrying] != deadletter.StatusRetry {
		t.Errorf("statuses %v", st)
	}
	if r, _ := b.stopped(t, "mailer", 0); r == "" {
		t.Error("mailer/0 was resumed")
	}

	if c, err := b.store.RetryAll(ctx, "orders"); err != nil || c.Changed() {
		t.Errorf("second RetryAll: %+v, %v", c, err)
	}
	// A subscriber known only by its checkpoint: nothing to do, not an error.
	b.halt(t, "idle", 0, "")
	if c, err := b.store.RetryAll(ctx, "idle"); err != nil || c.Changed() {
		t.Errorf("RetryAll(idle): %+v, %v", c, err)
	}
	if _, err := b.store.RetryAll(ctx, "ordres"); !errors.Is(err, deadletter.ErrNotFound) {
		t.Errorf("RetryAll(unknown): %v, want ErrNotFound", err)
	}
	if _, err := b.store.RetryAll(ctx, ""); !errors.Is(err, deadletter.ErrInvalid) {
		t.Errorf("RetryAll(\"\"): %v, want ErrInvalid", err)
	}
	if after := b.statuses(t); !maps.Equal(after, st) {
		t.Errorf("no-op calls changed %v, was %v", after, st)
	}
}

func TestDeadLetterSkip(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("ReleasesTheRestOfTheStream", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		p := b.parkStream(t)
		before := b.statuses(t)
		c, err := b.store.Skip(ctx, p.failed)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(c.Skipped, []int64{p.failed}) || !slices.Equal(c.Retried, []int64{p.parked12, p.parked15}) ||
			c.Was != deadletter.StatusOpen || len(c.Resumed) != 1 || c.Resumed[0].Partition != 0 {
			t.Errorf("Skip: %+v", c)
		}
		after := b.statuses(t)
		for id, st := range before {
			want := st
			switch id {
			case p.failed:
				want = deadletter.StatusSkipped
			case p.parked12, p.parked15:
				want = deadletter.StatusRetry
			}
			if after[id] != want {
				t.Errorf("dead letter %d: %s, want %s", id, after[id], want)
			}
		}
		if r, _ := b.stopped(t, "orders", 0); r != "" {
			t.Errorf("orders/0 still stopped: %q", r)
		}

		// Idempotent; a resolved entry cannot be skipped.
		for id, was := range map[int64]deadletter.Status{p.failed: deadletter.StatusSkipped, p.resolved: deadletter.StatusResolved} {
			if c, err := b.store.Skip(ctx, id); err != nil || c.Changed() || c.Was != was {
				t.Errorf("Skip(%d): %+v, %v", id, c, err)
			}
		}
		if again := b.statuses(t); !maps.Equal(again, after) {
			t.Errorf("no-op skips changed %v, was %v", again, after)
		}

		// A released entry may still be skipped before it is re-delivered.
		c, err = b.store.Skip(ctx, p.parked15)
		if err != nil || c.Was != deadletter.StatusRetry || !slices.Equal(c.Skipped, []int64{p.parked15}) || len(c.Retried) != 0 || len(c.Resumed) != 0 {
			t.Errorf("Skip of a retry entry: %+v, %v", c, err)
		}
		if _, err := b.store.Skip(ctx, 12345); !errors.Is(err, deadletter.ErrNotFound) {
			t.Errorf("Skip(unknown): %v", err)
		}
	})
}

func TestDeadLetterPurge(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := setup(t)
	cutoff := time.Date(2026, 2, 1, 0, 0, 0, 0, time.UTC)
	older := cutoff.Add(-time.Hour)
	purgedEvent, keptEvent := uuid.New(), uuid.New()
	atCutoff := b.add(t, deadletter.DeadLetter{GlobalSequence: 1, EventID: purgedEvent, Status: deadletter.StatusResolved, UpdatedAt: cutoff})
	newer := b.add(t, deadletter.DeadLetter{GlobalSequence: 2, EventID: keptEvent, Status: deadletter.StatusResolved, UpdatedAt: cutoff.Add(time.Microsecond)})
	// Their failed attempts: a purged dead letter's go with it.
	for _, ev := range []uuid.UUID{purgedEvent, keptEvent} {
		if _, err := b.db.Pool.Exec(ctx, `INSERT INTO annals.failures (subscriber_id, event_id, global_sequence, attempt, error)
			VALUES ('orders', $1, 1, 1, 'boom'), ('orders', $1, 1, 2, 'boom'), ('other', $1, 1, 1, 'boom')`, ev); err != nil {
			t.Fatal(err)
		}
	}
	attempts := func(sub string, ev uuid.UUID) (n int) {
		if err := b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM annals.failures WHERE subscriber_id = $1 AND event_id = $2`, sub, ev).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	skipped := b.add(t, deadletter.DeadLetter{GlobalSequence: 3, Status: deadletter.StatusSkipped, UpdatedAt: older})
	open := b.add(t, deadletter.DeadLetter{GlobalSequence: 4, Status: deadletter.StatusOpen, UpdatedAt: older})
	retry := b.add(t, deadletter.DeadLetter{GlobalSequence: 5, Status: deadletter.StatusRetry, UpdatedAt: cutoff})
	openNewer := b.add(t, deadletter.DeadLetter{GlobalSequence: 6, Status: deadletter.StatusOpen, UpdatedAt: cutoff.Add(time.Microsecond)})

	remaining := func(t *testing.T) []int64 {
		t.Helper()
		var out []int64
		for id := range b.statuses(t) {
			out = append(out, id)
		}
		slices.Sort(out)
		return out
	}

	// Resolved and skipped only, cutoff inclusive (nanoseconds below
	// PostgreSQL's microseconds do not move it).
	n, err := b.store.Purge(ctx, cutoff.Add(999*time.Nanosecond), false)
	if err != nil || n != 2 {
		t.Fatalf("Purge: %d, %v; want 2", n, err)
	}
	if got, want := remaining(t), []int64{newer, open, retry, openNewer}; !slices.Equal(got, want) {
		t.Fatalf("after Purge: %v, want %v", got, want)
	}
	for _, id := range []int64{atCutoff, skipped} {
		if _, err := b.store.Get(ctx, id); !errors.Is(err, deadletter.ErrNotFound) {
			t.Errorf("dead letter %d not purged: %v", id, err)
		}
	}
	if a, k, o := attempts("orders", purgedEvent), attempts("orders", keptEvent), attempts("other", purgedEvent); a != 0 || k != 2 || o != 1 {
		t.Errorf("failed attempts after Purge: purged entry's %d (want 0), kept entry's %d (want 2), another subscriber's %d (want 1)", a, k, o)
	}
	if n, err := b.store.Purge(ctx, cutoff, false); err != nil || n != 0 {
		t.Fatalf("second Purge: %d, %v", n, err)
	}
	n, err = b.store.Purge(ctx, cutoff, true)
	if err != nil || n != 2 {
		t.Fatalf("Purge with unresolved: %d, %v; want 2", n, err)
	}
	if got, want := remaining(t), []int64{newer, openNewer}; !slices.Equal(got, want) {
		t.Fatalf("after Purge with unresolved: %v, want %v", got, want)
	}
	if _, err := b.store.Purge(ctx, time.Time{}, true); !errors.Is(err, deadletter.ErrInvalid) {
		t.Errorf("Purge(zero time): %v", err)
	}
}

func TestDeadLetterNew(t *testing.T) {
	t.Parallel()
	if _, err := deadletter.New(nil, nil); err == nil {
		t.Error("nil pool accepted")
	}
	db := annalstest.NewDB(t, &annalstest.Options{Schema: `odd "DLQ"`})
	if _, err := deadletter.New(db.Pool, &deadletter.Config{Schema: "bad$schema"}); err == nil {
		t.Error("bad schema accepted")
	}
	s, err := deadletter.New(db.Pool, &deadletter.Config{Schema: `odd "DLQ"`})
	if err != nil {
		t.Fatal(err)
	}
	if page, err := s.List(t.Context(), deadletter.Filter{}); err != nil || len(page.DeadLetters) != 0 {
		t.Errorf("List in a quoted schema: %+v, %v", page, err)
	}
	if c, err := s.RetryAll(t.Context(), "x"); !errors.Is(err, deadletter.ErrNotFound) {
		t.Errorf("RetryAll in a quoted schema: %+v, %v", c, err)
	}
}
