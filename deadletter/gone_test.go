package deadletter_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/annals-dev/annals/deadletter"
)

// goneNote starts the error of a dead letter skipped because its event is
// no longer in the log.
const goneNote = "not delivered: the event no longer exists in the log"

// TestDeadLetterRetryGone: a dead letter whose event is no longer in the log
// (a hard delete and scavenge, a truncation or retention removed it; here:
// positions above 50, which setup never appended) cannot be re-delivered.
// Released, it used to hold its subscriber partition in re-delivery for
// ever. Retry, RetryAll and Skip (which releases the rest of the stream)
// skip it instead, with why in front of its error, and report it in
// Change.Gone (and Skipped); the rest of its stream is released as before.
func TestDeadLetterRetryGone(t *testing.T) {
	t.Parallel()
	ctx := t.Context()

	t.Run("Retry", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		failed := b.add(t, deadletter.DeadLetter{GlobalSequence: 60, Attempts: 1, Error: "boom"})
		parked := b.add(t, deadletter.DeadLetter{GlobalSequence: 61, Reason: deadletter.ReasonParked, Error: "parked"})
		later := b.add(t, deadletter.DeadLetter{GlobalSequence: 40, StreamID: "order-1", Reason: deadletter.ReasonParked})
		b.halt(t, "orders", 0, "handler failed at position 60")
		c, err := b.store.Retry(ctx, failed)
		if err != nil {
			t.Fatal(err)
		}
		// The positions sort the order of re-delivery: 40 exists, 60 and 61 are gone.
		if c.Was != deadletter.StatusOpen || !slices.Equal(c.Retried, []int64{later}) ||
			!slices.Equal(c.Gone, []int64{failed, parked}) || !slices.Equal(c.Skipped, []int64{failed, parked}) ||
			len(c.Resumed) != 1 || !c.Changed() {
			t.Fatalf("Retry: %+v; want %d released, %d and %d gone (skipped), the partition resumed", c, later, failed, parked)
		}
		st := b.statuses(t)
		if st[failed] != deadletter.StatusSkipped || st[parked] != deadletter.StatusSkipped || st[later] != deadletter.StatusRetry {
			t.Errorf("statuses %v", st)
		}
		d, err := b.store.Get(ctx, failed)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(d.Error, goneNote) || !strings.HasSuffix(d.Error, "\nlast error: boom") {
			t.Errorf("error of the gone dead letter: %q; want %q first, then the last error", d.Error, goneNote)
		}
		// Idempotent: nothing left to do.
		if c, err := b.store.Retry(ctx, failed); err != nil || c.Changed() || c.Was != deadletter.StatusSkipped {
			t.Errorf("Retry again: %+v, %v", c, err)
		}
	})

	t.Run("RetryAll", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		gone0 := b.add(t, deadletter.DeadLetter{GlobalSequence: 70, Error: "boom"})
		kept := b.add(t, deadletter.DeadLetter{GlobalSequence: 5, StreamID: "order-2"})
		gone1 := b.add(t, deadletter.DeadLetter{GlobalSequence: 71, Partition: 1, StreamID: "order-3"})
		other := b.add(t, deadletter.DeadLetter{GlobalSequence: 72, Subscriber: "mailer"})
		c, err := b.store.RetryAll(ctx, "orders")
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(c.Retried, []int64{kept}) || !slices.Equal(c.Gone, []int64{gone0, gone1}) || !slices.Equal(c.Skipped, c.Gone) {
			t.Fatalf("RetryAll: %+v; want %d released, %d and %d gone (skipped)", c, kept, gone0, gone1)
		}
		st := b.statuses(t)
		if st[gone0] != deadletter.StatusSkipped || st[gone1] != deadletter.StatusSkipped || st[kept] != deadletter.StatusRetry ||
			st[other] != deadletter.StatusOpen {
			t.Errorf("statuses %v", st)
		}
		if c, err := b.store.RetryAll(ctx, "orders"); err != nil || c.Changed() {
			t.Errorf("RetryAll again: %+v, %v", c, err)
		}
	})

	t.Run("Skip", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		failed := b.add(t, deadletter.DeadLetter{GlobalSequence: 10, Error: "boom"})
		parkedGone := b.add(t, deadletter.DeadLetter{GlobalSequence: 80, Reason: deadletter.ReasonParked})
		parked := b.add(t, deadletter.DeadLetter{GlobalSequence: 20, Reason: deadletter.ReasonParked})
		c, err := b.store.Skip(ctx, failed)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(c.Skipped, []int64{failed, parkedGone}) || !slices.Equal(c.Gone, []int64{parkedGone}) ||
			!slices.Equal(c.Retried, []int64{parked}) {
			t.Fatalf("Skip: %+v; want %d skipped, %d gone (skipped), %d released", c, failed, parkedGone, parked)
		}
		// The skipped one keeps its error: it was the operator's choice.
		if d, err := b.store.Get(ctx, failed); err != nil || d.Error != "boom" {
			t.Errorf("skipped dead letter: %+v, %v", d, err)
		}
	})
}
