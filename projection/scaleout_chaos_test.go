package projection_test

// An adversarial test of scale-out: runner instances (child processes and
// runners in the test's process) join and leave a balanced, partitioned
// projection and observer at random — SIGKILL (one or two processes at
// once), SIGTERM, context cancel, a cut of a member's lock session or of
// its other connections, and a leader frozen (SIGSTOP) in the middle of a
// batch while its lock session is terminated and another instance takes
// its partitions over — while writers append with random delays and
// rollbacks, and an operator moves one partition's checkpoint back while a
// batch of it is in flight and retries a dead letter. Triggers record
// every change of a checkpoint (claims, commits, the move) and, with every
// application of an event, its stream, version, partition and the epoch
// its transaction saw. The test then checks the read model against the
// log (exactly once, twice for what the move back applies again),
// per-stream order, that every commit came from its epoch's claimant, that
// the batches of the fenced and the frozen leader did not commit, that
// each departure left no partition unled for long, and that the balance
// converges once the churn stops.

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/checkpoint"
	"github.com/annals-dev/annals/deadletter"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/internal/childproc"
	"github.com/annals-dev/annals/projection"
)

// chaosParts is the partition count of both subscribers.
const chaosParts = 8

// chaosRelead bounds how long a departure (a kill, a stop, a frozen
// leader's terminated lock session) may leave a partition without a live
// leader. The design says tens of milliseconds; the rest is slack for a
// loaded 2-core machine under the race detector.
const chaosRelead = 5 * time.Second

// chaosTables: counted and counts are written by streamCounter ("counter"),
// seen by orderObserver ("watcher"), as in balance_test.go. counted's
// trigger fills in the event's stream, version and partition and the
// counter's epoch of that partition as the applying transaction sees it,
// takes 1 ms on average (so that kills and cuts find batches in flight),
// fails events of a stream listed in poison, and makes events of a stream
// listed in gate wait for the shared advisory lock gateKey. cp_log records
// every insert and update of a checkpoint with the session's
// application_name (the instance ID).
var chaosTables = fmt.Sprintf(`
CREATE TABLE counted (id bigserial PRIMARY KEY, event_id uuid NOT NULL, instance text NOT NULL, global_sequence bigint NOT NULL,
                      stream_id text, stream_version bigint, part int, epoch bigint);
CREATE TABLE counts (stream_id text PRIMARY KEY, n bigint NOT NULL);
CREATE TABLE seen (id bigserial PRIMARY KEY, instance text NOT NULL, stream_id text NOT NULL,
                   stream_version bigint NOT NULL, global_sequence bigint NOT NULL);
CREATE TABLE poison (stream_id text PRIMARY KEY);
CREATE TABLE gate (stream_id text PRIMARY KEY);
CREATE TABLE cp_log (id bigserial PRIMARY KEY, subscriber_id text NOT NULL, part int NOT NULL,
                     old_epoch bigint, new_epoch bigint NOT NULL, old_position bigint, new_position bigint NOT NULL,
                     owner text, app text NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp());
CREATE FUNCTION counted_fill() RETURNS trigger LANGUAGE plpgsql AS $f$
BEGIN
    SELECT e.stream_id, e.stream_version INTO NEW.stream_id, NEW.stream_version
      FROM annals.events e WHERE e.global_sequence = NEW.global_sequence;
    NEW.part := annals.stream_partition(NEW.stream_id, %d);
    SELECT c.epoch INTO NEW.epoch FROM annals.checkpoints c WHERE c.subscriber_id = 'counter' AND c.partition = NEW.part;
    IF EXISTS (SELECT 1 FROM public.poison p WHERE p.stream_id = NEW.stream_id) THEN
        RAISE EXCEPTION 'poisoned stream %%', NEW.stream_id;
    END IF;
    PERFORM pg_sleep(random() * 0.002);
    IF EXISTS (SELECT 1 FROM public.gate g WHERE g.stream_id = NEW.stream_id) THEN
        PERFORM pg_advisory_xact_lock_shared(%d);
    END IF;
    RETURN NEW;
END $f$;
CREATE TRIGGER counted_fill BEFORE INSERT ON counted FOR EACH ROW EXECUTE FUNCTION counted_fill();
CREATE FUNCTION cp_record() RETURNS trigger LANGUAGE plpgsql AS $f$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO public.cp_log (subscriber_id, part, new_epoch, new_position, owner, app)
        VALUES (NEW.subscriber_id, NEW.partition, NEW.epoch, NEW.position, NEW.owner, current_setting('application_name'));
    ELSIF (OLD.epoch, OLD.position, OLD.owner) IS DISTINCT FROM (NEW.epoch, NEW.position, NEW.owner) THEN
        INSERT INTO public.cp_log (subscriber_id, part, old_epoch, new_epoch, old_position, new_position, owner, app)
        VALUES (NEW.subscriber_id, NEW.partition, OLD.epoch, NEW.epoch, OLD.position, NEW.position, NEW.owner, current_setting('application_name'));
    END IF;
    RETURN NULL;
END $f$;
CREATE TRIGGER cp_record AFTER INSERT OR UPDATE ON annals.checkpoints FOR EACH ROW EXECUTE FUNCTION cp_record();`,
	chaosParts, gateKey)

