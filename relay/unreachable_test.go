package relay_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/relay"
)

// TestRelaySaysNATSIsUnreachable: while the NATS server is down, the
// relay's failures say that its connection is not connected, both the
// publish that fails and the next leadership's look at the stream (an
// operator's trial read "relay: stream ANNALS: context deadline exceeded",
// which does not tell an outage from a slow server); once NATS is back the
// stream holds every event once, in order.
func TestRelaySaysNATSIsUnreachable(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var logs annalstest.LogBuffer
	r, err := relay.New(b.db.Pool, b.nc, &relay.Config{
		AckTimeout: 300 * time.Millisecond, RetryBackoff: 100 * time.Millisecond,
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
	appendN := func(from, n int) {
		for i := from; i < from+n; i++ {
			if _, err := b.store.Append(ctx, fmt.Sprintf("s-%d", i%3), eventstore.Any,
				eventstore.EventData{Type: "t", Data: map[string]int{"i": i}}); err != nil {
				t.Fatal(err)
			}
		}
	}
	appendN(0, 5)
	annalstest.WaitFor(t, 20*time.Second, func() bool { return b.checkpoint("relay") == 5 })

	b.ns.Stop()
	appendN(5, 3)
	const down = "the NATS connection is RECONNECTING (no NATS server answers"
	said := func(msg string) bool {
		for line := range strings.Lines(logs.String()) {
			if strings.Contains(line, msg) && strings.Contains(line, down) {
				return true
			}
		}
		return false
	}
	annalstest.WaitFor(t, 30*time.Second, func() bool {
		return said("relay publish failed") && said("relay: stream ANNALS: "+down)
	})
	if err := b.ns.Up(); err != nil {
		t.Fatal(err)
	}
	annalstest.WaitFor(t, 30*time.Second, func() bool { return b.checkpoint("relay") == 8 })
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	checkExactlyOnce(t, b.relayed("ANNALS"), b.log())
}
