package natsconsumer_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/relay"
	"github.com/annals-dev/annals/relay/natsconsumer"
)

// TestALogRewoundTwiceStopsAConsumerOfTheFirstStream: the log is rewound
// twice, each time under another stream. Stream A (positions 1..15) is
// found rewound at 10 (the log restored there, 15 new events at 11..25);
// stream B, made anew, is stamped with A's rewind. B is found rewound in
// turn at 20 (the log restored again, 20 new events at 21..40), and C is
// made. A consumer placed in A at 15, offline through both, handled
// events 11..15 the log lost in the first rewind: moving to C, it stops at
// once with ErrLogRewound, agreed 10, naming A, though the rewind C's
// relay found last was B's at 20. A consumer placed in B at 25 stops by
// B's rewind (agreed 20); one placed in B at 18 goes on and handles C's
// 19..40. Before, the relay replaced A's rewind by B's, C was stamped with
// B's alone, and the consumer at 15 (not past 20) moved to C: it
// acknowledged C's 11..14 without handling them, as events handled before,
// and stopped only at 15, the event there another than the one it handled.
func TestALogRewoundTwiceStopsAConsumerOfTheFirstStream(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	old, low, mid := tallyIn("old_tally"), tallyIn("low_tally"), tallyIn("mid_tally")
	for _, p := range []tallyIn{old, low, mid} {
		if _, err := e.dst.Pool.Exec(ctx, fmt.Sprintf(`CREATE TABLE %s (pos bigint PRIMARY KEY, n int NOT NULL)`, pgx.Identifier{string(p)}.Sanitize())); err != nil {
			t.Fatal(err)
		}
	}
	run := func(p tallyIn) func() error {
		c, err := natsconsumer.New(ctx, e.nc, &natsconsumer.Config{Durable: string(p), Batch: 4, RetryBackoff: 50 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		return start(ctx, func(ctx context.Context) error { return c.RunProjection(ctx, e.dst.Pool, p) })
	}
	project := func(p tallyIn, want string) {
		t.Helper()
		stop := run(p)
		annalstest.WaitFor(t, 20*time.Second, func() bool { return p.tallied(ctx, e.dst.Pool) == want })
		if err := stop(); err != nil {
			t.Fatal(err)
		}
	}
	created := func() time.Time {
		t.Helper()
		s, err := e.js.Stream(ctx, "ANNALS")
		if err != nil {
			t.Fatal(err)
		}
		return s.CachedInfo().Created
	}
	// rewind leaves the log as restored at keep, appends n new events, and
	// publishes it into a stream made anew after the relay's refusal, as
	// the operator does (a relay process started after: the rewinds are
	// recorded in the database).
	rewind := func(keep int64, n int) {
		t.Helper()
		annalstest.RewindLog(t, e.src.Pool, "annals", keep)
		e.appendEvents(t, ctx, n)
		r, err := relay.New(e.src.Pool, e.nc, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := r.CatchUp(ctx); !errors.Is(err, relay.ErrStreamMismatch) || !strings.Contains(err.Error(), fmt.Sprintf("last agree at position %d", keep)) {
			t.Fatalf("the relay on the log rewound to %d: %v; want ErrStreamMismatch, saying where they agree", keep, err)
		}
		e.deleteStream(t, ctx)
		if _, err := e.src.Pool.Exec(ctx, `UPDATE annals.checkpoints SET position = 0 WHERE subscriber_id = 'relay'`); err != nil {
			t.Fatal(err)
		}
		if e.r, err = relay.New(e.src.Pool, e.nc, nil); err != nil {
			t.Fatal(err)
		}
		if err := e.r.CatchUp(ctx); err != nil {
			t.Fatal(err)
		}
	}

	e.appendAndRelay(t, ctx, 15)
	streamA := created()
	project(old, once(15))

	rewind(10, 8) // 11..18 new
	streamB := created()
	project(low, once(18))
	e.appendAndRelay(t, ctx, 7) // 19..25
	project(mid, once(25))

	rewind(20, 20) // 21..40 new

	stopped := func(p tallyIn, at, agreed int64, was time.Time) {
		t.Helper()
		c, err := natsconsumer.New(ctx, e.nc, &natsconsumer.Config{Durable: string(p), Batch: 4, RetryBackoff: 50 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		rctx, cancel := context.WithTimeout(ctx, 20*time.Second) // not stopping: the deadline's error
		defer cancel()
		err = c.RunProjection(rctx, e.dst.Pool, p)
		var rw *natsconsumer.RewoundError
		if !errors.Is(err, natsconsumer.ErrLogRewound) || !errors.As(err, &rw) || !rw.Stamped || rw.Position != at || rw.Agreed != agreed || !rw.Was.Equal(was) {
			t.Fatalf("the consumer at %d: %v (%+v); want ErrLogRewound from the stamp of the stream made anew, at %d, agreed %d, of the stream made at %v",
				at, err, rw, at, agreed, was)
		}
		if c, err := e.js.Consumer(ctx, "ANNALS", string(p)); err != nil || c.CachedInfo().AckFloor.Stream != 0 {
			t.Errorf("the consumer at %d acknowledged messages of the stream made anew (%v)", at, err)
		}
		if got := p.tallied(ctx, e.dst.Pool); got != once(int(at)) {
			t.Errorf("the read model at %d holds %s after the stop, want 1..%d once", at, got, at)
		}
	}
	// Placed in A, past A's rewind (10), not B's (20).
	stopped(old, 15, 10, streamA)
	// Placed in B, past B's rewind.
	stopped(mid, 25, 20, streamB)
	// Placed in B, at or below B's rewind: A's does not concern it.
	project(low, once(40))
}
