package natsconsumer_test

// A consumer following a live stream: each event handled as it arrives,
// not when the pull request that brought it ends, and a stop that does not
// wait for that request either, while what it still brings is handed
// back.

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/eventstore"
	"github.com/annals-dev/annals/relay"
	"github.com/annals-dev/annals/relay/natsconsumer"
)

// runKind is Run or RunProjection (tally) over e's stream, calling handled
// with each event its handler gets.
type runKind struct {
	name string
	run  func(ctx context.Context, e *env, c *natsconsumer.Consumer, handled func(eventstore.Event)) error
}

var runKinds = []runKind{
	{"Run", func(ctx context.Context, _ *env, c *natsconsumer.Consumer, handled func(eventstore.Event)) error {
		return c.Run(ctx, func(_ context.Context, ev eventstore.Event) error { handled(ev); return nil })
	}},
	{"RunProjection", func(ctx context.Context, e *env, c *natsconsumer.Consumer, handled func(eventstore.Event)) error {
		return c.RunProjection(ctx, e.dst.Pool, handledTally{handled})
	}},
}

// handledTally is tally, calling handled with each event it gets first.
type handledTally struct{ handled func(eventstore.Event) }

func (handledTally) Name() string { return "tally" }

func (h handledTally) Handle(ctx context.Context, tx pgx.Tx, e eventstore.Event) error {
	h.handled(e)
	return tally{}.Handle(ctx, tx, e)
}

// publish publishes the event at position pos (acct-0, version pos) to the
// relay's stream as the relay would, and returns once JetStream stored it.
func (e *env) publish(tb testing.TB, ctx context.Context, pos int64) {
	tb.Helper()
	ev := eventstore.Event{GlobalSequence: pos, ID: uuid.New(), StreamID: "acct-0", StreamVersion: pos,
		Type: "deposited", Data: json.RawMessage(`{"amount":1}`), RecordedAt: time.Now()}
	m, err := relay.Message("relay", "annals.deposited.acct-0", ev)
	if err != nil {
		tb.Fatal(err)
	}
	if _, err := e.js.PublishMsg(ctx, m); err != nil {
		tb.Fatal(err)
	}
}

// waitForPull waits until durable has a pull request open on the server (a
// consumer's fetch waiting for messages).
func (e *env) waitForPull(tb testing.TB, ctx context.Context, durable string) {
	tb.Helper()
	cons, err := e.js.Consumer(ctx, "ANNALS", durable)
	if err != nil {
		tb.Fatal(err)
	}
	annalstest.WaitFor(tb, 10*time.Second, func() bool {
		info, err := cons.Info(ctx)
		return err == nil && info.NumWaiting > 0
	})
}

// waitForNoPull waits until durable has no pull request open on the
// server: a stopped consumer's last one stays open until it expires (up to
// a second), and the server delivers to it meanwhile (the consumer hands
// those messages back when it ends).
func (e *env) waitForNoPull(tb testing.TB, ctx context.Context, durable string) {
	tb.Helper()
	cons, err := e.js.Consumer(ctx, "ANNALS", durable)
	if err != nil {
		tb.Fatal(err)
	}
	annalstest.WaitFor(tb, 10*time.Second, func() bool {
		info, err := cons.Info(ctx)
		return err == nil && info.NumWaiting == 0
	})
}

// TestALiveEventIsHandledAtOnce: Run and RunProjection following a live
// stream get each event as the server delivers it: ten events, each
// published once the one before was handled, are each handled within
// liveBound of their publish. Before, the consumer collected a whole fetch
// (Batch messages, or the pull request's expiry a second after it was
// made) before it handled any: each event after the first waited about a
// second (the pull request made just after the one before was handled).
func TestALiveEventIsHandledAtOnce(t *testing.T) {
	t.Parallel()
	const liveBound = 400 * time.Millisecond // about 1 s before; a few ms after
	for _, k := range runKinds {
		t.Run(k.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			if _, err := e.r.EnsureStream(ctx); err != nil {
				t.Fatal(err)
			}
			c, err := natsconsumer.New(ctx, e.nc, &natsconsumer.Config{Durable: "live"})
			if err != nil {
				t.Fatal(err)
			}
			const n = 10
			got := make(chan time.Time, n+1)
			stop := start(ctx, func(ctx context.Context) error {
				return k.run(ctx, e, c, func(eventstore.Event) { got <- time.Now() })
			})
			e.waitForPull(t, ctx, "live") // following the stream
			var took []time.Duration
			for pos := int64(1); pos <= n; pos++ {
				sent := time.Now()
				e.publish(t, ctx, pos)
				select {
				case at := <-got:
					took = append(took, at.Sub(sent))
				case <-time.After(10 * time.Second):
					t.Fatalf("event %d not handled within 10 s", pos)
				}
			}
			if err := stop(); err != nil {
				t.Fatal(err)
			}
			if slowest := slices.Max(took); slowest > liveBound {
				t.Fatalf("publish to handler: %v; want each within %v", took, liveBound)
			}
			t.Logf("publish to handler: %v", took)
		})
	}
}

// TestAStopIsPrompt: Run and RunProjection waiting on an idle stream (a
// pull request open, made just before) return at once when ctx ends.
// Before, they returned when the pull request ended, up to a second
// later.
func TestAStopIsPrompt(t *testing.T) {
	t.Parallel()
	const stopBound = 300 * time.Millisecond // about 1 s before; a few ms after
	for _, k := range runKinds {
		t.Run(k.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			if _, err := e.r.EnsureStream(ctx); err != nil {
				t.Fatal(err)
			}
			c, err := natsconsumer.New(ctx, e.nc, &natsconsumer.Config{Durable: "idle"})
			if err != nil {
				t.Fatal(err)
			}
			stop := start(ctx, func(ctx context.Context) error {
				return k.run(ctx, e, c, func(eventstore.Event) {})
			})
			e.waitForPull(t, ctx, "idle") // its first fetch, made at its start
			began := time.Now()
			if err := stop(); err != nil {
				t.Fatal(err)
			}
			if took := time.Since(began); took > stopBound {
				t.Fatalf("%s returned %v after ctx ended; want within %v", k.name, took, stopBound)
			} else {
				t.Logf("%s returned %v after ctx ended", k.name, took)
			}
		})
	}
}

