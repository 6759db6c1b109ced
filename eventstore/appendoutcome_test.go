package eventstore_test

import (
	"context"
	stderrors "errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/annals-dev/annals/eventstore"
)

// isBoth reports whether err matches target under the standard library's
// errors.Is and cockroachdb's.
func isBoth(err, target error) bool {
	return stderrors.Is(err, target) && errors.Is(err, target)
}

// TestRetryRacingItsOriginal: an append made again with the same
// caller-chosen IDs (a retry of one whose outcome its caller did not learn)
// while the original holds the ordering lock and then commits answers as
// an idempotent re-append, with the original's positions, whatever its
// expected version and whether it has one event (append_one) or several
// (append_batch). Both look the IDs up before the lock: with an expected
// version the original made wrong the retry was refused
// (ErrWrongExpectedVersion; migration 0025 looks again when a stream
// refuses), and with one that still held its INSERT met the stored IDs
// (a raw unique violation; the client now re-sends such an append through
// append_events, which looks them up under the lock).
func TestRetryRacingItsOriginal(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	ctx := context.Background()
	for _, exp := range []eventstore.ExpectedVersion{eventstore.Any, eventstore.NoStream, eventstore.StreamExists, eventstore.Exact(1)} {
		for _, n := range []int{1, 2} {
			stream := fmt.Sprintf("retry-%s-%d-%s", exp, n, uuid.NewString())
			if exp != eventstore.Any && exp != eventstore.NoStream {
				if _, err := b.store.Append(ctx, stream, eventstore.NoStream, eventstore.NewEvent(OrderPlaced{OrderID: "0"})); err != nil {
					t.Fatal(err)
				}
			}
			events := make([]eventstore.EventData, n)
			for i := range events {
				events[i] = eventstore.EventData{ID: uuid.New(), Data: OrderPlaced{OrderID: stream, Total: i}}
			}
			tx, err := b.db.Pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			orig, err := b.store.AppendTx(ctx, tx, stream, exp, events...) // holds the ordering lock until its commit
			if err != nil {
				t.Fatal(err)
			}
			done := make(chan outcome, 1)
			go func() {
				res, err := b.store.Append(ctx, stream, exp, events...)
				done <- outcome{res, err}
			}()
			waitFor(t, "the retry to wait for the ordering lock", func() bool { return lockWaiters(t, b) == 1 })
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			o := <-done
			if o.err != nil {
				t.Fatalf("%s, %d events: the retry failed: %v", exp, n, o.err)
			}
			if fmt.Sprint(o.res) != fmt.Sprint(orig) {
				t.Fatalf("%s, %d events: the retry answered %+v, want the original's %+v", exp, n, o.res, orig)
			}
			if v, err := b.store.StreamVersion(ctx, stream); err != nil || v != orig.StreamVersion {
				t.Fatalf("%s, %d events: stream at version %d (%v), want %d: the retry wrote", exp, n, v, err, orig.StreamVersion)
			}
		}
	}
}

// TestSQLRetryRacingItsOriginal pins down what docs/sql-api.md tells
// producers in other languages about a retry of append_one or append_batch
// (fewer than 64 events) racing its original: refused by its stream, it
// answers 3 with the stored positions (migration 0025); accepted by it, it
// raises a unique violation (23505), and the same call made again answers
// 3.
func TestSQLRetryRacingItsOriginal(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	ctx := context.Background()
	call := func(fn, stream string, expected *int64, ids []uuid.UUID) (status int16, seq *int64, err error) {
		if fn == "append_one" {
			err = b.db.Pool.QueryRow(ctx, `SELECT status, global_sequence FROM annals.append_one($1, $2, $3, 't', '{"a": 1}', NULL, true)`,
				stream, expected, ids[0]).Scan(&status, &seq)
			return status, seq, err
		}
		n := len(ids)
		err = b.db.Pool.QueryRow(ctx, `SELECT status, global_sequence FROM annals.append_batch(ARRAY[$1], ARRAY[$4::bigint],
			array_fill(1, ARRAY[$3::int]), (SELECT array_agg(g) FROM generate_series(1, $3::int) g), $2,
			array_fill('t'::text, ARRAY[$3::int]), array_fill('{"a": 1}'::text, ARRAY[$3::int]), array_fill(NULL::text, ARRAY[$3::int]), true)
			ORDER BY stream_version LIMIT 1`, stream, ids, n, expected).Scan(&status, &seq)
		return status, seq, err
	}
	zero := int64(0)
	for _, c := range []struct {
		fn string
		n  int
	}{{"append_one", 1}, {"append_batch", 1}, {"append_batch", 2}} {
		for _, expected := range []*int64{&zero, nil} {
			stream := fmt.Sprintf("sql-%s-%d-%v", c.fn, c.n, expected != nil)
			ids := make([]uuid.UUID, c.n)
			events := make([]string, c.n)
			for i := range ids {
				ids[i] = uuid.New()
				events[i] = fmt.Sprintf(`{"event_id": %q, "type": "t", "data": {"a": 1}}`, ids[i])
			}
			tx, err := b.db.Pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			var first int64
			if err := tx.QueryRow(ctx, `SELECT min(global_sequence) FROM annals.append_events($1, 0, $2)`,
				stream, "["+strings.Join(events, ",")+"]").Scan(&first); err != nil {
				t.Fatal(err)
			}
			type result struct {
				status int16
				seq    *int64
				err    error
			}
			done := make(chan result, 1)
			go func() {
				var r result
				r.status, r.seq, r.err = call(c.fn, stream, expected, ids)
				done <- r
			}()
			waitFor(t, "the retry to wait for the ordering lock", func() bool { return lockWaiters(t, b) == 1 })
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			r := <-done
			what := fmt.Sprintf("%s of %d events, expected version %v", c.fn, c.n, expected != nil)
			if expected == nil {
				var pgErr *pgconn.PgError
				if !errors.As(r.err, &pgErr) || pgErr.Code != "23505" {
					t.Fatalf("%s: %d at %v (%v), want a unique violation", what, r.status, r.seq, r.err)
				}
				r.status, r.seq, r.err = call(c.fn, stream, expected, ids) // called again, as the docs say
			}
			if r.err != nil || r.status != 3 || r.seq == nil || *r.seq != first {
				t.Fatalf("%s: status %d at %v (%v), want 3 at %d", what, r.status, r.seq, r.err, first)
			}
		}
	}
}

