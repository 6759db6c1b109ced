package eventstore_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/eventstore"
)

type seenEvent struct {
	pos     int64
	id      uuid.UUID
	stream  string
	version int64
}

// TestNoSkippedEventsUnderConcurrency is the contract's items 2–4: with many
// concurrent writers whose transactions do other work first, sleep, append
// to one or two streams, stay open after appending, or roll back, a reader
// that tails with nothing but "WHERE global_sequence > checkpoint" sees
// every committed event exactly once, in increasing position, with
// contiguous versions per stream, and no rolled-back event. Meanwhile a long
// write transaction on another table does not hold the reader back.
func TestNoSkippedEventsUnderConcurrency(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	b := setup(t, nil)
	if _, err := b.db.Pool.Exec(ctx, `CREATE TABLE side (id bigserial PRIMARY KEY, note text)`); err != nil {
		t.Fatal(err)
	}

	const writers = 16
	runFor := 4 * time.Second
	if testing.Short() {
		runFor = time.Second
	}

	var (
		mu         sync.Mutex
		committed  = map[uuid.UUID]string{} // event ID -> stream
		rolledBack = map[uuid.UUID]bool{}
	)
	record := func(ids map[uuid.UUID]string, ok bool) {
		mu.Lock()
		defer mu.Unlock()
		for id, s := range ids {
			if ok {
				committed[id] = s
			} else {
				rolledBack[id] = true
			}
		}
	}

	// The reader: the simplest possible tail, a checkpoint and a range query.
	var (
		seen      []seenEvent
		seenCount atomic.Int64
		readerPos atomic.Int64
		readerErr = make(chan error, 1)
		stopRead  = make(chan struct{})
		wg        sync.WaitGroup
	)
	// On any exit, failures included, stop every goroutine and give their
	// connections back before the harness closes the pool.
	t.Cleanup(func() {
		cancel()
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		conn, err := b.db.Pool.Acquire(ctx)
		if err != nil {
			readerErr <- err
			return
		}
		defer conn.Release()
		var checkpoint int64
		for {
			rows, err := conn.Query(ctx, `SELECT global_sequence, event_id, stream_id, stream_version
				FROM annals.events WHERE global_sequence > $1 ORDER BY global_sequence LIMIT 1000`, checkpoint)
			if err != nil {
				readerErr <- err
				return
			}
			var e seenEvent
			n := 0
			_, err = pgx.ForEachRow(rows, []any{&e.pos, &e.id, &e.stream, &e.version}, func() error {
				seen = append(seen, e)
				checkpoint = e.pos
				n++
				return nil
			})
			if err != nil {
				readerErr <- err
				return
			}
			seenCount.Add(int64(n))
			readerPos.Store(checkpoint)
			if n == 0 {
				select {
				case <-stopRead:
					readerErr <- nil
					return
				case <-time.After(time.Millisecond): // poll interval of the tail
				}
			}
		}
	}()

	// A long transaction that writes elsewhere stays open while the writers run.
	longTx, err := b.db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = longTx.Rollback(context.Background()) }()
	if _, err := longTx.Exec(ctx, `INSERT INTO side (note) VALUES ('long transaction')`); err != nil {
		t.Fatal(err)
	}

	deadline := time.Now().Add(runFor)
	var writersDone sync.WaitGroup
	var appends atomic.Int64
	writerErrs := make(chan error, writers)
	for w := range writers {
		wg.Add(1)
		writersDone.Add(1)
		go func() {
			defer wg.Done()
			defer writersDone.Done()
			rng := rand.New(rand.NewPCG(uint64(w), uint64(time.Now().UnixNano())))
			for time.Now().Before(deadline) && ctx.Err() == nil {
				err := writeOnce(ctx, b, rng, record)
				var pgErr *pgconn.PgError
				if errors.As(err, &pgErr) && pgErr.Code == "40001" {
					continue // a serialization failure rolled back; callers retry
				}
				if err != nil {
					writerErrs <- fmt.Errorf("writer %d: %w", w, err)
					return
				}
				appends.Add(1)
			}
		}()
	}

	// While the long transaction is open, the reader keeps receiving events.
	before := seenCount.Load()
	annalstest.WaitFor(t, 30*time.Second, func() bool { return seenCount.Load() > before+100 })
	var longOpen bool
	if err := longTx.QueryRow(ctx, `SELECT true`).Scan(&longOpen); err != nil || !longOpen {
		t.Fatalf("long transaction not open while the reader progressed: %v", err)
	}

	writersDone.Wait()
	close(writerErrs)
	for err := range writerErrs {
		t.Fatal(err)
	}
	if err := longTx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	head := mustHead(t, b.store)
	annalstest.WaitFor(t, 30*time.Second, func() bool { return readerPos.Load() >= head })
	close(stopRead)
	if err := <-readerErr; err != nil {
		t.Fatal(err)
	}

	mu.Lock()
	defer mu.Unlock()
	t.Logf("%d transactions, %d committed events, %d rolled-back events, head %d", appends.Load(), len(committed), len(rolledBack), head)
	if len(committed) < 200 || len(rolledBack) == 0 {
		t.Fatalf("workload too small to prove anything: %d committed, %d rolled back", len(committed), len(rolledBack))
	}
	seenIDs := make(map[uuid.UUID]bool, len(seen))
	nextVersion := map[string]int64{}
	for i, e := range seen {
		if i > 0 && e.pos <= seen[i-1].pos {
			t.Fatalf("position %d after %d: not strictly increasing", e.pos, seen[i-1].pos)
		}
		if seenIDs[e.id] {
			t.Fatalf("event %s seen twice", e.id)
		}
		seenIDs[e.id] = true
		if rolledBack[e.id] {
			t.Fatalf("rolled-back event %s seen at %d", e.id, e.pos)
		}
		if _, ok := committed[e.id]; !ok {
			t.Fatalf("event %s at %d was never reported committed", e.id, e.pos)
		}
		want := nextVersion[e.stream] + 1
		if e.version != want {
			t.Fatalf("stream %s: version %d seen after %d (position %d)", e.stream, e.version, want-1, e.pos)
		}
		nextVersion[e.stream] = e.version
	}
	for id, s := range committed {
		if !seenIDs[id] {
			t.Fatalf("committed event %s of stream %s was skipped by the reader", id, s)
		}
	}
}

