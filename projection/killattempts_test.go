package projection_test

// A runner process killed with SIGKILL between two attempts at a failing
// event: its successor continues the attempt count stored in failures, it
// does not start again at 1.

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/projection"
)

// killAttempt is a failures row.
type killAttempt struct {
	Attempt  int
	Error    string
	FailedAt time.Time
}

// killAttempts returns the failures rows of the balances subscriber for the
// event id, in the order they were written.
func killAttempts(f *fleet, id uuid.UUID) []killAttempt {
	f.t.Helper()
	ctx, cancel := f.ctx()
	defer cancel()
	rows, err := f.b.db.Pool.Query(ctx,
		`SELECT attempt, error, failed_at FROM annals.failures WHERE subscriber_id = $1 AND event_id = $2 ORDER BY id`, f.sub, id)
	if err != nil {
		f.t.Fatalf("read failures: %v", err)
	}
	as, err := pgx.CollectRows(rows, pgx.RowToStructByPos[killAttempt])
	if err != nil {
		f.t.Fatalf("read failures: %v", err)
	}
	return as
}

func killAttemptNumbers(as []killAttempt) []int {
	n := make([]int, len(as))
	for i, a := range as {
		n[i] = a.Attempt
	}
	return n
}

// killDeadLetter is a dead_letters row.
type killDeadLetter struct {
	EventID  uuid.UUID
	Stream   string
	Reason   string
	Status   string
	Attempts int
}

func killDeadLetters(f *fleet) []killDeadLetter {
	f.t.Helper()
	ctx, cancel := f.ctx()
	defer cancel()
	rows, err := f.b.db.Pool.Query(ctx,
		`SELECT event_id, stream_id, reason, status, attempts FROM annals.dead_letters WHERE subscriber_id = $1 ORDER BY global_sequence`, f.sub)
	if err != nil {
		f.t.Fatalf("read dead_letters: %v", err)
	}
	ds, err := pgx.CollectRows(rows, pgx.RowToStructByPos[killDeadLetter])
	if err != nil {
		f.t.Fatalf("read dead_letters: %v", err)
	}
	return ds
}

