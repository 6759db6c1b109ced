package eventstore_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/internal/schemaname"
)

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// holdAppendLock takes the log's ordering lock in a transaction of its own
// and returns the function that releases it. While it is held, every
// append waits for it on the server.
func holdAppendLock(t *testing.T, b *bundle) func() {
	t.Helper()
	ctx := context.Background()
	tx, err := b.db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	k1, k2 := schemaname.AppendLockKey("annals")
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1, $2)`, k1, k2); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	release := func() {
		once.Do(func() {
			if err := tx.Rollback(ctx); err != nil {
				t.Error(err)
			}
		})
	}
	t.Cleanup(release)
	return release
}

// lockWaiters counts the sessions waiting for an advisory lock in the
// test's database (other tests run in parallel in databases of their own).
func lockWaiters(t *testing.T, b *bundle) int {
	t.Helper()
	var n int
	if err := b.db.Pool.QueryRow(context.Background(),
		`SELECT count(*) FROM pg_locks
		  WHERE locktype = 'advisory' AND NOT granted
		    AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// twoInFlight configures a store that sends up to two groups at once, which
// oneGroup expects.
var twoInFlight = &eventstore.Config{GroupCommit: eventstore.GroupCommit{MaxInFlight: 2, ParallelEvents: -1}}

type outcome struct {
	res eventstore.AppendResult
	err error
}

// oneGroup runs the appends so that they travel in one group: it holds the
// ordering lock, fills the store's in-flight slots with appends of their own
// that wait for it, queues the appends, then lets everything go.
func oneGroup(t *testing.T, b *bundle, appends []func(ctx context.Context) (eventstore.AppendResult, error)) []outcome {
	t.Helper()
	ctx := context.Background()
	release := holdAppendLock(t, b)
	var wg sync.WaitGroup
	for i := range 2 { // the store's GroupCommit.MaxInFlight (twoInFlight)
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := b.store.Append(ctx, fmt.Sprintf("filler-%d-%s", i, uuid.NewString()), eventstore.NoStream,
				eventstore.NewEvent(OrderPlaced{OrderID: "filler"})); err != nil {
				t.Error(err)
			}
		}()
	}
	waitFor(t, "two appends waiting for the ordering lock", func() bool { return lockWaiters(t, b) == 2 })
	out := make([]outcome, len(appends))
	for i, fn := range appends {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out[i].res, out[i].err = fn(ctx)
		}()
	}
	waitFor(t, "the appends to queue", func() bool { return eventstore.QueuedAppends(b.store) == len(appends) })
	release()
	wg.Wait()
	return out
}