// writeOnce runs one randomized writer transaction.
func writeOnce(ctx context.Context, b *bundle, rng *rand.Rand, record func(map[uuid.UUID]string, bool)) error {
	stream := func() string { return fmt.Sprintf("acct-%d", rng.IntN(40)) }
	events := func() []eventstore.EventData {
		n := 1 + rng.IntN(3)
		out := make([]eventstore.EventData, n)
		for i := range out {
			out[i] = eventstore.EventData{ID: uuid.New(), Type: "acct.moved", Data: map[string]int{"amount": rng.IntN(100)}}
		}
		return out
	}
	ids := map[uuid.UUID]string{}
	note := func(s string, es []eventstore.EventData) {
		for _, e := range es {
			ids[e.ID] = s
		}
	}

	switch rng.IntN(10) {
	case 0: // an append in its own transaction
		s, es := stream(), events()
		note(s, es)
		_, err := b.store.Append(ctx, s, eventstore.Any, es...)
		record(ids, err == nil)
		return err
	case 1: // work, then appends and COMMIT in one round trip
		_, err := b.store.Transact(ctx, func(ctx context.Context, tx pgx.Tx, batch *eventstore.Batch) error {
			if _, err := tx.Exec(ctx, `INSERT INTO side (note) VALUES ('transact')`); err != nil {
				return err
			}
			sleepRand(rng, 3*time.Millisecond)
			s, es := stream(), events()
			note(s, es)
			return batch.Append(s, eventstore.Any, es...)
		})
		record(ids, err == nil)
		return err
	}

	tx, err := b.db.Pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if rng.IntN(3) == 0 { // (a) write another table first and take time
		if _, err := tx.Exec(ctx, `INSERT INTO side (note) VALUES ('before append')`); err != nil {
			return err
		}
		sleepRand(rng, 5*time.Millisecond)
	}
	for range 1 + rng.IntN(2) { // (b) one or two streams
		s, es := stream(), events()
		note(s, es)
		if _, err := b.store.AppendTx(ctx, tx, s, eventstore.Any, es...); err != nil {
			record(ids, false)
			return err
		}
	}
	if rng.IntN(4) == 0 { // (c) stay open after appending
		sleepRand(rng, 3*time.Millisecond)
	}
	if rng.IntN(10) == 0 { // (d) roll back
		record(ids, false)
		return tx.Rollback(ctx)
	}
	if err := tx.Commit(ctx); err != nil {
		record(ids, false)
		return err
	}
	record(ids, true)
	return nil
}

// sleepRand simulates work inside a transaction: the delay is the workload,
// not a wait for a condition.
func sleepRand(rng *rand.Rand, max time.Duration) {
	time.Sleep(time.Duration(rng.Int64N(int64(max))))
}