// TestFailureAttemptsSurviveKill: a child's projection fails every event of
// one stream, with a retry policy of 3 retries 300 ms apart. The child is
// killed with SIGKILL after attempt 2, while it waits for attempt 3; the
// next child makes attempts 3 and 4 and dead-letters the event after the
// 4th, and the other streams' events are applied exactly once across the
// kill.
func TestFailureAttemptsSurviveKill(t *testing.T) {
	t.Parallel()
	const (
		delay  = 300 * time.Millisecond
		poison = "acct-poison"
		each   = 10 // events of the other streams before and after the poison event
	)
	policy := projection.RetryPolicy{MaxRetries: 3, InitialDelay: delay, Multiplier: 1, Jitter: -1}
	f := newFleet(t, childMode{Kind: kindProjection, BatchSize: 100, FailStream: poison, Retry: &policy})

	// each events of three other streams, the poison event, each more: all
	// in the first batch.
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	appendOne := func(stream string, amount int) eventstore.AppendedEvent {
		t.Helper()
		res, err := f.b.store.Append(ctx, stream, eventstore.Any, eventstore.NewEvent(Deposited{Amount: amount}))
		if err != nil {
			t.Fatalf("append to %s: %v", stream, err)
		}
		return res.Events[0]
	}
	var before, after []int64 // positions of the other streams' events
	for i := range each {
		before = append(before, appendOne(fmt.Sprintf("acct-%d", i%3), i+1).GlobalSequence)
	}
	bad := appendOne(poison, 1000)
	for i := range each {
		after = append(after, appendOne(fmt.Sprintf("acct-%d", i%3), 100+i).GlobalSequence)
	}
	head := f.head()
	start := time.Now()

	// The first child applies the events before the poison event, fails it
	// twice and waits to retry: it is killed then.
	k1 := f.start("k1")
	var as []killAttempt
	if _, ok := eventually(15*time.Second, func() bool {
		as = killAttempts(f, bad.ID)
		return len(as) >= 2 || !k1.Alive()
	}); !ok || len(as) < 2 {
		t.Fatalf("attempts %v at the poison event within 15s, want 2; %s is %s", killAttemptNumbers(as), k1.ID, k1.State())
	}
	k1.Kill()
	killed := time.Since(start)
	as = killAttempts(f, bad.ID)
	if got := killAttemptNumbers(as); !slices.Equal(got, []int{1, 2}) {
		t.Fatalf("attempts %v when %s was killed, want [1 2]: the kill must land in the %v wait for attempt 3", got, k1.ID, delay)
	}
	if gap := as[1].FailedAt.Sub(as[0].FailedAt); gap < delay {
		t.Errorf("attempt 2 came %v after attempt 1, want at least the retry delay %v", gap, delay)
	}
	if ds := killDeadLetters(f); len(ds) != 0 {
		t.Fatalf("dead letters %+v before the kill, want none", ds)
	}
	// The events before the poison event were committed on their own, the
	// checkpoint with them.
	cp := f.checkpoint()
	if n := f.appliedBy(k1.ID); n != each || cp.Position != before[each-1] {
		t.Fatalf("after the kill: %s applied %d events, checkpoint %s; want the %d before the poison event, checkpoint at %d",
			k1.ID, n, cp, each, before[each-1])
	}

	// The second child goes on: attempt 3 at once, attempt 4 after the
	// delay, then the dead letter, then the events after it.
	k2 := f.start("k2")
	var ds []killDeadLetter
	var applied int64
	if _, ok := eventually(15*time.Second, func() bool {
		ds = killDeadLetters(f)
		cp = f.checkpoint()
		applied = f.queryInt(`SELECT count(*) FROM applied`)
		return len(ds) > 0 && cp.Position == head && applied == 2*each
	}); !ok {
		t.Fatalf("%s did not finish within 15s: dead letters %+v, checkpoint %s (head %d), %d events applied (want %d), attempts %v; %s is %s%s",
			k2.ID, ds, cp, head, applied, 2*each, killAttemptNumbers(killAttempts(f, bad.ID)), k2.ID, k2.State(), f.doubleApplications())
	}
	t.Logf("killed %s %v after its start; %s dead-lettered the event and caught up %v after the kill",
		k1.ID, killed.Round(time.Millisecond), k2.ID, (time.Since(start) - killed).Round(time.Millisecond))

	// The attempt count continued: 3 and 4 by the second child.
	as = killAttempts(f, bad.ID)
	if got := killAttemptNumbers(as); !slices.Equal(got, []int{1, 2, 3, 4}) {
		t.Errorf("attempts %v, want [1 2 3 4]: the second child must continue the count", got)
	}
	for i, a := range as {
		by := k1.ID
		if i >= 2 {
			by = k2.ID
		}
		if !strings.Contains(a.Error, "child "+by+":") {
			t.Errorf("attempt %d: error %q, want one made by %s", a.Attempt, a.Error, by)
		}
	}
	if len(as) == 4 {
		if gap := as[3].FailedAt.Sub(as[2].FailedAt); gap < delay {
			t.Errorf("attempt 4 came %v after attempt 3, want at least the retry delay %v", gap, delay)
		}
	}
	if len(ds) != 1 {
		t.Fatalf("dead letters %+v, want one", ds)
	}
	if d := ds[0]; d.EventID != bad.ID || d.Stream != poison || d.Reason != "failed" || d.Status != "open" || d.Attempts != 4 {
		t.Errorf("dead letter %+v, want event %s of %s, reason failed, status open, 4 attempts", d, bad.ID, poison)
	}

	// The other streams' events: each applied once, those before the poison
	// event by the first child, those after by the second at a later epoch.
	if n := f.queryInt(`SELECT count(*) FROM annals.events e WHERE e.stream_id <> $1
		AND (SELECT count(*) FROM applied a WHERE a.event_id = e.event_id AND a.global_sequence = e.global_sequence) <> 1`, poison); n != 0 {
		t.Errorf("%d events of the other streams were not applied exactly once", n)
	}
	if n := f.queryInt(`SELECT count(*) FROM applied WHERE event_id = $1`, bad.ID); n != 0 {
		t.Errorf("the poison event was applied %d times", n)
	}
	if n := f.queryInt(`SELECT count(*) FROM applied WHERE instance = $1 AND global_sequence = ANY($2)`, k1.ID, before); n != each {
		t.Errorf("%s applied %d of the %d events before the poison event", k1.ID, n, each)
	}
	if n := f.queryInt(`SELECT count(*) FROM applied WHERE instance = $1 AND global_sequence = ANY($2)
		AND epoch > (SELECT max(epoch) FROM applied WHERE instance = $3)`, k2.ID, after, k1.ID); n != each {
		t.Errorf("%s applied %d of the %d events after the poison event at a later epoch than %s's", k2.ID, n, each, k1.ID)
	}
	// The read model: the other streams' balances are the log's, and the
	// poison stream has none.
	if n := f.queryInt(`
		SELECT count(*) FROM (
		    SELECT stream_id, sum((data->>'amount')::bigint) AS amount, count(*) AS n
		      FROM annals.events WHERE stream_id <> $1 GROUP BY stream_id) w
		  FULL JOIN balances b ON b.account = w.stream_id
		 WHERE w.stream_id IS NULL OR b.account IS NULL OR b.amount <> w.amount OR b.events <> w.n`, poison); n != 0 {
		t.Errorf("%d accounts of the balances read model differ from the log", n)
	}
	f.checkNoDoubleApplication()
}
