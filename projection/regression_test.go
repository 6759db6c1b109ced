package projection_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/errors"

	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/projection"
)

// Regressions for bugs found in review.

// RunUntilCaughtUp whose context ends before it has caught up reports it,
// instead of returning nil with the checkpoint behind the head.
func TestRunUntilCaughtUpReportsAnUnfinishedCatchUp(t *testing.T) {
	t.Parallel()
	h := newFailHarness(t)
	streams := make([]string, 30)
	for i := range streams {
		streams[i] = "s"
	}
	h.appendTo(streams...)
	handler, _ := h.handler(failKinds[1], "slow", func(ctx context.Context, e eventstore.Event, call int) error {
		select { // a slow side effect
		case <-time.After(100 * time.Millisecond):
		case <-ctx.Done():
		}
		return nil
	})
	run := h.newRunner(projection.RetryPolicy{}, -1, failReg{handler, &projection.Options{BatchSize: 5}})
	ctx, cancel := context.WithTimeout(context.Background(), 700*time.Millisecond)
	defer cancel()
	err := run.r.RunUntilCaughtUp(ctx)
	pos, _ := h.checkpoint("slow")
	if pos >= 30 {
		t.Fatalf("the catch-up finished (checkpoint %d): the test proves nothing", pos)
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("RunUntilCaughtUp = %v with the checkpoint at %d of 30; want a deadline error", err, pos)
	}
	if pos == 0 {
		t.Fatalf("the observer's progress was not flushed when its context ended")
	}
}

// An event read again after it was dead-lettered (here: an operator moved
// the checkpoint back) keeps its dead letter's reason and error; it is not
// "parked behind itself".
func TestDeadLetterIsNotDowngradedToParked(t *testing.T) {
	t.Parallel()
	for _, k := range failKinds {
		t.Run(k.name, func(t *testing.T) {
			t.Parallel()
			h := newFailHarness(t)
			h.appendTo("ok", "bad", "ok")
			handler, _ := h.handler(k, "p", failOn("bad", 1))
			run := h.newRunner(projection.RetryPolicy{MaxRetries: -1}, -1, failReg{handler, &projection.Options{OnDeadLetter: projection.ParkStream}})
			if err := run.catchUp(); err != nil {
				t.Fatal(err)
			}
			before := h.deadLetters("p")
			if len(before) != 1 || before[0].Reason != "failed" {
				t.Fatalf("dead letters before the rewind: %v", before)
			}
			if _, err := h.pool.Exec(context.Background(), `UPDATE annals.checkpoints SET position = 0, epoch = epoch + 1 WHERE subscriber_id = 'p'`); err != nil {
				t.Fatal(err)
			}
			if err := run.catchUp(); err != nil {
				t.Fatal(err)
			}
			// (The test projection refuses to apply an event twice, so the
			// rewind dead-letters the replayed "ok" events of a projection
			// too; what matters here is the entry of "bad".)
			for _, d := range h.deadLetters("p") {
				if d.Stream == "bad" && (d.Reason != "failed" || !strings.Contains(d.Error, "cannot handle bad v1")) {
					t.Fatalf("after the rewind the dead letter of bad is %v (error %q)", d, d.Error)
				}
			}
		})
	}
}

// An error text PostgreSQL cannot store (a NUL byte, invalid UTF-8) is still
// recorded and dead-lettered instead of making its own recording fail.
func TestUnstorableErrorTextIsRecorded(t *testing.T) {
	t.Parallel()
	for _, k := range failKinds {
		t.Run(k.name, func(t *testing.T) {
			t.Parallel()
			h := newFailHarness(t)
			h.appendTo("ok", "bad", "ok")
			handler, _ := h.handler(k, "nul", func(_ context.Context, e eventstore.Event, call int) error {
				if e.StreamID == "bad" {
					return errors.New("bad byte \x00 and \xff here")
				}
				return nil
			})
			run := h.newRunner(projection.RetryPolicy{MaxRetries: -1}, -1, failReg{handler, &projection.Options{OnDeadLetter: projection.SkipEvent}})
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := run.r.RunUntilCaughtUp(ctx); err != nil {
				t.Fatal(err)
			}
			dls := h.deadLetters("nul")
			if len(dls) != 1 || !strings.Contains(dls[0].Error, `bad byte \x00 and`) {
				t.Fatalf("dead letters %v", dls)
			}
			if n := h.queryInt(`SELECT count(*) FROM annals.failures WHERE subscriber_id = 'nul'`); n != 1 {
				t.Fatalf("%d failures rows, want 1", n)
			}
		})
	}
}