// TestAStopHandsBackWhatTheOpenFetchBrings: after Run or RunProjection
// returned, the pull request of its last fetch stays open on the server
// until it expires, and the server delivers messages published meanwhile
// to it. They are handed back (Nak): a second consumer of the durable
// consumer gets them within a few seconds, not after AckWait (30 s here).
// The second consumer is a plain JetStream fetch: a natsconsumer would read
// them from the stream by sequence anyway (they show as delivered past its
// place). A message it gets delivered a second time went to the stopped
// fetch first; when the stopped fetch expired before the publish (a
// stalled machine), none does, and the round is tried again.
func TestAStopHandsBackWhatTheOpenFetchBrings(t *testing.T) {
	t.Parallel()
	for _, k := range runKinds {
		t.Run(k.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
			defer cancel()
			if _, err := e.r.EnsureStream(ctx); err != nil {
				t.Fatal(err)
			}
			const durable = "handback"
			c, err := natsconsumer.New(ctx, e.nc, &natsconsumer.Config{Durable: durable, AckWait: 30 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			cons, err := e.js.Consumer(ctx, "ANNALS", durable)
			if err != nil {
				t.Fatal(err)
			}
			var mu sync.Mutex
			var handled []int64
			pos := int64(0)
			for round := 1; ; round++ {
				stop := start(ctx, func(ctx context.Context) error {
					return k.run(ctx, e, c, func(ev eventstore.Event) {
						mu.Lock()
						defer mu.Unlock()
						handled = append(handled, ev.GlobalSequence)
					})
				})
				e.waitForPull(t, ctx, durable)
				if err := stop(); err != nil {
					t.Fatal(err)
				}
				const n = 3
				first := pos + 1
				for range n {
					pos++
					e.publish(t, ctx, pos)
				}
				// The second consumer: every message, each acknowledged.
				var seen []string
				redelivered := false
				annalstest.WaitFor(t, 5*time.Second, func() bool {
					batch, err := cons.Fetch(n-len(seen), jetstream.FetchMaxWait(200*time.Millisecond))
					if err != nil {
						t.Fatal(err)
					}
					for m := range batch.Messages() {
						md, err := m.Metadata()
						if err != nil {
							t.Fatal(err)
						}
						if err := m.Ack(); err != nil {
							t.Fatal(err)
						}
						seen = append(seen, fmt.Sprintf("%d(delivered %d)", md.Sequence.Stream, md.NumDelivered))
						redelivered = redelivered || md.NumDelivered > 1
					}
					return len(seen) == n
				})
				mu.Lock()
				h := slices.Clone(handled)
				mu.Unlock()
				if slices.ContainsFunc(h, func(p int64) bool { return p >= first }) {
					t.Fatalf("the stopped consumer handled %v; want none of %d..%d", h, first, pos)
				}
				if redelivered {
					t.Logf("round %d: the second consumer got %v", round, seen)
					break
				}
				if round == 3 {
					t.Fatalf("in 3 rounds the stopped consumer's fetch never got a message published after the stop (last round: %v)", seen)
				}
			}
		})
	}
}

// BenchmarkLiveLatency measures the time from publish to handler of Run
// and RunProjection following a live stream, one event published every
// 100 ms (a trickle: fewer than Batch a second), b.N events (run it with
// -benchtime 200x): p50, p99 and max in ms. Before the consumer handled
// messages as they arrived, each waited for its pull request to expire.
func BenchmarkLiveLatency(b *testing.B) {
	for _, k := range runKinds {
		b.Run(k.name, func(b *testing.B) {
			e := newEnv(b)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
			defer cancel()
			if _, err := e.r.EnsureStream(ctx); err != nil {
				b.Fatal(err)
			}
			c, err := natsconsumer.New(ctx, e.nc, &natsconsumer.Config{Durable: "bench"})
			if err != nil {
				b.Fatal(err)
			}
			var mu sync.Mutex
			sent := make([]time.Time, b.N+1)
			var took []time.Duration
			stop := start(ctx, func(ctx context.Context) error {
				return k.run(ctx, e, c, func(ev eventstore.Event) {
					mu.Lock()
					defer mu.Unlock()
					took = append(took, time.Since(sent[ev.GlobalSequence]))
				})
			})
			e.waitForPull(b, ctx, "bench")
			tick := time.NewTicker(100 * time.Millisecond)
			defer tick.Stop()
			b.ResetTimer()
			for pos := 1; pos <= b.N; pos++ {
				<-tick.C
				mu.Lock()
				sent[pos] = time.Now()
				mu.Unlock()
				e.publish(b, ctx, int64(pos))
			}
			annalstest.WaitFor(b, 10*time.Second, func() bool { mu.Lock(); defer mu.Unlock(); return len(took) == b.N })
			b.StopTimer()
			if err := stop(); err != nil {
				b.Fatal(err)
			}
			slices.Sort(took)
			ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
			b.ReportMetric(ms(took[len(took)/2]), "p50-ms")
			b.ReportMetric(ms(took[(len(took)*99)/100]), "p99-ms")
			b.ReportMetric(ms(took[len(took)-1]), "max-ms")
		})
	}
}
