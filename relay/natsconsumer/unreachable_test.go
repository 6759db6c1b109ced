package natsconsumer_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/relay/natsconsumer"
)

// TestAConsumerSaysNATSIsUnreachable: a consumer whose requests to the
// server fail while the NATS server is down says that its connection is
// not connected; an operator's trial read "reading relayed events from the
// stream by sequence failed; retrying ... context deadline exceeded" (the
// request was no read by sequence, and nothing told an outage from a slow
// server).
func TestAConsumerSaysNATSIsUnreachable(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	// No deadline: JetStream's requests then time out on their own (5 s),
	// as in a service that runs until stopped.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	e.appendAndRelay(t, ctx, 4)
	cfg := &natsconsumer.Config{Durable: "run", Batch: 2}
	if _, err := natsconsumer.New(ctx, e.nc, cfg); err != nil {
		t.Fatal(err)
	}
	// A process that died holding a full batch: the next one asks the
	// server about the durable consumer after each empty fetch.
	e.crash(t, ctx, "run", 2)
	var logs logBuffer
	cfg.Logger = logs.logger()
	c, err := natsconsumer.New(ctx, e.nc, cfg)
	if err != nil {
		t.Fatal(err)
	}
	var handled atomic.Int64
	stop := start(ctx, func(ctx context.Context) error {
		return c.Run(ctx, func(context.Context, eventstore.Event) error { handled.Add(1); return nil })
	})
	annalstest.WaitFor(t, 10*time.Second, func() bool { return handled.Load() == 4 })
	e.ns.Stop()
	const want = "the NATS connection is RECONNECTING (no NATS server answers)"
	annalstest.WaitFor(t, 30*time.Second, func() bool {
		for line := range strings.Lines(logs.String()) {
			if strings.Contains(line, "annals: reading relayed events from the stream failed; retrying") && strings.Contains(line, want) {
				return true
			}
		}
		return false
	})
	if err := stop(); err != nil {
		t.Fatal(err)
	}
}

// TestAConsumerWithADeadlineSaysNATSIsUnreachable: the same with a context
// that has a deadline (a minute): each request to the server is bounded on
// its own, so the failure is told within seconds rather than when the
// context ends (JetStream waits for an answer until the context's deadline
// when it has one; the consumer waited in silence).
func TestAConsumerWithADeadlineSaysNATSIsUnreachable(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	e.appendAndRelay(t, ctx, 4)
	cfg := &natsconsumer.Config{Durable: "run", Batch: 2}
	if _, err := natsconsumer.New(ctx, e.nc, cfg); err != nil {
		t.Fatal(err)
	}
	e.crash(t, ctx, "run", 2)
	var logs logBuffer
	cfg.Logger = logs.logger()
	c, err := natsconsumer.New(ctx, e.nc, cfg)
	if err != nil {
		t.Fatal(err)
	}
	var handled atomic.Int64
	stop := start(ctx, func(ctx context.Context) error {
		return c.Run(ctx, func(context.Context, eventstore.Event) error { handled.Add(1); return nil })
	})
	annalstest.WaitFor(t, 10*time.Second, func() bool { return handled.Load() == 4 })
	e.ns.Stop()
	annalstest.WaitFor(t, 20*time.Second, func() bool {
		return strings.Contains(logs.String(), "the NATS connection is RECONNECTING (no NATS server answers)")
	})
	if err := stop(); err != nil {
		t.Fatal(err)
	}
}
