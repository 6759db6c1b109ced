package archive_test

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	mrand "math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/archive"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/projection"
	"github.com/annals-dev/annals/scavenge"
	"github.com/annals-dev/annals/verify"
)

// chaosCustomer is an event with personal data of Subject.
type chaosCustomer struct {
	Subject string `json:"subject"`
	Name    string `json:"name" annals:"personal"`
	N       int    `json:"n"`
}

// chaosDelivery is one event as a subscriber got it.
type chaosDelivery struct {
	pos, version int64
	id           uuid.UUID
	stream, typ  string
}

// chaosObserver records every delivery, in delivery order.
type chaosObserver struct {
	name   string
	failed sync.Map
	mu     sync.Mutex
	got    []chaosDelivery
}

func (o *chaosObserver) Name() string { return o.name }

func (o *chaosObserver) Handle(_ context.Context, e eventstore.Event) error {
	if err := failOnce(&o.failed, e); err != nil {
		return err
	}
	o.mu.Lock()
	o.got = append(o.got, chaosDelivery{pos: e.GlobalSequence, version: e.StreamVersion, id: e.ID, stream: e.StreamID, typ: e.Type})
	o.mu.Unlock()
	return nil
}

func (o *chaosObserver) deliveries() []chaosDelivery {
	o.mu.Lock()
	defer o.mu.Unlock()
	return slices.Clone(o.got)
}

func (o *chaosObserver) top() int64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	var top int64
	for _, d := range o.got {
		top = max(top, d.pos)
	}
	return top
}

// chaosProjection writes every event it is given into chaos_rm, with no
// unique constraint, so that an event applied twice shows as two rows.
type chaosProjection struct {
	name, table string
	cut         func(context.Context, pgx.Tx) // now and then, cuts the connection after the batch's COMMIT
	failed      *sync.Map                     // events that failed once (each in 200 does, then succeeds)
}

// failOnce fails the first attempt at one event in 200.
func failOnce(failed *sync.Map, e eventstore.Event) error {
	if e.ID[15]%200 == 7 {
		if _, again := failed.LoadOrStore(e.ID, true); !again {
			return errors.Newf("event %d fails once", e.GlobalSequence)
		}
	}
	return nil
}

func (p chaosProjection) Name() string { return p.name }

func (p chaosProjection) Handle(ctx context.Context, tx pgx.Tx, e eventstore.Event) error {
	if err := failOnce(p.failed, e); err != nil {
		return err
	}
	_, err := tx.Exec(ctx, `INSERT INTO `+p.table+` (global_sequence, event_id, stream_id, stream_version) VALUES ($1, $2, $3, $4)`,
		e.GlobalSequence, e.ID, e.StreamID, e.StreamVersion)
	if err == nil && p.cut != nil && mrand.IntN(150) == 0 {
		p.cut(ctx, tx)
	}
	return err
}

// executes counts the Execute messages in b, whole frontend messages: a
// pipelined commit (a checkpoint move or appends, then COMMIT) has two or
// more, a handler's statement one.
func executes(b []byte) int {
	n := 0
	for len(b) >= 5 {
		size := int(binary.BigEndian.Uint32(b[1:5]))
		if size < 4 || 1+size > len(b) {
			return n
		}
		if b[0] == 'E' {
			n++
		}
		b = b[1+size:]
	}
	return n
}

// chaosTruth is what the writers and the lifecycle know happened.
type chaosTruth struct {
	mu         sync.Mutex
	committed  map[uuid.UUID]eventstore.AppendedEvent // appends that returned success
	stream     map[uuid.UUID]string                   // every event ID ever sent, to its stream
	maybe      map[uuid.UUID]bool                     // sent, outcome never learnt
	rolledBack map[uuid.UUID]bool                     // appended in a transaction rolled back
	minCount   map[string]int64                       // smallest MaxCount asked for, per stream
	forgotten  map[string]bool                        // subjects whose Forget was called
}

func (c *chaosTruth) commit(res eventstore.AppendResult) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, e := range res.Events {
		c.committed[e.ID] = e
		delete(c.maybe, e.ID)
	}
}

func (c *chaosTruth) sent(stream string, evs []eventstore.EventData) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, e := range evs {
		c.stream[e.ID] = stream
	}
}

func (c *chaosTruth) unknown(evs []eventstore.EventData) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, e := range evs {
		if _, ok := c.committed[e.ID]; !ok {
			c.maybe[e.ID] = true
		}
	}
}

