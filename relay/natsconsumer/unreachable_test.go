package natsconsumer_test

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
	// At debug level: the outage's first failed request is the one WARN
	// (TestAConsumerWarnsOnceOfANATSOutage), maybe the fetch in flight when
	// the server went; the info requests after it log at DEBUG, and say so.
	cfg.Logger = debugLogger(&logs)
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
	// At debug level: the outage's first failed request is the one WARN
	// (TestAConsumerWarnsOnceOfANATSOutage), maybe the fetch in flight when
	// the server went; the info requests after it log at DEBUG, and say so.
	cfg.Logger = debugLogger(&logs)
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

// TestAConsumerWarnsOnceOfANATSOutage: a consumer that asks the server
// about the durable consumer after each empty fetch (it holds
// unacknowledged messages) logged a WARN per failed request while NATS was
// down, one every requestTimeout (5 s) plus RetryBackoff: about ten a
// minute for as long as the outage lasted. It says it at WARN once, then at
// DEBUG with attempts and failing_for (a WARN again at most once a minute),
// and at INFO when the server answers again.
func TestAConsumerWarnsOnceOfANATSOutage(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	e.appendAndRelay(t, ctx, 4)
	cfg := &natsconsumer.Config{Durable: "run", Batch: 2}
	if _, err := natsconsumer.New(ctx, e.nc, cfg); err != nil {
		t.Fatal(err)
	}
	e.crash(t, ctx, "run", 2)
	var logs logBuffer
	cfg.Logger = debugLogger(&logs)
	c, err := natsconsumer.New(ctx, e.nc, cfg)
	if err != nil {
		t.Fatal(err)
	}
	var handled atomic.Int64
	stop := start(ctx, func(ctx context.Context) error {
		return c.Run(ctx, func(context.Context, eventstore.Event) error { handled.Add(1); return nil })
	})
	defer func() {
		if t.Failed() {
			t.Log(logs.String())
		}
	}()
	annalstest.WaitFor(t, 10*time.Second, func() bool { return handled.Load() == 4 })
	e.ns.Stop()
	// The outage's failed requests: the fetch in flight when the server
	// went ("server shutdown"), then the consumer info requests.
	isFailure := func(line string) bool {
		return strings.Contains(line, `msg="annals: reading relayed events from the stream failed; retrying"`) ||
			strings.Contains(line, `msg="annals: fetching relayed events failed"`)
	}
	failures := func() (warns, debugs []string) {
		for line := range strings.Lines(logs.String()) {
			switch {
			case !isFailure(line):
			case strings.Contains(line, "level=WARN"):
				warns = append(warns, line)
			case strings.Contains(line, "level=DEBUG"):
				debugs = append(debugs, line)
			}
		}
		return warns, debugs
	}
	// Three failed requests (about 15 s): the first at WARN, the others at DEBUG.
	annalstest.WaitFor(t, 40*time.Second, func() bool {
		w, d := failures()
		return len(w)+len(d) >= 3
	})
	warns, debugs := failures()
	if len(warns) != 1 {
		t.Fatalf("%d WARNs of %d failed requests within a minute of a NATS outage; want 1:\n%s", len(warns), len(warns)+len(debugs), strings.Join(warns, ""))
	}
	for _, want := range []string{"consumer=run", "attempts=1", "failing_for=0s"} {
		if !strings.Contains(warns[0], want) {
			t.Errorf("the WARN lacks %q: %s", want, warns[0])
		}
	}
	for i, d := range debugs {
		for _, want := range []string{"consumer=run", fmt.Sprintf("attempts=%d", i+2), "failing_for=", "the NATS connection is RECONNECTING"} {
			if !strings.Contains(d, want) {
				t.Errorf("a DEBUG lacks %q: %s", want, d)
			}
		}
	}
	const back = `level=INFO msg="annals: the NATS server answers the consumer's requests again" consumer=run attempts=`
	if strings.Contains(logs.String(), back) {
		t.Fatalf("said NATS answers again while it was down:\n%s", logs.String())
	}
	if err := e.ns.Up(); err != nil {
		t.Fatal(err)
	}
	annalstest.WaitFor(t, 30*time.Second, func() bool { return strings.Contains(logs.String(), back) })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
}

// debugLogger logs everything, debug records included, to l.
func debugLogger(l *logBuffer) *slog.Logger {
	return slog.New(slog.NewTextHandler(l, &slog.HandlerOptions{Level: slog.LevelDebug}))
}