// gateKey is the advisory lock the test holds to keep a batch of a gate
// stream in flight.
const gateKey = 771177

// chaosRetry dead-letters a failing event after 5 quick retries: more
// than the pool has connections, so that an observer whose connections
// were all cut (its handler writes through the pool) is not
// dead-lettered for it.
var chaosRetry = &projection.RetryPolicy{MaxRetries: 5, InitialDelay: 50 * time.Millisecond, Multiplier: 1, Jitter: -1}

// lockedBuffer collects an in-process runner's log.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// member is one runner instance: a child process or a runner in the
// test's process.
type member struct {
	id    string
	child *childproc.Child // nil for a runner in the test's process
	// In-process runners: cancel ends its run, done is closed when it has
	// shut down, log is its log.
	cancel context.CancelFunc
	done   <-chan struct{}
	log    *lockedBuffer
}

// chaos is the test's state.
type chaos struct {
	t    *testing.T
	b    *bundle
	rng  *rand.Rand
	mode childMode
	live []*member
	all  []*member
	n    int // instances started, for their IDs

	relead []time.Duration // how long each departure left partitions unled
	gated  int64           // events appended to gate streams
	cps    *checkpoint.Store
	// unclean lists the instances that lost leaderships without knowing
	// at first (their lock session was cut, or they were frozen): their
	// observer delivers again what it delivered since its last
	// checkpoint, which at-least-once allows.
	unclean map[string]bool
}

func (c *chaos) ctx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(c.t.Context(), 10*time.Second)
}

func (c *chaos) liveIDs() []string {
	ids := make([]string, len(c.live))
	for i, m := range c.live {
		ids[i] = m.id
	}
	return ids
}

// startChild starts a runner child process.
func (c *chaos) startChild() *member {
	c.t.Helper()
	c.n++
	id := fmt.Sprintf("c%d", c.n)
	m := &member{id: id, child: startChild(c.t, c.b.db, id, c.mode)}
	c.live, c.all = append(c.live, m), append(c.all, m)
	return m
}

// startLocal starts a runner in the test's process, on a pool of its own
// whose connections carry its instance ID as their application_name.
func (c *chaos) startLocal() *member {
	c.t.Helper()
	c.n++
	id := fmt.Sprintf("l%d", c.n)
	pool, err := childproc.Pool(c.t.Context(), c.b.db.URL, id)
	if err != nil {
		c.t.Fatal(err)
	}
	log := &lockedBuffer{}
	r, err := projection.NewRunner(pool, &projection.Config{
		InstanceID:        id,
		RetryBackoff:      childRetryBackoff,
		HeartbeatInterval: time.Second,
		ShutdownTimeout:   5 * time.Second,
		Retry:             chaosRetry,
		Logger:            slog.New(slog.NewTextHandler(log, &slog.HandlerOptions{Level: slog.LevelInfo})).With(slog.String("instance", id)),
	})
	if err != nil {
		c.t.Fatal(err)
	}
	opts := &projection.Options{BatchSize: c.mode.BatchSize, Partitions: chaosParts}
	if err := r.Register(orderObserver(pool, id), opts); err != nil {
		c.t.Fatal(err)
	}
	if err := r.Register(streamCounter(id), opts); err != nil {
		c.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done, err := r.Start(ctx)
	if err != nil {
		cancel()
		c.t.Fatal(err)
	}
	m := &member{id: id, cancel: cancel, done: done, log: log}
	c.t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			c.t.Errorf("runner %s has not stopped 15s after its context ended", id)
		}
		pool.Close()
		if c.t.Failed() {
			c.t.Logf("log of runner %s:\n%s", id, childproc.Tail(log.String(), 8000))
		}
	})
	c.live, c.all = append(c.live, m), append(c.all, m)
	return m
}

// registered waits until m has registered as an instance.
func (c *chaos) registered(m *member) {
	c.t.Helper()
	if _, ok := eventually(20*time.Second, func() bool {
		var n int
		_ = c.b.db.Pool.QueryRow(c.t.Context(), `SELECT count(*) FROM annals.instances WHERE instance_id = $1`, m.id).Scan(&n)
		return n == 1
	}); !ok {
		c.t.Fatalf("%s did not register within 20s", m.id)
	}
}

// leave ends a live member by how (kill, term, cancel), and checks that
// every partition is led by the members left within chaosRelead.
func (c *chaos) leave(m *member, how string) {
	c.t.Helper()
	c.live = slices.DeleteFunc(c.live, func(x *member) bool { return x == m })
	start := time.Now()
	switch how {
	case "kill":
		m.child.Kill()
	case "term":
		m.child.Term(15 * time.Second)
	case "cancel":
		m.cancel()
		select {
		case <-m.done:
		case <-time.After(15 * time.Second):
			c.t.Fatalf("runner %s has not stopped 15s after its context ended", m.id)
		}
	}
	c.t.Logf("%s: %s (%v); live %v", how, m.id, time.Since(start).Round(time.Millisecond), c.liveIDs())
	c.allLedWithin(start, how+" of "+m.id)
}