// definite reports an append error that says for sure nothing was
// written by this attempt.
func definite(err error) bool {
	return errors.Is(err, eventstore.ErrStreamDeleted) || errors.Is(err, eventstore.ErrSubjectForgotten) ||
		errors.Is(err, eventstore.ErrWrongExpectedVersion) || errors.Is(err, eventstore.ErrInvalidEvent)
}

// TestLifecycleChaos runs writers (appends, rolled-back AppendTx,
// multi-stream Transact, re-appends of stored events, personal data)
// against retention changes, soft and hard deletes (and recreations),
// Forget, scavenge and archive runs, two projections (one partitioned), an
// observer, a late observer from position 0 and a reader paging ReadAll
// from 0, with handlers failing once now and then, while backends are
// terminated, connections are cut right after a pipelined COMMIT and
// PostgreSQL restarts. It checks that no subscriber or reader skipped an
// event still in the log, that each got the log in position order and
// each stream in version order (the projections exactly once), that
// re-appends are answered with the stored positions, that only what
// retention and deletion allow is gone and nothing rolled back is
// anywhere, that reads see through the archive and redact forgotten
// subjects, and that verify finds nothing. The seed is logged; timing
// makes a run unrepeatable all the same.
func TestLifecycleChaos(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	seed := mrand.Uint64()
	t.Logf("seed %d", seed)

	cluster, pool := annalstest.PrivateCluster(t, ctx, nil)
	for _, table := range []string{"chaos_rm", "chaos_rm_part"} {
		if _, err := pool.Exec(ctx, `CREATE TABLE `+table+` (n bigserial PRIMARY KEY, global_sequence bigint NOT NULL,
			event_id uuid NOT NULL, stream_id text NOT NULL, stream_version bigint NOT NULL)`); err != nil {
			t.Fatal(err)
		}
	}

	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		t.Fatal(err)
	}
	kek, err := eventstore.NewLocalKEK(key)
	if err != nil {
		t.Fatal(err)
	}
	reg := eventstore.NewRegistry()
	if err := eventstore.Register[chaosCustomer](reg, "customer.seen", eventstore.PersonalData("Subject")); err != nil {
		t.Fatal(err)
	}
	if err := eventstore.RegisterLifecycleEvents(reg); err != nil {
		t.Fatal(err)
	}
	// Writers and runners go through connections the test can cut right
	// after a pipelined COMMIT is sent (the commit lands, its answer is lost).
	cp := annalstest.NewCutPool(t, &annalstest.DB{Pool: pool})
	var cuts atomic.Int64
	cutAtCommit := func(c context.Context, tx pgx.Tx) {
		conn, err := cp.Of(c, tx)
		if err != nil {
			return // the connection failed already
		}
		conn.CutAfter(func(b []byte) bool { return executes(b) >= 2 })
		cuts.Add(1)
	}
	store, err := eventstore.New(cp.Pool, &eventstore.Config{Registry: reg, KEK: kek, KeyCacheTTL: 50 * time.Millisecond, PageSize: 37})
	if err != nil {
		t.Fatal(err)
	}

	truth := &chaosTruth{committed: map[uuid.UUID]eventstore.AppendedEvent{}, stream: map[uuid.UUID]string{},
		maybe: map[uuid.UUID]bool{}, rolledBack: map[uuid.UUID]bool{}, minCount: map[string]int64{}, forgotten: map[string]bool{}}

	// Streams by what may happen to them.
	var plain, kept, deleted, subjects []string
	for i := range 6 {
		plain = append(plain, fmt.Sprintf("p-%d", i))
	}
	for i := range 3 {
		kept = append(kept, fmt.Sprintf("r-%d", i)) // retention by count and truncation
		deleted = append(deleted, fmt.Sprintf("d-%d", i))
	}
	for i := range 5 {
		subjects = append(subjects, fmt.Sprintf("s%d", i))
	}
	const aged = "a-0" // a maximum age

	// Plain streams lose no event: their appends are re-appended later,
	// and must be answered with the stored positions.
	type plainAppend struct {
		stream string
		evs    []eventstore.EventData
		res    eventstore.AppendResult
	}
	var plainMu sync.Mutex
	var plainDone []plainAppend
	var reappendErrs []string
	remember := func(stream string, evs []eventstore.EventData, res eventstore.AppendResult) {
		if strings.HasPrefix(stream, "p-") {
			plainMu.Lock()
			plainDone = append(plainDone, plainAppend{stream, evs, res})
			plainMu.Unlock()
		}
	}

	// The writers' appends: each retried with the same IDs until its
	// outcome is known (PostgreSQL restarts under them).
	appendKnown := func(wctx context.Context, stream string, evs []eventstore.EventData) {
		truth.sent(stream, evs)
		expected := eventstore.Any
		ambiguous := false
		recreated := false
		for attempt := 0; ; attempt++ {
			res, err := store.Append(wctx, stream, expected, evs...)
			if err == nil {
				truth.commit(res)
				remember(stream, evs, res)
				return
			}
			var del *eventstore.StreamDeletedError
			if errors.As(err, &del) && !del.Hard && !recreated {
				expected, recreated = eventstore.Exact(del.Version), true // recreate the stream
				continue
			}
			if definite(err) || wctx.Err() != nil || attempt > 200 {
				if ambiguous || !definite(err) {
					truth.unknown(evs)
				}
				return
			}
			if !errors.Is(err, eventstore.ErrNotWritten) {
				ambiguous = true
			}
			time.Sleep(20 * time.Millisecond) // back off before the retry, not a wait for a condition
		}
	}
	newEvents := func(n int) []eventstore.EventData {
		evs := make([]eventstore.EventData, n)
		for i := range evs {
			evs[i] = eventstore.EventData{ID: uuid.Must(uuid.NewV7()), Type: "chaos.happened", Data: map[string]any{"i": i}}
		}
		return evs
	}

	var ops [9]atomic.Int64 // appends, rollbacks, transacts, personal, retention, deletes, forgets, terminated, re-appends
	wctx, stopWriters := context.WithCancel(ctx)
	defer stopWriters()
	var writers sync.WaitGroup
	for w := range 4 {
		writers.Add(1)
		go func() {
			defer writers.Done()
			rnd := mrand.New(mrand.NewPCG(uint64(w), seed))
			for wctx.Err() == nil {
				time.Sleep(time.Duration(rnd.IntN(3000)) * time.Microsecond) // random pacing
				switch k := rnd.IntN(10); {
				case k < 4: // a plain append to any kind of stream
					all := slices.Concat(plain, kept, deleted, []string{aged})
					appendKnown(wctx, all[rnd.IntN(len(all))], newEvents(1+rnd.IntN(3)))
					ops[0].Add(1)
				case k < 5: // AppendTx in a transaction rolled back
					evs := newEvents(1 + rnd.IntN(2))
					stream := plain[rnd.IntN(len(plain))]
					truth.mu.Lock()
					for _, e := range evs {
						truth.rolledBack[e.ID] = true
					}
					truth.mu.Unlock()
					tx, err := pool.Begin(wctx)
					if err != nil {
						continue
					}
					_, _ = store.AppendTx(wctx, tx, stream, eventstore.Any, evs...)
					_ = tx.Rollback(context.WithoutCancel(wctx))
					ops[1].Add(1)
				case k < 7: // one transaction over two streams
					a, b := plain[rnd.IntN(len(plain))], kept[rnd.IntN(len(kept))]
					ea, eb := newEvents(1+rnd.IntN(2)), newEvents(1)
					truth.sent(a, ea)
					truth.sent(b, eb)
					for attempt := 0; ; attempt++ {
						cut := rnd.IntN(8) == 0
						results, err := store.Transact(wctx, func(c context.Context, tx pgx.Tx, batch *eventstore.Batch) error {
							if cut {
								cutAtCommit(c, tx)
							}
							if err := batch.Append(a, eventstore.Any, ea...); err != nil {
								return err
							}
							return batch.Append(b, eventstore.Any, eb...)
						})
						if err == nil {
							for _, r := range results {
								truth.commit(r)
							}
							remember(a, ea, results[0])
							break
						}
						if wctx.Err() != nil || attempt > 200 {
							truth.unknown(slices.Concat(ea, eb))
							break
						}
						time.Sleep(20 * time.Millisecond) // back off before the retry
					}
					ops[2].Add(1)
				case k < 8: // an earlier append to a plain stream, again: answered as stored
					plainMu.Lock()
					if len(plainDone) == 0 {
						plainMu.Unlock()
						continue
					}
					pa := plainDone[rnd.IntN(len(plainDone))]
					plainMu.Unlock()
					res, err := store.Append(wctx, pa.stream, eventstore.Any, pa.evs...)
					if err != nil {
						continue // PostgreSQL restarting, a cut connection
					}
					if !slices.Equal(res.Events, pa.res.Events) {
						plainMu.Lock()
						reappendErrs = append(reappendErrs, fmt.Sprintf("re-append to %s answered %v, stored %v", pa.stream, res.Events, pa.res.Events))
						plainMu.Unlock()
					}
					ops[8].Add(1)
				default: // personal data
					s := subjects[rnd.IntN(len(subjects))]
					evs := []eventstore.EventData{{ID: uuid.Must(uuid.NewV7()), Data: chaosCustomer{Subject: s, Name: "name-" + s, N: rnd.IntN(100)}}}
					appendKnown(wctx, "c-"+s, evs)
					ops[3].Add(1)
				}
			}
		}()
	}

	// A reader paging through the log from 0 again and again, while
	// events are archived and scavenged under it: in position order, and
	// nothing skipped that is still in the log afterwards; and stream reads
	// of the plain streams, from version 1 with no version missing.
	var readerMu sync.Mutex
	var readerErrs []string
	var passes atomic.Int64
	readerFail := func(format string, args ...any) {
		readerMu.Lock()
		readerErrs = append(readerErrs, fmt.Sprintf(format, args...))
		readerMu.Unlock()
	}
	writers.Add(1)
	go func() {
		defer writers.Done()
		rnd := mrand.New(mrand.NewPCG(99, seed))
		for wctx.Err() == nil {
			var seen []int64
			var last int64
			failed := false
			for e, err := range store.ReadAll(wctx, 0) {
				if err != nil {
					failed = true // PostgreSQL restarting, a cut connection
					break
				}
				if e.GlobalSequence <= last {
					readerFail("ReadAll(0) returned %d after %d", e.GlobalSequence, last)
				}
				last = e.GlobalSequence
				seen = append(seen, last)
			}
			if failed || last == 0 {
				continue
			}
			var missing []int64
			if err := pool.QueryRow(wctx, `SELECT coalesce(array_agg(global_sequence), '{}') FROM (
				SELECT global_sequence FROM annals.events_all
				 WHERE global_sequence <= $1 AND global_sequence NOT IN (SELECT unnest($2::bigint[])) LIMIT 10) x`, last, seen).Scan(&missing); err != nil {
				continue
			}
			if len(missing) > 0 {
				readerFail("ReadAll(0) read through %d and skipped %v, still in the log", last, missing)
			}
			passes.Add(1)
			stream := plain[rnd.IntN(len(plain))]
			var v int64
			for e, err := range store.ReadStream(wctx, stream, 0) {
				if err != nil {
					break
				}
				if e.StreamVersion != v+1 {
					readerFail("ReadStream(%s) returned version %d after %d", stream, e.StreamVersion, v)
				}
				v = e.StreamVersion
			}
		}
	}()

	// Subscribers.
	newRunnerOn := func() *projection.Runner {
		r, err := projection.NewRunner(cp.Pool, &projection.Config{LockRetryInterval: 50 * time.Millisecond,
			PollInterval: 200 * time.Millisecond, RetryBackoff: 100 * time.Millisecond, Logger: quiet,
			Retry: &projection.RetryPolicy{MaxRetries: 1000, InitialDelay: 50 * time.Millisecond, MaxDelay: 200 * time.Millisecond}})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	runIt := func(r *projection.Runner) func() {
		rctx, stop := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- r.Run(rctx) }()
		return func() {
			stop()
			if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
				t.Errorf("runner: %v", err)
			}
		}
	}
	obs := &chaosObserver{name: "chaos-obs"}
	late := &chaosObserver{name: "chaos-late"}
	runner := newRunnerOn()
	if err := runner.Register(chaosProjection{name: "chaos-proj", table: "chaos_rm", cut: cutAtCommit, failed: &sync.Map{}}, &projection.Options{BatchSize: 25}); err != nil {
		t.Fatal(err)
	}
	if err := runner.Register(chaosProjection{name: "chaos-part", table: "chaos_rm_part", cut: cutAtCommit, failed: &sync.Map{}}, &projection.Options{BatchSize: 10, Partitions: 3}); err != nil {
		t.Fatal(err)
	}
	if err := runner.Register(obs, &projection.Options{BatchSize: 25, CheckpointEvery: 10}); err != nil {
		t.Fatal(err)
	}
	stopRunner := runIt(runner)
	var stopLate func()

	// The invariant of the projection, checked while everything runs: in
	// any snapshot, every event at or below its checkpoint is applied.
	var skipped atomic.Value
	checkOnce := func(c context.Context) error {
		var missing []int64
		rows, err := pool.Query(c, `SELECT e.global_sequence FROM annals.events_all e
			WHERE e.global_sequence <= (SELECT coalesce(max(position), 0) FROM annals.checkpoints WHERE subscriber_id = 'chaos-proj')
			  AND NOT EXISTS (SELECT FROM chaos_rm r WHERE r.global_sequence = e.global_sequence) LIMIT 10`)
		if err != nil {
			return err
		}
		if missing, err = pgx.CollectRows(rows, pgx.RowTo[int64]); err != nil {
			return err
		}
		if len(missing) > 0 {
			skipped.CompareAndSwap(nil, fmt.Sprintf("positions %v are at or below the projection's checkpoint and not applied", missing))
		}
		return nil
	}

	// Lifecycle and chaos, on a schedule, until the writers stop.
	scav, err := scavenge.New(pool, &scavenge.Config{BatchSize: 50, Pause: -1, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	arch, err := archive.New(pool, &archive.Config{BatchSize: 40, Pause: -1, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	var scavenged, archived atomic.Int64
	runMaintenance := func(c context.Context) error {
		p, err := scav.RunOnce(c)
		if err != nil {
			return err
		}
		scavenged.Add(p.Removed)
		var head int64
		if err := pool.QueryRow(c, `SELECT coalesce(max(global_sequence), 0) FROM annals.events_all`).Scan(&head); err != nil {
			return err
		}
		if head > 30 {
			ap, err := arch.RunOnce(c, head-30)
			if err != nil {
				return err
			}
			archived.Add(ap.Moved)
		}
		return nil
	}
	terminate := func(c context.Context, which string) {
		var n int64
		if err := pool.QueryRow(c, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
			WHERE datname = current_database() AND pid <> pg_backend_pid() AND backend_type = 'client backend'
			  AND (`+which+`)`).Scan(&n); err == nil {
			ops[7].Add(n)
		}
	}

	rnd := mrand.New(mrand.NewPCG(seed, 7))
	start := time.Now()
	restarted := false
	var chaosErrs []string
	agedSet := false
	hardDone := false
	step := 0
	for time.Since(start) < 9*time.Second {
		step++
		time.Sleep(time.Duration(50+rnd.IntN(100)) * time.Millisecond) // pacing of the lifecycle operations
		el := time.Since(start)
		if err := checkOnce(ctx); err != nil {
			chaosErrs = append(chaosErrs, "check: "+err.Error())
		}
		switch {
		case !restarted && el > 4*time.Second:
			restarted = true
			if err := cluster.Restart(ctx); err != nil {
				t.Fatal(err)
			}
			continue
		case step%17 == 5: // the advisory lock holders: leaders, archiver, scavenger
			terminate(ctx, `pid IN (SELECT pid FROM pg_locks WHERE locktype = 'advisory')`)
			continue
		case step%23 == 11: // anybody, at random
			terminate(ctx, `random() < 0.2`)
			continue
		}
		if !hardDone && el > 5*time.Second {
			// d-0 is hard-deleted once; a soft deletion in the way is
			// undone by the writers' next append to it.
			_, err := store.DeleteStream(ctx, deleted[0], eventstore.Any, &eventstore.DeleteOptions{Hard: true})
			hardDone = err == nil
		}
		if stopLate == nil && el > 3*time.Second {
			r := newRunnerOn()
			if err := r.Register(late, &projection.Options{BatchSize: 40}); err != nil {
				t.Fatal(err)
			}
			stopLate = runIt(r)
		}
		if !agedSet {
			age := 1500 * time.Millisecond
			if _, err := store.SetStreamRetention(ctx, aged, eventstore.RetentionChange{MaxAge: &age}); err == nil {
				agedSet = true
			}
		}
		switch rnd.IntN(6) {
		case 0, 1:
			s := kept[rnd.IntN(len(kept))]
			var ch eventstore.RetentionChange
			if rnd.IntN(2) == 0 {
				n := int64(3 + rnd.IntN(6))
				truth.mu.Lock()
				if m, ok := truth.minCount[s]; !ok || n < m {
					truth.minCount[s] = n
				}
				truth.mu.Unlock()
				ch.MaxCount = &n
			} else {
				var v int64
				if err := pool.QueryRow(ctx, `SELECT coalesce((SELECT version FROM annals.streams WHERE stream_id = $1), 0)`, s).Scan(&v); err != nil {
					chaosErrs = append(chaosErrs, "version: "+err.Error())
					continue
				}
				tb := max(1, v-int64(rnd.IntN(5)))
				ch.TruncateBefore = &tb
			}
			if _, err := store.SetStreamRetention(ctx, s, ch); err != nil && !errors.Is(err, eventstore.ErrInvalidEvent) && !errors.Is(err, eventstore.ErrStreamNotFound) {
				chaosErrs = append(chaosErrs, "retention: "+err.Error())
			}
			ops[4].Add(1)
		case 2:
			s := deleted[rnd.IntN(len(deleted))]
			if _, err := store.DeleteStream(ctx, s, eventstore.Any, nil); err != nil && !errors.Is(err, eventstore.ErrStreamDeleted) && !errors.Is(err, eventstore.ErrStreamNotFound) {
				chaosErrs = append(chaosErrs, "delete: "+err.Error())
			}
			ops[5].Add(1)
		case 3:
			if el > 2*time.Second {
				s := subjects[rnd.IntN(2)] // s0 and s1 only
				truth.mu.Lock()
				truth.forgotten[s] = true
				truth.mu.Unlock()
				if _, err := store.Forget(ctx, s); err != nil {
					chaosErrs = append(chaosErrs, "forget: "+err.Error())
				}
				ops[6].Add(1)
			}
		default:
			if err := runMaintenance(ctx); err != nil && !errors.Is(err, scavenge.ErrBusy) && !errors.Is(err, archive.ErrBusy) {
				chaosErrs = append(chaosErrs, "maintenance: "+err.Error())
			}
		}
	}
	stopWriters()
	writers.Wait()
	// A Forget that failed while PostgreSQL was down is made again.
	for s := range truth.forgotten {
		annalstest.WaitForErr(t, 30*time.Second, func() error { _, err := store.Forget(ctx, s); return err })
	}
	t.Logf("ops: %d appends, %d rollbacks, %d transacts, %d personal, %d retention, %d deletes, %d forgets, %d backends terminated",
		ops[0].Load(), ops[1].Load(), ops[2].Load(), ops[3].Load(), ops[4].Load(), ops[5].Load(), ops[6].Load(), ops[7].Load())
	t.Logf("%d errors while PostgreSQL restarted and connections died (expected), e.g. %.300s", len(chaosErrs), strings.Join(chaosErrs, " | "))

	// The maintenance once more, with nothing in the way: archive what is
	// left and remove all that retention allows.
	annalstest.WaitForErr(t, 30*time.Second, func() error { return runMaintenance(ctx) })
	var head int64
	if err := pool.QueryRow(ctx, `SELECT coalesce(max(global_sequence), 0) FROM annals.events_all`).Scan(&head); err != nil {
		t.Fatal(err)
	}
	readModel := func(table string) []chaosDelivery {
		t.Helper()
		rows, err := pool.Query(ctx, `SELECT global_sequence, stream_version, event_id, stream_id FROM `+table+` ORDER BY n`)
		if err != nil {
			t.Fatal(err)
		}
		got, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (chaosDelivery, error) {
			var d chaosDelivery
			return d, r.Scan(&d.pos, &d.version, &d.id, &d.stream)
		})
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	annalstest.WaitForErr(t, 30*time.Second, func() error {
		var missing int64
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM annals.events_all e
			WHERE NOT EXISTS (SELECT FROM chaos_rm_part r WHERE r.global_sequence = e.global_sequence)`).Scan(&missing); err != nil {
			return err
		}
		if missing > 0 {
			return errors.Newf("the partitioned projection lacks %d events of the log", missing)
		}
		var cp int64
		if err := pool.QueryRow(ctx, `SELECT coalesce(max(position), 0) FROM annals.checkpoints WHERE subscriber_id = 'chaos-proj'`).Scan(&cp); err != nil {
			return err
		}
		if cp < head || obs.top() < head || late.top() < head {
			return errors.Newf("head %d; projection at %d, observer at %d, late observer at %d", head, cp, obs.top(), late.top())
		}
		return nil
	})
	if err := checkOnce(ctx); err != nil {
		t.Fatal(err)
	}
	stopRunner()
	stopLate()
	if s := skipped.Load(); s != nil {
		t.Errorf("the projection skipped events: %s", s)
	}
	t.Logf("head %d, %d scavenged, %d archived", head, scavenged.Load(), archived.Load())

	// The log as it ends.
	rows, err := pool.Query(ctx, `SELECT global_sequence, stream_version, event_id, stream_id, event_type FROM annals.events_all ORDER BY global_sequence`)
	if err != nil {
		t.Fatal(err)
	}
	final, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (chaosDelivery, error) {
		var d chaosDelivery
		return d, r.Scan(&d.pos, &d.version, &d.id, &d.stream, &d.typ)
	})
	if err != nil {
		t.Fatal(err)
	}
	inLog := map[uuid.UUID]chaosDelivery{}
	for _, d := range final {
		inLog[d.id] = d
	}
	lifecycleEvent := func(d chaosDelivery) bool {
		return strings.HasPrefix(d.typ, eventstore.ReservedTypePrefix) || strings.HasPrefix(d.stream, "$$")
	}

	// Nothing rolled back is anywhere; everything in the log was sent.
	truth.mu.Lock()
	for _, d := range final {
		if truth.rolledBack[d.id] {
			t.Errorf("event %d (%s@%d) was appended in a transaction that rolled back", d.pos, d.stream, d.version)
		}
		if _, ok := truth.stream[d.id]; !ok && !lifecycleEvent(d) {
			t.Errorf("event %d (%s@%d, %s) was never sent by a writer", d.pos, d.stream, d.version, d.typ)
		}
		if c, ok := truth.committed[d.id]; ok && (c.GlobalSequence != d.pos || c.StreamVersion != d.version) {
			t.Errorf("event %s is at %d (%s@%d); its append answered %d @%d", d.id, d.pos, d.stream, d.version, c.GlobalSequence, c.StreamVersion)
		}
	}

	// What is gone went by retention or deletion.
	type streamRow struct {
		version, truncateBefore int64
		state                   int
		maxCount                *int64
		maxAge                  *time.Duration
	}
	streams := map[string]streamRow{}
	srows, err := pool.Query(ctx, `SELECT stream_id, version, truncate_before, state, max_count, max_age FROM annals.streams`)
	if err != nil {
		t.Fatal(err)
	}
	for srows.Next() {
		var id string
		var s streamRow
		if err := srows.Scan(&id, &s.version, &s.truncateBefore, &s.state, &s.maxCount, &s.maxAge); err != nil {
			t.Fatal(err)
		}
		streams[id] = s
	}
	if err := srows.Err(); err != nil {
		t.Fatal(err)
	}
	gone := 0
	for id, c := range truth.committed {
		if _, ok := inLog[id]; ok {
			continue
		}
		gone++
		sid := truth.stream[id]
		s := streams[sid]
		minCount, counted := truth.minCount[sid]
		allowed := s.state == 2 || c.StreamVersion < s.truncateBefore || s.maxAge != nil ||
			(counted && c.StreamVersion <= s.version-minCount)
		if !allowed {
			t.Errorf("event %d (%s@%d) is gone, and its stream (version %d, truncate_before %d, state %d, count %v) allows no removal",
				c.GlobalSequence, sid, c.StreamVersion, s.version, s.truncateBefore, s.state, truth.minCount[sid])
		}
	}
	maybeIn := 0
	for id := range truth.maybe {
		if _, ok := inLog[id]; ok {
			maybeIn++
		}
	}
	t.Logf("%d events committed (%d gone by retention or deletion), %d of unknown outcome (%d of them in the log), %d rolled back",
		len(truth.committed), gone, len(truth.maybe), maybeIn, len(truth.rolledBack))
	truth.mu.Unlock()

	// The projection: each event once, in position order, per stream in
	// version order, and every event of the log.
	applied := readModel("chaos_rm")
	checkDeliveries := func(name string, got []chaosDelivery, once, partitioned bool) {
		t.Helper()
		seen := map[uuid.UUID]bool{}
		lastVersion := map[string]int64{}
		var last int64
		problems := 0
		report := func(format string, args ...any) {
			if problems++; problems <= 10 {
				t.Errorf(name+": "+format, args...)
			}
		}
		for _, d := range got {
			if seen[d.id] {
				if once {
					report("event %d (%s@%d) applied twice", d.pos, d.stream, d.version)
				}
				continue
			}
			seen[d.id] = true
			if d.pos <= last && !partitioned {
				report("event %d (%s@%d) first delivered after %d", d.pos, d.stream, d.version, last)
			}
			last = d.pos
			if d.version <= lastVersion[d.stream] {
				report("%s@%d first delivered after version %d of its stream", d.stream, d.version, lastVersion[d.stream])
			}
			lastVersion[d.stream] = d.version
			if l, ok := inLog[d.id]; ok && (l.pos != d.pos || l.version != d.version) {
				report("event %s delivered as %d (%s@%d), stored at %d (%s@%d)", d.id, d.pos, d.stream, d.version, l.pos, l.stream, l.version)
			}
			truth.mu.Lock()
			rb := truth.rolledBack[d.id]
			truth.mu.Unlock()
			if rb {
				report("event %d (%s@%d) of a rolled-back transaction delivered", d.pos, d.stream, d.version)
			}
		}
		for _, d := range final {
			if !seen[d.id] {
				report("event %d (%s@%d, %s) of the log never delivered", d.pos, d.stream, d.version, d.typ)
			}
		}
		if problems > 10 {
			t.Errorf("%s: %d problems in all", name, problems)
		}
	}
	checkDeliveries("projection", applied, true, false)
	checkDeliveries("partitioned projection", readModel("chaos_rm_part"), true, true)
	checkDeliveries("observer", obs.deliveries(), false, false)
	checkDeliveries("late observer", late.deliveries(), false, false)
	for _, e := range reappendErrs {
		t.Error(e)
	}
	for i, e := range readerErrs {
		if i < 10 {
			t.Error(e)
		}
	}
	t.Logf("%d connections cut after a COMMIT, %d re-appends, %d passes of ReadAll(0)", cuts.Load(), ops[8].Load(), passes.Load())
	if len(late.deliveries()) == 0 || late.deliveries()[0].pos > final[0].pos {
		t.Errorf("the late observer did not start from the log's start")
	}

	// Reads see the log through the archive.
	var all []uuid.UUID
	for e, err := range store.ReadAll(ctx, 0) {
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, e.ID)
		if e.Type == "customer.seen" {
			env, err := eventstore.Decode[chaosCustomer](reg, e)
			if err != nil {
				t.Fatalf("event %d: %v", e.GlobalSequence, err)
			}
			want := "name-" + env.Data.Subject
			truth.mu.Lock()
			if truth.forgotten[env.Data.Subject] {
				want = eventstore.Forgotten
			}
			truth.mu.Unlock()
			if env.Data.Name != want {
				t.Errorf("event %d of subject %s reads name %q, want %q", e.GlobalSequence, env.Data.Subject, env.Data.Name, want)
			}
		}
	}
	if len(all) != len(final) {
		t.Errorf("ReadAll(0) returned %d events, the log holds %d", len(all), len(final))
	} else {
		for i := range all {
			if all[i] != final[i].id {
				t.Errorf("ReadAll(0)'s event %d is %s, the log's %s", i, all[i], final[i].id)
				break
			}
		}
	}
	for sid, s := range streams {
		var want []int64
		for _, d := range final {
			if d.stream == sid && d.version >= s.truncateBefore && (s.maxCount == nil || d.version > s.version-*s.maxCount) {
				want = append(want, d.version)
			}
		}
		var got []int64
		var readErr error
		for e, err := range store.ReadStream(ctx, sid, 0) {
			if err != nil {
				readErr = err
				break
			}
			got = append(got, e.StreamVersion)
		}
		switch {
		case s.state != 0:
			if !errors.Is(readErr, eventstore.ErrStreamDeleted) {
				t.Errorf("ReadStream(%s), deleted: %v, %v", sid, got, readErr)
			}
		case readErr != nil:
			t.Errorf("ReadStream(%s): %v", sid, readErr)
		case s.maxAge != nil:
			if !slices.IsSorted(got) || len(got) > len(want) {
				t.Errorf("ReadStream(%s) with a maximum age: %v of %v", sid, got, want)
			}
		case !slices.Equal(got, want):
			t.Errorf("ReadStream(%s) = %v, want %v", sid, got, want)
		}
	}

	var dead, inArchive int64
	if err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM annals.dead_letters), (SELECT count(*) FROM annals.events_archive)`).Scan(&dead, &inArchive); err != nil {
		t.Fatal(err)
	}
	if dead != 0 {
		t.Errorf("%d dead letters", dead)
	}
	if inArchive == 0 || scavenged.Load() == 0 || !restarted || !hardDone {
		t.Errorf("the run did not exercise everything: %d archived, %d scavenged, restarted %v, hard delete %v",
			inArchive, scavenged.Load(), restarted, hardDone)
	}
	rep, err := verify.Log(ctx, pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !rep.OK() {
		b, _ := json.MarshalIndent(rep.Problems, "", "  ")
		t.Errorf("verify: %d problems: %s", rep.ProblemCount, b)
	}
}
