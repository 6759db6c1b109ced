package eventstore_test

import (
	"context"
	stderrors "errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/eventstore"
)

// holdStreamRow locks the streams row of stream in a transaction of its own
// and returns the function that releases it. A group that appends to the
// stream then waits inside its statement (its upsert of the row), holding
// the ordering lock: the group has been sent and is committing.
func holdStreamRow(t *testing.T, b *bundle, stream string) func() {
	t.Helper()
	ctx := context.Background()
	// A connection of its own: the pool's four are taken by the ordering
	// lock's holder, two fillers and the test's queries.
	conn, err := pgx.Connect(ctx, b.db.URL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var one int
	if err := tx.QueryRow(ctx, `SELECT 1 FROM annals.streams WHERE stream_id = $1 FOR UPDATE`, stream).Scan(&one); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	release := func() {
		once.Do(func() {
			if err := tx.Rollback(ctx); err != nil && !errors.Is(err, pgx.ErrTxClosed) {
				t.Error(err)
			}
		})
	}
	t.Cleanup(release)
	return release
}

// rowLockWaiters counts the sessions of the test's database that wait for a
// lock other than an advisory lock (here: the held streams row).
func rowLockWaiters(t *testing.T, b *bundle) int {
	t.Helper()
	var n int
	if err := b.db.Pool.QueryRow(context.Background(),
		`SELECT count(*) FROM pg_stat_activity
		  WHERE datname = current_database() AND wait_event_type = 'Lock' AND wait_event <> 'advisory'`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestGroupCancelledOnlyWhenEveryCallerIsGone pins down what a cancelled
// context does to an append whose group is already on the server: the
// caller returns at once, told the outcome is unknown, but the statement
// goes on for the other members of the group, whose appends must not fail
// because a neighbour gave up; only when every member is gone is the
// statement cancelled, and then nothing of the group is written.
func TestGroupCancelledOnlyWhenEveryCallerIsGone(t *testing.T) {
	t.Parallel()

	// sendGroup puts appends to the streams "<p>-a" and "<p>-b" (both at
	// version 1 already) into one group that is sent while the row of
	// "<p>-a" is locked, and returns the members' outcomes as channels
	// plus their cancel functions, once the statement waits on the row.
	sendGroup := func(t *testing.T, b *bundle, p string) (results []chan error, cancels []context.CancelFunc, releaseRow func()) {
		t.Helper()
		ctx := context.Background()
		for _, s := range []string{p + "-a", p + "-b"} {
			if _, err := b.store.Append(ctx, s, eventstore.NoStream, eventstore.NewEvent(OrderPlaced{OrderID: s})); err != nil {
				t.Fatal(err)
			}
		}
		releaseRow = holdStreamRow(t, b, p+"-a")
		releaseLock := holdAppendLock(t, b)
		var fillers sync.WaitGroup
		for i := range 2 { // fill both in-flight slots, so that the two appends below queue together
			fillers.Add(1)
			go func() {
				defer fillers.Done()
				if _, err := b.store.Append(ctx, fmt.Sprintf("%s-filler-%d", p, i), eventstore.NoStream,
					eventstore.NewEvent(OrderPlaced{OrderID: "filler"})); err != nil {
					t.Error(err)
				}
			}()
		}
		waitFor(t, "two fillers waiting for the ordering lock", func() bool { return lockWaiters(t, b) == 2 })
		for _, s := range []string{p + "-a", p + "-b"} {
			cctx, cancel := context.WithCancel(ctx)
			errc := make(chan error, 1)
			go func() {
				_, err := b.store.Append(cctx, s, eventstore.Exact(1), eventstore.NewEvent(OrderShipped{OrderID: s}))
				errc <- err
			}()
			results = append(results, errc)
			cancels = append(cancels, cancel)
		}
		waitFor(t, "both appends to queue", func() bool { return eventstore.QueuedAppends(b.store) == 2 })
		releaseLock()
		// A filler may still wait for the ordering lock, which the group
		// holds while it waits on the row: the fillers end after the group.
		t.Cleanup(fillers.Wait)
		waitFor(t, "the group to wait on the locked streams row", func() bool {
			return eventstore.QueuedAppends(b.store) == 0 && rowLockWaiters(t, b) == 1
		})
		return results, cancels, releaseRow
	}

	t.Run("OneMemberGivesUp", func(t *testing.T) {
		t.Parallel()
		b := setup(t, twoInFlight)
		ctx := context.Background()
		results, cancels, releaseRow := sendGroup(t, b, "one")
		cancels[0]()
		err := <-results[0]
		var unknown *eventstore.OutcomeUnknownError
		if !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "may have been written") ||
			!stderrors.Is(err, eventstore.ErrOutcomeUnknown) || !errors.As(err, &unknown) {
			t.Fatalf("the member that gave up: %v, want a cancellation that says the outcome is unknown (ErrOutcomeUnknown)", err)
		}
		// The statement still runs for the other member.
		if n := rowLockWaiters(t, b); n != 1 {
			t.Fatalf("%d statements wait on the row after one member gave up, want 1 (the group's)", n)
		}
		releaseRow()
		if err := <-results[1]; err != nil {
			t.Fatalf("the member that stayed: %v", err)
		}
		defer cancels[1]()
		// The group committed, the append of the member that gave up with it.
		for _, s := range []string{"one-a", "one-b"} {
			if v, err := b.store.StreamVersion(ctx, s); err != nil || v != 2 {
				t.Fatalf("%s at version %d (%v), want 2", s, v, err)
			}
		}
		if n := transactions(t, b, "one-a", "one-b"); n != 3 {
			t.Fatalf("the streams were written by %d transactions, want 3 (two first appends, one group)", n)
		}
		// The error's event IDs (generated by annals) find the stored
		// append: the same event again with them is an idempotent re-append.
		res, err := b.store.Append(ctx, "one-a", eventstore.Exact(1),
			eventstore.EventData{ID: unknown.EventIDs[0], Data: OrderShipped{OrderID: "one-a"}})
		if err != nil || res.StreamVersion != 2 || len(unknown.EventIDs) != 1 || res.Events[0].ID != unknown.EventIDs[0] {
			t.Fatalf("re-append with the error's event IDs %v: %+v (%v), want the stored version 2", unknown.EventIDs, res, err)
		}
		if v, err := b.store.StreamVersion(ctx, "one-a"); err != nil || v != 2 {
			t.Fatalf("one-a at version %d (%v) after the re-append, want 2", v, err)
		}
	})

	t.Run("EveryMemberGivesUp", func(t *testing.T) {
		t.Parallel()
		b := setup(t, twoInFlight)
		ctx := context.Background()
		results, cancels, releaseRow := sendGroup(t, b, "all")
		defer releaseRow()
		for i := range cancels {
			cancels[i]()
			if err := <-results[i]; !errors.Is(err, context.Canceled) || !stderrors.Is(err, eventstore.ErrOutcomeUnknown) {
				t.Fatalf("member %d: %v, want a cancellation whose outcome is unknown", i, err)
			}
		}
		// With nobody left, the statement is cancelled: it stops waiting on
		// the row while the row is still locked, and writes nothing.
		waitFor(t, "the group's statement to be cancelled", func() bool { return rowLockWaiters(t, b) == 0 })
		releaseRow()
		for _, s := range []string{"all-a", "all-b"} {
			if v, err := b.store.StreamVersion(ctx, s); err != nil || v != 1 {
				t.Fatalf("%s at version %d (%v), want 1: the cancelled group wrote", s, v, err)
			}
		}
		// The store still works.
		if _, err := b.store.Append(ctx, "all-a", eventstore.Exact(1), eventstore.NewEvent(OrderShipped{OrderID: "again"})); err != nil {
			t.Fatalf("append after the cancelled group: %v", err)
		}
	})
}

// TestAppendCancelledLone: an append whose context has ended before it is
// queued is never sent, even by a caller with a free slot (it used to send
// its own group, which could commit after Append had returned the bare
// context error), also beside concurrent appenders; a lone append cancelled
// while its statement is on the server is told its outcome is unknown.
func TestAppendCancelledLone(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	ctx := context.Background()

	gone, cancel := context.WithCancel(ctx)
	cancel()
	for round := range 20 {
		var wg sync.WaitGroup
		for w := range 4 {
			wg.Go(func() {
				if _, err := b.store.Append(ctx, fmt.Sprintf("busy-%d-%d", round, w), eventstore.NoStream,
					eventstore.NewEvent(OrderPlaced{OrderID: "busy"})); err != nil {
					t.Error(err)
				}
			})
		}
		stream := fmt.Sprintf("gone-%d", round)
		_, err := b.store.Append(gone, stream, eventstore.NoStream, eventstore.NewEvent(OrderPlaced{OrderID: stream}))
		wg.Wait()
		if !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "nothing was written") ||
			!stderrors.Is(err, eventstore.ErrNotWritten) || stderrors.Is(err, eventstore.ErrOutcomeUnknown) {
			t.Fatalf("round %d: append with an ended context: %v, want a cancellation that says nothing was written", round, err)
		}
		if v, err := b.store.StreamVersion(ctx, stream); !errors.Is(err, eventstore.ErrStreamNotFound) {
			t.Fatalf("round %d: %s at version %d (%v): an append with an ended context was written", round, stream, v, err)
		}
	}

	// On the server: its statement waits on the locked streams row.
	if _, err := b.store.Append(ctx, "held", eventstore.NoStream, eventstore.NewEvent(OrderPlaced{OrderID: "held"})); err != nil {
		t.Fatal(err)
	}
	release := holdStreamRow(t, b, "held")
	cctx, cancelHeld := context.WithCancel(ctx)
	errc := make(chan error, 1)
	go func() {
		_, err := b.store.Append(cctx, "held", eventstore.Exact(1), eventstore.NewEvent(OrderShipped{OrderID: "held"}))
		errc <- err
	}()
	waitFor(t, "the append to wait on the locked streams row", func() bool { return rowLockWaiters(t, b) == 1 })
	cancelHeld()
	err := <-errc
	release()
	if !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "may have been written") ||
		!stderrors.Is(err, eventstore.ErrOutcomeUnknown) || stderrors.Is(err, eventstore.ErrNotWritten) {
		t.Fatalf("a lone append cancelled on the server: %v, want a cancellation that says the outcome is unknown", err)
	}
}

// TestAppendCancellationsLeaveNoSlotTaken: appends cancelled at random
// moments (queued, taken, on their way) never leave the committer without
// a free slot: a group whose queued members had all gone took a slot and
// never gave it back, and later appends waited for ever.
func TestAppendCancellationsLeaveNoSlotTaken(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	ctx := context.Background()
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			for i := range 150 {
				cctx, cancel := context.WithTimeout(ctx, time.Duration((i*37+w*11)%300)*time.Microsecond)
				_, err := b.store.Append(cctx, fmt.Sprintf("c-%d-%d", w, i), eventstore.NoStream, eventstore.NewEvent(OrderPlaced{OrderID: "x"}))
				cancel()
				if err != nil && !errors.Is(err, context.DeadlineExceeded) {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	done := make(chan error, 1)
	go func() {
		_, err := b.store.Append(ctx, "after", eventstore.NoStream, eventstore.NewEvent(OrderPlaced{OrderID: "after"}))
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("an append after the cancellations did not return: the committer has no free slot")
	}
}
