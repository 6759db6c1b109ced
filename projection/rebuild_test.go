package projection_test

// Tests of Runner.Rebuild: a rebuild while another runner instance leads the
// subscriber live, crashed rebuilds continued by the live instance, the
// atomicity of the reset, partitions, and bad input.

import (
	"context"
	"fmt"
	"strings"
	"sync"
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

// rbHarness is a database whose read model rb_applied has one row per
// applied event, with the number of times it was applied (n) and the
// projection instance that applied it last (writer).
type rbHarness struct {
	t       *testing.T
	db      *annalstest.DB
	store   *eventstore.Store
	streams int // streams appended so far
}

const rbTables = `
CREATE TABLE rb_applied (
    event_id        uuid   PRIMARY KEY,
    global_sequence bigint NOT NULL,
    stream_id       text   NOT NULL,
    amount          bigint NOT NULL,
    writer          text   NOT NULL,
    n               int    NOT NULL
);`

func newRBHarness(t *testing.T) *rbHarness {
	t.Helper()
	db := annalstest.NewDB(t, nil)
	store, err := eventstore.New(db.Pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(t.Context(), rbTables); err != nil {
		t.Fatal(err)
	}
	return &rbHarness{t: t, db: db, store: store}
}

// rbProjection counts applications per event into rb_applied; it reads only
// rb.deposited events (the harness also appends rb.noise).
type rbProjection struct {
	name   string
	writer string
	// beforeReset, if set, runs first in Reset.
	beforeReset func(ctx context.Context, tx pgx.Tx) error
}

func (p *rbProjection) Name() string { return p.name }

func (p *rbProjection) Handle(ctx context.Context, tx pgx.Tx, e eventstore.Event) error {
	_, err := tx.Exec(ctx, `INSERT INTO rb_applied VALUES ($1, $2, $3, ($4::json ->> 'amount')::bigint, $5, 1)
		ON CONFLICT (event_id) DO UPDATE SET n = rb_applied.n + 1, writer = $5`,
		e.ID, e.GlobalSequence, e.StreamID, string(e.Data), p.writer)
	return err
}

func (p *rbProjection) Reset(ctx context.Context, tx pgx.Tx) error {
	if p.beforeReset != nil {
		if err := p.beforeReset(ctx, tx); err != nil {
			return err
		}
	}
	_, err := tx.Exec(ctx, `DELETE FROM rb_applied`)
	return err
}

var rbOptions = &projection.Options{Types: []string{"rb.deposited"}}

// fill appends n rb.deposited events (and one rb.noise event per stream, not
// read by the projection) in new streams of perStream events, one
// append_events call each, with the payload built by the server.
func (h *rbHarness) fill(n, perStream int) {
	h.t.Helper()
	for ; n > 0; h.streams++ {
		k := min(perStream, n)
		var got int
		err := h.db.Pool.QueryRow(h.t.Context(), `
			SELECT count(*) FROM annals.append_events($1, 0, (
			  SELECT jsonb_agg(jsonb_build_object('event_id', gen_random_uuid(),
			           'type', CASE WHEN i < $2 THEN 'rb.deposited' ELSE 'rb.noise' END,
			           'data', jsonb_build_object('amount', $3::int + i)) ORDER BY i)
			    FROM generate_series(0, $2) i))`,
			fmt.Sprintf("rb-%d", h.streams), k, h.streams*perStream).Scan(&got)
		if err != nil {
			h.t.Fatal(err)
		}
		if got != k+1 {
			h.t.Fatalf("appended %d events, want %d", got, k+1)
		}
		n -= k
	}
}

func (h *rbHarness) queryInt(sql string, args ...any) int64 {
	h.t.Helper()
	var n int64
	if err := h.db.Pool.QueryRow(h.t.Context(), sql, args...).Scan(&n); err != nil {
		h.t.Fatalf("%s: %v", strings.Join(strings.Fields(sql), " "), err)
	}
	return n
}

func (h *rbHarness) head() int64 {
	return h.queryInt(`SELECT coalesce(max(global_sequence), 0) FROM annals.events`)
}

// checkpointOf returns the summed position over the partitions (-1 without rows) and the owners.
func (h *rbHarness) checkpointOf(sub string) (int64, []string) {
	h.t.Helper()
	rows, err := h.db.Pool.Query(h.t.Context(), `SELECT position, coalesce(owner, '') FROM annals.checkpoints WHERE subscriber_id = $1 ORDER BY partition`, sub)
	if err != nil {
		h.t.Fatal(err)
	}
	var pos, p int64 = -1, 0
	var owner string
	var owners []string
	_, err = pgx.ForEachRow(rows, []any{&p, &owner}, func() error {
		if pos < 0 {
			pos = 0
		}
		pos += p
		owners = append(owners, owner)
		return nil
	})
	if err != nil {
		h.t.Fatal(err)
	}
	return pos, owners
}

// checkReadModel fails the test unless rb_applied holds exactly the
// rb.deposited events through `through`, each applied once, with its data:
// what a fresh build from the log gives.
func (h *rbHarness) checkReadModel(through int64) {
	h.t.Helper()
	if bad := h.queryInt(`SELECT count(*) FROM rb_applied WHERE n <> 1`); bad != 0 {
		h.t.Fatalf("%d events applied more than once", bad)
	}
	diff := h.queryInt(`
		SELECT count(*) FROM (
		  SELECT event_id, global_sequence, stream_id, (data ->> 'amount')::bigint AS amount
		    FROM annals.events WHERE event_type = 'rb.deposited' AND global_sequence <= $1
		  EXCEPT SELECT event_id, global_sequence, stream_id, amount FROM rb_applied
		) missing`, through)
	extra := h.queryInt(`
		SELECT count(*) FROM (
		  SELECT event_id, global_sequence, stream_id, amount FROM rb_applied
		  EXCEPT SELECT event_id, global_sequence, stream_id, (data ->> 'amount')::bigint
		    FROM annals.events WHERE event_type = 'rb.deposited' AND global_sequence <= $1
		) extra`, through)
	if diff != 0 || extra != 0 {
		h.t.Fatalf("read model differs from a fresh build through %d: %d events missing, %d extra or wrong", through, diff, extra)
	}
}

// liveRunner runs a runner with p in the background, as a live instance.
func (h *rbHarness) liveRunner(id string, p *rbProjection, opts *projection.Options) *projection.Runner {
	h.t.Helper()
	cfg := testConfig(100 * time.Millisecond)
	cfg.InstanceID = id
	r, err := projection.NewRunner(h.db.Pool, cfg)
	if err != nil {
		h.t.Fatal(err)
	}
	if err := r.Register(p, opts); err != nil {
		h.t.Fatal(err)
	}
	runInBackground(h.t, r)
	return r
}

// rebuilder returns a runner (not running) with p registered, to rebuild with.
func (h *rbHarness) rebuilder(id string, p any, opts *projection.Options) *projection.Runner {
	h.t.Helper()
	cfg := testConfig(100 * time.Millisecond)
	cfg.InstanceID = id
	r, err := projection.NewRunner(h.db.Pool, cfg)
	if err != nil {
		h.t.Fatal(err)
	}
	if err := r.Register(p, opts); err != nil {
		h.t.Fatal(err)
	}
	return r
}

// waitCaughtUp waits until every partition's checkpoint is owned by owner
// and the summed positions... (for one partition: the position is the head).
func (h *rbHarness) waitLiveAt(sub, owner string, parts int, timeout time.Duration) {
	h.t.Helper()
	annalstest.WaitForErr(h.t, timeout, func() error {
		head := h.head()
		rows, err := h.db.Pool.Query(h.t.Context(), `SELECT position, coalesce(owner, '') FROM annals.checkpoints WHERE subscriber_id = $1`, sub)
		if err != nil {
			return err
		}
		var pos int64
		var o string
		n := 0
		_, err = pgx.ForEachRow(rows, []any{&pos, &o}, func() error {
			n++
			if o != owner || pos != head {
				return errors.Newf("partition at %d owned by %q; want %d owned by %q", pos, o, head, owner)
			}
			return nil
		})
		if err == nil && n != parts {
			err = errors.Newf("%d checkpoint rows, want %d", n, parts)
		}
		return err
	})
}

// TestRebuildWhileLive rebuilds 100,000 events while another runner instance
// leads the subscriber: the live instance stands by during the rebuild and
// takes over afterwards; the read model equals a fresh build, with every
// event applied exactly once; progress reaches done == total.
func TestRebuildWhileLive(t *testing.T) {
	t.Parallel()
	const events = 100_000
	h := newRBHarness(t)
	start := time.Now()
	h.fill(events, 1000)
	head := h.head()
	t.Logf("filled %d events in %s", events, time.Since(start))

	// The live instance starts with a broken read model at the head: the
	// rebuild must replace it, not add to it.
	const sub = "rb-live"
	if _, err := h.db.Pool.Exec(t.Context(), `INSERT INTO annals.checkpoints (subscriber_id, partition, position, epoch) VALUES ($1, 0, $2, 1)`, sub, head); err != nil {
		t.Fatal(err)
	}
	if _, err := h.db.Pool.Exec(t.Context(), `INSERT INTO rb_applied SELECT event_id, global_sequence, stream_id, 0, 'stale', 7 FROM annals.events WHERE global_sequence % 3 = 0`); err != nil {
		t.Fatal(err)
	}
	live := h.liveRunner("live-1", &rbProjection{name: sub, writer: "live"}, rbOptions)
	h.waitLiveAt(sub, live.InstanceID(), 1, 10*time.Second)

	var (
		mu       sync.Mutex
		progress []projection.RebuildProgress
		during   = make(chan struct{})
		appended = make(chan error, 1)
	)
	rb := h.rebuilder("rebuilder", &rbProjection{name: sub, writer: "rebuild"}, rbOptions)
	start = time.Now()
	err := rb.Rebuild(t.Context(), sub, &projection.RebuildOptions{
		BatchSize:   5000,
		LockTimeout: 20 * time.Second,
		OnProgress: func(p projection.RebuildProgress) {
			mu.Lock()
			progress = append(progress, p)
			first := len(progress) == 1
			mu.Unlock()
			if first {
				// Events appended during the rebuild are the live instance's.
				go func() {
					defer close(during)
					_, err := h.store.Append(context.Background(), "rb-during", eventstore.Any,
						eventstore.EventData{Type: "rb.deposited", Data: map[string]int{"amount": -1}},
						eventstore.EventData{Type: "rb.deposited", Data: map[string]int{"amount": -2}})
					appended <- err
				}()
			}
		},
	})
	if err != nil {
		t.Fatalf("Rebuild: %+v", err)
	}
	t.Logf("rebuilt in %s", time.Since(start))
	<-during
	if err := <-appended; err != nil {
		t.Fatal(err)
	}

	// Progress: increasing, ending with done == total == the events read.
	mu.Lock()
	if len(progress) < events/5000 {
		t.Errorf("%d progress calls, want at least %d", len(progress), events/5000)
	}
	for i, p := range progress {
		if i > 0 && p.Done < progress[i-1].Done {
			t.Errorf("progress went back: %d after %d", p.Done, progress[i-1].Done)
		}
		if p.Total != events || p.Head != head || p.Projection != sub {
			t.Errorf("progress %d: %+v; want total %d, head %d", i, p, events, head)
		}
		if p.Finished != (i == len(progress)-1) {
			t.Errorf("progress %d of %d: Finished %v", i, len(progress), p.Finished)
		}
	}
	last := progress[len(progress)-1]
	mu.Unlock()
	if last.Done != events || last.Rate <= 0 || last.ETA != 0 {
		t.Errorf("last progress %+v; want done %d, a rate, no ETA", last, events)
	}

	// Everything through the rebuild's head was applied by the rebuild, once;
	// the live instance stood by meanwhile, then took over and applied what
	// was appended during and after the rebuild.
	if n := h.queryInt(`SELECT count(*) FROM rb_applied WHERE global_sequence <= $1 AND writer <> 'rebuild'`, head); n != 0 {
		t.Errorf("%d events through the rebuild's head were applied by someone else", n)
	}
	h.fill(500, 250)
	h.waitLiveAt(sub, live.InstanceID(), 1, 15*time.Second)
	h.checkReadModel(h.head())
	if n := h.queryInt(`SELECT count(*) FROM rb_applied WHERE global_sequence > $1 AND writer = 'live'`, head); n != 502 {
		t.Errorf("the live instance applied %d events after the rebuild, want 502", n)
	}
}

// TestRebuildPartitioned rebuilds every partition of a partitioned
// projection while a live instance leads them all.
func TestRebuildPartitioned(t *testing.T) {
	t.Parallel()
	h := newRBHarness(t)
	h.fill(3000, 100)
	const sub = "rb-parts"
	opts := &projection.Options{Types: []string{"rb.deposited"}, Partitions: 3}
	live := h.liveRunner("live-p", &rbProjection{name: sub, writer: "live"}, opts)
	h.waitLiveAt(sub, live.InstanceID(), 3, 20*time.Second)
	h.checkReadModel(h.head())
	if _, err := h.db.Pool.Exec(t.Context(), `UPDATE rb_applied SET n = 5`); err != nil { // break it
		t.Fatal(err)
	}
	head := h.head()

	var last projection.RebuildProgress
	rb := h.rebuilder("rebuilder-p", &rbProjection{name: sub, writer: "rebuild"}, opts)
	err := rb.Rebuild(t.Context(), sub, &projection.RebuildOptions{BatchSize: 400, LockTimeout: 20 * time.Second,
		OnProgress: func(p projection.RebuildProgress) { last = p }})
	if err != nil {
		t.Fatalf("Rebuild: %+v", err)
	}
	if !last.Finished || last.Done != 3000 || last.Total != 3000 {
		t.Errorf("last progress %+v; want 3000 of 3000", last)
	}
	if n := h.queryInt(`SELECT count(*) FROM rb_applied WHERE writer <> 'rebuild'`); n != 0 {
		t.Errorf("%d events applied by someone else during the rebuild", n)
	}
	h.checkReadModel(head)
	h.fill(300, 10)
	h.waitLiveAt(sub, live.InstanceID(), 3, 20*time.Second)
	h.checkReadModel(h.head())
}

// TestRebuildCrashContinuedByLive stops a rebuild midway, by cancelling its
// context and by terminating its lock's session: the read model stays
// consistent with the committed checkpoint, and the live instance takes over
// and finishes the replay, applying every event exactly once.
func TestRebuildCrashContinuedByLive(t *testing.T) {
	t.Parallel()
	for _, how := range []string{"Cancel", "KillLockSession"} {
		t.Run(how, func(t *testing.T) {
			t.Parallel()
			h := newRBHarness(t)
			h.fill(10_000, 1000)
			head := h.head()
			sub := "rb-crash-" + strings.ToLower(how)
			// A live instance leads, caught up (with a read model to rebuild).
			if _, err := h.db.Pool.Exec(t.Context(), `INSERT INTO annals.checkpoints (subscriber_id, partition, position, epoch) VALUES ($1, 0, $2, 1)`, sub, head); err != nil {
				t.Fatal(err)
			}
			if _, err := h.db.Pool.Exec(t.Context(), `INSERT INTO rb_applied SELECT event_id, global_sequence, stream_id, 0, 'stale', 1 FROM annals.events`); err != nil {
				t.Fatal(err)
			}
			live := h.liveRunner("live-c", &rbProjection{name: sub, writer: "live"}, rbOptions)
			h.waitLiveAt(sub, live.InstanceID(), 1, 10*time.Second)

			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			k1, k2 := advisorylock.Key(catchup.LockKey("", sub, 0))
			rb := h.rebuilder("rebuilder-c", &rbProjection{name: sub, writer: "rebuild"}, rbOptions)
			var stoppedAt int64
			err := rb.Rebuild(ctx, sub, &projection.RebuildOptions{BatchSize: 1000, LockTimeout: 20 * time.Second,
				OnProgress: func(p projection.RebuildProgress) {
					if p.Done < 3000 || stoppedAt != 0 {
						return
					}
					stoppedAt = p.Done
					if how == "Cancel" {
						cancel()
						return
					}
					// The rebuild holds the lock: end its session.
					if _, err := h.db.Pool.Exec(context.Background(), `SELECT pg_terminate_backend(pid) FROM pg_locks
						WHERE locktype = 'advisory' AND classid = ($1::int4::int8 & 4294967295)::oid
						  AND objid = ($2::int4::int8 & 4294967295)::oid AND objsubid = 2 AND granted
		  AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`, k1, k2); err != nil {
						t.Error(err)
					}
				}})
			if err == nil {
				t.Fatal("Rebuild succeeded; want it stopped midway")
			}
			t.Logf("Rebuild stopped after %d events: %v", stoppedAt, err)
			// The live instance continues the replay from the last committed
			// batch: nothing applied twice, nothing missing.
			h.waitLiveAt(sub, live.InstanceID(), 1, 30*time.Second)
			h.checkReadModel(head)
			rebuilt := h.queryInt(`SELECT count(*) FROM rb_applied WHERE writer = 'rebuild'`)
			if rebuilt < 3000 || rebuilt >= 10_000 {
				t.Errorf("the rebuild applied %d events before it stopped; want 3000..9999", rebuilt)
			}
			h.fill(100, 100)
			h.waitLiveAt(sub, live.InstanceID(), 1, 15*time.Second)
			h.checkReadModel(h.head())
		})
	}
}

// TestRebuildResetIsAtomic: when the transaction that resets the read model
// cannot also set the checkpoint to 0 (here another leader's claim fences
// it), nothing changes: not the read model, not the checkpoint.
func TestRebuildResetIsAtomic(t *testing.T) {
	t.Parallel()
	h := newRBHarness(t)
	h.fill(300, 100)
	const sub = "rb-atomic"
	r := h.rebuilder("first", &rbProjection{name: sub, writer: "first"}, rbOptions)
	if err := r.RunUntilCaughtUp(t.Context()); err != nil {
		t.Fatal(err)
	}
	before, _ := h.checkpointOf(sub)
	p := &rbProjection{name: sub, writer: "rebuild", beforeReset: func(ctx context.Context, tx pgx.Tx) error {
		// Another leader claims the partition while the reset runs.
		_, err := h.db.Pool.Exec(ctx, `UPDATE annals.checkpoints SET epoch = epoch + 1 WHERE subscriber_id = $1`, sub)
		return err
	}}
	err := h.rebuilder("rebuilder-a", p, rbOptions).Rebuild(t.Context(), sub, &projection.RebuildOptions{LockTimeout: 10 * time.Second})
	if err == nil || !strings.Contains(err.Error(), "nothing changed") {
		t.Fatalf("Rebuild: %v; want a fenced reset", err)
	}
	after, _ := h.checkpointOf(sub)
	if after != before || before != h.head() {
		t.Errorf("checkpoint %d before, %d after the failed reset (head %d)", before, after, h.head())
	}
	h.checkReadModel(h.head())
	if n := h.queryInt(`SELECT count(*) FROM rb_applied WHERE writer <> 'first'`); n != 0 {
		t.Errorf("%d rows changed", n)
	}
}

// TestRebuildSettlesDeadLetters: a stream parked behind a dead letter before
// the rebuild is replayed in full when the event no longer fails; the dead
// letter is settled (resolved) and the subscriber's stop is cleared.
func TestRebuildSettlesDeadLetters(t *testing.T) {
	t.Parallel()
	h := newRBHarness(t)
	h.fill(20, 10) // streams rb-…-0 and rb-…-1
	const sub = "rb-dlq"
	fail := &failingOnce{rbProjection: rbProjection{name: sub, writer: "first"}}
	cfg := testConfig(100 * time.Millisecond)
	cfg.Retry = &projection.RetryPolicy{MaxRetries: -1}
	r, err := projection.NewRunner(h.db.Pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Register(fail, rbOptions); err != nil {
		t.Fatal(err)
	}
	fail.failAt = 3
	if err := r.RunUntilCaughtUp(t.Context()); err != nil {
		t.Fatal(err)
	}
	if parked := h.queryInt(`SELECT count(*) FROM annals.dead_letters WHERE subscriber_id = $1 AND status = 'open'`, sub); parked != 8 {
		t.Fatalf("%d open dead letters, want 8 (the failed event and the 7 parked behind it)", parked)
	}
	fail.failAt = 0
	if err := r.Rebuild(t.Context(), sub, &projection.RebuildOptions{LockTimeout: 10 * time.Second}); err != nil {
		t.Fatalf("Rebuild: %+v", err)
	}
	h.checkReadModel(h.head())
	if open := h.queryInt(`SELECT count(*) FROM annals.dead_letters WHERE subscriber_id = $1 AND status <> 'resolved'`, sub); open != 0 {
		t.Errorf("%d dead letters not resolved after the rebuild applied their events", open)
	}
}

// failingOnce fails the event at position failAt (0: none).
type failingOnce struct {
	rbProjection
	failAt int64
}

func (f *failingOnce) Handle(ctx context.Context, tx pgx.Tx, e eventstore.Event) error {
	if e.GlobalSequence == f.failAt {
		return errors.New("broken")
	}
	return f.rbProjection.Handle(ctx, tx, e)
}

// noReset is a projection without Reset.
type noReset struct{ name string }

func (p noReset) Name() string                                           { return p.name }
func (p noReset) Handle(context.Context, pgx.Tx, eventstore.Event) error { return nil }

type rbObserver struct{ name string }

func (o rbObserver) Name() string                                   { return o.name }
func (o rbObserver) Handle(context.Context, eventstore.Event) error { return nil }

// TestRebuildBadInput: an unknown name, an observer, a projection that
// cannot reset (also a typed one without OnReset), and a running rebuild are
// refused with typed errors, and nothing changes.
func TestRebuildBadInput(t *testing.T) {
	t.Parallel()
	h := newRBHarness(t)
	h.fill(10, 10)
	reg := eventstore.NewRegistry()
	eventstore.MustRegister[Deposited](reg, "rb.deposited")
	typed := projection.New("typed-no-reset", reg)
	projection.On(typed, func(context.Context, pgx.Tx, eventstore.Envelope[Deposited]) error { return nil })

	r, err := projection.NewRunner(h.db.Pool, testConfig(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	for _, handler := range []any{&rbProjection{name: "good", writer: "good"}, noReset{"no-reset"}, rbObserver{"observer"}, typed} {
		if err := r.Register(handler, rbOptions); err != nil {
			t.Fatal(err)
		}
	}
	if err := r.RunUntilCaughtUp(t.Context()); err != nil {
		t.Fatal(err)
	}
	cps := func() string {
		rows, err := h.db.Pool.Query(t.Context(), `SELECT subscriber_id, position, epoch FROM annals.checkpoints ORDER BY 1`)
		if err != nil {
			t.Fatal(err)
		}
		var s string
		var p, e int64
		var out []string
		if _, err := pgx.ForEachRow(rows, []any{&s, &p, &e}, func() error { out = append(out, fmt.Sprintf("%s@%d/%d", s, p, e)); return nil }); err != nil {
			t.Fatal(err)
		}
		return strings.Join(out, " ")
	}
	before := cps()
	for _, c := range []struct {
		name string
		want error
		text string
	}{
		{"nope", projection.ErrUnknownProjection, `"nope" is not registered (registered: good, no-reset, observer, typed-no-reset)`},
		{"no-reset", projection.ErrNotResetter, "does not implement projection.Resetter"},
		{"typed-no-reset", projection.ErrNotResetter, "has no OnReset"},
		{"observer", projection.ErrObserver, "is an observer"},
	} {
		err := r.Rebuild(t.Context(), c.name, nil)
		if !errors.Is(err, c.want) || !strings.Contains(err.Error(), c.text) {
			t.Errorf("Rebuild(%q) = %v; want %v containing %q", c.name, err, c.want, c.text)
		}
	}
	if err := r.Rebuild(t.Context(), "good", &projection.RebuildOptions{BatchSize: -1}); err == nil {
		t.Error("Rebuild with a negative batch size succeeded")
	}
	if after := cps(); after != before {
		t.Errorf("checkpoints changed:\n before %s\n after  %s", before, after)
	}
	infos := r.Registered()
	var got []string
	for _, i := range infos {
		got = append(got, fmt.Sprintf("%s:%v:%v", i.Name, i.Observer, i.Rebuildable))
	}
	if want := "good:false:true no-reset:false:false observer:true:false typed-no-reset:false:false"; strings.Join(got, " ") != want {
		t.Errorf("Registered() = %v; want %s", got, want)
	}

	// A second rebuild while one runs is refused, and does not disturb it.
	release := make(chan struct{})
	started := make(chan struct{})
	var once sync.Once
	done := make(chan error, 1)
	go func() {
		done <- r.Rebuild(t.Context(), "good", &projection.RebuildOptions{BatchSize: 2, OnProgress: func(projection.RebuildProgress) {
			once.Do(func() { close(started); <-release })
		}})
	}()
	<-started
	r2 := h.rebuilder("second", &rbProjection{name: "good", writer: "second"}, rbOptions)
	if err := r2.Rebuild(t.Context(), "good", nil); !errors.Is(err, projection.ErrRebuildRunning) {
		t.Errorf("concurrent Rebuild = %v; want ErrRebuildRunning", err)
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatalf("first Rebuild: %+v", err)
	}
	h.checkReadModel(h.head())
}

// TestRebuildEmptyLog: a projection that never ran, over an empty log, is
// rebuilt at once, with one final progress call of 0 of 0.
func TestRebuildEmptyLog(t *testing.T) {
	t.Parallel()
	h := newRBHarness(t)
	var calls []projection.RebuildProgress
	err := h.rebuilder("empty", &rbProjection{name: "rb-empty", writer: "rebuild"}, rbOptions).Rebuild(t.Context(), "rb-empty",
		&projection.RebuildOptions{OnProgress: func(p projection.RebuildProgress) { calls = append(calls, p) }})
	if err != nil {
		t.Fatalf("Rebuild: %+v", err)
	}
	if len(calls) != 1 || !calls[0].Finished || calls[0].Done != 0 || calls[0].Total != 0 {
		t.Errorf("progress calls %+v; want one finished 0 of 0", calls)
	}
	if pos, owners := h.checkpointOf("rb-empty"); pos != 0 || len(owners) != 1 {
		t.Errorf("checkpoint %d, owners %v", pos, owners)
	}
}
