package relay_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/internal/childproc"
)

// TestExactlyOnceInJetStream: 5,000 events appended by 8 writers while the
// relay process is SIGKILLed 5 times (two relay processes run at any time,
// one leading, one standing by; each kill hits the leader and a new
// standby is started) and the NATS server is restarted once. Afterwards the
// JetStream stream holds each event once (count and IDs), in position order
// (so each stream's events in version order), and a monitor that compared
// the relay's checkpoint with the newest message in the stream every few
// milliseconds never saw the checkpoint ahead of it.
func TestExactlyOnceInJetStream(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 80*time.Second)
	defer cancel()

	natsURL := b.ns.ClientURL()
	var seq atomic.Int64
	start := func() *childproc.Child {
		id := fmt.Sprintf("relay-%d", seq.Add(1))
		spec, _ := json.Marshal(childSpec{URL: b.db.URL, NATS: natsURL, Instance: id})
		return childproc.Start(t, id, childEnv+"="+string(spec))
	}
	children := map[string]*childproc.Child{}
	var all []*childproc.Child
	start0 := start
	start = func() *childproc.Child { c := start0(); all = append(all, c); return c }
	for range 2 {
		c := start()
		children[c.ID] = c
	}

	// The monitor: the checkpoint, read first, must never be ahead of the
	// newest message the stream holds, read after it.
	var violations, samples atomic.Int64
	monitorCtx, stopMonitor := context.WithCancel(ctx)
	var monitorWG sync.WaitGroup
	monitorWG.Add(1)
	go func() {
		defer monitorWG.Done()
		for monitorCtx.Err() == nil {
			var cp int64
			if err := b.db.Pool.QueryRow(monitorCtx, `SELECT coalesce((SELECT position FROM annals.checkpoints WHERE subscriber_id = 'relay'), 0)`).Scan(&cp); err != nil {
				continue // the test is ending
			}
			last, err := lastPosition(monitorCtx, b.js)
			if err != nil {
				time.Sleep(5 * time.Millisecond) // NATS is restarting: sampling pace
				continue
			}
			samples.Add(1)
			if cp > last {
				violations.Add(1)
				t.Errorf("checkpoint %d is ahead of the newest message in JetStream (position %d)", cp, last)
			}
			time.Sleep(5 * time.Millisecond) // sampling pace
		}
	}()

	// 8 writers, 625 events each, paced so that the kills fall among them.
	const writers, perWriter = 8, 625
	var written atomic.Int64
	var writerWG sync.WaitGroup
	writerErr := make(chan error, writers)
	for w := range writers {
		writerWG.Add(1)
		go func() {
			defer writerWG.Done()
			pace := time.NewTicker(4 * time.Millisecond)
			defer pace.Stop()
			for i := range perWriter {
				<-pace.C
				ed := eventstore.EventData{ID: uuid.Must(uuid.NewV7()), Type: "thing.done", Data: map[string]int{"w": w, "i": i}}
				if _, err := b.store.Append(ctx, fmt.Sprintf("w%d-s%d", w, i%5), eventstore.Any, ed); err != nil {
					writerErr <- err
					return
				}
				written.Add(1)
			}
		}()
	}

	leader := func() *childproc.Child {
		var owner string
		annalstest.WaitFor(t, 20*time.Second, func() bool {
			err := b.db.Pool.QueryRow(ctx, `SELECT coalesce(owner, '') FROM annals.checkpoints WHERE subscriber_id = 'relay'`).Scan(&owner)
			return err == nil && children[owner] != nil
		})
		return children[owner]
	}
	relayedCount := func() int64 {
		last, err := lastPosition(ctx, b.js)
		if err != nil {
			return -1
		}
		return last
	}
	for k := range 5 {
		// Let the leader publish some, then kill it.
		before := relayedCount()
		annalstest.WaitFor(t, 30*time.Second, func() bool { return relayedCount() > before+700 || written.Load() == writers*perWriter })
		l := leader()
		l.Kill()
		delete(children, l.ID)
		t.Logf("kill %d: SIGKILLed %s at %d written, %d relayed", k+1, l.ID, written.Load(), relayedCount())
		c := start()
		children[c.ID] = c
		if k == 2 {
			if err := b.ns.Restart(); err != nil {
				t.Fatal(err)
			}
			t.Logf("restarted the NATS server")
		}
	}
	writerWG.Wait()
	close(writerErr)
	for err := range writerErr {
		t.Fatal(err)
	}
	head := int64(writers * perWriter)
	annalstest.WaitFor(t, 40*time.Second, func() bool { return b.checkpoint("relay") == head })
	stopMonitor()
	monitorWG.Wait()
	for _, c := range children {
		// A child started after the last kill may still be starting (no
		// signal handler yet, under load): SIGTERM then kills it outright.
		annalstest.WaitFor(t, 30*time.Second, func() bool { return strings.Contains(c.Log(), "child: relaying") })
		c.Term(15 * time.Second)
	}
	if samples.Load() < 50 {
		t.Fatalf("the monitor took only %d samples", samples.Load())
	}
	t.Logf("monitor: %d samples, %d violations", samples.Load(), violations.Load())
	failed := 0
	for _, c := range all {
		failed += strings.Count(c.Log(), "relay publish failed")
	}
	t.Logf("leaderships ended by a failed publish (the NATS restart): %d", failed)
	checkExactlyOnce(t, b.relayed("ANNALS"), b.log())
}

// lastPosition returns the position of the newest message in the stream.
func lastPosition(ctx context.Context, js jetstream.JetStream) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, "ANNALS")
	if err != nil {
		return 0, err
	}
	info := s.CachedInfo()
	if info.State.Msgs == 0 {
		return 0, nil
	}
	m, err := s.GetMsg(ctx, info.State.LastSeq)
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(m.Header.Get("Annals-Position"), 10, 64)
}
