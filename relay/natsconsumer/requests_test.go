package natsconsumer_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/annals-dev/annals/annalstest"
	"github.com/annals-dev/annals/relay/natsconsumer"
)

// apiTap records the JetStream API requests of one connection (those whose
// reply subject starts with its inbox prefix), as a subscription to
// "$JS.API.>" on another connection sees them: the requests that reached
// the server, whichever client calls made them.
type apiTap struct {
	mu       sync.Mutex
	subjects []string
}

func tapAPI(t *testing.T, nc *nats.Conn, inboxPrefix string) *apiTap {
	t.Helper()
	tap := &apiTap{}
	sub, err := nc.Subscribe("$JS.API.>", func(m *nats.Msg) {
		if strings.HasPrefix(m.Reply, inboxPrefix+".") {
			tap.mu.Lock()
			tap.subjects = append(tap.subjects, m.Subject)
			tap.mu.Unlock()
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return tap
}

// saw reports whether a request to a subject starting with prefix was seen.
func (a *apiTap) saw(prefix string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, s := range a.subjects {
		if strings.HasPrefix(s, prefix) {
			return true
		}
	}
	return false
}

// take returns the subjects of the requests seen since the last take.
func (a *apiTap) take() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	s := a.subjects
	a.subjects = nil
	return s
}

// TestAHealthyConsumerOnlyFetches: a consumer whose messages no other
// process holds, at a low publish rate (one message at a time, with pauses
// in which its fetches come back empty) and idle, makes no JetStream API
// request but its fetches: no stream or consumer info, no read by
// sequence, as before the consumer learnt to read past a crashed full
// batch. Before the fix every empty fetch asked for the stream's info, and a
// message published just after one was read by sequence (one more
// request), then delivered again and acknowledged as a duplicate.
func TestAHealthyConsumerOnlyFetches(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// The consumer's own connection, told apart by its inbox prefix (the
	// relay's requests go on e.nc).
	nc, err := nats.Connect(e.ns.ClientURL(), nats.CustomInboxPrefix("_CONSUMER"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	tap := tapAPI(t, e.nc, "_CONSUMER")
	const fetch = "$JS.API.CONSUMER.MSG.NEXT.ANNALS.tally"

	e.appendAndRelay(t, ctx, 1)
	c, err := natsconsumer.New(ctx, nc, &natsconsumer.Config{Durable: "tally", Batch: 10})
	if err != nil {
		t.Fatal(err)
	}
	stop := start(ctx, func(ctx context.Context) error { return c.RunProjection(ctx, e.dst.Pool, tally{}) })
	annalstest.WaitFor(t, 10*time.Second, func() bool { return e.tallied(ctx) == once(1) })
	// The start (stream info, consumer made) came before the first fetch:
	// once the tap saw that fetch, it saw them.
	annalstest.WaitFor(t, 5*time.Second, func() bool { return tap.saw(fetch) })
	tap.take()

	const n = 6
	for i := 2; i <= n; i++ {
		time.Sleep(1300 * time.Millisecond) // longer than a fetch waits: at least one comes back empty
		e.appendAndRelay(t, ctx, 1)
		annalstest.WaitFor(t, 5*time.Second, func() bool { return e.tallied(ctx) == once(i) })
	}
	time.Sleep(2 * time.Second) // idle
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	fetches := 0
	for _, s := range tap.take() {
		if strings.HasPrefix(s, fetch) {
			fetches++
		} else {
			t.Errorf("a healthy consumer made a request other than a fetch: %s", s)
		}
	}
	if fetches < n-1 {
		t.Errorf("the tap saw %d fetches for %d messages", fetches, n-1)
	}
}