// transactions returns how many transactions wrote the events of streams.
func transactions(t *testing.T, b *bundle, streams ...string) int {
	t.Helper()
	var n int
	if err := b.db.Pool.QueryRow(context.Background(),
		`SELECT count(DISTINCT xmin::text) FROM annals.events WHERE stream_id = ANY($1)`, streams).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestGroupCommit(t *testing.T) {
	t.Parallel()

	t.Run("ConcurrentAppendsShareATransaction", func(t *testing.T) {
		t.Parallel()
		b := setup(t, twoInFlight)
		var fns []func(context.Context) (eventstore.AppendResult, error)
		var streams []string
		for i := range 10 {
			s := fmt.Sprintf("order-%d", i)
			streams = append(streams, s)
			fns = append(fns, func(ctx context.Context) (eventstore.AppendResult, error) {
				return b.store.Append(ctx, s, eventstore.NoStream,
					eventstore.NewEvent(OrderPlaced{OrderID: s, Total: i}), eventstore.NewEvent(OrderShipped{OrderID: s}))
			})
		}
		out := oneGroup(t, b, fns)
		var positions []int64
		for i, o := range out {
			if o.err != nil {
				t.Fatalf("append %d: %v", i, o.err)
			}
			if o.res.StreamVersion != 2 || len(o.res.Events) != 2 || o.res.StreamID != streams[i] {
				t.Fatalf("append %d: result %+v", i, o.res)
			}
			if o.res.Events[0].StreamVersion != 1 || o.res.Events[1].GlobalSequence != o.res.Events[0].GlobalSequence+1 {
				t.Fatalf("append %d: events %+v are not consecutive", i, o.res.Events)
			}
			positions = append(positions, o.res.Events[0].GlobalSequence, o.res.Events[1].GlobalSequence)
		}
		if n := transactions(t, b, streams...); n != 1 {
			t.Fatalf("10 queued appends were written by %d transactions, want 1", n)
		}
		// The results are the stored rows.
		for i, s := range streams {
			evs, err := collect(t, b.store.ReadStream(context.Background(), s, 1))
			if err != nil || len(evs) != 2 {
				t.Fatalf("read %s: %v, %d events", s, err, len(evs))
			}
			for j, e := range evs {
				if e.GlobalSequence != out[i].res.Events[j].GlobalSequence || e.ID != out[i].res.Events[j].ID {
					t.Fatalf("%s event %d stored at %d (%s), reported at %d (%s)", s, j, e.GlobalSequence, e.ID,
						out[i].res.Events[j].GlobalSequence, out[i].res.Events[j].ID)
				}
			}
		}
		seen := map[int64]bool{}
		for _, p := range positions {
			if seen[p] {
				t.Fatalf("position %d reported twice", p)
			}
			seen[p] = true
		}
	})

	t.Run("EachAppendHasItsOwnOutcome", func(t *testing.T) {
		t.Parallel()
		b := setup(t, twoInFlight)
		ctx := context.Background()
		// Prepare: a stream at version 1, and a stored event to re-append.
		for _, st := range []string{"existing", "existing2"} {
			if _, err := b.store.Append(ctx, st, eventstore.NoStream, eventstore.NewEvent(OrderPlaced{OrderID: "e"})); err != nil {
				t.Fatal(err)
			}
		}
		stored := eventstore.EventData{ID: uuid.New(), Data: OrderPlaced{OrderID: "again"}}
		first, err := b.store.Append(ctx, "replayed", eventstore.NoStream, stored)
		if err != nil {
			t.Fatal(err)
		}
		clash := eventstore.EventData{ID: stored.ID, Data: OrderPlaced{OrderID: "other content"}}
		head := mustHead(t, b.store)

		out := oneGroup(t, b, []func(context.Context) (eventstore.AppendResult, error){
			func(ctx context.Context) (eventstore.AppendResult, error) { // ok
				return b.store.Append(ctx, "fresh", eventstore.NoStream, eventstore.NewEvent(OrderPlaced{OrderID: "f"}))
			},
			func(ctx context.Context) (eventstore.AppendResult, error) { // wrong expected version
				return b.store.Append(ctx, "existing", eventstore.Exact(5), eventstore.NewEvent(OrderShipped{OrderID: "e"}))
			},
			func(ctx context.Context) (eventstore.AppendResult, error) { // idempotent re-append
				return b.store.Append(ctx, "replayed", eventstore.NoStream, stored)
			},
			func(ctx context.Context) (eventstore.AppendResult, error) { // event ID stored with other content
				return b.store.Append(ctx, "clash", eventstore.Any, clash)
			},
			func(ctx context.Context) (eventstore.AppendResult, error) { // must not exist, but does
				return b.store.Append(ctx, "existing2", eventstore.NoStream, eventstore.NewEvent(OrderShipped{OrderID: "e"}))
			},
			func(ctx context.Context) (eventstore.AppendResult, error) { // two appends to one stream: never in one group
				return b.store.Append(ctx, "twice", eventstore.Any, eventstore.NewEvent(OrderShipped{OrderID: "t"}))
			},
			func(ctx context.Context) (eventstore.AppendResult, error) {
				return b.store.Append(ctx, "twice", eventstore.Any, eventstore.NewEvent(OrderShipped{OrderID: "t"}))
			},
		})
		if out[0].err != nil || out[0].res.StreamVersion != 1 || out[0].res.Events[0].GlobalSequence <= head {
			t.Fatalf("fresh: %+v, %v", out[0].res, out[0].err)
		}
		var wev *eventstore.WrongExpectedVersionError
		if !errors.As(out[1].err, &wev) || wev.Actual != 1 || wev.StreamID != "existing" || wev.Expected != eventstore.Exact(5) {
			t.Fatalf("wrong version: %v", out[1].err)
		}
		if !errors.Is(out[1].err, eventstore.ErrWrongExpectedVersion) {
			t.Fatalf("wrong version does not match ErrWrongExpectedVersion: %v", out[1].err)
		}
		if out[2].err != nil || len(out[2].res.Events) != 1 || out[2].res.Events[0] != first.Events[0] {
			t.Fatalf("re-append: %+v, %v; first %+v", out[2].res, out[2].err, first)
		}
		if !errors.Is(out[3].err, eventstore.ErrEventIDConflict) {
			t.Fatalf("clash: %v", out[3].err)
		}
		if !errors.As(out[4].err, &wev) || wev.Actual != 1 || wev.StreamID != "existing2" {
			t.Fatalf("no stream: %v", out[4].err)
		}
		if out[5].err != nil || out[6].err != nil || out[5].res.StreamVersion+out[6].res.StreamVersion != 3 {
			t.Fatalf("twice: %+v, %v; %+v, %v", out[5].res, out[5].err, out[6].res, out[6].err)
		}
		if n := transactions(t, b, "twice"); n != 2 {
			t.Fatalf("two appends to one stream were written by %d transactions, want 2", n)
		}
		// Nothing of the failed appends was written.
		var clashCount int
		if err := b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM annals.streams WHERE stream_id = 'clash'`).Scan(&clashCount); err != nil || clashCount != 0 {
			t.Fatalf("clash stream: %d, %v", clashCount, err)
		}
		for _, st := range []string{"existing", "existing2"} {
			if v, err := b.store.StreamVersion(ctx, st); err != nil || v != 1 {
				t.Fatalf("%s at version %d, %v; want 1", st, v, err)
			}
		}
	})

	t.Run("AFailingGroupFallsBackToSingleAppends", func(t *testing.T) {
		t.Parallel()
		b := setup(t, twoInFlight)
		ctx := context.Background()
		// A trigger that fails every insert into one stream stands for any
		// error that aborts a whole statement.
		if _, err := b.db.Pool.Exec(ctx, `
			CREATE FUNCTION public.poison() RETURNS trigger LANGUAGE plpgsql AS $$
			BEGIN
				IF NEW.stream_id = 'poison' THEN RAISE EXCEPTION 'poisoned stream'; END IF;
				RETURN NEW;
			END $$;
			CREATE TRIGGER poison BEFORE INSERT ON annals.events FOR EACH ROW EXECUTE FUNCTION public.poison();`); err != nil {
			t.Fatal(err)
		}
		var fns []func(context.Context) (eventstore.AppendResult, error)
		for i := range 5 {
			s := fmt.Sprintf("healthy-%d", i)
			if i == 2 {
				s = "poison"
			}
			fns = append(fns, func(ctx context.Context) (eventstore.AppendResult, error) {
				return b.store.Append(ctx, s, eventstore.NoStream, eventstore.NewEvent(OrderPlaced{OrderID: s}))
			})
		}
		out := oneGroup(t, b, fns)
		for i, o := range out {
			if i == 2 {
				if o.err == nil || !strings.Contains(o.err.Error(), "poisoned stream") {
					t.Fatalf("poison: %v", o.err)
				}
				continue
			}
			if o.err != nil || o.res.StreamVersion != 1 {
				t.Fatalf("healthy append %d: %+v, %v", i, o.res, o.err)
			}
		}
		var n int
		if err := b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM annals.events WHERE stream_id LIKE 'healthy-%'`).Scan(&n); err != nil || n != 4 {
			t.Fatalf("%d healthy events stored (%v), want 4", n, err)
		}
	})

	t.Run("CancelledWhileQueuedWritesNothing", func(t *testing.T) {
		t.Parallel()
		b := setup(t, twoInFlight)
		release := holdAppendLock(t, b)
		ctx := context.Background()
		var wg sync.WaitGroup
		for i := range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if _, err := b.store.Append(ctx, fmt.Sprintf("filler-%d", i), eventstore.NoStream,
					eventstore.NewEvent(OrderPlaced{OrderID: "filler"})); err != nil {
					t.Error(err)
				}
			}()
		}
		waitFor(t, "two appends waiting for the ordering lock", func() bool { return lockWaiters(t, b) == 2 })
		cctx, cancel := context.WithCancel(ctx)
		errc := make(chan error, 1)
		go func() {
			_, err := b.store.Append(cctx, "cancelled", eventstore.NoStream, eventstore.NewEvent(OrderPlaced{OrderID: "c"}))
			errc <- err
		}()
		waitFor(t, "the append to queue", func() bool { return eventstore.QueuedAppends(b.store) == 1 })
		cancel()
		if err := <-errc; !errors.Is(err, context.Canceled) {
			t.Fatalf("cancelled append: %v", err)
		}
		if n := eventstore.QueuedAppends(b.store); n != 0 {
			t.Fatalf("%d appends still queued after the cancel", n)
		}
		release()
		wg.Wait()
		if v, err := b.store.StreamVersion(ctx, "cancelled"); !errors.Is(err, eventstore.ErrStreamNotFound) {
			t.Fatalf("cancelled stream at version %d (%v), want not found", v, err)
		}
	})

	t.Run("WritersInALoopTravelTogether", func(t *testing.T) {
		t.Parallel()
		// A long Linger, so that a slow (race-enabled, shared) machine still
		// sees every writer queue again before the next group leaves.
		b := setup(t, &eventstore.Config{GroupCommit: eventstore.GroupCommit{Linger: 100 * time.Millisecond}})
		ctx := context.Background()
		const writers, rounds = 8, 30
		var wg sync.WaitGroup
		var streams []string
		for w := range writers {
			s := fmt.Sprintf("loop-%d", w)
			streams = append(streams, s)
			wg.Add(1)
			go func() {
				defer wg.Done()
				for v := range rounds {
					if _, err := b.store.Append(ctx, s, eventstore.Exact(int64(v)), eventstore.NewEvent(OrderPlaced{OrderID: s})); err != nil {
						t.Error(err)
						return
					}
				}
			}()
		}
		wg.Wait()
		// Without lingering the writers split into cohorts that take turns
		// (two or more transactions per round); with it, each round after
		// the first is one group.
		if n := transactions(t, b, streams...); n > rounds+rounds/4 {
			t.Fatalf("%d writers × %d appends took %d transactions, want about %d", writers, rounds, n, rounds)
		}
	})

	t.Run("PacedAppendersStopPayingTheLinger", func(t *testing.T) {
		t.Parallel()
		// Appenders that do not come back at once (paced, not in a loop):
		// B queues behind A's group each round, and A does not append
		// again. The first two times, B's group lingers for A in vain;
		// after that, groups leave at once.
		const linger = time.Second
		b := setup(t, &eventstore.Config{GroupCommit: eventstore.GroupCommit{Linger: linger}})
		ctx := context.Background()
		var took []time.Duration
		for round := range 4 {
			// The last round's group finishes its bookkeeping after B has
			// its outcome: were A to queue before that, that group would
			// linger for A (a miss of its own, which would start the
			// skipping a round early).
			waitFor(t, "the last round's group done", func() bool { return eventstore.GroupsInFlight(b.store) == 0 })
			release := holdAppendLock(t, b)
			errs := make(chan error, 2)
			go func() {
				_, err := b.store.Append(ctx, fmt.Sprintf("a-%d", round), eventstore.NoStream, eventstore.NewEvent(OrderPlaced{OrderID: "a"}))
				errs <- err
			}()
			waitFor(t, "A waiting for the ordering lock", func() bool { return lockWaiters(t, b) == 1 })
			var bDone time.Time
			go func() {
				_, err := b.store.Append(ctx, fmt.Sprintf("b-%d", round), eventstore.NoStream, eventstore.NewEvent(OrderPlaced{OrderID: "b"}))
				bDone = time.Now()
				errs <- err
			}()
			waitFor(t, "B queued behind A", func() bool { return eventstore.QueuedAppends(b.store) == 1 })
			released := time.Now()
			release()
			for range 2 {
				if err := <-errs; err != nil {
					t.Fatal(err)
				}
			}
			took = append(took, bDone.Sub(released))
		}
		if took[0] < linger || took[1] < linger || took[2] >= linger/2 || took[3] >= linger/2 {
			t.Fatalf("B's append after the lock was released took %v: want the first two to wait the linger (%v), the others not", took, linger)
		}
	})

	t.Run("Disabled", func(t *testing.T) {
		t.Parallel()
		b := setup(t, &eventstore.Config{GroupCommit: eventstore.GroupCommit{Disabled: true}})
		ctx := context.Background()
		var wg sync.WaitGroup
		var streams []string
		for i := range 8 {
			s := fmt.Sprintf("alone-%d", i)
			streams = append(streams, s)
			wg.Add(1)
			go func() {
				defer wg.Done()
				if _, err := b.store.Append(ctx, s, eventstore.NoStream, eventstore.NewEvent(OrderPlaced{OrderID: s})); err != nil {
					t.Error(err)
				}
			}()
		}
		wg.Wait()
		if n := transactions(t, b, streams...); n != 8 {
			t.Fatalf("8 appends without group commit were written by %d transactions, want 8", n)
		}
	})

	t.Run("BadConfig", func(t *testing.T) {
		t.Parallel()
		b := setup(t, nil)
		if _, err := eventstore.New(b.db.Pool, &eventstore.Config{GroupCommit: eventstore.GroupCommit{MaxEvents: -1}}); err == nil {
			t.Fatal("a negative MaxEvents was accepted")
		}
	})
}

