package projection_test

// Tests of fencing during handler retries and of the rebuild's own lock: a
// live leader retrying a failing event lets go of its lock as soon as a
// rebuild fences it (and records no attempt after the fence); a rebuild
// forgets earlier failed attempts; two rebuilds started together never
// fence each other.

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/advisorylock"
	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/catchup"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/projection"
)

// poisonStream is the stream whose events the poisoned projection fails.
const poisonStream = "rb-poison"

// poisoned is an rbProjection whose handler fails every event of
// poisonStream; if block is set, it first waits for block to close (after
// closing entered once).
type poisoned struct {
	rbProjection
	entered   chan struct{}
	enterOnce sync.Once
	block     chan struct{}
}

func (p *poisoned) Handle(ctx context.Context, tx pgx.Tx, e eventstore.Event) error {
	if e.StreamID != poisonStream {
		return p.rbProjection.Handle(ctx, tx, e)
	}
	if p.block != nil {
		p.enterOnce.Do(func() { close(p.entered) })
		select {
		case <-p.block:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return errors.New("poison")
}

// retryCounter counts the OnRetry and OnDeadLetter hook calls and keeps the
// last retried attempt's number.
type retryCounter struct{ retries, deadLetters, lastAttempt atomic.Int64 }

func (c *retryCounter) hooks() projection.Hooks {
	return projection.Hooks{
		OnRetry: func(_ string, _ eventstore.Event, attempt int, _ error) {
			c.retries.Add(1)
			c.lastAttempt.Store(int64(attempt))
		},
		OnDeadLetter: func(string, eventstore.Event, string, error) { c.deadLetters.Add(1) },
	}
}

// poisonedLive starts a live runner leading p with a retry policy of many
// retries a minute apart, waits until it has caught up with the log, and
// appends one event to poisonStream, which p fails.
func (h *rbHarness) poisonedLive(p *poisoned, counter *retryCounter) {
	h.t.Helper()
	h.poisonedLiveWith(p, counter, false)
}

// poisonedLiveWith is poisonedLive; with mate, the poison event is appended
// after a good event in the same transaction (so they share a batch) and the
// engine's RetryBackoff is a minute.
func (h *rbHarness) poisonedLiveWith(p *poisoned, counter *retryCounter, mate bool) {
	h.t.Helper()
	h.fill(20, 10)
	cfg := testConfig(100 * time.Millisecond)
	if mate {
		cfg.RetryBackoff = time.Minute
	}
	cfg.InstanceID = "live-poisoned"
	cfg.Retry = &projection.RetryPolicy{MaxRetries: 100, InitialDelay: time.Minute, Jitter: -1}
	cfg.Hooks = counter.hooks()
	r, err := projection.NewRunner(h.db.Pool, cfg)
	if err != nil {
		h.t.Fatal(err)
	}
	if err := r.Register(p, rbOptions); err != nil {
		h.t.Fatal(err)
	}
	runInBackground(h.t, r)
	h.waitLiveAt(p.name, r.InstanceID(), 1, 15*time.Second)
	if mate {
		_, err := h.store.Transact(h.t.Context(), func(_ context.Context, _ pgx.Tx, b *eventstore.Batch) error {
			if err := b.Append("rb-mate", eventstore.NoStream, eventstore.EventData{Type: "rb.deposited", Data: map[string]int{"amount": 3}}); err != nil {
				return err
			}
			return b.Append(poisonStream, eventstore.NoStream, eventstore.EventData{Type: "rb.deposited", Data: map[string]int{"amount": 7}})
		})
		if err != nil {
			h.t.Fatal(err)
		}
		return
	}
	// Alone in its batch, so the failure goes straight to the retry path.
	if _, err := h.store.Append(h.t.Context(), poisonStream, eventstore.NoStream,
		eventstore.EventData{Type: "rb.deposited", Data: map[string]int{"amount": 7}}); err != nil {
		h.t.Fatal(err)
	}
}

// waitRebuildQueued waits until a rebuild of sub has fenced its leader and
// waits in the queue of partition 0's lock. The tests above need both: once
// the rebuild is queued, PostgreSQL hands it the released lock and the
// fenced leader's try as a standby fails, so it cannot lead on under a new
// epoch and record an attempt of the poison event. TakeOver queues before it
// fences (catchup/TestTakeOverQueuesBeforeItFences), so the fence implies
// the queue; the pg_locks check states the precondition here too (an
// earlier TakeOver fenced first, and these tests failed in that window).
func (h *rbHarness) waitRebuildQueued(sub string) {
	h.t.Helper()
	annalstest.WaitFor(h.t, 10*time.Second, func() bool {
		return h.queryInt(`SELECT count(*) FROM annals.checkpoints WHERE subscriber_id = $1 AND owner LIKE 'rebuild:%'`, sub) == 1
	})
	k1, k2 := advisorylock.Key(catchup.LockKey("", sub, 0))
	annalstest.WaitFor(h.t, 10*time.Second, func() bool {
		return h.queryInt(`SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND objsubid = 2
		     AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
		     AND classid = ($1::int4::int8 & 4294967295)::oid AND objid = ($2::int4::int8 & 4294967295)::oid`, k1, k2) == 1
	})
}

func (h *rbHarness) failureRows(sub string) int64 {
	return h.queryInt(`SELECT count(*) FROM annals.failures WHERE subscriber_id = $1`, sub)
}

// TestFencedRetryLetsGoForRebuild: the live leader is waiting a minute to
// retry a poison event when a rebuild (with the fixed handler) starts: it
// notices the fence during its wait and lets go, so the rebuild gets the
// lock well within its 10 s LockTimeout; the rebuilt read model is a fresh
// build, and the fenced leader recorded no attempt after the fence.
func TestFencedRetryLetsGoForRebuild(t *testing.T) {
	t.Parallel()
	h := newRBHarness(t)
	const sub = "rb-fenced-wait"
	counter := &retryCounter{}
	h.poisonedLive(&poisoned{rbProjection: rbProjection{name: sub, writer: "live"}}, counter)
	annalstest.WaitFor(t, 15*time.Second, func() bool { return counter.retries.Load() == 1 })
	if n := h.failureRows(sub); n != 1 {
		t.Fatalf("%d failures rows while the leader waits to retry, want 1", n)
	}

	start := time.Now()
	err := h.rebuilder("rebuilder", &rbProjection{name: sub, writer: "rebuild"}, rbOptions).
		Rebuild(t.Context(), sub, &projection.RebuildOptions{LockTimeout: 10 * time.Second})
	if err != nil {
		t.Fatalf("Rebuild while the leader waits to retry: %+v", err)
	}
	t.Logf("rebuilt in %s", time.Since(start))
	head := h.head()
	h.checkReadModel(head)
	if n := h.queryInt(`SELECT count(*) FROM rb_applied WHERE writer <> 'rebuild'`); n != 0 {
		t.Errorf("%d events applied by someone other than the rebuild", n)
	}
	// The reset deleted the attempt recorded before the fence; nothing since.
	if n := h.failureRows(sub); n != 0 {
		t.Errorf("%d failures rows after the rebuild, want 0", n)
	}
	if n, d := counter.retries.Load(), counter.deadLetters.Load(); n != 1 || d != 0 {
		t.Errorf("the live leader recorded %d attempts and %d dead letters; want 1 and 0", n, d)
	}
	// The live instance takes over from the rebuilt checkpoint.
	h.waitLiveAt(sub, "live-poisoned", 1, 15*time.Second)
}

// TestFencedLeaderRecordsNoAttempt: the live leader's handler is running on
// the poison event when a rebuild fences it; the attempt fails after the
// fence, and the leader records nothing (RecordFailure is fenced) and lets
// go at once.
func TestFencedLeaderRecordsNoAttempt(t *testing.T) {
	t.Parallel()
	h := newRBHarness(t)
	const sub = "rb-fenced-record"
	counter := &retryCounter{}
	p := &poisoned{rbProjection: rbProjection{name: sub, writer: "live"}, entered: make(chan struct{}), block: make(chan struct{})}
	h.poisonedLive(p, counter)
	select {
	case <-p.entered:
	case <-time.After(15 * time.Second):
		t.Fatal("the live leader never handled the poison event")
	}

	done := make(chan error, 1)
	go func() {
		done <- h.rebuilder("rebuilder", &rbProjection{name: sub, writer: "rebuild"}, rbOptions).
			Rebuild(context.Background(), sub, &projection.RebuildOptions{LockTimeout: 10 * time.Second})
	}()
	// The rebuild fences the leader, then waits for its lock.
	h.waitRebuildQueued(sub)
	close(p.block) // the attempt fails now, after the fence
	if err := <-done; err != nil {
		t.Fatalf("Rebuild: %+v", err)
	}
	h.checkReadModel(h.head())
	if n := h.failureRows(sub); n != 0 {
		t.Errorf("%d failures rows after the rebuild, want 0", n)
	}
	if n, d := counter.retries.Load(), counter.deadLetters.Load(); n != 0 || d != 0 {
		t.Errorf("the fenced leader recorded %d attempts and %d dead letters; want none", n, d)
	}
}

// TestFencedBatchMateCommitLetsGo: the poison event shares its batch with a
// good one; the leader is blocked in the poison handler when a rebuild fences
// it. Committing the good event alone is then fenced, and that — not the
// handler's error — must reach the engine, which lets go at once instead of
// waiting its RetryBackoff (a minute here) to notice the fence on a re-read.
func TestFencedBatchMateCommitLetsGo(t *testing.T) {
	t.Parallel()
	h := newRBHarness(t)
	const sub = "rb-fenced-mate"
	counter := &retryCounter{}
	p := &poisoned{rbProjection: rbProjection{name: sub, writer: "live"}, entered: make(chan struct{}), block: make(chan struct{})}
	h.poisonedLiveWith(p, counter, true)
	select {
	case <-p.entered:
	case <-time.After(15 * time.Second):
		t.Fatal("the live leader never handled the poison event")
	}
	done := make(chan error, 1)
	go func() {
		done <- h.rebuilder("rebuilder", &rbProjection{name: sub, writer: "rebuild"}, rbOptions).
			Rebuild(context.Background(), sub, &projection.RebuildOptions{LockTimeout: 10 * time.Second})
	}()
	h.waitRebuildQueued(sub)
	close(p.block)
	if err := <-done; err != nil {
		t.Fatalf("Rebuild (the fenced leader kept its lock?): %+v", err)
	}
	h.checkReadModel(h.head())
}

// flaky fails the event at position failAt its first fails times.
type flaky struct {
	rbProjection
	failAt int64
	fails  atomic.Int64
}

func (f *flaky) Handle(ctx context.Context, tx pgx.Tx, e eventstore.Event) error {
	if e.GlobalSequence == f.failAt && f.fails.Add(-1) >= 0 {
		return errors.New("transient")
	}
	return f.rbProjection.Handle(ctx, tx, e)
}

// TestRebuildForgetsEarlierAttempts: an event that spent its retries before
// the rebuild (and was skipped) fails once, transiently, during the replay:
// it is retried, not dead-lettered at its first failure, and the rebuilt
// read model has it.
func TestRebuildForgetsEarlierAttempts(t *testing.T) {
	t.Parallel()
	h := newRBHarness(t)
	h.fill(20, 10)
	const sub = "rb-forget"
	counter := &retryCounter{}
	cfg := testConfig(100 * time.Millisecond)
	cfg.Retry = &projection.RetryPolicy{MaxRetries: 2}
	cfg.Clock = immediateClock{}
	cfg.Hooks = counter.hooks()
	r, err := projection.NewRunner(h.db.Pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	p := &flaky{rbProjection: rbProjection{name: sub, writer: "rebuild"}, failAt: 4}
	if err := r.Register(p, &projection.Options{Types: rbOptions.Types, OnDeadLetter: projection.SkipEvent}); err != nil {
		t.Fatal(err)
	}
	p.fails.Store(3) // every attempt of the first run
	if err := r.RunUntilCaughtUp(t.Context()); err != nil {
		t.Fatal(err)
	}
	if n, d := h.failureRows(sub), counter.deadLetters.Load(); n != 3 || d != 1 {
		t.Fatalf("before the rebuild: %d failures rows and %d dead letters; want 3 and 1", n, d)
	}

	p.fails.Store(1) // one transient failure during the replay
	counter.retries.Store(0)
	if err := r.Rebuild(t.Context(), sub, &projection.RebuildOptions{LockTimeout: 10 * time.Second}); err != nil {
		t.Fatalf("Rebuild: %+v", err)
	}
	h.checkReadModel(h.head())
	if d := counter.deadLetters.Load(); d != 1 {
		t.Errorf("%d dead letters during the rebuild; want none", d-1)
	}
	if n, a := counter.retries.Load(), counter.lastAttempt.Load(); n != 1 || a != 1 {
		t.Errorf("during the rebuild: %d retries, the last of attempt %d; want 1, attempt 1 of a fresh count", n, a)
	}
	if rows := h.failureRows(sub); rows != 0 {
		t.Errorf("%d failures rows after the rebuild; want none (the retried event succeeded)", rows)
	}
}

// TestConcurrentRebuilds: two rebuilds of the same projection started
// together (from two runner instances), over a few rounds: in each, exactly
// one runs and the other fails at once with ErrRebuildRunning (never
// checkpoint.ErrFenced halfway), and the read model is a fresh build.
func TestConcurrentRebuilds(t *testing.T) {
	t.Parallel()
	h := newRBHarness(t)
	h.fill(400, 100)
	const sub = "rb-concurrent"
	a := h.rebuilder("rebuilder-a", &rbProjection{name: sub, writer: "a"}, &projection.Options{Types: rbOptions.Types, Partitions: 2})
	b := h.rebuilder("rebuilder-b", &rbProjection{name: sub, writer: "b"}, &projection.Options{Types: rbOptions.Types, Partitions: 2})
	for round := range 4 {
		start := make(chan struct{})
		errs := make([]error, 2)
		returned := []chan struct{}{make(chan struct{}), make(chan struct{})}
		var wg sync.WaitGroup
		for i, r := range []*projection.Runner{a, b} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer close(returned[i])
				<-start
				var once sync.Once
				errs[i] = r.Rebuild(t.Context(), sub, &projection.RebuildOptions{BatchSize: 50, LockTimeout: 10 * time.Second,
					OnProgress: func(projection.RebuildProgress) {
						// Still running when the other has returned: the two overlap.
						once.Do(func() {
							select {
							case <-returned[1-i]:
							case <-time.After(10 * time.Second):
							}
						})
					}})
			}()
		}
		close(start)
		wg.Wait()
		ok, running := 0, 0
		for _, err := range errs {
			switch {
			case err == nil:
				ok++
			case errors.Is(err, projection.ErrRebuildRunning):
				running++
			default:
				t.Errorf("round %d: Rebuild: %v", round, err)
			}
		}
		if ok != 1 || running != 1 {
			t.Fatalf("round %d: %d rebuilds succeeded and %d were refused (%v); want 1 and 1", round, ok, running, errs)
		}
		h.checkReadModel(h.head())
		if n := h.queryInt(`SELECT count(DISTINCT writer) FROM rb_applied`); n != 1 {
			t.Errorf("round %d: the read model was written by %d rebuilds", round, n)
		}
	}
}