// allLedWithin waits until every partition of both subscribers is led by
// a live member, and fails the test unless that holds within chaosRelead
// of since.
func (c *chaos) allLedWithin(since time.Time, what string) {
	c.t.Helper()
	if len(c.live) == 0 {
		return
	}
	var hs map[string][]string
	if _, ok := eventually(chaosRelead, func() bool {
		hs = holders(c.t, c.b.db, []string{"counter", "watcher"}, chaosParts)
		return allLed(hs, c.liveIDs())
	}); !ok {
		c.t.Fatalf("partitions not led by %v %v after %s: %s", c.liveIDs(), time.Since(since), what, describe(hs))
	}
	d := time.Since(since)
	c.relead = append(c.relead, d)
	c.t.Logf("every partition led again %v after %s", d.Round(time.Millisecond), what)
}

// writer appends events to acct-N streams at random moments, a quarter of
// them in transactions that roll back (amounts from rolledBackAmount: none
// may reach the log), until stop is closed, and counts what it committed
// per stream.
type writer struct {
	store     *eventstore.Store
	rng       *rand.Rand
	committed map[string]int64
	rolled    int
}

const rolledBackAmount = 1_000_000

var errRollBack = errors.New("the writer rolls back")

func (w *writer) run(ctx context.Context, stop <-chan struct{}) error {
	for {
		select {
		case <-stop:
			return nil
		case <-time.After(time.Duration(w.rng.IntN(40)) * time.Millisecond): // pacing, not a wait for a condition
		}
		stream := fmt.Sprintf("acct-%d", w.rng.IntN(40))
		k := 1 + w.rng.IntN(4)
		evs := make([]eventstore.EventData, k)
		rollback := w.rng.IntN(4) == 0
		for i := range evs {
			amount := 1 + w.rng.IntN(1000)
			if rollback {
				amount += rolledBackAmount
			}
			evs[i] = eventstore.NewEvent(Deposited{Amount: amount})
		}
		switch {
		case rollback:
			_, err := w.store.Transact(ctx, func(ctx context.Context, tx pgx.Tx, b *eventstore.Batch) error {
				if err := b.Append(stream, eventstore.Any, evs...); err != nil {
					return err
				}
				if _, err := tx.Exec(ctx, `SELECT pg_sleep($1)`, float64(w.rng.IntN(20))/1000); err != nil {
					return err
				}
				return errRollBack
			})
			if !errors.Is(err, errRollBack) {
				return errors.Wrap(err, "a transaction that rolls back")
			}
			w.rolled += k
		case w.rng.IntN(2) == 0:
			// An append inside a transaction that does some work first.
			if _, err := w.store.Transact(ctx, func(ctx context.Context, tx pgx.Tx, b *eventstore.Batch) error {
				if _, err := tx.Exec(ctx, `SELECT pg_sleep($1)`, float64(w.rng.IntN(20))/1000); err != nil {
					return err
				}
				return b.Append(stream, eventstore.Any, evs...)
			}); err != nil {
				return err
			}
			w.committed[stream] += int64(k)
		default:
			if _, err := w.store.Append(ctx, stream, eventstore.Any, evs...); err != nil {
				return err
			}
			w.committed[stream] += int64(k)
		}
	}
}

// streamIn returns a stream ID with the prefix whose partition is part.
func (c *chaos) streamIn(prefix string, part int) string {
	c.t.Helper()
	ctx, cancel := c.ctx()
	defer cancel()
	for i := range 1000 {
		s := fmt.Sprintf("%s-%d", prefix, i)
		var p int
		if err := c.b.db.Pool.QueryRow(ctx, `SELECT annals.stream_partition($1, $2)`, s, chaosParts).Scan(&p); err != nil {
			c.t.Fatal(err)
		}
		if p == part {
			return s
		}
	}
	c.t.Fatalf("no stream %s-N in partition %d", prefix, part)
	return ""
}

func (c *chaos) exec(sql string, args ...any) {
	c.t.Helper()
	ctx, cancel := c.ctx()
	defer cancel()
	if _, err := c.b.db.Pool.Exec(ctx, sql, args...); err != nil {
		c.t.Fatalf("%s: %v", strings.Join(strings.Fields(sql), " "), err)
	}
}

func (c *chaos) queryInt(sql string, args ...any) int64 {
	c.t.Helper()
	ctx, cancel := c.ctx()
	defer cancel()
	var n int64
	if err := c.b.db.Pool.QueryRow(ctx, sql, args...).Scan(&n); err != nil {
		c.t.Fatalf("%s: %v", strings.Join(strings.Fields(sql), " "), err)
	}
	return n
}