// TestSenderLeavesAtItsDeadline: an Append whose caller takes a group of
// others' appends too (a free slot when it queues) returns at its own
// deadline, told that the outcome is unknown, as a member that did not
// send the group would be: it used to send the group itself and wait for
// its statement, which goes on for the others.
func TestSenderLeavesAtItsDeadline(t *testing.T) {
	t.Parallel()
	b := setup(t, nil) // two groups in flight, the second for 200 events or more
	ctx := context.Background()
	release := holdAppendLock(t, b)
	xDone := make(chan error, 1)
	go func() { // the first group: waits for the ordering lock
		_, err := b.store.Append(ctx, "x", eventstore.NoStream, eventstore.NewEvent(OrderPlaced{OrderID: "x"}))
		xDone <- err
	}()
	waitFor(t, "the first group to wait for the ordering lock", func() bool { return lockWaiters(t, b) == 1 })
	bDone := make(chan error, 1)
	go func() { // queued: too few events for a second group
		_, err := b.store.Append(ctx, "b", eventstore.NoStream, eventstore.NewEvent(OrderPlaced{OrderID: "b"}))
		bDone <- err
	}()
	waitFor(t, "an append to queue", func() bool { return eventstore.QueuedAppends(b.store) == 1 })

	// 200 events: the second slot opens, and this caller takes {b, a}.
	events := make([]eventstore.EventData, 200)
	for i := range events {
		events[i] = eventstore.NewEvent(OrderPlaced{OrderID: "a", Total: i})
	}
	actx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	aDone := make(chan error, 1)
	go func() {
		_, err := b.store.Append(actx, "a", eventstore.NoStream, events...)
		aDone <- err
	}()
	var aErr error
	select {
	case aErr = <-aDone:
	case <-time.After(20 * time.Second):
		t.Fatal("the append that sent its group did not return at its deadline (the ordering lock is still held)")
	}
	var unknown *eventstore.OutcomeUnknownError
	if !isBoth(aErr, eventstore.ErrOutcomeUnknown) || !errors.Is(aErr, context.DeadlineExceeded) || !errors.As(aErr, &unknown) {
		t.Fatalf("the append that sent its group: %v, want a deadline whose outcome is unknown", aErr)
	}
	if n := lockWaiters(t, b); n != 2 {
		t.Fatalf("%d statements wait for the ordering lock, want 2 (the group goes on for the append queued first)", n)
	}
	release()
	for _, c := range []chan error{xDone, bDone} {
		if err := <-c; err != nil {
			t.Fatal(err)
		}
	}
	// The group committed, the append that left with it.
	if v, err := b.store.StreamVersion(ctx, "a"); err != nil || v != 200 {
		t.Fatalf("a at version %d (%v), want 200", v, err)
	}
	// Its event IDs find it.
	for i := range events {
		events[i].ID = unknown.EventIDs[i]
	}
	res, err := b.store.Append(ctx, "a", eventstore.NoStream, events...)
	if err != nil || res.StreamVersion != 200 || len(res.Events) != 200 || res.Events[0].StreamVersion != 1 {
		t.Fatalf("re-append with the error's event IDs: %+v (%v), want the stored versions 1..200", res.StreamVersion, err)
	}
}

