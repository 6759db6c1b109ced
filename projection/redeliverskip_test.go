package projection_test

import (
	"context"
	"testing"
	"time"

	"github.com/cockroachdb/errors"

	"github.com/annals-dev/annals/deadletter"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/projection"
)

// redeliverSkipSetup dead-letters one event of a subscriber of kind k whose handler
// fails the first delivery and blocks the re-delivery (until release, or
// until its context ends unless ignoreCtx), releases the dead letter and
// waits until the handler is blocked in its re-delivery. It returns the
// dead letter's ID.
func redeliverSkipSetup(t *testing.T, h *failHarness, k failKind, opts *projection.Options, ignoreCtx bool) (id int64, release chan struct{}) {
	t.Helper()
	inHandler := make(chan struct{}, 1)
	release = make(chan struct{})
	sub, _ := h.handler(k, "obs", func(ctx context.Context, _ eventstore.Event, call int) error {
		if call == 1 {
			return errors.New("first delivery fails")
		}
		inHandler <- struct{}{}
		if ignoreCtx {
			<-release
			return nil
		}
		select {
		case <-release:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	})
	h.start(h.newRunner(projection.RetryPolicy{MaxRetries: -1}, -1, failReg{sub, opts}))
	t.Cleanup(func() {
		select {
		case <-release:
		default:
			close(release)
		}
	})
	h.appendTo("a")
	h.waitFor(failWait, "the dead letter", func() bool { return len(h.deadLetters("obs")) == 1 })
	id = h.deadLetters("obs")[0].ID
	dl, err := deadletter.New(h.pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := dl.Retry(t.Context(), id); err != nil {
		t.Fatal(err)
	}
	select {
	case <-inHandler:
	case <-time.After(failWait):
		t.Fatalf("no re-delivery within %v:\n%s", failWait, h.dump())
	}
	return id, release
}

// skipAsync runs an operator's Skip of id in the background.
func skipAsync(t *testing.T, h *failHarness, id int64) <-chan deadletter.Change {
	t.Helper()
	dl, err := deadletter.New(h.pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan deadletter.Change, 1)
	go func() {
		c, err := dl.Skip(context.Background(), id)
		if err != nil {
			t.Errorf("Skip: %v", err)
		}
		done <- c
	}()
	return done
}

// An operator's Skip of a dead letter while its re-delivery's handler runs
// waits for the re-delivery, then finds the entry resolved and changes
// nothing. For an observer it used to succeed at once (Was: retry), the
// handler's side effect happened all the same, and the entry stayed
// "skipped" (resolved without delivery) although its event was delivered.
// (A projection's re-delivery then rolled back, its entry skipped and not
// applied, and the runner logged an error and waited a retry interval.)
func TestRedeliverySkipWaits(t *testing.T) {
	t.Parallel()
	for _, k := range failKinds {
		t.Run(k.name, func(t *testing.T) {
			t.Parallel()
			h := newFailHarness(t)
			id, release := redeliverSkipSetup(t, h, k, &projection.Options{OnDeadLetter: projection.ParkStream}, false)
			done := skipAsync(t, h, id)
			// The Skip waits on the dead letter's row lock.
			h.waitFor(failWait, "the Skip to wait for the re-delivery's lock", func() bool {
				return h.queryInt(`SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'`) > 0
			})
			close(release)
			var c deadletter.Change
			select {
			case c = <-done:
			case <-time.After(failWait):
				t.Fatalf("Skip did not return within %v after the re-delivery", failWait)
			}
			if c.Was != deadletter.StatusResolved || c.Changed() {
				t.Errorf("Skip during the re-delivery: %+v, want Was resolved and no change", c)
			}
			if d := h.deadLetters("obs")[0]; d.Status != "resolved" {
				t.Errorf("dead letter %v, want resolved", d)
			}
			if seen := h.seen("obs"); len(seen) != 1 {
				t.Errorf("%s handled %v, want the event once", k.name, seen)
			}
		})
	}
}

// A handler that ignores its context and overruns HandlerTimeout does not
// hold the dead letter's lock for longer than the timeout and a few
// seconds: the server ends the re-delivery's session, and the operator's
// Skip goes through.
func TestRedeliveryLockBoundedObserver(t *testing.T) {
	t.Parallel()
	h := newFailHarness(t)
	const timeout = 200 * time.Millisecond
	id, release := redeliverSkipSetup(t, h, failKinds[1], &projection.Options{HandlerTimeout: timeout}, true)
	start := time.Now()
	done := skipAsync(t, h, id)
	var c deadletter.Change
	select {
	case c = <-done:
	case <-time.After(timeout + 20*time.Second):
		t.Fatalf("Skip still waits %v after the handler overran its timeout", time.Since(start))
	}
	close(release)
	if c.Was != deadletter.StatusRetry || len(c.Skipped) != 1 {
		t.Errorf("Skip after the bound: %+v, want Was retry and the entry skipped", c)
	}
	t.Logf("Skip waited %v", time.Since(start).Round(time.Millisecond))
}