// moveBack is the operator's checkpoint set of counter's partition part
// to about half its position. In the same transaction, with the row
// locked, it records which events of the partition after the new position
// were applied already (they are applied again: the documented effect of a
// move back) and the counted ID from which re-applications may follow.
func (c *chaos) moveBack(part int) (again map[string]bool, boundary int64, moved checkpoint.Moved) {
	c.t.Helper()
	ctx, cancel := c.ctx()
	defer cancel()
	again = map[string]bool{}
	err := pgx.BeginFunc(ctx, c.b.db.Pool, func(tx pgx.Tx) error {
		var pos int64
		if err := tx.QueryRow(ctx, `SELECT position FROM annals.checkpoints WHERE subscriber_id = 'counter' AND partition = $1 FOR UPDATE`, part).Scan(&pos); err != nil {
			return err
		}
		to := pos / 2
		rows, err := tx.Query(ctx, `SELECT event_id::text FROM counted WHERE part = $1 AND global_sequence > $2`, part, to)
		if err != nil {
			return err
		}
		ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return err
		}
		for _, id := range ids {
			again[id] = true
		}
		if err := tx.QueryRow(ctx, `SELECT nextval('counted_id_seq')`).Scan(&boundary); err != nil {
			return err
		}
		moved, err = c.cps.Move(ctx, tx, "counter", part, to)
		return err
	})
	if err != nil {
		c.t.Fatalf("checkpoint set counter/%d: %v", part, err)
	}
	return again, boundary, moved
}