func TestAppendBatchSQL(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	ctx := context.Background()
	var meta []string // per event; nil: none
	call := func(streams []string, expected []*int64, appendIdx, index []int32, types, data []string) error {
		ids := make([]uuid.UUID, len(types))
		for i := range ids {
			ids[i] = uuid.New()
		}
		if meta == nil {
			meta = make([]string, len(types))
		}
		defer func() { meta = nil }()
		rows, err := b.db.Pool.Query(ctx, `SELECT * FROM annals.append_batch($1, $2, $3, $4, $5, $6, $7, $8, false)`,
			streams, expected, appendIdx, index, ids, types, data, meta)
		if err != nil {
			return err
		}
		rows.Close()
		return rows.Err()
	}
	one := func(v int64) *int64 { return &v }
	obj := `{"a":1}`
	for name, tc := range map[string]func() error{
		"NoAppends": func() error { return call(nil, nil, nil, nil, nil, nil) },
		"EmptyStream": func() error {
			return call([]string{""}, []*int64{nil}, []int32{1}, []int32{1}, []string{"t"}, []string{obj})
		},
		// Each append's stream is checked, not only the first one's.
		"EmptySecondStream": func() error {
			return call([]string{"s", ""}, []*int64{nil, nil}, []int32{1, 1, 2}, []int32{1, 2, 1}, []string{"t", "t", "t"}, []string{obj, obj, obj})
		},
		"SecondExpectedBelowMinusOne": func() error {
			return call([]string{"s", "u"}, []*int64{nil, one(-2)}, []int32{1, 2}, []int32{1, 1}, []string{"t", "t"}, []string{obj, obj})
		},
		"SameStreamTwice": func() error {
			return call([]string{"s", "s"}, []*int64{nil, nil}, []int32{1, 2}, []int32{1, 1}, []string{"t", "t"}, []string{obj, obj})
		},
		"ExpectedBelowMinusOne": func() error {
			return call([]string{"s"}, []*int64{one(-2)}, []int32{1}, []int32{1}, []string{"t"}, []string{obj})
		},
		"EmptyType": func() error {
			return call([]string{"s"}, []*int64{nil}, []int32{1}, []int32{1}, []string{""}, []string{obj})
		},
		"NotJSON": func() error {
			return call([]string{"s"}, []*int64{nil}, []int32{1}, []int32{1}, []string{"t"}, []string{"{nope"})
		},
		"ScalarData": func() error {
			return call([]string{"s"}, []*int64{nil}, []int32{1}, []int32{1}, []string{"t"}, []string{"42"})
		},
		"EventsOutOfOrder": func() error {
			return call([]string{"s", "u"}, []*int64{nil, nil}, []int32{2, 1}, []int32{1, 1}, []string{"t", "t"}, []string{obj, obj})
		},
		"IndexGap": func() error {
			return call([]string{"s"}, []*int64{nil}, []int32{1, 1}, []int32{1, 3}, []string{"t", "t"}, []string{obj, obj})
		},
		"AppendWithoutEvents": func() error {
			return call([]string{"s", "u"}, []*int64{nil, nil}, []int32{1}, []int32{1}, []string{"t"}, []string{obj})
		},
		"StreamOverLimit": func() error {
			return call([]string{strings.Repeat("s", eventstore.MaxStreamIDBytes+1)}, []*int64{nil}, []int32{1}, []int32{1}, []string{"t"}, []string{obj})
		},
		"StreamOnlyWhitespace": func() error {
			return call([]string{" \u3000"}, []*int64{nil}, []int32{1}, []int32{1}, []string{"t"}, []string{obj})
		},
		"StreamControlCharacter": func() error {
			return call([]string{"a\x01b"}, []*int64{nil}, []int32{1}, []int32{1}, []string{"t"}, []string{obj})
		},
		"TypeOverLimit": func() error {
			return call([]string{"s"}, []*int64{nil}, []int32{1}, []int32{1}, []string{strings.Repeat("t", eventstore.MaxEventTypeBytes+1)}, []string{obj})
		},
		"TypeOnlyWhitespace": func() error {
			return call([]string{"s"}, []*int64{nil}, []int32{1}, []int32{1}, []string{"  "}, []string{obj})
		},
		"ExpectedOverflows": func() error {
			return call([]string{"s"}, []*int64{one(1<<63 - 1)}, []int32{1}, []int32{1}, []string{"t"}, []string{obj})
		},
		"MetadataNotObject": func() error {
			meta = []string{"[1]"}
			return call([]string{"s"}, []*int64{nil}, []int32{1}, []int32{1}, []string{"t"}, []string{obj})
		},
		"MetadataReservedKeyType": func() error {
			meta = []string{`{"correlation_id": 7}`}
			return call([]string{"s"}, []*int64{nil}, []int32{1}, []int32{1}, []string{"t"}, []string{obj})
		},
		"MetadataSchemaVersionNotPositive": func() error {
			meta = []string{`{"schema_version": 0}`}
			return call([]string{"s"}, []*int64{nil}, []int32{1}, []int32{1}, []string{"t"}, []string{obj})
		},
		"MetadataKeyOverLimit": func() error {
			meta = []string{`{"` + strings.Repeat("k", eventstore.MaxMetadataKeyBytes+1) + `": 1}`}
			return call([]string{"s"}, []*int64{nil}, []int32{1}, []int32{1}, []string{"t"}, []string{obj})
		},
		"LengthsDiffer": func() error {
			return call([]string{"s"}, []*int64{nil}, []int32{1}, []int32{1}, []string{"t", "t"}, []string{obj})
		},
	} {
		t.Run(name, func(t *testing.T) {
			// Malformed JSON is refused by the json type's input function
			// (22P02), as it is by append_events' jsonb parameter.
			var pgErr *pgconn.PgError
			if err := tc(); !errors.As(err, &pgErr) || (pgErr.Code != eventstore.CodeInvalidEvent && pgErr.Code != "22P02") {
				t.Fatalf("got %v, want SQLSTATE %s", err, eventstore.CodeInvalidEvent)
			}
			if pgErr.Code == eventstore.CodeInvalidEvent {
				var d struct{ Field string }
				if jerr := json.Unmarshal([]byte(pgErr.Detail), &d); jerr != nil || d.Field == "" {
					t.Fatalf("DETAIL %q does not name the field (%v)", pgErr.Detail, jerr)
				}
			}
		})
	}
	// Arrays that are not one-dimensional and 1-based, found by review: they
	// used to make the subscripts miss, so versions could be forged (a gap,
	// or an expected version bypassed on another stream).
	if _, err := b.store.Append(ctx, "victim", eventstore.NoStream, eventstore.NewEvent(OrderPlaced{OrderID: "v"})); err != nil {
		t.Fatal(err)
	}
	headBefore := mustHead(t, b.store)
	for name, sql := range map[string]string{
		"IndexNotOneBased": `SELECT * FROM annals.append_batch(ARRAY['gap'], ARRAY[NULL]::bigint[], ARRAY[1, 1],
			'[2:3]={1,7}'::int[], ARRAY[gen_random_uuid(), gen_random_uuid()], ARRAY['t', 't'], ARRAY['{}', '{}'], ARRAY['', ''], false)`,
		"IndexTwoDimensional": `SELECT * FROM annals.append_batch(ARRAY['gap'], ARRAY[NULL]::bigint[], ARRAY[1, 1, 1],
			'{{1},{9},{2}}'::int[], ARRAY[gen_random_uuid(), gen_random_uuid(), gen_random_uuid()], ARRAY['t', 't', 't'],
			ARRAY['{}', '{}', '{}'], ARRAY['', '', ''], false)`,
		"StreamsNotOneBased": `SELECT * FROM annals.append_batch('[0:1]={big,victim}'::text[], ARRAY[NULL, 7]::bigint[], ARRAY[1, 2],
			ARRAY[1, 1], ARRAY[gen_random_uuid(), gen_random_uuid()], ARRAY['t', 'Forged'], ARRAY['{}', '{}'], ARRAY['', ''], false)`,
		"ExpectedNotOneBased": `SELECT * FROM annals.append_batch(ARRAY['big', 'victim'], '[0:1]={NULL,7}'::bigint[], ARRAY[1, 2],
			ARRAY[1, 1], ARRAY[gen_random_uuid(), gen_random_uuid()], ARRAY['t', 'Forged'], ARRAY['{}', '{}'], ARRAY['', ''], false)`,
		"SameIDTwice": `SELECT * FROM annals.append_batch(ARRAY['a', 'b'], ARRAY[NULL, NULL]::bigint[], ARRAY[1, 2], ARRAY[1, 1],
			ARRAY['0193a1b2-7c3d-7e4f-8a5b-6c7d8e9f0a1b', '0193a1b2-7c3d-7e4f-8a5b-6c7d8e9f0a1b']::uuid[], ARRAY['t', 't'],
			ARRAY['{}', '{}'], ARRAY['', ''], false)`,
		"DataNotStorableAsJSONB": `SELECT * FROM annals.append_batch(ARRAY['nul'], ARRAY[NULL]::bigint[], ARRAY[1], ARRAY[1],
			ARRAY[gen_random_uuid()], ARRAY['t'], ARRAY['{"a":"x\u0000y"}'], ARRAY[''], false)`,
		"CheckIDsNull": `SELECT * FROM annals.append_batch(ARRAY['n'], ARRAY[NULL]::bigint[], ARRAY[1], ARRAY[1],
			ARRAY[gen_random_uuid()], ARRAY['t'], ARRAY['{}'], ARRAY[''], NULL)`,
		// Up to 16 events, IDs and streams are compared pairwise; past 16
		// they are sorted and counted: a repeat is found either way, wherever
		// it is.
		"SameIDInOneAppend": `SELECT * FROM annals.append_batch(ARRAY['a'], ARRAY[NULL]::bigint[], ARRAY[1, 1, 1], ARRAY[1, 2, 3],
			ARRAY[gen_random_uuid(), '0193a1b2-7c3d-7e4f-8a5b-6c7d8e9f0a1c', '0193a1b2-7c3d-7e4f-8a5b-6c7d8e9f0a1c']::uuid[],
			ARRAY['t', 't', 't'], ARRAY['{}', '{}', '{}'], ARRAY['', '', ''], true)`,
		"SameStreamFirstAndLast": `SELECT * FROM annals.append_batch(ARRAY['a', 'b', 'c', 'a'], ARRAY[NULL, NULL, NULL, NULL]::bigint[],
			ARRAY[1, 2, 3, 4], ARRAY[1, 1, 1, 1], ARRAY[gen_random_uuid(), gen_random_uuid(), gen_random_uuid(), gen_random_uuid()],
			ARRAY['t', 't', 't', 't'], ARRAY['{}', '{}', '{}', '{}'], ARRAY['', '', '', ''], false)`,
		"SameIDIn17Events": `SELECT * FROM annals.append_batch(ARRAY['a', 'b'], ARRAY[NULL, NULL]::bigint[],
			array_fill(1, ARRAY[16]) || 2, (SELECT array_agg(g) FROM generate_series(1, 16) g) || 1,
			(SELECT array_agg(gen_random_uuid()) FROM generate_series(1, 15)) || '0193a1b2-7c3d-7e4f-8a5b-6c7d8e9f0a1d'::uuid || '0193a1b2-7c3d-7e4f-8a5b-6c7d8e9f0a1d'::uuid,
			array_fill('t'::text, ARRAY[17]), array_fill('{}'::text, ARRAY[17]), array_fill(''::text, ARRAY[17]), true)`,
		"SameStreamIn17Appends": `SELECT * FROM annals.append_batch(
			(SELECT array_agg('s' || g) FROM generate_series(1, 16) g) || 's3'::text, array_fill(NULL::bigint, ARRAY[17]),
			(SELECT array_agg(g) FROM generate_series(1, 17) g), array_fill(1, ARRAY[17]),
			(SELECT array_agg(gen_random_uuid()) FROM generate_series(1, 17)),
			array_fill('t'::text, ARRAY[17]), array_fill('{}'::text, ARRAY[17]), array_fill(''::text, ARRAY[17]), false)`,
	} {
		t.Run(name, func(t *testing.T) {
			rows, err := b.db.Pool.Query(ctx, sql)
			if err == nil {
				rows.Close()
				err = rows.Err()
			}
			var pgErr *pgconn.PgError
			if !errors.As(err, &pgErr) || pgErr.Code != eventstore.CodeInvalidEvent {
				t.Fatalf("got %v, want SQLSTATE %s", err, eventstore.CodeInvalidEvent)
			}
			var d struct{ Field string }
			if jerr := json.Unmarshal([]byte(pgErr.Detail), &d); jerr != nil || d.Field == "" {
				t.Fatalf("DETAIL %q does not name the field (%v)", pgErr.Detail, jerr)
			}
		})
	}
	if h := mustHead(t, b.store); h != headBefore {
		t.Fatalf("bad calls wrote events: head %d, was %d", h, headBefore)
	}
	if v, err := b.store.StreamVersion(ctx, "victim"); err != nil || v != 1 {
		t.Fatalf("victim at version %d (%v), want 1", v, err)
	}

	// A good call from SQL: two streams, positions in argument order.
	rows, err := b.db.Pool.Query(ctx, `SELECT stream_id, status, global_sequence, stream_version
		FROM annals.append_batch(ARRAY['x', 'y'], ARRAY[0, NULL]::bigint[], ARRAY[1, 1, 2], ARRAY[1, 2, 1],
			ARRAY[gen_random_uuid(), gen_random_uuid(), gen_random_uuid()], ARRAY['t', 't', 't'],
			ARRAY['{"n":1}', '{"n":2}', '[3]'], ARRAY[NULL, '', '{"m":1}'], false)
		ORDER BY global_sequence`)
	if err != nil {
		t.Fatal(err)
	}
	type row struct {
		Stream   string
		Status   int16
		Pos, Ver int64
	}
	got, err := pgx.CollectRows(rows, pgx.RowToStructByPos[row])
	if err != nil {
		t.Fatal(err)
	}
	// A refused call may have drawn positions (a hole), so compare from the first.
	if len(got) == 3 {
		base := got[0].Pos - 1
		for i := range got {
			got[i].Pos -= base
		}
	}
	want := []row{{"x", 0, 1, 1}, {"x", 0, 2, 2}, {"y", 0, 3, 1}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	var storedData, storedMeta string
	if err := b.db.Pool.QueryRow(ctx, `SELECT data::text, coalesce(metadata::text, 'null') FROM annals.events WHERE stream_id = 'y'`).Scan(&storedData, &storedMeta); err != nil || storedData != "[3]" || storedMeta != `{"m":1}` {
		t.Fatalf("stored %s %s (%v)", storedData, storedMeta, err)
	}
}

// TestAppendBatchLooksIDsUpWhenItMust covers append_batch's calls of many
// events with caller-chosen IDs on a log never archived (migration 0020): no
// look-up first, and one after all when an append is refused by its stream (a retry
// whose stream moved on) or when the INSERT finds an ID stored (the writes
// undone, the call started again). Outcomes are those of a look-up first.
func TestAppendBatchLooksIDsUpWhenItMust(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	ctx := context.Background()
	type app struct {
		stream   string
		expected *int64
		ids      []uuid.UUID
		data     string
	}
	type row struct {
		stream         string
		status         int16
		id             *uuid.UUID
		seq, ver, actu *int64
	}
	// Each call carries 64 new events in a stream of their own besides the
	// appends under test: append_batch skips the look-up only for calls of
	// at least 64 events.
	fills := 0
	call := func(check bool, apps ...app) ([]row, error) {
		fills++
		fill := app{fmt.Sprintf("opt-fill-%d", fills), nil, make([]uuid.UUID, 64), `{"fill": true}`}
		for i := range fill.ids {
			fill.ids[i] = uuid.New()
		}
		apps = append(apps, fill)
		var (
			streams        []string
			expected       []*int64
			appendIdx, idx []int32
			ids            []uuid.UUID
			types, data    []string
			meta           []*string
		)
		for i, a := range apps {
			streams, expected = append(streams, a.stream), append(expected, a.expected)
			for j, id := range a.ids {
				appendIdx, idx = append(appendIdx, int32(i+1)), append(idx, int32(j+1))
				ids, types, data, meta = append(ids, id), append(types, "t"), append(data, a.data), append(meta, nil)
			}
		}
		rows, err := b.db.Pool.Query(ctx, `SELECT * FROM annals.append_batch($1, $2, $3, $4, $5, $6, $7, $8, $9)`,
			streams, expected, appendIdx, idx, ids, types, data, meta, check)
		if err != nil {
			return nil, err
		}
		return pgx.CollectRows(rows, func(r pgx.CollectableRow) (row, error) {
			var x row
			err := r.Scan(&x.stream, &x.status, &x.id, &x.seq, &x.ver, &x.actu)
			return x, err
		})
	}
	// outcome: the status of each stream's append, and the stored position
	// and version of each event row, checked against the log.
	outcome := func(rows []row) map[string]int16 {
		t.Helper()
		got := map[string]int16{}
		defer func() {
			if t.Failed() {
				return
			}
			if st, ok := got[fmt.Sprintf("opt-fill-%d", fills)]; !ok || st != 0 {
				t.Fatalf("the call's other append: status %d (answered: %t), want 0", st, ok)
			}
		}()
		for _, r := range rows {
			got[r.stream] = r.status
			if r.status != 0 && r.status != 3 {
				continue
			}
			var seq, ver int64
			var stream string
			if err := b.db.Pool.QueryRow(ctx, `SELECT global_sequence, stream_version, stream_id FROM annals.events_all WHERE event_id = $1`,
				*r.id).Scan(&seq, &ver, &stream); err != nil {
				t.Fatalf("event %v of %s: %v", *r.id, r.stream, err)
			}
			if seq != *r.seq || ver != *r.ver || stream != r.stream {
				t.Fatalf("row %s %v: position %d version %d, stored %d %d in %s", r.stream, *r.id, *r.seq, *r.ver, seq, ver, stream)
			}
		}
		return got
	}
	version := func(stream string) int64 {
		t.Helper()
		var v int64
		if err := b.db.Pool.QueryRow(ctx, `SELECT version FROM annals.streams WHERE stream_id = $1`, stream).Scan(&v); err != nil {
			t.Fatal(err)
		}
		return v
	}
	zero := func() *int64 { v := int64(0); return &v }
	newIDs := func(n int) []uuid.UUID {
		ids := make([]uuid.UUID, n)
		for i := range ids {
			ids[i] = uuid.New()
		}
		return ids
	}
	const data, other = `{"a": 1}`, `{"a": 2}`

	stored := app{"opt-a", zero(), newIDs(2), data}
	refusedStored := app{"opt-b", zero(), newIDs(1), data}
	rows, err := call(true, stored, refusedStored)
	if err != nil {
		t.Fatal(err)
	}
	if got := outcome(rows); got["opt-a"] != 0 || got["opt-b"] != 0 {
		t.Fatalf("first appends: %v", got)
	}

	// Found by the INSERT: stored whole and identical (3), beside a new
	// append that lands after the undone attempt.
	again := stored
	again.expected = nil
	fresh := app{"opt-c", zero(), newIDs(3), data}
	last := func() int64 {
		t.Helper()
		var n int64
		if err := b.db.Pool.QueryRow(ctx, `SELECT pg_sequence_last_value('annals.events_global_sequence')`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	before := last()
	rows, err = call(true, again, fresh)
	if err != nil {
		t.Fatal(err)
	}
	if got := outcome(rows); got["opt-a"] != 3 || got["opt-c"] != 0 {
		t.Fatalf("re-append beside a new append: %v", got)
	}
	// The undone attempt drew positions for the call's 69 events, and the
	// second as many: the look-up was skipped (a look-up first draws once).
	if drawn := last() - before; drawn != 2*69 {
		t.Fatalf("the call drew %d positions, want %d (an undone attempt, then the writes)", drawn, 2*69)
	}
	// Refused by its stream (expects 0, the stream is at 1), and a retry.
	fresh2 := app{"opt-d", zero(), newIDs(1), data}
	rows, err = call(true, refusedStored, fresh2)
	if err != nil {
		t.Fatal(err)
	}
	if got := outcome(rows); got["opt-b"] != 3 || got["opt-d"] != 0 {
		t.Fatalf("re-append whose stream moved on: %v", got)
	}
	// Found by the INSERT with other content (2), or only some of the
	// append's IDs stored (2).
	conflict := again
	conflict.data = other
	partial := app{"opt-c", nil, append([]uuid.UUID{fresh.ids[0]}, newIDs(1)...), data}
	fresh3 := app{"opt-e", nil, newIDs(2), data}
	rows, err = call(true, conflict, fresh3)
	if err != nil {
		t.Fatal(err)
	}
	if got := outcome(rows); got["opt-a"] != 2 || got["opt-e"] != 0 {
		t.Fatalf("stored with other content: %v", got)
	}
	rows, err = call(true, partial)
	if err != nil {
		t.Fatal(err)
	}
	if got := outcome(rows); got["opt-c"] != 2 {
		t.Fatalf("partly stored: %v", got)
	}
	// The undone attempts left nothing behind: each stream's version is its
	// events' count, and each ID is stored once.
	for stream, want := range map[string]int64{"opt-a": 2, "opt-b": 1, "opt-c": 3, "opt-d": 1, "opt-e": 2} {
		var n int64
		if err := b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM annals.events WHERE stream_id = $1`, stream).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if v := version(stream); v != want || n != want {
			t.Fatalf("stream %s: version %d, %d events, want %d", stream, v, n, want)
		}
	}
	// An event moved into the archive some other way than archive() (as a
	// restore or logical replication would: the archive step sequence stays
	// unset) is still found: the call looks the IDs up first.
	moveTx, err := b.db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := moveTx.Exec(ctx, `SET LOCAL session_replication_role = replica`); err != nil {
		t.Fatal(err)
	}
	if _, err := moveTx.Exec(ctx, `WITH m AS (DELETE FROM annals.events WHERE event_id = $1 RETURNING *)
		INSERT INTO annals.events_archive SELECT * FROM m`, fresh2.ids[0]); err != nil {
		t.Fatal(err)
	}
	if err := moveTx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	restored := fresh2
	restored.expected = nil
	rows, err = call(true, restored)
	if err != nil {
		t.Fatal(err)
	}
	if got := outcome(rows); got["opt-d"] != 3 {
		t.Fatalf("re-append of an event restored into the archive: %v", got)
	}
	var copies int64
	if err := b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM annals.events_all WHERE event_id = $1`, fresh2.ids[0]).Scan(&copies); err != nil || copies != 1 {
		t.Fatalf("%d copies of the restored event (%v), want 1", copies, err)
	}
	// Without check_ids, a stored ID is still the unique violation it was.
	_, err = call(false, app{"opt-f", nil, stored.ids[:1], data})
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "23505" || pgErr.ConstraintName != "events_event_id_key" {
		t.Fatalf("stored ID without check_ids: got %v, want a unique violation of events_event_id_key", err)
	}
}

// TestAppendBatchRacingTheSameIDs: another append of the same caller-chosen
// IDs commits while an append_batch call waits for the ordering lock. A call
// of 64 events or more looks the IDs up under the lock (migration 0020) and
// answers 3 with the stored positions; a smaller one looked them up before
// the lock and meets the stored rows at its INSERT: unique_violation, which
// the Go client answers by re-sending the group's appends one by one
// (docs/sql-api.md says both).
func TestAppendBatchRacingTheSameIDs(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	ctx := context.Background()
	for _, n := range []int{64, 1} {
		stream := fmt.Sprintf("race-%d", n)
		ids := make([]uuid.UUID, n)
		events := make([]string, n)
		for i := range ids {
			ids[i] = uuid.New()
			events[i] = fmt.Sprintf(`{"event_id": %q, "type": "t", "data": {"a": 1}}`, ids[i])
		}
		// The first append holds the ordering lock until its commit.
		tx, err := b.db.Pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var first int64
		if err := tx.QueryRow(ctx, `SELECT min(global_sequence) FROM annals.append_events($1, NULL, $2)`,
			stream, "["+strings.Join(events, ",")+"]").Scan(&first); err != nil {
			t.Fatal(err)
		}
		type outcome struct {
			status int16
			seq    *int64
			err    error
		}
		done := make(chan outcome, 1)
		go func() {
			var o outcome
			o.err = b.db.Pool.QueryRow(ctx, `SELECT status, global_sequence FROM annals.append_batch(ARRAY[$1], ARRAY[NULL]::bigint[],
				array_fill(1, ARRAY[$3::int]), (SELECT array_agg(g) FROM generate_series(1, $3::int) g), $2,
				array_fill('t'::text, ARRAY[$3::int]), array_fill('{"a": 1}'::text, ARRAY[$3::int]), array_fill(NULL::text, ARRAY[$3::int]), true)
				ORDER BY stream_version LIMIT 1`, stream, ids, n).Scan(&o.status, &o.seq)
			done <- o
		}()
		waitFor(t, "the second call waiting for the ordering lock", func() bool { return lockWaiters(t, b) == 1 })
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		o := <-done
		var pgErr *pgconn.PgError
		switch {
		case n >= 64 && (o.err != nil || o.status != 3 || o.seq == nil || *o.seq != first):
			t.Fatalf("%d events: status %d at %v (%v), want 3 at %d", n, o.status, o.seq, o.err, first)
		case n < 64 && (!errors.As(o.err, &pgErr) || pgErr.Code != "23505"):
			t.Fatalf("%d event: %v, want a unique violation", n, o.err)
		}
		var copies int
		if err := b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM annals.events WHERE stream_id = $1`, stream).Scan(&copies); err != nil || copies != n {
			t.Fatalf("%d events stored in %s (%v), want %d", copies, stream, err, n)
		}
	}
}
