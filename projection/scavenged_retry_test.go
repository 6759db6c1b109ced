package projection_test

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/annals-dev/annals/deadletter"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/failure"
	"github.com/annals-dev/annals/projection"
	"github.com/annals-dev/annals/scavenge"
)

// goneNote starts the error of a dead letter skipped because its event is
// no longer in the log.
const goneNote = "not delivered: the event no longer exists in the log"

// goneWarning is the runner's warning when it skips released dead letters
// whose events are gone.
const goneWarning = "released dead letters skipped: their events no longer exist in the log"

// A dead letter whose event a hard delete and a scavenge removed from the
// log: a released one used to hold its partition in re-delivery for ever
// (the re-delivery's read joined the events and found nothing, and every
// batch read still counted it released), so nothing after it was applied
// and Await timed out. Now:
//
//   - ReleasedBeforeScavenge: an operator released it while it still
//     existed (here while no runner ran), then the scavenger removed it.
//     The runner skips it, with the reason in its error, logs one warning,
//     and goes on.
//   - RetriedAfterScavenge: the operator's RetryAll finds its event gone,
//     skips it instead of releasing it, and says so (Change.Gone).
//
// For projections and observers, under ParkStream: the hard delete's
// deletion event is parked behind the failure, a second dead letter of the
// same stream, and goes the same way.
func TestScavengedDeadLetterRetry(t *testing.T) {
	t.Parallel()
	for _, k := range failKinds {
		for _, released := range []bool{true, false} {
			name := k.name + "/RetriedAfterScavenge"
			if released {
				name = k.name + "/ReleasedBeforeScavenge"
			}
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				testScavengedDeadLetterRetry(t, k, released)
			})
		}
	}
}

func testScavengedDeadLetterRetry(t *testing.T, k failKind, releaseFirst bool) {
	ctx := t.Context()
	h := newFailHarness(t)
	const sub = "scavenged"
	handler, _ := h.handler(k, sub, func(_ context.Context, e eventstore.Event, _ int) error {
		if e.StreamID == "bad-1" {
			return failure.Permanent(errNamed("boom"))
		}
		return nil
	})
	reg := failReg{handler, &projection.Options{OnDeadLetter: projection.ParkStream, CheckpointEvery: 1}}
	noRetry := projection.RetryPolicy{MaxRetries: -1}
	dl, err := deadletter.New(h.pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	await := func(run *failRun, pos int64) {
		t.Helper()
		actx, cancel := context.WithTimeout(ctx, failWait)
		defer cancel()
		if err := run.r.Await(actx, sub, pos); err != nil {
			t.Fatalf("Await %d: %v\n%s", pos, err, h.dump())
		}
	}

	run := h.newRunner(noRetry, -1, reg)
	stop := h.start(run)
	evs := h.appendTo("bad-1", "good-1")
	await(run, evs[1].Pos) // bad-1 is dead-lettered
	del, err := h.store.DeleteStream(ctx, "bad-1", eventstore.Any, &eventstore.DeleteOptions{Hard: true})
	if err != nil {
		t.Fatal(err)
	}
	good := h.appendTo("good-1")
	await(run, good[0].Pos) // the deletion event is parked behind it
	dls := h.deadLetters(sub)
	if len(dls) != 2 || dls[0].Pos != evs[0].Pos || dls[1].Pos != del.Events[0].GlobalSequence ||
		dls[0].Status != "open" || dls[1].Status != "open" || dls[1].Reason != "parked" {
		t.Fatalf("dead letters %v, want bad-1's event failed and its deletion parked, open", dls)
	}
	ids := []int64{dls[0].ID, dls[1].ID}

	if releaseFirst {
		// The operator releases them while no runner runs (a deploy, say),
		// and the scavenger removes their events before one starts.
		stop()
		c, err := dl.RetryAll(ctx, sub)
		if err != nil || !slices.Equal(c.Retried, ids) || len(c.Gone) != 0 {
			t.Fatalf("RetryAll: %+v, %v; want %v released", c, err, ids)
		}
	}
	sc, err := scavenge.New(h.pool, &scavenge.Config{Pause: -1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sc.RunOnce(ctx); err != nil {
		t.Fatal(err)
	}
	if n := h.queryInt(`SELECT count(*) FROM annals.events_all WHERE stream_id = 'bad-1'`); n != 0 {
		t.Fatalf("%d events of bad-1 left after the scavenge, want none", n)
	}
	if releaseFirst {
		run = h.newRunner(noRetry, -1, reg)
		h.start(run)
	} else {
		c, err := dl.RetryAll(ctx, sub)
		if err != nil || len(c.Retried) != 0 || !slices.Equal(c.Gone, ids) || !slices.Equal(c.Skipped, ids) || !c.Changed() {
			t.Fatalf("RetryAll after the scavenge: %+v, %v; want %v gone (skipped), none released", c, err, ids)
		}
	}

	after := h.appendTo("good-2")
	await(run, after[0].Pos)
	for _, d := range h.deadLetters(sub) {
		if d.Status != "skipped" || !strings.HasPrefix(d.Error, goneNote) || !strings.Contains(d.Error, "\nlast error: ") {
			t.Errorf("dead letter %v: error %q; want skipped, %q first, then the last error", d, d.Error, goneNote)
		}
	}
	if d := h.deadLetters(sub); len(d) != 2 || !strings.Contains(d[0].Error, "boom") {
		t.Errorf("dead letters %v: want both, bad-1's with its last error (boom) kept", d)
	}
	var applied []string
	for _, e := range h.seen(sub) {
		if strings.HasPrefix(e.String(), "$$") {
			continue // the deletion's record in the metadata stream (migration 0038)
		}
		applied = append(applied, e.String())
	}
	if want := []string{evs[1].String(), good[0].String(), after[0].String()}; !slices.Equal(applied, want) {
		t.Errorf("applied %v, want %v", applied, want)
	}
	warnings := strings.Count(h.logs.tail(1<<20), goneWarning)
	if want := map[bool]int{true: 1, false: 0}[releaseFirst]; warnings != want {
		t.Errorf("%d warnings %q, want %d:\n%s", warnings, goneWarning, want, h.logs.tail(20))
	}
	if n := h.queryInt(`SELECT count(*) FROM annals.dead_letters WHERE status IN ('open', 'retry')`); n != 0 {
		t.Errorf("%d unresolved dead letters left", n)
	}
}

// errNamed is an error with a message and no stack, for the handlers here.
type errNamed string

func (e errNamed) Error() string { return string(e) }