// TestScaleOutChaos: see the file comment.
func TestScaleOutChaos(t *testing.T) {
	t.Parallel()
	seed := uint64(time.Now().UnixNano())
	t.Logf("random seed %d", seed)
	b := setup(t)
	c := &chaos{
		t: t, b: b, rng: rand.New(rand.NewPCG(seed, 1)), unclean: map[string]bool{},
		mode: childMode{Kind: kindBalanced, Partitions: chaosParts, BatchSize: 20, Defaults: true, Retry: chaosRetry},
	}
	c.exec(chaosTables)
	var err error
	if c.cps, err = checkpoint.New(""); err != nil {
		t.Fatal(err)
	}

	// The poisoned stream and the moved partition are different ones, so
	// that the move back does not settle the dead letter.
	poisonPart := c.rng.IntN(chaosParts)
	movedPart := (poisonPart + 1 + c.rng.IntN(chaosParts-1)) % chaosParts
	poisoned := c.streamIn("poison", poisonPart)
	c.exec(`INSERT INTO poison VALUES ($1)`, poisoned)
	t.Logf("poisoned stream %s (partition %d); the operator moves partition %d back", poisoned, poisonPart, movedPart)

	// Writers.
	stop := make(chan struct{})
	writers := make([]*writer, 2)
	werr := make(chan error, len(writers))
	for i := range writers {
		writers[i] = &writer{store: b.store, rng: rand.New(rand.NewPCG(seed, uint64(i+2))), committed: map[string]int64{}}
		go func() { werr <- writers[i].run(t.Context(), stop) }()
	}
	stopWriters := func() {
		if stop == nil {
			return
		}
		close(stop)
		stop = nil
		for range writers {
			if err := <-werr; err != nil {
				t.Errorf("writer: %v", err)
			}
		}
	}
	defer stopWriters()

	first := []*member{c.startChild(), c.startLocal(), c.startChild()}
	for _, m := range first {
		c.registered(m)
	}
	if _, err := b.store.Append(t.Context(), poisoned, eventstore.Any,
		eventstore.NewEvent(Deposited{Amount: 1}), eventstore.NewEvent(Deposited{Amount: 2})); err != nil {
		t.Fatal(err)
	}

	// Churn: instances join and leave at random for about 15 s; the
	// operator moves a checkpoint back at the first third and retries the
	// dead letter as soon as there is one.
	var again map[string]bool
	var boundary int64
	moved, retried := false, false
	var dls *deadletter.Store
	dls, err = deadletter.New(b.db.Pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	churnStart := time.Now()
	for step := 0; time.Since(churnStart) < 15*time.Second; step++ {
		switch n := len(c.live); {
		case n < 2 || (n < 5 && c.rng.IntN(2) == 0):
			var m *member
			if c.rng.IntN(3) == 0 {
				m = c.startLocal()
			} else {
				m = c.startChild()
			}
			c.registered(m)
			t.Logf("join: %s; live %v", m.id, c.liveIDs())
		case c.children() >= 2 && n >= 3 && c.rng.IntN(4) == 0:
			// Two processes die at once.
			var kids []*member
			for _, m := range c.live {
				if m.child != nil {
					kids = append(kids, m)
				}
			}
			c.rng.Shuffle(len(kids), func(i, j int) { kids[i], kids[j] = kids[j], kids[i] })
			start := time.Now()
			for _, m := range kids[:2] {
				if err := syscall.Kill(m.child.PID(), syscall.SIGKILL); err != nil {
					t.Fatal(err)
				}
			}
			for _, m := range kids[:2] {
				m.child.Kill() // waits for it to be gone
				c.live = slices.DeleteFunc(c.live, func(x *member) bool { return x == m })
			}
			t.Logf("kill: %s and %s at once; live %v", kids[0].id, kids[1].id, c.liveIDs())
			c.allLedWithin(start, "kill of "+kids[0].id+" and "+kids[1].id)
		case c.rng.IntN(5) == 0:
			// A member's connections are cut while it runs: its lock
			// session (it opens a new one and is owed its share again), or
			// every other connection (its batches in flight fail and are
			// retried; its listener reconnects).
			m := c.live[c.rng.IntN(n)]
			what, cond := "lock session", "l.pid IS NOT NULL"
			if c.rng.IntN(2) == 0 {
				what, cond = "other connections", "l.pid IS NULL"
			} else {
				c.unclean[m.id] = true
			}
			start := time.Now()
			k := c.queryInt(`
				SELECT count(pg_terminate_backend(a.pid)) FROM pg_stat_activity a
				  LEFT JOIN (SELECT DISTINCT pid FROM pg_locks WHERE locktype = 'advisory' AND granted AND objsubid = 2) l USING (pid)
				 WHERE a.application_name = $1 AND `+cond, m.id)
			t.Logf("cut: %d connections (%s) of %s", k, what, m.id)
			c.allLedWithin(start, "cut of "+m.id+"'s "+what)
		default:
			m := c.live[c.rng.IntN(n)]
			how := "cancel"
			if m.child != nil {
				how = []string{"kill", "kill", "term"}[c.rng.IntN(3)]
			}
			c.leave(m, how)
		}
		if !moved && time.Since(churnStart) > 5*time.Second {
			// The move fences a batch in flight: the leader's commit fails
			// (checkpoint.ErrFenced) and nothing of it is applied.
			g := c.holdGate("gatem", movedPart)
			var mv checkpoint.Moved
			again, boundary, mv = c.moveBack(movedPart)
			g.open()
			moved = true
			t.Logf("checkpoint set counter/%d: %d → %d, epoch %d → %d, with %s's batch in flight; %d events to be applied again",
				movedPart, mv.Before.Position, mv.After.Position, mv.Before.Epoch, mv.After.Epoch, g.waiter, len(again))
			i := slices.IndexFunc(c.live, func(m *member) bool { return m.id == g.waiter })
			if i < 0 {
				t.Fatalf("the batch in flight is %q's, not a live member's", g.waiter)
			}
			if l := c.stoppedLeading(c.live[i], movedPart, mv.Before.Epoch); !strings.Contains(l, "claimed by another leader") {
				t.Errorf("%s's batch in flight at the move: want its commit fenced (checkpoint.ErrFenced), its log says %q", g.waiter, l)
			}
		}
		if !retried {
			var id int64
			err := b.db.Pool.QueryRow(t.Context(), `SELECT id FROM annals.dead_letters WHERE subscriber_id = 'counter' AND reason = 'failed' AND status = 'open'`).Scan(&id)
			if err == nil {
				c.exec(`DELETE FROM poison`)
				ch, err := dls.Retry(t.Context(), id)
				if err != nil {
					t.Fatal(err)
				}
				retried = true
				t.Logf("dlq retry %d: %+v", id, ch)
			} else if !errors.Is(err, pgx.ErrNoRows) {
				t.Fatal(err)
			}
		}
		pace := time.Duration(200+c.rng.IntN(800)) * time.Millisecond
		if c.rng.IntN(3) == 0 {
			pace = 0 // the next change while this one's handovers are under way
		}
		select { // pacing of the churn
		case <-time.After(pace):
		case <-t.Context().Done():
			t.Fatal(t.Context().Err())
		}
	}
	if !moved || !retried {
		t.Fatalf("the churn ended before the operator's actions: moved %v, dead letter retried %v", moved, retried)
	}

	stopWriters()
	var want int64
	for _, w := range writers {
		for _, n := range w.committed {
			want += n
		}
	}

	// The churn is over: a leader is frozen in the middle of a batch and
	// taken over; then the members converge to their shares.
	for c.children() < 2 {
		c.registered(c.startChild())
	}
	waitBalanced(t, b.db, []string{"counter", "watcher"}, chaosParts, c.liveIDs(), 20*time.Second)
	c.freeze()
	d := waitBalanced(t, b.db, []string{"counter", "watcher"}, chaosParts, c.liveIDs(), 20*time.Second)
	t.Logf("balanced across %v %v after the churn", c.liveIDs(), d.Round(time.Millisecond))

	c.verify(want+2+c.gated, again, boundary, movedPart, writers)
}

// children counts the live child processes.
func (c *chaos) children() int {
	n := 0
	for _, m := range c.live {
		if m.child != nil {
			n++
		}
	}
	return n
}

// freeze makes a leader stale in the middle of a batch: it holds the gate
// lock, appends an event to a gate stream of a partition that a child
// process leads, and once that child's batch waits for the gate, stops the
// child (SIGSTOP) and terminates its lock session, as the server does once
// it has idled for the lock's FreezeTimeout (here at once, not after it;
// docs/operations.md, "A frozen process is taken over after the lock's
// FreezeTimeout").
// The other members take its partitions; then the gate opens (the frozen
// batch's statement completes on the server, and the new leader's batch
// waits for its row of counts) and the child resumes (SIGCONT): its batch
// must not commit.
func (c *chaos) freeze() {
	t := c.t
	t.Helper()
	var x *member
	for _, m := range c.live {
		if m.child != nil {
			x = m
			break
		}
	}
	hs := holders(t, c.b.db, []string{"counter"}, chaosParts)
	part := slices.Index(hs["counter"], x.id)
	c.unclean[x.id] = true
	if part < 0 {
		t.Fatalf("%s leads no partition of counter: %s", x.id, describe(hs))
	}
	g := c.holdGate("gatef", part)
	defer g.open()
	gated := g.stream
	if g.waiter != x.id {
		t.Fatalf("the batch of %s (counter/%d) waiting for the gate is %q's, want %s's; holders %s", gated, part, g.waiter, x.id,
			describe(holders(t, c.b.db, []string{"counter"}, chaosParts)))
	}
	before := c.queryInt(`SELECT epoch FROM annals.checkpoints WHERE subscriber_id = 'counter' AND partition = $1`, part)

	_, resume := x.child.Freeze()
	defer resume()
	start := time.Now()
	if n := c.queryInt(`
		SELECT count(pg_terminate_backend(pid)) FROM (
		    SELECT DISTINCT l.pid FROM pg_locks l JOIN pg_stat_activity a USING (pid)
		     WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2 AND a.application_name = $1) s`, x.id); n != 1 {
		t.Fatalf("%s holds advisory locks on %d sessions, want its one lock session", x.id, n)
	}
	c.live = slices.DeleteFunc(c.live, func(m *member) bool { return m == x })
	c.allLedWithin(start, "SIGSTOP of "+x.id+" and the end of its lock session")
	c.live = append(c.live, x)
	var taker string
	if _, ok := eventually(chaosRelead, func() bool {
		_ = c.b.db.Pool.QueryRow(t.Context(), `SELECT coalesce(owner, '') FROM annals.checkpoints WHERE subscriber_id = 'counter' AND partition = $1 AND epoch > $2`, part, before).Scan(&taker)
		return taker != ""
	}); !ok || taker == x.id {
		t.Fatalf("counter/%d not claimed by another instance after %s was frozen (owner %q)", part, x.id, taker)
	}
	// A stale leader's commit is refused.
	if err := c.cps.Commit(t.Context(), c.b.db.Pool, "counter", part, before, 1<<40); !errors.Is(err, checkpoint.ErrFenced) {
		t.Fatalf("a commit of counter/%d at the frozen leader's epoch %d: %v, want checkpoint.ErrFenced", part, before, err)
	}
	g.open()
	// The new leader's batch applies the gated event, at once if its
	// insert into counts came first, or else once the frozen batch is gone.
	if _, ok := eventually(10*time.Second, func() bool {
		return c.queryInt(`SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND wait_event_type = 'Lock'`, taker) > 0 ||
			c.queryInt(`SELECT count(*) FROM counted WHERE stream_id = $1`, gated) > 0
	}); !ok {
		t.Fatalf("%s's batch of %s neither waits for the frozen batch nor committed", taker, gated)
	}
	resume()
	if _, ok := eventually(20*time.Second, func() bool {
		return c.queryInt(`SELECT count(*) FROM counted WHERE stream_id = $1`, gated) > 0
	}); !ok {
		t.Fatalf("the gated event of %s is not applied 20s after %s resumed", gated, x.id)
	}
	var by string
	if err := c.b.db.Pool.QueryRow(t.Context(), `SELECT string_agg(instance, ',') FROM counted WHERE stream_id = $1`, gated).Scan(&by); err != nil {
		t.Fatal(err)
	}
	if by != taker {
		t.Fatalf("the gated event was applied by %s, want once, by %s (the frozen %s's batch must not commit)", by, taker, x.id)
	}
	// How the resumed leader learnt it was stale.
	how := c.stoppedLeading(x, part, before)
	if how == "" {
		t.Errorf("%s logged no end of its leadership of counter/%d at epoch %d", x.id, part, before)
	}
	t.Logf("froze %s in a batch of counter/%d; %s took over; the resumed batch did not commit: %s", x.id, part, taker, how)
}

// gate is a batch held in flight: the test holds the gate lock, and a
// batch with an event of stream waits for it in waiter's handler.
type gate struct {
	stream, waiter string
	open           func()
}

// holdGate takes the gate lock, appends an event to a stream with the
// prefix in partition part of counter, marked as a gate stream, and
// returns once that event's batch waits for the gate, with the instance
// whose batch it is. Call open to let it go on (at the latest, deferred).
func (c *chaos) holdGate(prefix string, part int) *gate {
	t := c.t
	t.Helper()
	g := &gate{stream: c.streamIn(prefix, part)}
	c.exec(`INSERT INTO gate VALUES ($1)`, g.stream)
	conn, err := c.b.db.Pool.Acquire(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(t.Context(), `SELECT pg_advisory_lock($1)`, gateKey); err != nil {
		conn.Release()
		t.Fatal(err)
	}
	var once sync.Once
	g.open = func() {
		once.Do(func() {
			if _, err := conn.Exec(context.Background(), `SELECT pg_advisory_unlock($1)`, gateKey); err != nil {
				t.Error(err)
			}
			conn.Release()
		})
	}
	if _, err := c.b.store.Append(t.Context(), g.stream, eventstore.Any, eventstore.NewEvent(Deposited{Amount: 7})); err != nil {
		g.open()
		t.Fatal(err)
	}
	c.gated++
	if _, ok := eventually(10*time.Second, func() bool {
		_ = c.b.db.Pool.QueryRow(t.Context(), `
			SELECT coalesce(max(a.application_name), '') FROM pg_locks l JOIN pg_stat_activity a USING (pid)
			 WHERE l.locktype = 'advisory' AND NOT l.granted AND l.objsubid = 1 AND l.objid = $1`, gateKey).Scan(&g.waiter)
		return g.waiter != ""
	}); !ok {
		g.open()
		t.Fatalf("no batch of %s (counter/%d) waits for the gate after 10s", g.stream, part)
	}
	return g
}

// logOf returns m's log.
func (m *member) logOf() string {
	if m.child != nil {
		return m.child.Log()
	}
	return m.log.String()
}

// stoppedLeading waits for m's log line saying it stopped leading
// counter/part at epoch, and returns it ("" if none came within 10 s).
func (c *chaos) stoppedLeading(m *member, part int, epoch int64) string {
	var line string
	eventually(10*time.Second, func() bool {
		for _, l := range strings.Split(m.logOf(), "\n") {
			if strings.Contains(l, "stopped leading") && strings.Contains(l, "subscriber=counter") &&
				strings.Contains(l, fmt.Sprintf("partition=%d epoch=%d", part, epoch)) {
				line = l
				return true
			}
		}
		return false
	})
	return line
}

// verify waits for both subscribers to catch up and checks the outcome.
func (c *chaos) verify(want int64, again map[string]bool, boundary int64, movedPart int, writers []*writer) {
	t := c.t
	t.Helper()
	events := c.queryInt(`SELECT count(*) FROM annals.events`)
	if events != want {
		t.Fatalf("the log has %d events; the writers committed %d (and 2 poisoned)", events, want)
	}
	if n := c.queryInt(`SELECT count(*) FROM annals.events WHERE (data->>'amount')::int >= $1`, rolledBackAmount); n != 0 {
		t.Fatalf("%d events of rolled-back transactions are in the log", n)
	}
	var rolled int
	for _, w := range writers {
		rolled += w.rolled
	}
	var counted, seen int64
	if _, ok := eventually(30*time.Second, func() bool {
		counted = c.queryInt(`SELECT count(DISTINCT event_id) FROM counted`)
		seen = c.queryInt(`SELECT count(DISTINCT global_sequence) FROM seen`)
		return counted == events && seen == events
	}); !ok {
		var dl string
		_ = c.b.db.Pool.QueryRow(t.Context(), `SELECT coalesce(string_agg(format('%s %s/%s %s %s', id, subscriber_id, partition, reason, status), '; '), '') FROM annals.dead_letters`).Scan(&dl)
		t.Fatalf("not caught up 30s after the churn: %d events, %d applied, %d seen; dead letters: %s", events, counted, seen, dl)
	}
	if n := c.queryInt(`SELECT count(*) FROM annals.dead_letters WHERE status IN ('open', 'retry')`); n != 0 {
		t.Fatalf("%d dead letters unresolved at the end", n)
	}

	// Exactly once, but twice for what the move back applied again.
	rows, err := c.b.db.Pool.Query(t.Context(), `SELECT event_id::text, count(*) FROM counted GROUP BY event_id`)
	if err != nil {
		t.Fatal(err)
	}
	applications, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (struct {
		id string
		n  int64
	}, error) {
		var x struct {
			id string
			n  int64
		}
		return x, r.Scan(&x.id, &x.n)
	})
	if err != nil {
		t.Fatal(err)
	}
	twice := 0
	for _, a := range applications {
		w := int64(1)
		if again[a.id] {
			w, twice = 2, twice+1
		}
		if a.n != w {
			t.Errorf("event %s applied %d times, want %d", a.id, a.n, w)
		}
	}
	if twice != len(again) {
		t.Errorf("%d events applied again after the move back, want %d", twice, len(again))
	}
	// counts equals the log's per-stream counts plus what was applied again.
	if n := c.queryInt(`
		SELECT count(*) FROM (
		    SELECT stream_id, count(*) AS n FROM counted GROUP BY stream_id
		) a FULL JOIN counts USING (stream_id)
		WHERE a.n IS DISTINCT FROM counts.n`); n != 0 {
		t.Errorf("counts differs from the applications in %d streams", n)
	}
	if n := c.queryInt(`
		SELECT count(*) FROM (
		    SELECT stream_id, count(*) AS n FROM annals.events GROUP BY stream_id
		) l FULL JOIN (
		    SELECT stream_id, count(DISTINCT event_id) AS n FROM counted GROUP BY stream_id
		) a USING (stream_id)
		WHERE l.n IS DISTINCT FROM a.n`); n != 0 {
		t.Errorf("the projection's streams differ from the log's in %d streams", n)
	}
	for _, w := range writers {
		for s, k := range w.committed {
			var n int64
			_ = c.b.db.Pool.QueryRow(t.Context(), `SELECT count(*) FROM annals.events WHERE stream_id = $1`, s).Scan(&n)
			if n < k {
				t.Errorf("stream %s has %d events; a writer alone committed %d", s, n, k)
			}
		}
	}

	// Per-stream order: versions strictly increase in application order
	// (counted's ID), restarting once in the moved partition at the move.
	rows, err = c.b.db.Pool.Query(t.Context(), `SELECT id, stream_id, stream_version, part FROM counted ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	last := map[string]int64{}
	var id, ver int64
	var stream string
	var part int
	crossed := map[string]bool{}
	if _, err := pgx.ForEachRow(rows, []any{&id, &stream, &ver, &part}, func() error {
		if part == movedPart && id > boundary && !crossed[stream] {
			crossed[stream] = true
			last[stream] = 0
		}
		if ver <= last[stream] {
			return errors.Newf("counter applied %s v%d after v%d (counted id %d)", stream, ver, last[stream], id)
		}
		last[stream] = ver
		return nil
	}); err != nil {
		t.Error(err)
	}
	// Each observer process in stream order, but those that lost a
	// leadership without knowing: they deliver again what they delivered
	// since their last checkpoint (at least once).
	rows, err = c.b.db.Pool.Query(t.Context(), `SELECT instance, stream_id, stream_version FROM seen ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	lastSeen := map[[2]string]int64{}
	var inst string
	if _, err := pgx.ForEachRow(rows, []any{&inst, &stream, &ver}, func() error {
		k := [2]string{inst, stream}
		if ver <= lastSeen[k] && !c.unclean[inst] {
			return errors.Newf("observer %s delivered %s v%d after v%d", inst, stream, ver, lastSeen[k])
		}
		lastSeen[k] = ver
		return nil
	}); err != nil {
		t.Error(err)
	}

	c.checkLeadership()
	slices.Sort(c.relead)
	t.Logf("%d events (%d rolled back, none in the log), %d applied twice after the move back; %d departures, partitions led again within %v (max)",
		events, rolled, len(again), len(c.relead), c.relead[len(c.relead)-1].Round(time.Millisecond))
}

// checkLeadership checks cp_log: epochs only grow; every commit (a move of
// the position under the same epoch) was made by a connection of the
// instance that claimed that epoch; and every application of an event was
// made under an epoch its instance had claimed.
func (c *chaos) checkLeadership() {
	t := c.t
	t.Helper()
	type key struct {
		sub   string
		part  int
		epoch int64
	}
	claimant := map[key]string{}
	lastEpoch := map[[2]any]int64{}
	rows, err := c.b.db.Pool.Query(t.Context(), `SELECT subscriber_id, part, coalesce(old_epoch, -1), new_epoch, coalesce(old_position, -1), new_position, coalesce(owner, ''), app FROM cp_log ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	var sub, owner, app string
	var part int
	var oldEpoch, newEpoch, oldPos, newPos int64
	claims, commits := 0, 0
	if _, err := pgx.ForEachRow(rows, []any{&sub, &part, &oldEpoch, &newEpoch, &oldPos, &newPos, &owner, &app}, func() error {
		sp := [2]any{sub, part}
		if prev, ok := lastEpoch[sp]; ok && newEpoch < prev {
			return errors.Newf("%s/%d: epoch went back from %d to %d", sub, part, prev, newEpoch)
		}
		lastEpoch[sp] = newEpoch
		switch {
		case newEpoch != oldEpoch:
			if owner != "" { // a claim; the operator's move has no owner
				if owner != app {
					return errors.Newf("%s/%d: epoch %d claimed for %s by a session of %s", sub, part, newEpoch, owner, app)
				}
				if prev, ok := claimant[key{sub, part, newEpoch}]; ok {
					return errors.Newf("%s/%d: epoch %d claimed by %s and %s", sub, part, newEpoch, prev, owner)
				}
				claimant[key{sub, part, newEpoch}] = owner
				claims++
			}
		case newPos != oldPos:
			commits++
			if who := claimant[key{sub, part, newEpoch}]; who != app {
				return errors.Newf("%s/%d: %s moved the checkpoint %d → %d at epoch %d, which %q claimed", sub, part, app, oldPos, newPos, newEpoch, who)
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	// Every application was made under its instance's epoch.
	rows, err = c.b.db.Pool.Query(t.Context(), `SELECT part, epoch, instance, count(*) FROM counted GROUP BY 1, 2, 3`)
	if err != nil {
		t.Fatal(err)
	}
	var epoch, n int64
	var inst string
	if _, err := pgx.ForEachRow(rows, []any{&part, &epoch, &inst, &n}, func() error {
		if who := claimant[key{"counter", part, epoch}]; who != inst {
			return errors.Newf("counter/%d: %s applied %d events at epoch %d, which %q claimed", part, inst, n, epoch, who)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	t.Logf("leadership: %d claims, %d checkpoint moves, each by its epoch's claimant", claims, commits)
}
