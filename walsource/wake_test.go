package walsource_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/projection"
	"github.com/annals-dev/annals/walsource"
)

// appliedProjection records each event in a table whose primary key makes
// a second application fail (and its batch with it).
type appliedProjection struct{}

func (appliedProjection) Name() string { return "applied" }

func (appliedProjection) Handle(ctx context.Context, tx pgx.Tx, e eventstore.Event) error {
	_, err := tx.Exec(ctx, `INSERT INTO applied (global_sequence, event_id) VALUES ($1, $2)`, e.GlobalSequence, e.ID)
	return err
}

// TestWakeDeliversExactlyOnce: a projection woken by the WAL (and not by
// NOTIFY or polling: its poll interval is a minute) applies every event
// exactly once while a writer appends across a killed replication connection
// (pg_terminate_backend on the walsender) and a PostgreSQL restart; while
// the runner is down, its slot keeps every event appended meanwhile and
// sends them when it is back.
func TestWakeDeliversExactlyOnce(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 80*time.Second)
	defer cancel()
	cluster, pool := annalstest.PrivateCluster(t, ctx, nil)
	if _, err := pool.Exec(ctx, `CREATE TABLE applied (global_sequence bigint PRIMARY KEY, event_id uuid NOT NULL UNIQUE)`); err != nil {
		t.Fatal(err)
	}
	store, err := eventstore.New(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	// decoded counts, per position, how often a leadership's slot sent it.
	var decodedMu = make(chan struct{}, 1)
	decoded := map[int64]int{}
	wake, err := walsource.NewWake(ctx, pool, &walsource.WakeConfig{
		StatusInterval: 50 * time.Millisecond,
		OnCommit: func(_ string, _ int, c walsource.Commit) {
			decodedMu <- struct{}{}
			for _, e := range c.Events {
				decoded[e.GlobalSequence]++
			}
			<-decodedMu
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	decodedIn := func(from, to int64) int {
		decodedMu <- struct{}{}
		defer func() { <-decodedMu }()
		n := 0
		for p := from; p <= to; p++ {
			if decoded[p] > 0 {
				n++
			}
		}
		return n
	}
	query := func(sql string, args ...any) int64 {
		t.Helper()
		var n int64
		if err := pool.QueryRow(ctx, sql, args...).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	head := func() int64 { return query(`SELECT coalesce(max(global_sequence), 0) FROM annals.events`) }
	applied := func() int64 { return query(`SELECT count(*) FROM applied`) }

	start := func() (stop func()) {
		r, err := projection.NewRunner(pool, &projection.Config{
			Wake: wake.For, PollInterval: time.Minute, RetryBackoff: 100 * time.Millisecond,
			LockRetryInterval: 50 * time.Millisecond,
		})
		if err != nil {
			t.Fatal(err)
		}
		if err := r.Register(appliedProjection{}, &projection.Options{BatchSize: 50}); err != nil {
			t.Fatal(err)
		}
		rctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- r.Run(rctx) }()
		return func() {
			cancel()
			if err := <-done; err != nil {
				t.Error(err)
			}
		}
	}

	// The writer appends n events, paced, retrying failed appends (a retry
	// of an append that committed is idempotent: the event has its ID).
	const n = 600
	var written atomic.Int64
	writerDone := make(chan error, 1)
	gate := make(chan struct{}) // the writer pauses at n/2 until the restart is over
	go func() {
		pace := time.NewTicker(3 * time.Millisecond)
		defer pace.Stop()
		for i := range n {
			<-pace.C
			if i == n/2 {
				<-gate
			}
			ed := eventstore.EventData{ID: uuid.Must(uuid.NewV7()), Type: "moved", Data: map[string]int{"i": i}}
			for {
				_, err := store.Append(ctx, fmt.Sprintf("s-%d", i%9), eventstore.Any, ed)
				if err == nil {
					break
				}
				if ctx.Err() != nil {
					writerDone <- err
					return
				}
				time.Sleep(20 * time.Millisecond) // back off before retrying, not a wait for a condition
			}
			written.Add(1)
		}
		writerDone <- nil
	}()

	stop := start()
	annalstest.WaitFor(t, 20*time.Second, func() bool { return applied() > 0 })
	annalstest.WaitFor(t, 20*time.Second, func() bool { return written.Load() >= n/5 })
	var killed bool
	if err := pool.QueryRow(ctx, `SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1 AND active_pid IS NOT NULL`,
		wake.Slot("applied", 0)).Scan(&killed); err != nil || !killed {
		t.Fatalf("terminate the walsender: %v, %v", killed, err)
	}
	annalstest.WaitFor(t, 20*time.Second, func() bool { return written.Load() >= n/3 })
	if err := cluster.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	close(gate)
	if err := <-writerDone; err != nil {
		t.Fatal(err)
	}
	annalstest.WaitFor(t, 30*time.Second, func() bool { return applied() == n })
	stop()

	// Down: the slot keeps what is appended meanwhile, and sends it on return.
	downFrom := head()
	for i := range 40 {
		if _, err := store.Append(ctx, fmt.Sprintf("d-%d", i%3), eventstore.Any, eventstore.EventData{Type: "moved", Data: map[string]int{"i": i}}); err != nil {
			t.Fatal(err)
		}
	}
	// The walsender ends a moment after the runner's replication
	// connection closes (make soak caught it still active once): poll.
	annalstest.WaitForErr(t, 10*time.Second, func() error {
		if got := query(`SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1 AND NOT active`, wake.Slot("applied", 0)); got != 1 {
			return errors.New("the slot is gone or active while the runner is down")
		}
		return nil
	})
	stop = start()
	annalstest.WaitFor(t, 20*time.Second, func() bool { return applied() == n+40 })
	annalstest.WaitFor(t, 20*time.Second, func() bool { return decodedIn(downFrom+1, downFrom+40) == 40 })
	stop()

	// Counted, not read off the head: an append the restart cut off after
	// it drew its position leaves a gap in the positions (its retry draws
	// another), as any rolled-back append does.
	if got, logged := query(`SELECT count(DISTINCT event_id) FROM applied`), query(`SELECT count(*) FROM annals.events`); got != n+40 || logged != n+40 {
		t.Fatalf("%d distinct events applied, %d in the log, want %d", got, logged, n+40)
	}
	if mismatch := query(`SELECT count(*) FROM applied a JOIN annals.events e USING (global_sequence) WHERE a.event_id <> e.event_id`); mismatch != 0 {
		t.Fatalf("%d applied rows differ from the log", mismatch)
	}
}
