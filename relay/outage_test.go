package relay_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/relay"
)

// TestRelayRecoversFromANATSOutage: the NATS server goes away for longer
// than the relay's ack timeout while events are appended and published;
// the relay's publishes fail, it commits what was acknowledged, ends its
// leadership and claims again, and once NATS is back the stream holds every
// event once, in order.
func TestRelayRecoversFromANATSOutage(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var logs annalstest.LogBuffer
	r, err := relay.New(b.db.Pool, b.nc, &relay.Config{
		BatchSize: 20, AckTimeout: 300 * time.Millisecond, RetryBackoff: 100 * time.Millisecond,
		LockRetryInterval: 50 * time.Millisecond, PollInterval: 100 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(&logs, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(runCtx) }()

	const n = 600
	var written atomic.Int64
	writerDone := make(chan error, 1)
	go func() {
		pace := time.NewTicker(3 * time.Millisecond)
		defer pace.Stop()
		for i := range n {
			<-pace.C
			if _, err := b.store.Append(ctx, fmt.Sprintf("s-%d", i%6), eventstore.Any,
				eventstore.EventData{Type: "t", Data: map[string]int{"i": i}}); err != nil {
				writerDone <- err
				return
			}
			written.Add(1)
		}
		writerDone <- nil
	}()
	annalstest.WaitFor(t, 20*time.Second, func() bool { return b.checkpoint("relay") > 50 })
	b.ns.Stop()
	outage := time.NewTimer(time.Second) // the outage: longer than the ack timeout
	<-outage.C
	if err := b.ns.Up(); err != nil {
		t.Fatal(err)
	}
	if err := <-writerDone; err != nil {
		t.Fatal(err)
	}
	annalstest.WaitFor(t, 30*time.Second, func() bool { return b.checkpoint("relay") == n })
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(logs.String(), "relay publish failed") {
		t.Fatalf("no publish failed during a 1s outage with a 300ms ack timeout; the log:\n%s", logs.String())
	}
	msgs := b.relayed("ANNALS")
	if len(msgs) != n {
		have := map[int64]bool{}
		for _, m := range msgs {
			e, _ := relay.Decode(m.Header, m.Data)
			have[e.GlobalSequence] = true
		}
		var missing []int64
		for p := int64(1); p <= n; p++ {
			if !have[p] {
				missing = append(missing, p)
			}
		}
		t.Logf("missing %v\nlog:\n%s", missing, logs.String())
	}
	checkExactlyOnce(t, msgs, b.log())
}

// A relay stopped during a NATS outage, with publishes awaiting their
// acknowledgements, returns at once rather than after AckTimeout (it
// waited it out: SIGTERM took --ack-timeout); what it did not see
// acknowledged is published by the next run, chained, once each.
func TestRelayStopsAtOnceDuringANATSOutage(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const ackTimeout = 40 * time.Second
	var logs annalstest.LogBuffer
	r, err := relay.New(b.db.Pool, b.nc, &relay.Config{AckTimeout: ackTimeout, RetryBackoff: 50 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if t.Failed() {
			t.Logf("the relay's log:\n%s", logs.String())
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 2*ackTimeout)
	defer cancel()
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	done := make(chan error, 1)
	go func() { done <- r.Run(runCtx) }()
	appendMany(t, b.store, 3)
	annalstest.WaitFor(t, 20*time.Second, func() bool { return b.checkpoint("relay") == 3 })
	b.ns.Stop()
	annalstest.WaitFor(t, 10*time.Second, func() bool { return !b.nc.IsConnected() })
	sent := b.nc.Stats().OutMsgs
	appendMany(t, b.store, 3)
	// Published into the reconnect buffer (one batch at least): awaiting
	// acknowledgements.
	annalstest.WaitFor(t, 20*time.Second, func() bool { return b.nc.Stats().OutMsgs > sent })
	t0 := time.Now()
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if d := time.Since(t0); d > ackTimeout/4 {
		t.Fatalf("Run returned %v after its context ended, during a NATS outage (AckTimeout %v)", d, ackTimeout)
	}
	if err := b.ns.Up(); err != nil {
		t.Fatal(err)
	}
	if err := r.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	checkExactlyOnce(t, b.relayed("ANNALS"), b.log())
}