// TestAppendOutcomeMarkers: the errors of an append whose outcome the
// caller cannot learn from a typed answer say which of two things
// happened, through errors.Is of the standard library and cockroachdb:
// ErrNotWritten (never sent) or ErrOutcomeUnknown (sent, no answer: an
// *OutcomeUnknownError with the event IDs sent, those annals generated
// too). A lone append whose session is terminated while it waits for the
// ordering lock is outcome-unknown as well, through group commit (append_one,
// append_batch) and without it (append_events): it used to be a bare
// *pgconn.PgError.
func TestAppendOutcomeMarkers(t *testing.T) {
	t.Parallel()

	t.Run("NotSent", func(t *testing.T) {
		t.Parallel()
		b := setup(t, nil)
		ctx := context.Background()
		gone, cancel := context.WithCancel(ctx)
		cancel()
		_, err := b.store.Append(gone, "gone", eventstore.NoStream, eventstore.NewEvent(OrderPlaced{OrderID: "gone"}))
		if !isBoth(err, eventstore.ErrNotWritten) || !isBoth(err, context.Canceled) || stderrors.Is(err, eventstore.ErrOutcomeUnknown) {
			t.Fatalf("an append with an ended context: %v, want ErrNotWritten and context.Canceled", err)
		}

		// Queued behind a group that waits for the ordering lock.
		release := holdAppendLock(t, b)
		first := make(chan error, 1)
		go func() {
			_, err := b.store.Append(ctx, "first", eventstore.NoStream, eventstore.NewEvent(OrderPlaced{OrderID: "first"}))
			first <- err
		}()
		waitFor(t, "the first group to wait for the ordering lock", func() bool { return lockWaiters(t, b) == 1 })
		qctx, qcancel := context.WithCancel(ctx)
		queued := make(chan error, 1)
		go func() {
			_, err := b.store.Append(qctx, "queued", eventstore.NoStream, eventstore.NewEvent(OrderPlaced{OrderID: "queued"}))
			queued <- err
		}()
		waitFor(t, "an append to queue", func() bool { return eventstore.QueuedAppends(b.store) == 1 })
		qcancel()
		if err := <-queued; !isBoth(err, eventstore.ErrNotWritten) || !isBoth(err, context.Canceled) || stderrors.Is(err, eventstore.ErrOutcomeUnknown) {
			t.Fatalf("a queued append cancelled: %v, want ErrNotWritten and context.Canceled", err)
		}
		release()
		if err := <-first; err != nil {
			t.Fatal(err)
		}
		if _, err := b.store.StreamVersion(ctx, "queued"); !errors.Is(err, eventstore.ErrStreamNotFound) {
			t.Fatalf("the cancelled queued append: %v, want no stream", err)
		}
	})

	for _, c := range []struct {
		name   string
		cfg    *eventstore.Config
		events int
	}{
		{"AppendOne", nil, 1},
		{"AppendBatch", nil, 2},
		{"GroupCommitDisabled", &eventstore.Config{GroupCommit: eventstore.GroupCommit{Disabled: true}}, 1},
	} {
		t.Run("SessionTerminated"+c.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, c.cfg)
			ctx := context.Background()
			release := holdAppendLock(t, b)
			events := make([]eventstore.EventData, c.events)
			for i := range events {
				events[i] = eventstore.NewEvent(OrderPlaced{OrderID: "t", Total: i})
			}
			done := make(chan error, 1)
			go func() {
				_, err := b.store.Append(ctx, "t", eventstore.NoStream, events...)
				done <- err
			}()
			waitFor(t, "the append to wait for the ordering lock", func() bool { return lockWaiters(t, b) == 1 })
			var terminated bool
			if err := b.db.Pool.QueryRow(ctx, `SELECT pg_terminate_backend(l.pid) FROM pg_locks l
				  WHERE l.locktype = 'advisory' AND NOT l.granted
				    AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())`).Scan(&terminated); err != nil || !terminated {
				t.Fatalf("terminate the append's session: %v, %v", terminated, err)
			}
			err := <-done
			release()
			var unknown *eventstore.OutcomeUnknownError
			if !isBoth(err, eventstore.ErrOutcomeUnknown) || !stderrors.As(err, &unknown) || stderrors.Is(err, eventstore.ErrNotWritten) {
				t.Fatalf("an append whose session was terminated: %v, want ErrOutcomeUnknown", err)
			}
			if unknown.StreamID != "t" || len(unknown.EventIDs) != c.events || unknown.EventIDs[0] == uuid.Nil {
				t.Fatalf("the error holds stream %q and IDs %v, want t and %d IDs", unknown.StreamID, unknown.EventIDs, c.events)
			}
			if !strings.Contains(err.Error(), "may have been written") {
				t.Fatalf("%q does not say the append may have been written", err.Error())
			}
			// The retry the error asks for.
			for i := range events {
				events[i].ID = unknown.EventIDs[i]
			}
			res, err := b.store.Append(ctx, "t", eventstore.NoStream, events...)
			if err != nil || len(res.Events) != c.events || res.Events[0].ID != unknown.EventIDs[0] {
				t.Fatalf("re-append with the error's IDs: %+v (%v)", res, err)
			}
		})
	}
}
